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
CPU as capacity (a node hosts only as much of a type as its CPU can feed) and weighs pinned types by the scarcity
of their card models (see `FragAware`). F is read off
per-type sums of memoised per-GPU vectors (`TypeTable`), so ranking the GPUs of a node for one container costs a
few small vector operations per distinct GPU state.
"""

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction

from vgpu.inventory import GPUDevice
from vgpu.requests import ContainerRequest
from vgpu.scheduler.fit import FitResult, GPUOrder, GPUUsage
from vgpu.scheduler.policies.base import NodeContext, NodePolicy, PodContext, register
from vgpu.scheduler.policies.fragtable import GPURaw, GPUSums, TypeTable, gpu_raw
from vgpu.scheduler.policies.shares import lowest_index_order, placed_usage
from vgpu.scheduler.policies.workload import PodType, WorkloadLearner, pod_type, scarcity_weights, typical_types

__all__ = ["FGD", "FragAware"]

CONTEXT_LIMIT = 65_536  # fragaware's memoised context classes kept before the memo starts over

# the target workload: its table, and for fragaware the same target with CPU as a capacity
Target = tuple[TypeTable, TypeTable | None]
# the last GPU order, for the score that follows: (sums before, free CPU, free CPU after, the request, per state of
# the GPU it moves to the request: the integer score and the tie-break)
LastOrder = tuple[GPUSums | None, int | None, int | None, ContainerRequest | None, dict[GPURaw, tuple[int, float]]]


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def _sigmoid_score(delta: float) -> int:
    """The simulator's int(sigmoid((F_before - F_after)/1000) * 100)."""
    return int(_sigmoid(delta / 1000.0) * 100)



class _FragOrder:
    """A frag policy's GPU order for one node and pod: the first GPU with the best integer score for a one-GPU
    container (GPUs in the same state rank the same, F does not depend on GPU order: each state is ranked once), the
    lowest indices for a multi-GPU one. `depends_on_policy` says whether any call ranked GPUs in more than one
    state, the only case in which the target workload can change what it returns."""

    __slots__ = ("depends_on_policy", "node", "pod", "policy")

    def __init__(self, policy: "_FragDescent", node: NodeContext | None, pod: PodContext | None) -> None:
        self.policy, self.node, self.pod = policy, node, pod
        self.depends_on_policy = False

    def __call__(self, devices: Sequence[GPUDevice], usage: Sequence[GPUUsage], request: ContainerRequest,
                 candidates: list[int]) -> list[int]:
        if request.count != 1:
            return lowest_index_order(devices, usage, request, candidates)
        policy, node, pod = self.policy, self.node, self.pod
        table = policy.table
        start = table.sums(devices, usage)
        cpu, cpu_after = policy._cpu_read(node, pod)
        # per state of a candidate GPU: the integer score and tie-break of moving the request onto it
        states: dict[GPURaw, int] = {}
        moves: list[tuple[int, GPUDevice, GPURaw]] = []
        raws, cores = start.raws, request.cores
        for i in candidates:
            state = raws[i]
            if state not in states:
                memory, kind, healthy, split, shares, used, used_cores = state
                states[state] = i
                moves.append((i, devices[i], (memory, kind, healthy, split, shares + 1,
                                              used + request.memory_on(memory), used_cores + cores)))
        moved = dict(zip(states, policy._move_scores(start, table.moved(start, moves), cpu, cpu_after,
                                                     node is not None)))
        # `score` of the fit that follows reads the move from here
        policy._last_order = (start, cpu, cpu_after, request, moved)
        if len(moved) == 1:
            return candidates  # one state: lowest index first, as fit lists them
        self.depends_on_policy = True
        return sorted(candidates, key=lambda i: -moved[raws[i]][0])  # stable: lowest index first among equals


