"""Kubelet gRPC protocols (deviceplugin v1beta1, podresources v1): .proto sources and generated Python code.

Generated modules: `vgpu.proto.deviceplugin.v1beta1.api_pb2` / `api_pb2_grpc` and `vgpu.proto.podresources.v1.api_pb2` /
`api_pb2_grpc`. Regenerate with `python proto/generate.py`.
"""
