"""Annotation keys of the wire contract (Volcano's and HAMi's names, docs/install.md).

Node inventory is written by the device plugin, node holds by `vgpu consolidate`; the assignment keys by the scheduler
at bind; the selector keys by users.
"""

# Node inventory.
NODE_REGISTER = "volcano.sh/node-vgpu-register"
NODE_HANDSHAKE = "volcano.sh/node-vgpu-handshake"
HAMI_NODE_REGISTER = "hami.io/node-nvidia-register"
# Ours: each GPU's NVLink island and NUMA node (vgpu.inventory.encode_topology), beside either inventory
NODE_TOPOLOGY = "vgpu-sharing.io/node-gpu-topology"

# Ours, on nodes: GPUs kept free for pending pods (vgpu.holds), written by `vgpu consolidate --execute` on the nodes
# it evicted pods from, read by the scheduler extender
CONSOLIDATION_HOLD = "vgpu-sharing.io/consolidation-hold"

# Scheduler decision, carried on the Binding.
VGPU_NODE = "volcano.sh/vgpu-node"
VGPU_IDS = "volcano.sh/vgpu-ids-new"
DEVICES_TO_ALLOCATE = "volcano.sh/devices-to-allocate"
VGPU_TIME = "volcano.sh/vgpu-time"
BIND_TIME = "volcano.sh/bind-time"
BIND_PHASE = "volcano.sh/bind-phase"

BIND_PHASE_ALLOCATING = "allocating"
BIND_PHASE_SUCCESS = "success"
BIND_PHASE_FAILED = "failed"
# Value the device plugin writes into vgpu-time once a pod is done (Volcano's MaxUint64).
VGPU_TIME_DONE = "18446744073709551615"

# User selectors.
USE_GPU_TYPE = "nvidia.com/use-gputype"
NOUSE_GPU_TYPE = "nvidia.com/nouse-gputype"
USE_GPU_UUID = "volcano.sh/vgpu-use-gpuuuid"
NOUSE_GPU_UUID = "volcano.sh/vgpu-nouse-gpuuuid"
# HAMi's names of the same two lists (HAMi pkg/device/nvidia: GPUUseUUID, GPUNoUseUUID); either name is read
HAMI_USE_GPU_UUID = "nvidia.com/use-gpuuuid"
HAMI_NOUSE_GPU_UUID = "nvidia.com/nouse-gpuuuid"
# HAMi's per-pod GPU order inside a node (binpack or spread), over the scheduler's --gpu-policy
HAMI_GPU_SCHEDULER_POLICY = "hami.io/gpu-scheduler-policy"
# HAMi's per-pod node order (binpack or spread), over the scheduler's --node-policy
HAMI_NODE_SCHEDULER_POLICY = "hami.io/node-scheduler-policy"
GPU_ORDER_NAMES = ("binpack", "spread")
# Ours: what the pod's compute may reach (% of each GPU, above vgpu-cores) while its GPUs' other tenants are idle;
# read only on nodes whose device plugin runs with --idle-share (node.pacing, docs/isolation.md)
CORES_CEILING = "vgpu-sharing.io/cores-ceiling"
# Ours: a pod annotated "true" is never moved by `vgpu consolidate` (planning/consolidate.py)
NO_CONSOLIDATE = "vgpu-sharing.io/no-consolidate"
VGPU_MODE = "volcano.sh/vgpu-mode"

# Request type keyword written in every assignment entry.
DEVICE_TYPE = "NVIDIA"
MODE_HAMI_CORE = "hami-core"
