"""The workload a node policy aims at: pod types and their frequencies, learned from the pods the scheduler sees.

A pod type is a pod's CPU request plus its GPU requests without container names (and its GPU-type selectors);
`typical_types` keeps the most frequent types covering a share of the pods; `WorkloadLearner` counts observed types
and offers a new target when the workload has drifted. Used by the fragmentation-aware policies (`policies.frag`).
"""

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

from vgpu.inventory import GPUDevice
from vgpu.requests import ContainerRequest, Selectors
from vgpu.scheduler.policies.base import PodContext
from vgpu.scheduler.policies.shares import request_milli

__all__ = ["REFERENCE_CARD", "PodType", "WorkloadLearner", "pod_type", "scarcity_weights", "typical_types"]

# a card large enough that a request's memory share on it is its share of any card, in milli
REFERENCE_CARD = GPUDevice(uuid="reference", split=1, memory=1_000_000, type="reference")
_EMPTY_PODCTX = PodContext()

# (cpu milli, normalised GPU requests, selectors)
PodType = tuple[int, tuple[ContainerRequest, ...], Selectors]


def pod_type(requests: Sequence[ContainerRequest], pod: PodContext | None) -> PodType:
    """The workload type of a pod: its CPU request and its GPU requests without container names."""
    pod = pod or _EMPTY_PODCTX
    norm = tuple(replace(r, container="", init=False) for r in requests)
    return (pod.cpu, norm, pod.selectors if norm else Selectors())


def _sort_key(t: PodType) -> tuple[int, int, int, tuple[str, ...]]:
    cpu, reqs, sel = t
    milli = max((request_milli(r, REFERENCE_CARD) for r in reqs), default=0)
    count = sum(r.count for r in reqs)
    return (cpu, milli, count, sel.use_types)


def typical_types(counts: Counter[PodType], coverage: float) -> list[tuple[PodType, float]]:
    """The most frequent types covering at least `coverage` of the pods, with renormalised probabilities.

    Ties in count are ordered as the FGD simulator does: by (cpu, gpu milli, GPU count, type), descending.
    """
    total = sum(counts.values())
    if total == 0:
        return []
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], _sort_key(kv[0])), reverse=True)
    kept, covered = [], 0
    for t, n in ranked:
        kept.append((t, n))
        covered += n
        if covered >= coverage * total:
            break
    return [(t, n / covered) for t, n in kept]



def scarcity_weights(types: Sequence[tuple[PodType, float]], capacity: Mapping[str, int]) -> list[float]:
    """Each type's probability divided by the share of the cluster's GPUs its selectors allow (`capacity`: GPUs per
    device type), renormalised: a type pinned to a few card models weighs more, one that may use any GPU (or none)
    keeps its probability relative to the others. Without a capacity, the probabilities."""
    total = sum(capacity.values())
    if not total:
        return [w for _, w in types]
    weights = []
    for (_, requests, selectors), w in types:
        allowed = sum(n for kind, n in capacity.items() if selectors.type_allowed(kind)) if requests else total
        weights.append(w * total / max(allowed, 1))
    norm = sum(weights) or 1.0
    return [w / norm for w in weights]


class WorkloadLearner:
    """Counts observed pod types and offers a new target at 1, 2, 4, ... pods, then every `period` pods or an
    eighth of the pods seen, whichever is more, when it has drifted: a total variation distance above `drift` from
    the current target (types missing from one count as weight 0 there)."""

    GROWTH = 8  # past `period` pods, a rebuild is considered after another 1/GROWTH of the pods seen

    def __init__(self, coverage: float, period: int, drift: float = 0.0) -> None:
        self.coverage = coverage
        self.period = period
        self.drift = drift
        self.counts: Counter[PodType] = Counter()
        self.seen = 0
        self._next = 1

    def add(self, t: PodType) -> bool:
        """Count one pod; True when the target should be rebuilt."""
        self.counts[t] += 1
        self.seen += 1
        n = self.seen
        if n < self._next:
            return False
        self._next = 2 * n if n < self.period else n + max(self.period, n // self.GROWTH)
        return True

    def target(self, current: Sequence[tuple[PodType, float]]) -> list[tuple[PodType, float]] | None:
        """The typical types of the pods seen so far, or None when they are within `drift` of `current`."""
        types = typical_types(self.counts, self.coverage)
        old = dict(current)
        if old:
            new = dict(types)
            distance = sum(abs(new.get(t, 0.0) - old.get(t, 0.0)) for t in new.keys() | old.keys()) / 2
            if distance <= self.drift:
                return None
        return types
