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
CPU as capacity: a node hosts only as much of a type as its CPU can feed (see `FragAware`). F is read off
per-type sums of memoised per-GPU vectors (`TypeTable`), so ranking the GPUs of a node for one container costs a
few small vector operations per distinct GPU state.
"""

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace

import numpy as np

from vgpu.inventory import GPUDevice
from vgpu.requests import ContainerRequest, Selectors
from vgpu.scheduler.fit import FitResult, GPUOrder, GPUUsage
from vgpu.scheduler.policies.base import NodeContext, PodContext, register
from vgpu.scheduler.policies.shares import idle_milli, lowest_index_order, request_milli, usage_after

__all__ = ["FGD", "FragAware", "GPUSums", "PodType", "TypeTable", "pod_type", "typical_types"]

MEMO_LIMIT = 100_000  # per-GPU vectors kept before the memo starts over (bounds a long-running extender's memory)
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


def _raw(device: GPUDevice, used: GPUUsage) -> tuple:
    """One GPU's state as the memo key of its vectors (`gpu_order_for` builds the state after a placement from it field by field)."""
    return (device.memory, device.type, device.healthy, device.split, used.shares, used.memory, used.cores)


class GPUSums:
    """A node's GPUs summed per target type: how many GPUs fit the type, their idle share, and the node's idle
    share (all exact integers), plus each GPU's own vectors so that a change of one GPU is two vector updates."""

    __slots__ = ("count", "idle", "known", "raws", "usable", "vectors")

    def __init__(self, count: np.ndarray, usable: np.ndarray, idle: int, vectors: list, raws: tuple = ()) -> None:
        self.count = count
        self.usable = usable
        self.idle = idle
        self.vectors = vectors
        self.raws = raws  # per GPU (memory, type, healthy, split, shares, memory used, cores used), when memoised
        self.known: dict[tuple, float] = {}  # (table, free CPU) -> F, for memoised sums


