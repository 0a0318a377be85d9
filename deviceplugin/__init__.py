"""Kubelet device plugin and node monitor of vgpu-sharing (`vgpu device-plugin`).

Advertises each GPU as split fake devices for three resources, answers kubelet's Allocate with the isolation
library's environment and mounts for the pod the scheduler placed, publishes the node inventory annotation and
serves node metrics. Never imports `scheduler`.
"""
