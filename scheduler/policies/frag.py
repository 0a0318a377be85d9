"""Fragmentation-aware node policies: `fgd` (the ATC'23 baseline) and `fragaware` (ours).

Both rank a placement by how much it changes the node's *fragmentation* for a target workload M (a distribution
of pod types): for each type m, the free GPU share the node cannot give to m — all of it when the node cannot host
m at all (GPU type, too few fitting GPUs, or too little free CPU), otherwise the free share of the GPUs too small
for m. F_n(M) = sum_m p_m F_n(m), in milli-GPU. A GPU "fits" a type when its free memory, free cores and free
slots all cover the type's request, so memory and cores count as well as the GPU share.

`fgd` is the paper's policy as its simulator implements it: an oracle target workload (the replay hands it the
trace through `set_workload`; without one it learns from observed pods), the integer score
int(100 * sigmoid(-dF / 1000)), and the first GPU with the best such score. `fragaware` learns the workload online
from the pods it is shown, scores the same way, and breaks equal scores with a second measure that counts free
CPU as capacity: a node hosts only as much of a type as its CPU can feed (see `FragAware`). F values are memoised
per node state (sorted per-GPU free resources and a CPU class), since many nodes share one.
"""

import math
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import replace

import numpy as np

from scheduler.fit import FitResult, GPUOrder, GPUUsage
from scheduler.policies.base import NodeContext, PodContext, register
from scheduler.policies.shares import idle_milli, lowest_index_order, request_milli, usage_after
from vgpu.inventory import GPUDevice
from vgpu.requests import ContainerRequest, Selectors

__all__ = ["PodType", "TypeTable", "FGD", "FragAware", "pod_type", "typical_types"]

MEMO_LIMIT = 500_000  # entries kept per memo before it starts over (bounds a long-running extender's memory)
_REF_CARD = GPUDevice(uuid="reference", split=1, memory=1_000_000, type="reference")
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
    milli = max((request_milli(r, _REF_CARD) for r in reqs), default=0)
    count = sum(r.count for r in reqs)
    return (cpu, milli, count, sel.use_types)


def typical_types(counts: Counter, coverage: float) -> list[tuple[PodType, float]]:
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


