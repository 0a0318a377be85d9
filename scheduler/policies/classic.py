"""Volcano's binpack and spread node scores, with Volcano's spread bug fixed.

binpack: sum over the pod's GPUs of 100 * memory used after placement / card memory (Volcano's GPUScore).
spread: sum over the pod's GPUs of 100 when the GPU held no container before the pod (Volcano evaluated this
after the increment, so it was always 0).
"""

from collections.abc import Sequence

from vgpu.inventory import GPUDevice
from vgpu.requests import ContainerRequest
from vgpu.scheduler.fit import FitResult, GPUUsage
from vgpu.scheduler.policies.base import NodeContext, NodePolicy, PodContext, register

__all__ = ["Binpack", "Spread"]


def _after(usage: Sequence[GPUUsage], result: FitResult) -> dict[int, tuple[int, int]]:
    """Per GPU index taken by the pod: (containers before, memory after)."""
    taken: dict[int, tuple[int, int]] = {}
    for indices, grants in zip(result.placement, result.assignment):
        for i, grant in zip(indices, grants):
            shares, memory = taken.get(i, (usage[i].shares, usage[i].memory))
            taken[i] = (shares, memory + grant.memory)
    return taken


@register("binpack")
class Binpack(NodePolicy):
    """Prefer nodes whose chosen GPUs end up fullest in memory."""

    name = "binpack"

    def score(
        self,
        devices: Sequence[GPUDevice],
        usage: Sequence[GPUUsage],
        requests: Sequence[ContainerRequest],
        result: FitResult,
        node: NodeContext | None = None,
        pod: PodContext | None = None,
    ) -> float:
        return float(sum(100.0 * memory / devices[i].memory for i, (_, memory) in _after(usage, result).items()))


@register("spread")
class Spread(NodePolicy):
    """Prefer nodes where the pod lands on GPUs that were idle."""

    name = "spread"

    def score(
        self,
        devices: Sequence[GPUDevice],
        usage: Sequence[GPUUsage],
        requests: Sequence[ContainerRequest],
        result: FitResult,
        node: NodeContext | None = None,
        pod: PodContext | None = None,
    ) -> float:
        return float(sum(100.0 for shares, _ in _after(usage, result).values() if shares == 0))
