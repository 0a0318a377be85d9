"""The ATC'23 baselines as node policies: random, bestfit, dotprod and packing.

Each follows the score plugin of the FGD paper's simulator (USENIX ATC'23, docs/placement.md) on GPU shares in
milli-GPU, with its GPU choice (`best`: least free share that fits, lowest index; `random` for random). Node CPU
enters bestfit and dotprod through the optional node context; without it (the extender) the CPU terms are 0.
"""

import random as _random
from collections.abc import Sequence

from vgpu.inventory import GPUDevice
from vgpu.requests import ContainerRequest
from vgpu.scheduler.fit import FitResult, GPUOrder, GPUUsage
from vgpu.scheduler.policies.base import NodeContext, NodePolicy, PodContext, register
from vgpu.scheduler.policies.shares import MILLI, bestfit_gpu_order, idle_milli, placed_milli

__all__ = ["MAX_SPEC_CPU", "MAX_SPEC_GPU", "BestFit", "DotProd", "Packing", "RandomFit"]

MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8_000


def _cpu_terms(node: NodeContext | None, pod: PodContext | None) -> tuple[int, int]:
    """(free CPU, requested CPU) in milli, or (0, 0) without a node context."""
    if node is None:
        return 0, 0
    return node.cpu_free, (pod.cpu if pod else 0)


class _CPUAware(NodePolicy):
    """A baseline whose score reads the node's free CPU: one context class per free-CPU value."""

    uses_node_context = True

    def gpu_order(self, node: NodeContext | None, pod: PodContext | None) -> GPUOrder | None:
        return bestfit_gpu_order

    def context_class(self, cpu_free: int, memory_free: int, pod: PodContext) -> int:
        return cpu_free


@register("random")
class RandomFit(NodePolicy):
    """Random-fit: every feasible node scores the same and the winner is drawn uniformly (`tie_break`)."""

    name = "random"
    tie_break = "random"  # placement draws uniformly among the best nodes, as kube-scheduler does on equal scores

    def __init__(self) -> None:
        super().__init__()
        self._rng = _random.Random(0)

    def seed(self, seed: int) -> None:
        """Reseed the GPU choice."""
        self._rng = _random.Random(seed)

    def _shuffled(self, devices: Sequence[GPUDevice], usage: Sequence[GPUUsage], request: ContainerRequest,
                  candidates: list[int]) -> list[int]:
        shuffled = list(candidates)
        self._rng.shuffle(shuffled)
        return shuffled

    def gpu_order(self, node: NodeContext | None, pod: PodContext | None) -> GPUOrder | None:
        return self._shuffled

    def score(self, devices: Sequence[GPUDevice], usage: Sequence[GPUUsage], requests: Sequence[ContainerRequest],
              result: FitResult, node: NodeContext | None = None, pod: PodContext | None = None) -> float:
        return 0.0


@register("bestfit")
class BestFit(_CPUAware):
    """Least leftover CPU and GPU share after placement wins: int((1 - s) * 100)."""

    name = "bestfit"

    def score(
        self,
        devices: Sequence[GPUDevice],
        usage: Sequence[GPUUsage],
        requests: Sequence[ContainerRequest],
        result: FitResult,
        node: NodeContext | None = None,
        pod: PodContext | None = None,
    ) -> float:
        cpu_free, cpu_req = _cpu_terms(node, pod)
        gpu_left = sum(idle_milli(d, u) for d, u in zip(devices, usage))
        taken = placed_milli(devices, requests, result)
        s = 0.5 * (cpu_free - cpu_req) / MAX_SPEC_CPU + 0.5 * (gpu_left - taken) / MAX_SPEC_GPU
        return float(int((1 - s) * 100))


@register("dotprod")
class DotProd(_CPUAware):
    """Tetris-like: the smallest dot product of node free vector and pod request vector wins."""

    name = "dotprod"

    def score(self, devices: Sequence[GPUDevice], usage: Sequence[GPUUsage], requests: Sequence[ContainerRequest],
              result: FitResult, node: NodeContext | None = None, pod: PodContext | None = None) -> float:
        cpu_free, cpu_req = _cpu_terms(node, pod)
        gpu_left = sum(idle_milli(d, u) for d, u in zip(devices, usage))
        taken = placed_milli(devices, requests, result)
        dot = (cpu_free / MAX_SPEC_CPU) * (cpu_req / MAX_SPEC_CPU) + (gpu_left / MAX_SPEC_GPU) * (
            taken / MAX_SPEC_GPU
        )
        return float(int(100 * (1 - dot / 2)))


@register("packing")
class Packing(NodePolicy):
    """GPU packing: shared GPUs (tightest first), then free GPUs of used nodes, then small empty nodes."""

    name = "packing"

    def gpu_order(self, node: NodeContext | None, pod: PodContext | None) -> GPUOrder | None:
        return bestfit_gpu_order

    def score(self, devices: Sequence[GPUDevice], usage: Sequence[GPUUsage], requests: Sequence[ContainerRequest],
              result: FitResult, node: NodeContext | None = None, pod: PodContext | None = None) -> float:
        if not requests:
            return 0.0
        idle = [idle_milli(d, u) for d, u in zip(devices, usage)]
        fully_free = sum(1 for v in idle if v == MILLI)
        if fully_free == len(devices):
            return float(max(100 // 3 - fully_free, fully_free))
        taken = [i for indices in result.placement for i in indices]
        fully_used = sum(1 for i in taken if idle[i] == MILLI)
        if fully_used > 0:
            return float(max(100 // 2 - fully_used, 100 // 3))
        ratio = sum(idle[i] * 100 // MILLI for i in taken)
        return float(max(100 - ratio // 10, 100 // 2))
