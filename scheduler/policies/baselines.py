"""The ATC'23 baselines as node policies: random, bestfit, dotprod and packing.

Each follows the FGD simulator's score plugin (`../shared/research/fgd-benchmark.md` section 4) on GPU shares in
milli-GPU, with its GPU choice (`best`: least free share that fits, lowest index; `random` for random). Node CPU
enters bestfit and dotprod through the optional node context; without it (the extender) the CPU terms are 0.
"""

import random as _random
from collections.abc import Sequence

import numpy as np

from vgpu.inventory import GPUDevice
from vgpu.requests import ContainerRequest
from vgpu.scheduler.fit import FitResult, GPUUsage
from vgpu.scheduler.policies.base import NodeContext, PodContext, register
from vgpu.scheduler.policies.shares import MILLI, bestfit_gpu_order, idle_milli, placed_milli

__all__ = ["MAX_SPEC_CPU", "MAX_SPEC_GPU", "BestFit", "DotProd", "Packing", "RandomFit"]

MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8_000


def _cpu_terms(node: NodeContext | None, pod: PodContext | None) -> tuple[int, int]:
    """(free CPU, requested CPU) in milli, or (0, 0) without a node context."""
    if node is None:
        return 0, 0
    return node.cpu_free, (pod.cpu if pod else 0)


def _exact_cpu_bins(cpu_free: np.ndarray, memory_free: np.ndarray, pod: PodContext) -> np.ndarray:
    return cpu_free.astype(np.int64)


class _Stateless:
    def observe(self, requests: Sequence[ContainerRequest], pod: PodContext | None = None) -> None:
        return None


@register("random")
class RandomFit(_Stateless):
    """Random-fit: every feasible node scores the same and the winner is drawn uniformly (`tie_break`)."""

    name = "random"
    # The replay draws uniformly among the best nodes instead of taking the lowest rank; kube-scheduler does the
    # same for equal scores, so in the extender a constant score is random-fit.
    tie_break = "random"

    def __init__(self) -> None:
        self._rng = _random.Random(0)

    def seed(self, seed: int) -> None:
        """Reseed the GPU choice."""
        self._rng = _random.Random(seed)

    def gpu_order(self, devices, usage, request, candidates):
        shuffled = list(candidates)
        self._rng.shuffle(shuffled)
        return shuffled

    def score(self, devices, usage, requests, result, node=None, pod=None) -> float:
        return 0.0


@register("bestfit")
class BestFit(_Stateless):
    """Least leftover CPU and GPU share after placement wins: int((1 - s) * 100)."""

    name = "bestfit"
    gpu_order = staticmethod(bestfit_gpu_order)
    context_bins = staticmethod(_exact_cpu_bins)

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
class DotProd(_Stateless):
    """Tetris-like: the smallest dot product of node free vector and pod request vector wins."""

    name = "dotprod"
    gpu_order = staticmethod(bestfit_gpu_order)
    context_bins = staticmethod(_exact_cpu_bins)

    def score(self, devices, usage, requests, result, node=None, pod=None) -> float:
        cpu_free, cpu_req = _cpu_terms(node, pod)
        gpu_left = sum(idle_milli(d, u) for d, u in zip(devices, usage))
        taken = placed_milli(devices, requests, result)
        dot = (cpu_free / MAX_SPEC_CPU) * (cpu_req / MAX_SPEC_CPU) + (gpu_left / MAX_SPEC_GPU) * (
            taken / MAX_SPEC_GPU
        )
        return float(int(100 * (1 - dot / 2)))


@register("packing")
class Packing(_Stateless):
    """GPU packing: shared GPUs (tightest first), then free GPUs of used nodes, then small empty nodes."""

    name = "packing"
    gpu_order = staticmethod(bestfit_gpu_order)

    def score(self, devices, usage, requests, result, node=None, pod=None) -> float:
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