class _FragDescent(NodePolicy):
    """Shared machinery: a target table, CPU-class bins, the first-best GPU order and the sigmoid score."""

    uses_node_context = True
    coverage = 0.95
    period = 256
    drift = 0.0

    uses_capacity = False  # whether the target depends on the cluster's GPUs per device type (`relearn`)
    TIE_WEIGHT = 0.0  # the weight of the second table's tie-break (fragaware); below one point of the score

    def __init__(self) -> None:
        super().__init__()
        self._learner = WorkloadLearner(self.coverage, self.period, self.drift)
        self._oracle = False
        self._due = False
        self._capacity: dict[str, int] = {}
        self._install([])

    def _install(self, types: Sequence[tuple[PodType, float]]) -> None:
        """Make `types` the target workload (one assignment: a request being served keeps the pair it read)."""
        self._target: Target = (TypeTable(types), None)
        self._last_order: LastOrder = (None, None, None, None, {})

    @property
    def table(self) -> TypeTable:
        """The target workload's table."""
        return self._target[0]

    def observe(self, requests: Sequence[ContainerRequest], pod: PodContext | None = None) -> None:
        if not self._oracle and self._learner.add(pod_type(requests, pod)):
            self._due = True

    @property
    def due(self) -> bool:
        return self._due

    def relearn(self, capacity: Mapping[str, int] | None = None) -> bool:
        moved = self.uses_capacity and capacity is not None and dict(capacity) != self._capacity
        if not self._due and not moved:
            return False
        types = self._learner.target(self.table.types) if self._due else None
        self._due = False
        if types is None and not moved:
            return False
        if moved and capacity is not None:
            self._capacity = dict(capacity)
        self._install(self.table.types if types is None else types)
        self.epoch += 1
        return True

    def _cpu_read(self, node: NodeContext | None, pod: PodContext | None) -> tuple[int | None, int | None]:
        """The free CPU (milli) F reads on a node, and once `pod` is placed there (None: unlimited)."""
        if node is None:
            return None, None
        return node.cpu_free, node.cpu_free - (pod.cpu if pod else 0)

    def _cpu_pair(self, cpu_free: int, memory_free: int, pod: PodContext) -> tuple[int, int]:
        """`_cpu_read` of a node with this free CPU and memory."""
        return cpu_free, cpu_free - pod.cpu

    def _table_class(self, before: int | None, after: int | None) -> int:
        """The target table's CPU classes of a node's free CPU before and after a placement, as one number in
        [0, (levels + 2)^2): what the GPU order and FGD's score read of the node."""
        table = self.table
        return table.cpu_class(before) * (len(table.cpu_levels) + 2) + table.cpu_class(after)

    def context_class(self, cpu_free: int, memory_free: int, pod: PodContext) -> int:
        return self._table_class(*self._cpu_pair(cpu_free, memory_free, pod))

    def order_class(self, node: NodeContext | None, pod: PodContext) -> int:
        return self._table_class(*self._cpu_read(node, pod))

    def _move_scores(self, start: GPUSums, ends: Sequence[GPUSums], cpu: int | None, after: int | None,
                     contextual: bool) -> list[tuple[int, float]]:
        """For placements that take a node's GPUs from `start` to each of `ends` (sums) and its free CPU from `cpu`
        to `after` (`_cpu_read`): FGD's integer score, and the tie-break in [0, TIE_WEIGHT]: the sigmoid of
        the change of the second table's measure (fragaware), 0 without one or without node context
        (`contextual`). Only nodes of equal integer score are compared by the tie-break."""
        table, second = self._target
        f_start = table.f(start, cpu)
        scores = [_sigmoid_score(f_start - end) for end in table.f_many(ends, after)]
        if second is None or not contextual:
            return [(score, 0.0) for score in scores]
        second_start, weight = second.f(start, cpu), self.TIE_WEIGHT
        return [(score, weight * _sigmoid((second_start - end) / 1000.0))
                for score, end in zip(scores, second.f_many(ends, after))]

    def gpu_order(self, node: NodeContext | None, pod: PodContext | None) -> GPUOrder | None:
        return _FragOrder(self, node, pod)

    def score(
        self,
        devices: Sequence[GPUDevice],
        usage: Sequence[GPUUsage],
        requests: Sequence[ContainerRequest],
        result: FitResult,
        node: NodeContext | None = None,
        pod: PodContext | None = None,
    ) -> float:
        table = self._target[0]
        start = table.sums(devices, usage)
        last = self._last_order
        cpu, after = self._cpu_read(node, pod)
        known = None
        if (len(requests) == 1 and requests[0] is last[3] and len(result.placement[0]) == 1 and last[0] is start
                and last[1] == cpu and last[2] == after):
            known = last[4].get(start.raws[result.placement[0][0]])
        if known is None:
            end = start
            for i, used in sorted(placed_usage(usage, result).items()):
                (end,) = table.moved(end, [(i, devices[i], gpu_raw(devices[i], used))])
            (known,) = self._move_scores(start, [end], cpu, after, node is not None)
        return float(known[0] + known[1])


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
        counts: Counter[PodType] = Counter(pod_type(reqs, pod) for reqs, pod in pods)
        self._install(typical_types(counts, self.coverage))
        self._oracle = True
        self.epoch += 1