class TypeTable:
    """A target workload as arrays, with per-card request columns and per-GPU fit vectors.

    F is additive over a node's GPUs except for the thresholds (enough fitting GPUs, enough CPU), so a node is
    summed once from memoised per-GPU vectors (`sums`), a placement on one GPU updates the sums (`moved`), and F
    is read off the sums (`f`, `f_rows`). Every sum over GPUs is of integers, so F does not depend on the order
    GPUs are added in, and the weighted sum over types is one dot product per row, so one node state gets the same
    F bits whether it is evaluated alone or in a batch of moves.

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
        self._zeros = np.zeros(len(self.types), dtype=np.float64)
        self._columns: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._vectors: dict[tuple, tuple[np.ndarray, np.ndarray, int]] = {}  # one GPU's device and usage -> vectors
        self._cpu_parts: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}  # CPU class -> its part of F
        self._cpu_terms: dict[int | None, tuple[np.ndarray, np.ndarray | None]] = {}  # free CPU -> its part of F
        self._sums: dict[tuple, GPUSums] = {}  # a node's GPU states, in order -> their sums

    def __len__(self) -> int:
        return len(self.types)

    def with_cpu_capacity(self) -> "TypeTable":
        """The same target with CPU as a capacity, sharing this table's per-GPU caches (they do not depend on
        CPU), so a node's sums serve both tables."""
        fed = TypeTable(self.types, cpu_capacity=True, cpu_quantum=self.cpu_quantum)
        fed._columns, fed._vectors, fed._sums = self._columns, self._vectors, self._sums
        return fed

    def cpu_class(self, cpu_free: int | None) -> int:
        """The CPU part of F: free CPU in quanta with `cpu_capacity` (-1: unlimited), else how many distinct type
        CPU requests fit in `cpu_free` (None: unlimited)."""
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

    def _vector(self, device: GPUDevice, used: GPUUsage, raw: tuple | None = None) -> tuple:
        """Per type, whether this GPU fits one container of it and then its idle share; the GPU's idle share; the
        two vectors stacked."""
        if raw is None:
            raw = _raw(device, used)
        vector = self._vectors.get(raw)
        if vector is None:
            idle = idle_milli(device, used)
            if used.shares < device.split and device.healthy:
                need_mem, need_cores, allowed = self._card_columns((device.memory, device.type))
                fits = (device.memory - used.memory >= need_mem) & (100 - used.cores >= need_cores) & allowed
                if used.shares:
                    fits &= need_cores < 100  # an exclusive container needs an empty GPU
                one = fits.astype(np.float64)
            else:
                one = self._zeros
            vector = (one, one * idle, idle, np.stack((one, one * idle)))
            if len(self._vectors) >= MEMO_LIMIT:
                self._vectors.clear()
            self._vectors[raw] = vector
        return vector

    def sums(self, devices: Sequence[GPUDevice], usage: Sequence[GPUUsage]) -> GPUSums:
        """The node's GPUs summed per type (memoised per node state; never modified by the caller)."""
        raws = tuple(map(_raw, devices, usage))
        found = self._sums.get(raws)
        if found is None:
            vectors = [self._vector(d, u, raw) for d, u, raw in zip(devices, usage, raws)]
            if vectors:
                total = np.add.reduce([v[3] for v in vectors])
                found = GPUSums(total[0], total[1], sum(v[2] for v in vectors), vectors, raws)
            else:
                found = GPUSums(self._zeros, self._zeros, 0, vectors, raws)
            if len(self._sums) >= MEMO_LIMIT // 10:
                self._sums.clear()
            self._sums[raws] = found
        return found

    def moved(self, sums: GPUSums, index: int, device: GPUDevice, used: GPUUsage) -> GPUSums:
        """`sums` with GPU `index` (`device`) at usage `used` instead."""
        old_one, old_idle_fit, old_idle, _ = sums.vectors[index]
        vector = self._vector(device, used)
        one, idle_fit, idle, _ = vector
        vectors = list(sums.vectors)
        vectors[index] = vector
        return GPUSums(sums.count + (one - old_one), sums.usable + (idle_fit - old_idle_fit),
                       sums.idle - old_idle + idle, vectors)

    def moves(self, sums: GPUSums, moves: Sequence[tuple[int, tuple]]) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """Rows of per-type counts, usable shares and idle shares: one row per (GPU index, its new vector) move,
        each applied to `sums` alone."""
        old = [sums.vectors[i] for i, _ in moves]
        new = [v for _, v in moves]
        change = np.array([v[3] for v in new]) - np.array([v[3] for v in old])
        return (sums.count + change[:, 0], sums.usable + change[:, 1],
                [sums.idle - o[2] + n[2] for o, n in zip(old, new)])

    def _terms(self, cpu_free: int | None) -> tuple[np.ndarray, np.ndarray | None]:
        """Per type, whether a GPU type can be hosted at this free CPU, and the GPU share the CPU can feed."""
        terms = self._cpu_terms.get(cpu_free)
        if terms is None:
            if len(self._cpu_terms) >= MEMO_LIMIT:
                self._cpu_terms.clear()
            cpu_ok, feed = self._cpu_part(self.cpu_class(cpu_free))
            terms = self._cpu_terms[cpu_free] = (self.gpu & cpu_ok, feed)
        return terms

    def f(self, sums: GPUSums, cpu_free: int | None) -> float:
        """F_n(M) in milli-GPU of a node with these sums and free CPU (None: unlimited)."""
        if sums.idle == 0 or not len(self.types):
            return 0.0
        key = (id(self), cpu_free)
        value = sums.known.get(key)
        if value is None:
            hostable, feed = self._terms(cpu_free)
            usable = sums.usable if feed is None else np.minimum(sums.usable, feed)
            per_type = np.where((sums.count >= self.count) & hostable, sums.idle - usable, float(sums.idle))
            value = sums.known[key] = float(self.p @ per_type)
        return value

    def f_rows(self, count: np.ndarray, usable: np.ndarray, idle: Sequence[int], cpu_free: int | None) -> list[float]:
        """`f` of each row of per-type counts, usable shares and idle share (`moves`), at free CPU `cpu_free`."""
        if not len(self.types):
            return [0.0] * len(idle)
        hostable, feed = self._terms(cpu_free)
        if feed is not None:
            usable = np.minimum(usable, feed)
        column = np.array(idle, dtype=np.float64)[:, None]
        per_type = np.where((count >= self.count) & hostable, column - usable, column)
        p = self.p
        return [float(p @ row) if i else 0.0 for row, i in zip(per_type, idle)]

    def fragment(self, devices: Sequence[GPUDevice], usage: Sequence[GPUUsage], cpu_free: int | None) -> float:
        """F_n(M) in milli-GPU for a node with these GPUs, usage and free CPU (None: unlimited)."""
        return self.f(self.sums(devices, usage), cpu_free)

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
        """Make `types` the target workload (one assignment: a request being served keeps the pair it read)."""
        self._target: tuple[TypeTable, TypeTable | None] = (TypeTable(types), None)
        self._last_order: tuple = (None, None, None, {})

    @property
    def table(self) -> TypeTable:
        """The target workload's table."""
        return self._target[0]

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

    def _ties(
        self, target: tuple, start: GPUSums, rows: tuple[np.ndarray, np.ndarray, list[int]],
        node: NodeContext | None, pod: PodContext | None,
    ) -> list[float]:
        """The tie-break, in [0, 1), of each move from `start` to a row of `rows` (`TypeTable.moves`); only moves
        of equal integer score are compared by it (none here)."""
        return [0.0] * len(rows[2])

    def _ranks(
        self, target: tuple, start: GPUSums, rows: tuple[np.ndarray, np.ndarray, list[int]],
        node: NodeContext | None, pod: PodContext | None,
    ) -> tuple[list[int], list[float | None]]:
        """Integer scores of the moves from `start` to each row, and the tie-break of those with the best one."""
        table = target[0]
        f_start = table.f(start, _cpu(node))
        scores = [_sigmoid_score(f_start - end) for end in table.f_rows(*rows, _cpu_after(node, pod))]
        best = max(scores)
        top = [k for k, score in enumerate(scores) if score == best]
        ties: list[float | None] = [None] * len(scores)
        if len(top) == len(scores):
            chosen = rows
        else:
            chosen = (rows[0][top], rows[1][top], [rows[2][k] for k in top])
        for k, tie in zip(top, self._ties(target, start, chosen, node, pod)):
            ties[k] = tie
        return scores, ties

    def gpu_order_for(self, node: NodeContext | None, pod: PodContext | None) -> GPUOrder:
        def order(devices, usage, request, candidates):
            if request.count != 1:
                return lowest_index_order(devices, usage, request, candidates)
            # GPUs in the same state rank the same (F does not depend on GPU order): rank each state once, and
            # compute the tie-break only for the states that share the best integer score.
            target = self._target
            table = target[0]
            start = table.sums(devices, usage)
            row_of: dict[tuple, int] = {}
            moves = []
            keys = []
            raws, vector_of, cores = start.raws, table._vectors.get, request.cores
            for i in candidates:
                state = raws[i]
                k = row_of.get(state)
                if k is None:
                    memory, kind, healthy, split, shares, used, used_cores = state
                    after = (memory, kind, healthy, split, shares + 1, used + request.memory_on(memory),
                             used_cores + cores)
                    vector = vector_of(after)
                    if vector is None:
                        vector = table._vector(devices[i], GPUUsage(*after[4:]), after)
                    k = row_of[state] = len(moves)
                    moves.append((i, vector))
                keys.append(k)
            scores, ties = self._ranks(target, start, table.moves(start, moves), node, pod)
            # `score` of the fit that follows (the chosen GPU is one of the best) reads its value from here: per
            # move (GPU state before, vector after), the rank
            self._last_order = (start, _cpu(node), _cpu_after(node, pod), {
                (raws[moves[k][0]], id(moves[k][1])): (moves[k][1], float(scores[k] + tie))
                for k, tie in enumerate(ties) if tie is not None
            })
            rank = {i: (-scores[k], -(ties[k] or 0.0), i) for i, k in zip(candidates, keys)}
            return sorted(candidates, key=rank.__getitem__)

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
        target = self._target
        table = target[0]
        start = table.sums(devices, usage)
        placed = usage_after(usage, result)
        moved = sorted({i for indices in result.placement for i in indices})
        if len(moved) == 1:
            (i,) = moved
            vector = table._vector(devices[i], placed[i])
            last = self._last_order
            if last[0] is start and last[1] == _cpu(node) and last[2] == _cpu_after(node, pod):
                known = last[3].get((start.raws[i], id(vector)))
                if known is not None and known[0] is vector:
                    return known[1]
        end = start
        for i in moved:
            end = table.moved(end, i, devices[i], placed[i])
        scores, ties = self._ranks(target, start, (end.count[None], end.usable[None], [end.idle]), node, pod)
        return float(scores[0] + (ties[0] or 0.0))


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
        table = TypeTable(types)
        self._target = (table, table.with_cpu_capacity())
        self._last_order = (None, None, None, {})

    @property
    def fed(self) -> TypeTable:
        """The target workload's table with CPU as a capacity (the tie-break's measure)."""
        return self._target[1]

    def context_bins(self, cpu_free: np.ndarray, memory_free: np.ndarray, pod: PodContext) -> np.ndarray:
        table, fed = self._target
        levels = len(table.cpu_levels) + 1
        return fed.bins(cpu_free, pod.cpu) * (levels * levels) + table.bins(cpu_free, pod.cpu)

    def _ties(
        self, target: tuple, start: GPUSums, rows: tuple[np.ndarray, np.ndarray, list[int]],
        node: NodeContext | None, pod: PodContext | None,
    ) -> list[float]:
        if node is None:
            return [0.0] * len(rows[2])
        fed = target[1]
        f_start = fed.f(start, _cpu(node))
        return [self.TIE_WEIGHT * _sigmoid((f_start - end) / 1000.0)
                for end in fed.f_rows(*rows, _cpu_after(node, pod))]
