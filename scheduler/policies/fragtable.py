"""Fragmentation of a node for a target workload, computed from memoised per-GPU vectors.

For each pod type m of the target, the free GPU share (milli-GPU) a node cannot give to m: all of it when the node
cannot host m (GPU type, too few fitting GPUs, too little free CPU), otherwise the free share of the GPUs too small
for m; F_n(M) = sum_m p_m F_n(m). A GPU "fits" a type when its free memory, free cores and free slots all cover the
type's request. `TypeTable` holds the target as arrays and reads F off per-type sums of per-GPU vectors (`GPUSums`),
so ranking the GPUs of a node for one container costs a few small vector operations per distinct GPU state.
"""

import bisect
from collections.abc import Sequence

import numpy as np

from vgpu.inventory import GPUDevice
from vgpu.scheduler.fit import GPUUsage
from vgpu.scheduler.policies.shares import idle_milli, request_milli
from vgpu.scheduler.policies.workload import REFERENCE_CARD, PodType

__all__ = ["MEMO_LIMIT", "GPURaw", "GPUSums", "GPUVector", "TypeTable", "gpu_raw"]

MEMO_LIMIT = 100_000  # per-GPU vectors kept before the memo starts over (bounds a long-running extender's memory)
WEIGHT_BITS = 20


# one GPU: (memory, type, healthy, split, shares, memory used, cores used)
GPURaw = tuple[int, str, bool, int, int, int, int]
# one GPU's vectors: per type whether it fits one container, that times its idle share, its idle share, both stacked
GPUVector = tuple[np.ndarray, np.ndarray, int, np.ndarray]


def gpu_raw(device: GPUDevice, used: GPUUsage) -> GPURaw:
    """One GPU's state as the memo key of its vectors (the frag policies' GPU order builds the state after a
    placement from it field by field)."""
    return (device.memory, device.type, device.healthy, device.split, used.shares, used.memory, used.cores)


class GPUSums:
    """A node's GPUs summed per target type: how many GPUs fit the type, their idle share, and the node's idle
    share (all exact integers), plus each GPU's own vectors so that a change of one GPU is one vector update."""

    __slots__ = ("count", "fitted", "idle", "known", "raws", "stacked", "usable", "vectors")

    def __init__(self, stacked: np.ndarray, idle: int, vectors: list[GPUVector], raws: tuple[GPURaw, ...] = ()) -> None:
        self.stacked = stacked  # the two rows below, stacked
        self.count, self.usable = stacked
        self.idle = idle
        self.vectors = vectors
        self.raws = raws  # per GPU (memory, type, healthy, split, shares, memory used, cores used), when memoised
        self.known: dict[tuple[int, int], float] = {}  # (table id, CPU class) -> F, for memoised sums
        # per type, the idle share of the fitting GPUs when enough of them fit the type, else 0; with the GPU counts
        # per type it was computed for (`TypeTable._fitted`)
        self.fitted: tuple[np.ndarray, np.ndarray] | None = None


