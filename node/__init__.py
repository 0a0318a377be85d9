"""The node layer: what a GPU node's agents need whichever way pods reach the GPUs.

Both kubelet plugins stand on it, the device plugin (vgpu.deviceplugin) and the DRA plugin (vgpu.draplugin), and
neither imports the other. It holds the GPU backends and their health (`backends`: NVML, the simulated GPUs of
deploy's sim DaemonSet and the demo, none), the limits a container is given as environment and mounts
(`response`), the host files the isolation library is installed into (`host`), the records of what each container
was granted (`records`), the reading of containers' accounting files (`accounting`) and the driver-side limits for
containers without the library (`driverlimits`), and how an agent's process lives (`process`).
"""
