"""Kubelet gRPC protocols (deviceplugin v1beta1, podresources v1, plugin registration, DRA node service v1):
.proto sources and generated Python code.

Generated modules: `vgpu.proto.<api>.<version>.api_pb2` / `api_pb2_grpc` for `deviceplugin.v1beta1`,
`podresources.v1`, `pluginregistration.v1` and `dra.v1`. Regenerate with `python proto/generate.py`.
"""