class TypeTable:
    """A target workload as arrays, with per-card request columns and per-GPU fit vectors.

    F is additive over a node's GPUs except for the thresholds (enough fitting GPUs, enough CPU), so a node is
    summed once from memoised per-GPU vectors (`sums`), a placement on one GPU updates the sums (`moved`), and F
    is read off the sums (`f`, memoised per CPU class). Every sum over GPUs is of integers, and the type weights are
    integers too (the probabilities in units of 2^-20), so the weighted sum over types is exact whatever order it is
    added in: one node state gets the same F bits whether its sums were added up (`sums`) or updated (`moved`).

    With `cpu_capacity` the node's free CPU limits how much of its idle GPU share a type can use (as many pods
    of the type as the CPU can feed, each taking its GPU demand), instead of only whether one pod fits, and a
    CPU-only type counts the node's idle GPUs as stranded only when the CPU cannot take one of its pods (FGD counts
    them always); free CPU is then counted in steps of `cpu_quantum` milli (rounded down).
    """

    def __init__(
        self, types: Sequence[tuple[PodType, float]], cpu_capacity: bool = False, cpu_quantum: int = 1000
    ) -> None:
        self.types = list(types)
        self.cpu_capacity = cpu_capacity
        self.cpu_quantum = cpu_quantum
        # weights in units of 2^-WEIGHT_BITS: integer-valued, so sums of their products with integer shares are exact
        self.weights = np.round(np.array([w for _, w in types], dtype=np.float64) * (1 << WEIGHT_BITS))
        self.weight_total = float(self.weights.sum())
        self.cpu = np.array([t[0] for t, _ in types], dtype=np.int64)
        self.count = np.array([sum(r.count for r in t[1]) for t, _ in types], dtype=np.int64)
        self.gpu = self.count > 0
        # A type with several GPU containers is approximated by its largest request on `count` GPUs.
        self._reqs = [max(t[1], key=lambda r: request_milli(r, REFERENCE_CARD)) if t[1] else None for t, _ in types]
        self.demand = np.array(
            [c * request_milli(r, REFERENCE_CARD) if r else 0 for c, r in zip(self.count.tolist(), self._reqs)],
            dtype=np.float64,
        )
        self._sels = [t[2] for t, _ in types]
        self.cpu_levels = np.unique(self.cpu)
        self._levels: list[int] = self.cpu_levels.tolist()  # for `cpu_class` of one node
        self._zeros = np.zeros(len(self.types), dtype=np.float64)
        self._columns: dict[tuple[int, str], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._vectors: dict[GPURaw, GPUVector] = {}  # one GPU's device and usage -> vectors
        self._cpu_terms: dict[int, tuple[np.ndarray | None, np.ndarray]] = {}  # CPU class -> `_terms`
        self._sums: dict[tuple[GPURaw, ...], GPUSums] = {}  # a node's GPU states, in order -> their sums

    def __len__(self) -> int:
        return len(self.types)

    def with_cpu_capacity(self, weights: Sequence[float] | None = None) -> "TypeTable":
        """The same types with CPU as a capacity (and other `weights` when given), sharing this table's per-GPU
        caches (they depend on neither), so a node's sums serve both tables."""
        types = self.types if weights is None else [(t, w) for (t, _), w in zip(self.types, weights)]
        fed = TypeTable(types, cpu_capacity=True, cpu_quantum=self.cpu_quantum)
        fed._columns, fed._vectors, fed._sums = self._columns, self._vectors, self._sums
        fed.count = self.count  # the same types: a node's `fitted` serves both
        return fed

    def cpu_class(self, cpu_free: int | None) -> int:
        """The CPU part of F: free CPU in quanta with `cpu_capacity` (-1: unlimited), else how many distinct type
        CPU requests fit in `cpu_free` (None: unlimited)."""
        if self.cpu_capacity:
            return -1 if cpu_free is None else int(cpu_free) // self.cpu_quantum
        if cpu_free is None:
            return len(self.cpu_levels)
        return bisect.bisect_right(self._levels, cpu_free)

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

    def vector(self, device: GPUDevice, used: GPUUsage, raw: GPURaw | None = None) -> GPUVector:
        """Per type, whether this GPU fits one container of it and then its idle share; the GPU's idle share; the
        two vectors stacked."""
        if raw is None:
            raw = gpu_raw(device, used)
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
        raws = tuple(map(gpu_raw, devices, usage))
        found = self._sums.get(raws)
        if found is None:
            vectors = [self.vector(d, u, raw) for d, u, raw in zip(devices, usage, raws)]
            if vectors:
                found = GPUSums(np.add.reduce([v[3] for v in vectors]), sum(v[2] for v in vectors), vectors, raws)
            else:
                found = GPUSums(np.stack((self._zeros, self._zeros)), 0, vectors, raws)
            if len(self._sums) >= MEMO_LIMIT // 10:
                self._sums.clear()
            self._sums[raws] = found
        return found

    def moved(self, sums: GPUSums, moves: Sequence[tuple[int, GPUDevice, GPURaw]]) -> list[GPUSums]:
        """For each (index, device, raw) of `moves`, `sums` with GPU `index` (`device`) in state `raw` (`gpu_raw`)
        instead, each applied to `sums` alone: the sums of a node in that state when known (`sums`; they carry their
        memoised F), else updated from `sums` and not kept (in a cluster of many GPU states they are seldom met
        again, and keeping them pushes the nodes' own sums out)."""
        out: list[GPUSums] = []
        old = sums.vectors
        for index, device, raw in moves:
            raws = sums.raws[:index] + (raw,) + sums.raws[index + 1:] if sums.raws else ()
            found = self._sums.get(raws) if raws else None
            if found is None:
                vector = self.vector(device, GPUUsage(*raw[4:]), raw)
                vectors = list(old)
                vectors[index] = vector
                found = GPUSums(sums.stacked + (vector[3] - old[index][3]), sums.idle - old[index][2] + vector[2],
                                vectors, raws)
            out.append(found)
        return out

    def _terms(self, cls: int) -> tuple[np.ndarray | None, np.ndarray]:
        """Per type at this CPU class (`cpu_class`): the most of a node's usable idle share the type can take, and
        its weight. A type the node cannot host takes nothing (FGD: GPU types only; with `cpu_capacity` a CPU-only
        type too, when the CPU covers it, and the node's GPUs then strand nothing for it); else it takes the GPU
        share the CPU can feed, or all of it. Without a finite bound the caps are left out (None) and a type the
        node cannot host weighs 0 instead."""
        terms = self._cpu_terms.get(cls)
        if terms is None:
            if len(self._cpu_terms) >= MEMO_LIMIT:
                self._cpu_terms.clear()
            cpu_ok, feed = self._cpu_part(cls)
            hostable = cpu_ok if self.cpu_capacity else self.gpu & cpu_ok
            if feed is None:
                terms = (None, np.where(hostable, self.weights, 0.0))
            else:
                terms = (np.where(hostable, feed, 0.0), self.weights)
            self._cpu_terms[cls] = terms
        return terms

    def _fitted(self, sums: GPUSums) -> np.ndarray:
        """Per type, the idle share of the node's GPUs that fit it when enough of them do (its GPU count), else 0."""
        known = sums.fitted
        if known is None or known[0] is not self.count:
            known = sums.fitted = (self.count, sums.usable * (sums.count >= self.count))
        return known[1]

    def f(self, sums: GPUSums, cpu_free: int | None) -> float:
        """F_n(M) in milli-GPU of a node with these sums and free CPU (None: unlimited)."""
        if sums.idle == 0 or not len(self.types):
            return 0.0
        value = sums.known.get((id(self), self.cpu_class(cpu_free)))
        return self.f_many([sums], cpu_free)[0] if value is None else value

    def f_many(self, many: Sequence[GPUSums], cpu_free: int | None) -> list[float]:
        """`f` of each of `many` at the same free CPU (memoised on each)."""
        cls = self.cpu_class(cpu_free)
        key = (id(self), cls)
        terms: tuple[np.ndarray | None, np.ndarray] | None = None  # read on the first value not known yet
        values: list[float] = []
        for sums in many:
            if sums.idle == 0 or not len(self.types):
                values.append(0.0)
                continue
            value = sums.known.get(key)
            if value is None:
                if terms is None:
                    terms = self._terms(cls)
                cap, weights = terms
                # the idle share less what each type can use of it, weighed; every term is an integer (shares,
                # caps, weights), so the sum is exact however it is grouped
                used = self._fitted(sums) if cap is None else np.minimum(self._fitted(sums), cap)
                value = sums.known[key] = (sums.idle * self.weight_total - float(used @ weights)) / (1 << WEIGHT_BITS)
            values.append(value)
        return values

    def fragment(self, devices: Sequence[GPUDevice], usage: Sequence[GPUUsage], cpu_free: int | None) -> float:
        """F_n(M) in milli-GPU for a node with these GPUs, usage and free CPU (None: unlimited)."""
        return self.f(self.sums(devices, usage), cpu_free)

    def _cpu_part(self, cls: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Per type, whether the CPU class covers one pod, and the GPU share the CPU can feed (None: no bound)."""
        if not self.cpu_capacity:
            return self.cpu <= (self.cpu_levels[cls - 1] if cls > 0 else -1), None
        if cls < 0:
            return np.ones(len(self.cpu), dtype=bool), None
        cpu_free = cls * self.cpu_quantum
        feedable = np.where(self.cpu > 0, cpu_free // np.maximum(self.cpu, 1), np.iinfo(np.int64).max)
        return self.cpu <= cpu_free, np.where(self.gpu, feedable * self.demand, np.inf)  # CPU-only: no GPU share