class TypeTable:
    """A target workload as arrays, with per-card request columns and a memo of F per node state.

    With `cpu_capacity` the node's free CPU limits how much of its idle GPU share a type can use (as many pods
    of the type as the CPU can feed, each taking its GPU demand), instead of only whether one pod fits; free CPU
    is then counted in steps of `cpu_quantum` milli (rounded down).
    """

    def __init__(
        self, types: Sequence[tuple[PodType, float]], cpu_capacity: bool = False, cpu_quantum: int = 1000
    ) -> None:
        self.types = list(types)
        self.cpu_capacity = cpu_capacity
        self.cpu_quantum = cpu_quantum
        self.p = np.array([w for _, w in types], dtype=np.float64)
        self.cpu = np.array([t[0] for t, _ in types], dtype=np.int64)
        self.count = np.array([sum(r.count for r in t[1]) for t, _ in types], dtype=np.int64)
        self.gpu = self.count > 0
        # A type with several GPU containers is approximated by its largest request on `count` GPUs.
        self._reqs = [max(t[1], key=lambda r: request_milli(r, _REF_CARD)) if t[1] else None for t, _ in types]
        self.demand = np.array(
            [c * request_milli(r, _REF_CARD) if r else 0 for c, r in zip(self.count.tolist(), self._reqs)],
            dtype=np.float64,
        )
        self._sels = [t[2] for t, _ in types]
        self.cpu_levels = np.unique(self.cpu)
        self._columns: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._stacked: dict[tuple, tuple[np.ndarray, ...]] = {}
        self._gpu_parts: dict[tuple, tuple[np.ndarray, np.ndarray, float]] = {}  # sorted GPU state -> its part of F
        self._cpu_parts: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}  # CPU class -> its part of F
        self._items: dict[tuple, tuple] = {}  # one GPU's device and usage -> its part of a memo key
        self.memo: dict[Hashable, float] = {}

    def __len__(self) -> int:
        return len(self.types)

    def with_cpu_capacity(self) -> "TypeTable":
        """The same target with CPU as a capacity, sharing this table's GPU-side caches (they do not depend on
        CPU), so a node state's GPU part is computed once for both."""
        fed = TypeTable(self.types, cpu_capacity=True, cpu_quantum=self.cpu_quantum)
        fed._columns, fed._stacked = self._columns, self._stacked
        fed._gpu_parts, fed._items = self._gpu_parts, self._items
        return fed

    def cpu_class(self, cpu_free: int | None) -> int:
        """The CPU part of the memo key: free CPU in quanta with `cpu_capacity` (-1: unlimited), else how many
        distinct type CPU requests fit in `cpu_free` (None: unlimited)."""
        if self.cpu_capacity:
            return -1 if cpu_free is None else int(cpu_free) // self.cpu_quantum
        if cpu_free is None:
            return len(self.cpu_levels)
        return int(np.searchsorted(self.cpu_levels, cpu_free, side="right"))

    def _card_columns(self, card: tuple[int, str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cols = self._columns.get(card)
        if cols is None:
            memory, kind = card
            device = GPUDevice(uuid="column", split=1, memory=memory, type=kind)
            need_mem = np.array([r.memory_on(memory) if r else 0 for r in self._reqs], dtype=np.int64)
            need_cores = np.array([r.cores if r else 0 for r in self._reqs], dtype=np.int64)
            allowed = np.array([s.type_allowed(device.type) for s in self._sels], dtype=bool)
            cols = (need_mem, need_cores, allowed)
            self._columns[card] = cols
        return cols

    def _node_columns(self, cards: tuple[tuple[int, str], ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per (type, GPU) matrices of memory and cores needed and type allowed, for a node's cards in order."""
        cols = self._stacked.get(cards)
        if cols is None:
            per_card = [self._card_columns(c) for c in cards]
            cols = tuple(np.stack([c[k] for c in per_card], axis=1) for k in range(3))
            self._stacked[cards] = cols
        return cols

    def fragment(self, devices: Sequence[GPUDevice], usage: Sequence[GPUUsage], cpu_free: int | None) -> float:
        """F_n(M) in milli-GPU for a node with these GPUs, usage and free CPU (None: unlimited)."""
        cls = self.cpu_class(cpu_free)
        items = self._items
        state = []
        for d, u in zip(devices, usage):
            raw = (d.memory, d.type, d.healthy, d.split, u.shares, u.memory, u.cores)
            item = items.get(raw)
            if item is None:
                if len(items) >= MEMO_LIMIT:
                    items.clear()
                item = items[raw] = (
                    d.memory,
                    d.type,
                    d.memory - u.memory,
                    100 - u.cores,
                    idle_milli(d, u),
                    u.shares < d.split and d.healthy,
                    u.shares == 0,
                )
            state.append(item)
        state.sort()
        key = (tuple(state), cls)
        value = self.memo.get(key)
        if value is None:
            if len(self.memo) >= MEMO_LIMIT:
                self.memo.clear()
            value = self._compute(key[0], cls)
            self.memo[key] = value
        return value

    def _compute(self, state: tuple, cls: int) -> float:
        if not len(self.types) or not state:
            return 0.0
        usable, can_gpu, total = self._gpu_part(state)
        if total == 0:
            return 0.0
        cpu_ok, feed = self._cpu_part(cls)
        if feed is not None:
            usable = np.minimum(usable, feed)
        per_type = np.where(can_gpu & cpu_ok, total - usable, total)
        return float(self.p @ per_type)

    def _gpu_part(self, state: tuple) -> tuple[np.ndarray, np.ndarray, float]:
        """Per type, the idle share of the GPUs that fit it and whether enough GPUs fit it; the node's idle share."""
        part = self._gpu_parts.get(state)
        if part is None:
            gpus = np.array([s[2:] for s in state], dtype=np.int64)
            free_mem, free_cores, idle_int, open_, empty = gpus.T
            idle = idle_int.astype(np.float64)
            need_mem, need_cores, allowed = self._node_columns(tuple((s[0], s[1]) for s in state))
            fits = (free_mem >= need_mem) & (free_cores >= need_cores) & (open_ > 0) & allowed
            fits &= (need_cores < 100) | (empty > 0)
            part = (fits.astype(np.float64) @ idle, self.gpu & (fits.sum(axis=1) >= self.count), idle.sum())
            if len(self._gpu_parts) >= MEMO_LIMIT:
                self._gpu_parts.clear()
            self._gpu_parts[state] = part
        return part

    def _cpu_part(self, cls: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Per type, whether the CPU class covers one pod, and the GPU share the CPU can feed (None: no bound)."""
        part = self._cpu_parts.get(cls)
        if part is None:
            feed = None
            if not self.cpu_capacity:
                cpu_ok = self.cpu <= (self.cpu_levels[cls - 1] if cls > 0 else -1)
            elif cls < 0:
                cpu_ok = np.ones(len(self.cpu), dtype=bool)
            else:
                cpu_free = cls * self.cpu_quantum
                cpu_ok = self.cpu <= cpu_free
                feedable = np.where(self.cpu > 0, cpu_free // np.maximum(self.cpu, 1), np.iinfo(np.int64).max)
                feed = feedable * self.demand
            part = self._cpu_parts[cls] = (cpu_ok, feed)
        return part

    def bins(self, cpu_free: np.ndarray, cpu_request: int) -> np.ndarray:
        """Vectorised CPU classes before and after taking `cpu_request`, as one integer per node."""
        if self.cpu_capacity:
            q = self.cpu_quantum
            return (cpu_free // q).astype(np.int64) * (1 << 24) + (cpu_free - cpu_request) // q
        n = len(self.cpu_levels) + 1
        before = np.searchsorted(self.cpu_levels, cpu_free, side="right")
        after = np.searchsorted(self.cpu_levels, cpu_free - cpu_request, side="right")
        return before.astype(np.int64) * n + after


def _cpu(node: NodeContext | None) -> int | None:
    return None if node is None else node.cpu_free


def _cpu_after(node: NodeContext | None, pod: PodContext | None) -> int | None:
    return None if node is None else node.cpu_free - (pod.cpu if pod else 0)


def _descent(table: TypeTable, devices, before, after, node: NodeContext | None, pod: PodContext | None) -> float:
    """F before minus F after on `table` (positive: the move lowers fragmentation)."""
    return table.fragment(devices, before, _cpu(node)) - table.fragment(devices, after, _cpu_after(node, pod))


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def _sigmoid_score(delta: float) -> int:
    """The simulator's int(sigmoid((F_before - F_after)/1000) * 100)."""
    return int(_sigmoid(delta / 1000.0) * 100)


class _Learner:
    """Counts observed pod types and offers a new target at 1, 2, 4, ... pods, then every `period` pods, when it
    has drifted: other types, or a total variation distance above `drift` from the current one."""

    def __init__(self, coverage: float, period: int, drift: float = 0.0) -> None:
        self.coverage = coverage
        self.period = period
        self.drift = drift
        self.counts: Counter = Counter()
        self.seen = 0

    def add(self, t: PodType) -> bool:
        """Count one pod; True when the target should be rebuilt."""
        self.counts[t] += 1
        self.seen += 1
        n = self.seen
        return (n & (n - 1)) == 0 if n < self.period else n % self.period == 0

    def target(self, current: Sequence[tuple[PodType, float]]) -> list[tuple[PodType, float]] | None:
        """The typical types of the pods seen so far, or None when they are within `drift` of `current`."""
        types = typical_types(self.counts, self.coverage)
        old = dict(current)
        if old and len(old) == len(types) and all(t in old for t, _ in types):
            distance = sum(abs(w - old[t]) for t, w in types) / 2
            if distance <= self.drift:
                return None
        return types


class _FragDescent:
    """Shared machinery: a target table, CPU-class bins, the first-best GPU order and the sigmoid score."""

    name = ""
    coverage = 0.95
    period = 256
    drift = 0.0

    def __init__(self) -> None:
        self._learner = _Learner(self.coverage, self.period, self.drift)
        self._oracle = False
        self.epoch = 0
        self._install([])

    def _install(self, types: Sequence[tuple[PodType, float]]) -> None:
        """Make `types` the target workload."""
        self.table = TypeTable(types)

    def observe(self, requests: Sequence[ContainerRequest], pod: PodContext | None = None) -> None:
        if self._oracle:
            return
        if self._learner.add(pod_type(requests, pod)):
            types = self._learner.target(self.table.types)
            if types is not None:
                self._install(types)
                self.epoch += 1

    def context_bins(self, cpu_free: np.ndarray, memory_free: np.ndarray, pod: PodContext) -> np.ndarray:
        return self.table.bins(cpu_free, pod.cpu)

    def _rank(
        self,
        devices: Sequence[GPUDevice],
        before: Sequence[GPUUsage],
        after: Sequence[GPUUsage],
        node: NodeContext | None,
        pod: PodContext | None,
    ) -> float:
        """How good the move from usage `before` to `after` is (higher is better): the integer sigmoid score plus
        the policy's tie-break."""
        score = _sigmoid_score(_descent(self.table, devices, before, after, node, pod))
        return score + self._tie(devices, before, after, node, pod)

    def _tie(self, devices, before, after, node: NodeContext | None, pod: PodContext | None) -> float:
        """A tie-break in [0, 1) among moves of equal integer score (none here)."""
        return 0.0

    def gpu_order_for(self, node: NodeContext | None, pod: PodContext | None) -> GPUOrder:
        def order(devices, usage, request, candidates):
            if request.count != 1:
                return lowest_index_order(devices, usage, request, candidates)
            # GPUs in the same state rank the same (F does not depend on GPU order): rank each state once, and
            # compute the tie-break only for the states that share the best integer score.
            ranks: dict[tuple, list] = {}  # GPU state -> [usage after, integer score, tie-break]
            state_of = {}
            for i in candidates:
                d, u = devices[i], usage[i]
                state = (d.memory, d.type, d.healthy, d.split, u.shares, u.memory, u.cores)
                if state not in ranks:
                    taken = GPUUsage(u.shares, u.memory, u.cores)
                    taken.add(request.memory_on(d.memory), request.cores)
                    after = list(usage)
                    after[i] = taken
                    ranks[state] = [after, _sigmoid_score(_descent(self.table, devices, usage, after, node, pod)), 0.0]
                state_of[i] = state
            best = max(r[1] for r in ranks.values())
            for r in ranks.values():
                if r[1] == best:
                    r[2] = self._tie(devices, usage, r[0], node, pod)
            return sorted(candidates, key=lambda i: (-ranks[state_of[i]][1], -ranks[state_of[i]][2], i))

        return order

    @property
    def gpu_order(self) -> GPUOrder:
        """The GPU order without node context."""
        return self.gpu_order_for(None, None)

    def score(
        self,
        devices: Sequence[GPUDevice],
        usage: Sequence[GPUUsage],
        requests: Sequence[ContainerRequest],
        result: FitResult,
        node: NodeContext | None = None,
        pod: PodContext | None = None,
    ) -> float:
        return float(self._rank(devices, usage, usage_after(usage, result), node, pod))


@register("fgd")
class FGD(_FragDescent):
    """Fragmentation Gradient Descent as in the ATC'23 simulator (integer sigmoid score, first-best GPU).

    The replay gives it the trace's workload up front (`set_workload`, the paper's oracle: the most frequent
    (CPU, GPU share, GPU count, type) specs covering 95 % of pods); without it, it learns from observed pods.
    """

    name = "fgd"
    coverage = 0.95
    period = 256

    def set_workload(self, pods: Iterable[tuple[Sequence[ContainerRequest], PodContext]]) -> None:
        """Fix the target workload to these pods (the paper's oracle); observed pods are then ignored."""
        counts: Counter = Counter(pod_type(reqs, pod) for reqs, pod in pods)
        self._install(typical_types(counts, self.coverage))
        self._oracle = True
        self.epoch += 1


@register("fragaware")
class FragAware(_FragDescent):
    """Ours (`vgpu replay`'s "ours"): fragmentation descent with the target learned online, CPU-aware tie-breaks.

    No oracle: the target is the distribution of the pods it has been shown so far (`observe`), the
    types covering 99 % of them, rebuilt after 1, 2, 4, ... 128 pods and then every 256 when it has drifted
    (other types, or a total variation distance above 2 %), so a steady workload stops invalidating caches. A type
    is the pod's CPU request plus its per-GPU memory share, cores and GPU count (and type selectors); a GPU fits a
    type only when its free memory, free cores and free slots all cover it.

    The score is FGD's integer sigmoid of the fragmentation change, plus a tie-break below one point: the sigmoid
    of the change of a second measure in which a node's free CPU also bounds how much of its idle GPU share each
    type can use (`TypeTable(cpu_capacity=True)`). Among placements FGD ranks equal, the one that leaves CPU and
    GPUs best matched wins, so CPU-heavy pods stop stranding GPUs on CPU-poor nodes, without overriding the
    fragmentation descent itself (as a primary term it cost placement quality on share-heavy traces;
    docs/placement.md). Without node context (a node that reports no allocatable CPU) CPU is unlimited and the
    tie-break is left out.
    """

    name = "fragaware"
    coverage = 0.99
    period = 256
    drift = 0.02
    TIE_WEIGHT = 0.999  # the tie-break stays below one point of the integer score

    def _install(self, types: Sequence[tuple[PodType, float]]) -> None:
        self.table = TypeTable(types)
        self.fed = self.table.with_cpu_capacity()

    def context_bins(self, cpu_free: np.ndarray, memory_free: np.ndarray, pod: PodContext) -> np.ndarray:
        levels = len(self.table.cpu_levels) + 1
        fed = self.fed.bins(cpu_free, pod.cpu)
        return fed * (levels * levels) + self.table.bins(cpu_free, pod.cpu)

    def _tie(self, devices, before, after, node: NodeContext | None, pod: PodContext | None) -> float:
        if node is None:
            return 0.0
        return self.TIE_WEIGHT * _sigmoid(_descent(self.fed, devices, before, after, node, pod) / 1000.0)