@register("fragaware")
class FragAware(_FragDescent):
    """Ours (`vgpu replay`'s "ours"): fragmentation descent with the target learned online, CPU-aware tie-breaks.

    No oracle: the target is the distribution of the pods it has been shown so far (`observe` counts them), the
    types covering 99 % of them, rebuilt by `relearn` after 1, 2, 4, ... 128 pods and then every 256 pods or an
    eighth of the pods seen when it has drifted by a total variation distance above 2 %, so a steady workload stops
    invalidating caches. A type is the pod's CPU request plus its per-GPU memory share, cores and GPU count (and
    type selectors); a GPU fits a type only when its free memory, free cores and free slots all cover it.

    The score is FGD's integer sigmoid of the fragmentation change, plus a tie-break below one point: the sigmoid
    of the change of a second measure (`TypeTable(cpu_capacity=True)`) in which a node's free CPU also bounds how
    much of its idle GPU share each type can use, a CPU-only type strands a node's GPUs only when the node's CPU
    cannot take it, and each type weighs its probability over the share of the cluster's GPUs its card-model
    selectors allow (`scarcity_weights`, against the `capacity` given to `relearn`). Among placements FGD ranks
    equal, the one that leaves CPU and GPUs best matched, and the small card models to the pods pinned to them,
    wins; as a primary term the CPU measure cost placement quality on share-heavy traces (docs/placement.md). The
    tie-break ranks nodes; inside a node the GPU is FGD's. Without node context (a node that reports no allocatable
    CPU) CPU is unlimited and the tie-break is left out.

    Both measures read a node's free CPU bounded by what its free memory can feed at the CPU-to-memory ratio of the
    pods observed (fixed when the target is rebuilt): a node whose memory is nearly spent hosts no pod for its idle
    CPU, so its idle GPUs count as stranded there and placement keeps memory beside the GPUs that need it.
    """

    name = "fragaware"
    coverage = 0.99
    period = 256
    drift = 0.02
    uses_capacity = True
    TIE_WEIGHT = 0.999

    def __init__(self) -> None:
        self._cpu_seen = 0  # CPU (milli) and memory (MiB) requested by the pods observed so far
        self._memory_seen = 0
        self._per_memory: tuple[int, int] | None = None  # their ratio when the target was installed, as a fraction
        super().__init__()

    def observe(self, requests: Sequence[ContainerRequest], pod: PodContext | None = None) -> None:
        super().observe(requests, pod)
        if pod is not None:
            self._cpu_seen += pod.cpu
            self._memory_seen += pod.memory

    def _install(self, types: Sequence[tuple[PodType, float]]) -> None:
        table = TypeTable(types)
        self._target = (table, table.with_cpu_capacity(scarcity_weights(types, self._capacity)))
        self._last_order = (None, None, None, None, {})
        self._context_classes: dict[tuple[int, int, int, int], int] = {}  # `context_class`, memoised
        self._last_read: tuple[NodeContext | None, PodContext | None, tuple[int, int]] = (None, None, (0, 0))
        # fixed with the target, so that the scores of unchanged nodes change only with the epoch
        ratio = self._observed_ratio()
        self._per_memory = (ratio.numerator, ratio.denominator) if ratio else None

    def _observed_ratio(self) -> Fraction | None:
        """CPU (milli) per MiB of memory requested by the pods observed (None: no memory requested yet)."""
        if not self._memory_seen:
            return None
        return Fraction(self._cpu_seen, self._memory_seen).limit_denominator(1 << 16)

    def relearn(self, capacity: Mapping[str, int] | None = None) -> bool:
        scheduled = self._due
        if super().relearn(capacity):
            return True
        if not scheduled:
            return False
        # the types held still: rebuild anyway when the pods' CPU-to-memory ratio has drifted
        ratio, installed = self._observed_ratio(), self._per_memory
        if ratio is None:
            return False
        if installed is not None and abs(ratio - Fraction(*installed)) <= self.drift * Fraction(*installed):
            return False
        self._install(self.table.types)
        self.epoch += 1
        return True

    def _fed_by_memory(self, cpu: int, memory: int) -> int:
        """Free CPU bounded by what the free memory can feed at the observed CPU-to-memory ratio of pods."""
        ratio = self._per_memory
        return cpu if ratio is None else min(cpu, memory * ratio[0] // ratio[1])

    def _cpu_read(self, node: NodeContext | None, pod: PodContext | None) -> tuple[int | None, int | None]:
        # one evaluation asks it for its GPU order, its fit's order and its score: the last answer is kept (both
        # contexts are immutable, and held here, so `is` cannot be fooled by a reused id)
        if node is None:
            return None, None
        last = self._last_read
        if last[0] is node and last[1] is pod:
            return last[2]
        before = self._fed_by_memory(node.cpu_free, node.memory_free)
        pair = (before, before if pod is None else
                self._fed_by_memory(node.cpu_free - pod.cpu, node.memory_free - pod.memory))
        self._last_read = (node, pod, pair)
        return pair

    def _cpu_pair(self, cpu_free: int, memory_free: int, pod: PodContext) -> tuple[int, int]:
        return (self._fed_by_memory(cpu_free, memory_free),
                self._fed_by_memory(cpu_free - pod.cpu, memory_free - pod.memory))

    def context_class(self, cpu_free: int, memory_free: int, pod: PodContext) -> int:
        key = (cpu_free, memory_free, pod.cpu, pod.memory)
        known = self._context_classes.get(key)
        if known is None:
            if len(self._context_classes) >= CONTEXT_LIMIT:
                self._context_classes.clear()
            known = self._context_classes[key] = self._context_class(cpu_free, memory_free, pod)
        return known

    def _context_class(self, cpu_free: int, memory_free: int, pod: PodContext) -> int:
        table, fed = self._target
        assert fed is not None  # fragaware always installs both tables
        levels = len(table.cpu_levels) + 2
        before, after = self._cpu_pair(cpu_free, memory_free, pod)
        tie = (fed.cpu_class(before) << 24) + fed.cpu_class(after)  # the tie-break's classes
        return tie * levels * levels + self._table_class(before, after)  # the table's below levels^2
