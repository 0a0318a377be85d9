"""GPU share arithmetic shared by the share-aware node policies (baselines, fgd, fragaware).

A GPU's free share, in milli-GPU, is the smaller of its free memory and free cores as fractions of the card
(0 when it is unhealthy or has no free container slot). A request's share on a card is the larger of its memory
and cores fractions. When memory is counted exactly (as the trace replay does) this is exactly the trace's
`gpu_milli`.
"""

from collections.abc import Sequence

from vgpu.inventory import GPUDevice
from vgpu.requests import ContainerRequest
from vgpu.scheduler.fit import FitResult, GPUUsage

__all__ = [
    "MILLI",
    "bestfit_gpu_order",
    "idle_milli",
    "lowest_index_order",
    "placed_milli",
    "placed_usage",
    "request_milli",
]

MILLI = 1000


def idle_milli(device: GPUDevice, used: GPUUsage) -> int:
    """Free share of one GPU in milli-GPU."""
    if not device.healthy or used.shares >= device.split or device.memory <= 0:
        return 0
    by_memory = MILLI * (device.memory - used.memory) // device.memory
    by_cores = 10 * (100 - used.cores)
    return max(0, min(by_memory, by_cores))


def request_milli(request: ContainerRequest, device: GPUDevice) -> int:
    """Share of one of `device`'s GPUs that `request` takes, in milli-GPU (rounded up)."""
    memory = request.memory_on(device.memory)
    by_memory = -(-MILLI * memory // device.memory) if device.memory > 0 else MILLI
    return min(MILLI, max(by_memory, 10 * request.cores))


def placed_usage(usage: Sequence[GPUUsage], result: FitResult) -> dict[int, GPUUsage]:
    """The usage of each GPU `result` places a container on, once the pod is placed (copies; `usage` is kept)."""
    after: dict[int, GPUUsage] = {}
    for indices, grants in zip(result.placement, result.assignment):
        for i, grant in zip(indices, grants):
            used = after.get(i)
            if used is None:
                old = usage[i]
                used = after[i] = GPUUsage(old.shares, old.memory, old.cores)
            used.add(grant.memory, grant.cores)
    return after


def placed_milli(devices: Sequence[GPUDevice], requests: Sequence[ContainerRequest], result: FitResult) -> int:
    """Total milli-GPU the pod takes when placed as `result` says."""
    total = 0
    for request, indices in zip(requests, result.placement):
        for i in indices:
            total += request_milli(request, devices[i])
    return total


def bestfit_gpu_order(
    devices: Sequence[GPUDevice], usage: Sequence[GPUUsage], request: ContainerRequest, candidates: list[int]
) -> list[int]:
    """The simulator's `best` GPU choice: least free share first, lowest index on ties."""
    return sorted(candidates, key=lambda i: (idle_milli(devices[i], usage[i]), i))


def lowest_index_order(
    devices: Sequence[GPUDevice], usage: Sequence[GPUUsage], request: ContainerRequest, candidates: list[int]
) -> list[int]:
    """Lowest index first."""
    return sorted(candidates)
