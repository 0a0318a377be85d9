"""The one node-selection loop: the extender's /filter, /prioritize and /bind and the trace replay place through it.

Nodes are registered once (`register`: the ledger's nodes by the extender, the trace's by the replay) and get a
slot. For each pod shape (`PodShape`: requests, selectors and, for policies that use node context, the CPU request)
a board keeps every registered node's fit and score as arrays by slot. A node that changes (`NodeState.charge`,
`set_requested`, ...) appends its slot to the placement's change log, and a board re-evaluates exactly the nodes
logged since it was last used. Evaluations are memoised by the node's GPU state with the UUIDs left out
(`nodestate.gpu_state`), the policy's context class of the node for this pod (`NodePolicy.context_class`) and the
pod's signature, so nodes in the same state are fitted and scored once. A request costs a few array operations
over the candidates plus the evaluations of the nodes that changed since the board was last used; `warm` makes
those evaluations off the request path for the most recently used shapes (the extender's learner thread, after a
bind), so that the next request of each finds them in the memo. A pod that names
GPU UUIDs is evaluated per node. Fits are stored with GPU indices; the chosen node's grants use its own UUIDs.
In DRA mode someone else picks the GPUs (kube-scheduler's allocator): `device_order` then replaces the policy's GPU
order, so nodes are fitted and scored on the GPUs the pod will really get (scheduler/draview.py, docs/dra.md).

Topology (`topology=True`, the default; not in DRA mode, where the allocator picks the devices): on nodes that
publish NVLink islands, fit gives a multi-GPU container the GPUs of one island, else of one NUMA node
(`scheduler.fit`), and a node's score for a pod with such a container falls by `TIER_STEP` per tier of locality it
can offer (`fit.topology_tier`: 0 island, 1 NUMA node, 2 neither), so a node that gives the pod one island beats
every node that cannot, whatever the policy. Nodes whose islands are unknown are tier 0: placement is then as
without topology. Islands are part of the memo key (`_key`), so nodes of different layouts never share a fit.

Comparison: the higher score wins, then the lower `NodeState.rank` (the extender's ledger ranks nodes by name, the
replay by the seed's random order); a policy with `tie_break = "random"` draws uniformly among the best instead.

Learning policies: a score computed before the policy's `epoch` changed is stale, and so is a fit, unless the GPU
order it was made with says it depended on neither the learned target nor the node (`depends_on_policy`: such a
fit is stored once for every context class). Decide mode (the
extender's default, and the replay) refreshes at most `refresh_budget` stale nodes per request in candidate order, then
rescores the best-ranked stale ones until a current score is the best (at most `rescore_limit`), so a change of
target never stalls one request and the chosen node always has a current score. `refresh` rescores stale entries
off the request path (the extender's learner thread; the replay between pods when told to). Score mode reports
feasibility from the stored fits and rescores at /prioritize.

Not thread-safe: callers serialise (the extender holds its ledger's lock).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np

from vgpu import keys
from vgpu.requests import ContainerRequest, Selectors
from vgpu.scheduler.fit import GPU_ORDERS, FitResult, GPUOrder, fit, grants_on, topology_known, topology_tier
from vgpu.scheduler.nodestate import NodeState, gpu_state
from vgpu.scheduler.policies.base import NodePolicy, PodContext, make_policy

__all__ = ["REFRESH_BUDGET", "RESCORE_LIMIT", "TIER_STEP", "WARM_BOARDS", "Choice", "Evaluation", "Placement",
           "PodShape"]

# Decide mode, after a change of learned target: stale nodes refreshed per request in candidate order, then stale
# nodes rescored best first until a current score is the best.
REFRESH_BUDGET = 2
RESCORE_LIMIT = 4
RESCORE_HEAD = 32  # stale contenders sorted before the first is rescored (the rest only when reached)
FULL_SORT = 512  # stale contenders up to which one sort of all is cheaper than sorting the head first
MEMO_LIMIT = 200_000  # evaluations kept before the memo starts over
KEY_LIMIT = 200_000  # distinct GPU states (and pod signatures) numbered before the numbering starts over
BOARD_LIMIT = 256  # pod shapes whose per-node results are kept (least recently used dropped first)
WARM_BOARDS = 16  # pod shapes, most recently used first, whose changed nodes `warm` evaluates off the request path
LOG_LIMIT = 1 << 20  # not a memory size: change-log entries kept; a board further behind re-evaluates every node
LOG_TRIM = 1 << 14  # change-log entries added between looks at what every board has read (which is then dropped)
NO_CONTEXT = -(2**62)  # the context class of a node that reports no allocatable CPU and memory
ANY_EPOCH = -2  # the epoch of a failed fit that no GPU order can change (a pod with one request)
ANY_TARGET = -3  # the epoch of a stored fit whose GPU order depended on neither the learned target nor the node
ANY_CLASS = -(2**62) - 1  # the order class of such a fit: it holds for every context class
FAIL = -np.inf  # the board score of a node the pod does not fit
# what a node's score loses per topology tier of a multi-GPU pod's placement: more than any policy's score range
# (scores of nodes up to 1024 GPUs stay apart; ties among tie-breaks finer than 1e-9 may merge on tiers 1 and 2)
TIER_STEP = float(2**20)  # not a memory size


@dataclass(frozen=True, slots=True)
class PodShape:
    """What placement reads of a pod; `signature` numbers the shape (equal shapes place alike everywhere)."""

    requests: tuple[ContainerRequest, ...]
    selectors: Selectors
    context: PodContext
    signature: int
    numbering: int  # the placement's signature numbering the signature belongs to
    raw: tuple[Any, ...] = field(repr=False, compare=False)

    @property
    def multi_gpu(self) -> bool:
        """A container asks for more than one GPU, so where its GPUs are in the node's topology matters."""
        return any(request.count > 1 for request in self.requests)

    @property
    def per_node(self) -> bool:
        """The pod names GPU UUIDs, so its fit depends on more than the GPU state."""
        return bool(self.selectors.use_uuids or self.selectors.nouse_uuids)


@dataclass(slots=True)
class Evaluation:
    """A fit (GPU indices) and its score (the policy's, less the topology tier's `TIER_STEP`s) for one memo key;
    `epoch` is the policy epoch of the score (-1: none), or of the fit when it failed (ANY_EPOCH: no GPU order can
    change it)."""

    result: FitResult
    fit_epoch: int
    score: float = 0.0
    epoch: int = -1


@dataclass(slots=True)
class Choice:
    """The outcome of one placement: feasible nodes (input order), why the others fail, and in decide mode the
    chosen node, its position among the candidates and its grants."""

    feasible: list[NodeState] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    best: NodeState | None = None
    best_index: int = -1
    result: FitResult | None = None


@dataclass(slots=True)
class _Board:
    """One pod shape on every registered node, by slot: its score (nan: to evaluate; FAIL: does not fit), the epoch
    of that score (Evaluation.epoch) and the evaluation; current up to `pos` in the change log."""

    pod: PodShape
    score: np.ndarray
    epoch: np.ndarray
    entries: list[Evaluation | None]
    pos: int
    warmed: int = 0  # change-log position up to which `Placement.warm` has evaluated the changed nodes


def _stale(entry: Evaluation | None, epoch: int) -> bool:
    """Whether a board's evaluation needs scoring with the policy's current target."""
    return entry is None or entry.epoch != epoch


def _best_first(values: np.ndarray, ranks: np.ndarray, slots: np.ndarray,
                head: int) -> Iterator[list[tuple[float, int, int]]]:
    """(value, rank, slot) of each node, higher value then lower rank (then lower slot) first: about the `head`
    first in one sorted list, then the others in a second (made only if reached). Up to `FULL_SORT` nodes are sorted
    at once; of more, only the head first (the rest sorted only if reached)."""
    n = len(values)
    if n <= FULL_SORT:
        order = np.lexsort((slots, ranks, -values))
        for part in (order[:head], order[head:]):
            if len(part):
                yield list(zip(values[part].tolist(), ranks[part].tolist(), slots[part].tolist()))
        return
    threshold = np.partition(values, n - head)[n - head]
    top, at = values > threshold, values == threshold
    need = head - int(top.sum())  # at least 1: `threshold` is the head-th highest value
    if int(at.sum()) > need:  # many nodes share the threshold: take those of the lowest ranks among them
        tied = ranks[at]
        top |= at & (ranks <= np.partition(tied, need - 1)[need - 1])
    else:
        top |= at
    for mask in (top, ~top):
        order = np.lexsort((slots[mask], ranks[mask], -values[mask]))
        yield list(zip(values[mask][order].tolist(), ranks[mask][order].tolist(), slots[mask][order].tolist()))


def _better(score: float, rank: int, best: tuple[float, int] | None) -> bool:
    return best is None or score > best[0] or (score == best[0] and rank < best[1])


class Placement:
    """Fits, scores and compares nodes for pods under one node policy; see the module docstring."""

    def __init__(self, policy: NodePolicy, *, gpu_policy: str = "binpack", decide: bool = True,
                 refresh_budget: int = REFRESH_BUDGET, rescore_limit: int = RESCORE_LIMIT, seed: int = 0,
                 device_order: GPUOrder | None = None, topology: bool = True) -> None:
        self.policy = policy
        # the node scores a pod may choose over `policy` (HAMi's hami.io/node-scheduler-policy: Selectors.node_order)
        self._pod_policies = {name: make_policy(name) for name in keys.GPU_ORDER_NAMES}
        # the order devices are really taken in when someone else picks them (DRA mode: kube-scheduler's allocator,
        # first fit); it replaces the policy's GPU order, so nodes are scored on the devices the pod will get
        self.device_order = device_order
        # topology-aware fits and node preference (module docstring); the DRA allocator's choice ignores topology
        self.topology = topology and device_order is None
        self.decide = decide
        self.refresh_budget = refresh_budget
        self.rescore_limit = rescore_limit
        self.contextual = policy.uses_node_context
        self.default_order: GPUOrder = GPU_ORDERS[gpu_policy]
        self.rng = random.Random(seed)
        self._memo: dict[tuple[Any, int, int], Evaluation] = {}
        self._fits: dict[tuple[Any, int, int], tuple[FitResult, int]] = {}  # (key, order class, sig) -> (fit, epoch)
        self._keys: dict[tuple[Any, ...], int] = {}
        self._signatures: dict[tuple[Any, ...], int] = {}
        self._numbering = 0  # bumped when the signatures are numbered anew
        self._tag = (id(self), 0)  # the key numbering NodeState.key belongs to
        self._nodes: list[NodeState] = []  # by slot
        self._rank = np.zeros(0, dtype=np.int64)  # by slot
        self._changes: list[int] = []  # the change log: slots, in order of change
        self._base = 0  # change-log entries dropped so far
        self._next_trim = LOG_TRIM  # log length at which the entries every board has read are dropped
        self._boards: OrderedDict[int, _Board] = OrderedDict()  # by pod signature, least recently used first
        # work done, for benchmarks: node states evaluated (results not found in the memo), fits and scores computed
        self.evaluated = 0
        self.evaluations = 0
        self.scorings = 0

    # ------------------------------------------------------------------ nodes and keys

    def register(self, state: NodeState) -> int:
        """Give a node a slot (once): its changes are then logged here and boards keep its results."""
        if state.changes is self._changes:
            return state.slot
        slot = len(self._nodes)
        self._nodes.append(state)
        state.slot, state.changes = slot, self._changes
        if slot >= len(self._rank):
            self._rank = np.concatenate([self._rank, np.zeros(max(64, slot), dtype=np.int64)])
        self._rank[slot] = state.rank
        self._changes.append(slot)
        return slot

    def registered(self, state: NodeState) -> bool:
        """Whether `state` has a slot here."""
        return state.changes is self._changes

    def rerank(self) -> None:
        """Read every registered node's rank again (the ledger renumbers nodes when one comes or goes)."""
        self._rank[: len(self._nodes)] = [s.rank for s in self._nodes]

    def shape(self, requests: tuple[ContainerRequest, ...], selectors: Selectors, context: PodContext) -> PodShape:
        """The placement form of a pod's requests, selectors and context."""
        raw = (requests, selectors, context.cpu if self.contextual else 0)
        return PodShape(requests, selectors, context, self._signature(raw), self._numbering, raw)

    def _signature(self, raw: tuple[Any, ...]) -> int:
        sig = self._signatures.get(raw)
        if sig is None:
            if len(self._signatures) >= KEY_LIMIT:
                self._signatures = {}
                self._numbering += 1
                self._memo, self._fits = {}, {}
                self._boards.clear()
            sig = self._signatures[raw] = len(self._signatures)
        return sig

    def _sig(self, pod: PodShape) -> int:
        return pod.signature if pod.numbering == self._numbering else self._signature(pod.raw)

    def _key(self, state: NodeState) -> int:
        if state.key_tag == self._tag:
            return state.key
        raw = gpu_state(state.devices, state.usage)
        if self.topology and topology_known(state.devices):
            raw = (*raw, tuple((d.island, d.numa) for d in state.devices))
        key = self._keys.get(raw)
        if key is None:
            if len(self._keys) >= KEY_LIMIT:
                self._keys = {}
                self._memo, self._fits = {}, {}
                self._tag = (id(self), self._tag[1] + 1)
            key = self._keys[raw] = len(self._keys)
        state.key, state.key_tag = key, self._tag
        return key

    def _classes(self, states: Sequence[NodeState], pod: PodShape) -> list[int]:
        """The policy's context class of each node for this pod (0 when the policy uses no node context)."""
        if not self.contextual:
            return [0] * len(states)
        of, context = self.policy.context_class, pod.context
        return [NO_CONTEXT if s.cpu_allocatable is None or s.memory_allocatable is None
                else of(s.cpu_allocatable - s.cpu_requested, s.memory_allocatable - s.memory_requested, context)
                for s in states]

    # ------------------------------------------------------------------ evaluation

    def _evaluate(self, state: NodeState, key: tuple[Any, int, int], pod: PodShape, epoch: int,
                  want_score: bool) -> Evaluation:
        entry = self._memo.get(key)
        node = None
        if entry is None or (entry.fit_epoch != epoch and entry.epoch != ANY_EPOCH):
            self.evaluated += 1
            # a fit that no GPU order of the policy could change is stored for every context class
            known = self._fits.get((key[0], ANY_CLASS, key[2]))
            if known is None:
                # a learning policy's GPU order may have changed too
                node = state.context() if self.contextual else None
                order_class = 0 if self.device_order else self.policy.order_class(node, pod.context)
                fit_key = (key[0], order_class, key[2])
                known = self._fits.get(fit_key)
                if known is None or (known[1] != epoch and known[1] != ANY_TARGET):
                    order = (self.device_order or GPU_ORDERS.get(pod.selectors.gpu_order)
                             or self.policy.gpu_order(node, pod.context) or self.default_order)
                    result = fit(state.devices, state.usage, pod.requests, pod.selectors, order, self.topology)
                    self.evaluations += 1
                    if len(self._fits) >= MEMO_LIMIT:
                        self._fits = {}
                    if getattr(order, "depends_on_policy", True):
                        known = self._fits[fit_key] = (result, epoch)
                    else:  # neither the learned target nor the node's context class could change it
                        known = self._fits[(key[0], ANY_CLASS, key[2])] = (result, ANY_TARGET)
            entry = Evaluation(known[0], epoch)
            if len(self._memo) >= MEMO_LIMIT:
                self._memo = {}
            self._memo[key] = entry
        if not entry.result.ok:
            entry.epoch = ANY_EPOCH if len(pod.requests) <= 1 else epoch  # nothing to score
        elif want_score and entry.epoch != epoch:
            if node is None and self.contextual:
                node = state.context()  # the fit was known: the context is read only now
            policy = self._pod_policies.get(pod.selectors.node_order, self.policy)
            entry.score = float(policy.score(state.devices, state.usage, pod.requests, entry.result, node=node,
                                             pod=pod.context))
            if self.topology and pod.multi_gpu:
                entry.score -= TIER_STEP * topology_tier(state.devices, entry.result.placement)
            entry.epoch = epoch
            self.scorings += 1
        return entry

    def evaluate(self, state: NodeState, pod: PodShape, want_score: bool = True) -> tuple[FitResult, float]:
        """Fit (with this node's grants) and score of a pod on one node, without choosing."""
        entry = self._evaluate(state, self._memo_key(state, self._classes([state], pod)[0], pod), pod,
                               self.policy.epoch, want_score)
        return self.on_node(state, pod, entry.result), entry.score

    def _memo_key(self, state: NodeState, cls: int, pod: PodShape) -> tuple[Any, int, int]:
        return ((state.name, state.generation) if pod.per_node else self._key(state), cls, self._sig(pod))

    @staticmethod
    def on_node(state: NodeState, pod: PodShape, result: FitResult) -> FitResult:
        """`result` (possibly computed on another node in the same state) with this node's GPU UUIDs."""
        if not result.ok or not result.placement:
            return result
        return FitResult(ok=True, placement=result.placement,
                         assignment=grants_on(state.devices, pod.requests, result.placement))

    # ------------------------------------------------------------------ boards

    def _board(self, pod: PodShape) -> _Board:
        """The pod shape's board, with the nodes changed since its last use marked for evaluation."""
        sig = self._sig(pod)
        n = len(self._nodes)
        board = self._boards.get(sig)
        if len(self._changes) >= self._next_trim:
            self._trim_log()
        if board is None or board.pos < self._base:
            board = _Board(pod, np.full(n, np.nan), np.full(n, -1, dtype=np.int64), [None] * n,
                           self._base + len(self._changes))
            self._boards[sig] = board
            if len(self._boards) > BOARD_LIMIT:
                self._boards.popitem(last=False)
        else:
            self._boards.move_to_end(sig)
            self._sync(board)
        return board

    def _trim_log(self) -> None:
        """Drop the change-log entries every board has read; past LOG_LIMIT, the older half whatever was read (a
        board that had not read it re-evaluates every node)."""
        end = self._base + len(self._changes)
        drop = min((board.pos for board in self._boards.values()), default=end) - self._base
        if len(self._changes) > LOG_LIMIT:
            drop = max(drop, len(self._changes) // 2)
        if drop > 0:
            del self._changes[:drop]
            self._base += drop
        self._next_trim = len(self._changes) + LOG_TRIM

    def _sync(self, board: _Board) -> None:
        """Size a board to the registered nodes and mark the nodes changed since its last use."""
        n = len(self._nodes)
        if len(board.score) < n:
            grow = n - len(board.score)
            board.score = np.concatenate([board.score, np.full(grow, np.nan)])
            board.epoch = np.concatenate([board.epoch, np.full(grow, -1, dtype=np.int64)])
            board.entries.extend([None] * grow)
        end = self._base + len(self._changes)
        if board.pos < end:
            board.score[self._changes[board.pos - self._base:]] = np.nan
            board.pos = end

    def _fill(self, board: _Board, slots: np.ndarray, epoch: int, want_score: bool) -> None:
        """Evaluate the pod of `board` on the nodes at `slots` and store the results."""
        pod = board.pod
        states = [self._nodes[s] for s in slots.tolist()]
        sig = self._sig(pod)
        for slot, state, cls in zip(slots.tolist(), states, self._classes(states, pod)):
            key = ((state.name, state.generation) if pod.per_node else self._key(state), cls, sig)
            self._store(board, slot, self._evaluate(state, key, pod, epoch, want_score))

    def _refresh(self, board: _Board, slots: list[int], epoch: int,
                 classes: dict[int, int] | None = None) -> list[Evaluation]:
        """Rescore nodes of a board with the current target; their context classes are taken from `classes` (by
        slot) or computed in one batch."""
        entries: list[Evaluation | None] = [board.entries[s] for s in slots]
        todo = [i for i, entry in enumerate(entries) if entry is None or entry.epoch != epoch]
        states = [self._nodes[slots[i]] for i in todo]
        if classes is not None and all(slots[i] in classes for i in todo):
            known = [classes[slots[i]] for i in todo]
        else:
            known = self._classes(states, board.pod)
        for i, state, cls in zip(todo, states, known):
            entries[i] = self._evaluate(state, self._memo_key(state, cls, board.pod), board.pod, epoch, True)
        out: list[Evaluation] = []
        for slot, entry in zip(slots, entries):
            assert entry is not None  # evaluated above
            self._store(board, slot, entry)
            out.append(entry)
        return out

    @staticmethod
    def _store(board: _Board, slot: int, entry: Evaluation) -> None:
        board.entries[slot] = entry
        board.score[slot] = entry.score if entry.result.ok else FAIL
        board.epoch[slot] = entry.epoch

    def _prepare(self, board: _Board, slots: np.ndarray, epoch: int, want_score: bool) -> None:
        """Evaluate the candidates the board does not know, and refit failed multi-request fits of earlier targets."""
        score, past = board.score[slots], board.epoch[slots]
        redo = np.isnan(score) | ((score == FAIL) & (past != epoch) & (past != ANY_EPOCH))
        if redo.any():
            self._fill(board, slots[redo], epoch, want_score)

    # ------------------------------------------------------------------ requests

    def choose(self, states: Sequence[NodeState], pod: PodShape, explain: bool = True,
               slots: np.ndarray | None = None) -> Choice:
        """Feasible nodes, failure reasons and, in decide mode, the best node for the pod. `slots`: the slots of
        `states` when the caller keeps them (-1 for a node that is not registered: it is evaluated on its own);
        `explain=False` leaves out the failure reasons (the replay needs only the choice)."""
        if slots is None:
            slots = np.fromiter((s.slot if self.registered(s) else -1 for s in states), np.int64, len(states))
        epoch = self.policy.epoch
        decide = self.decide
        board = self._board(pod)
        loose = np.flatnonzero(slots < 0)
        mine = slots if not len(loose) else slots[slots >= 0]
        self._prepare(board, mine, epoch, decide)
        choice = Choice()
        extra = [(int(i), self.evaluate(states[i], pod, decide)) for i in loose.tolist()]
        score, past = board.score[mine], board.epoch[mine]
        fits = score > FAIL
        if not decide:
            ok = np.zeros(len(states), dtype=bool)
            ok[slots >= 0] = fits
            for i, (result, _) in extra:
                ok[i] = result.ok
            choice.feasible = [states[i] for i in np.flatnonzero(ok).tolist()]
            if explain:
                self._explain(choice, states, slots, board, extra)
            return choice
        stale = fits & (past != epoch)
        if stale.any() and self.refresh_budget > 0:
            self._refresh_some(board, mine[stale], epoch, self.refresh_budget)
            score, past = board.score[mine], board.epoch[mine]
            fits = score > FAIL  # a refit under the current target may fail where an earlier one fitted
            stale = fits & (past != epoch)
        best = self._best(mine, score, fits & ~stale, extra, states)
        if stale.any():
            best = self._rescore_stale(board, mine, score, stale, best, epoch)
        if best is None:
            if explain:
                self._explain(choice, states, slots, board, extra)
            return choice
        index, result = self._resolve_best(best, states, slots, board, extra)
        if explain:
            self._explain(choice, states, slots, board, extra)
        chosen = states[index]
        choice.best, choice.best_index = chosen, index
        choice.result = self.on_node(chosen, pod, result)
        choice.feasible = [chosen]
        return choice

    def _refresh_some(self, board: _Board, stale: np.ndarray, epoch: int, budget: int) -> None:
        """Rescore stale nodes in candidate order; a node whose evaluation is already current (shared with a node
        in the same state) costs nothing."""
        picked: list[int] = []
        start, step = 0, 4 * budget + 4  # read a few at a time: most requests stop soon after `budget` stale nodes
        while start < len(stale):
            for slot in stale[start:start + step].tolist():
                entry = board.entries[slot]
                if entry is not None and entry.epoch == epoch:
                    self._store(board, slot, entry)
                    continue
                if len(picked) >= budget:
                    break
                picked.append(slot)
            else:
                start, step = start + step, 2 * step
                continue
            break
        self._refresh(board, picked, epoch)

    def _best(self, mine: np.ndarray, score: np.ndarray, current: np.ndarray,
              extra: list[tuple[int, tuple[FitResult, float]]],
              states: Sequence[NodeState]) -> tuple[float, int, int] | None:
        """The best (score, rank, slot or -1 - input index) among current results; None when nothing fits."""
        best: tuple[float, int, int] | None = None
        if current.any():
            top = float(score[current].max())
            tied = mine[current & (score == top)]
            if self.policy.tie_break == "random":
                slot = int(tied[self.rng.randrange(len(tied))])
            else:
                slot = int(tied[np.argmin(self._rank[tied])])
            best = (top, int(self._rank[slot]), slot)
        for i, (result, value) in extra:
            rank = states[i].rank
            if result.ok and _better(value, rank, best[:2] if best else None):
                best = (value, rank, -1 - i)
        return best

    def _rescore_stale(self, board: _Board, mine: np.ndarray, score: np.ndarray, stale: np.ndarray,
                       best: tuple[float, int, int] | None, epoch: int) -> tuple[float, int, int] | None:
        """A node ranked on an earlier target's score wins only once rescored with the current one: rescore the
        stale nodes that would beat the best, best first, at most `rescore_limit` of them."""
        contenders = mine[stale]
        values = score[stale]
        if best is not None:
            keep = (values > best[0]) | ((values == best[0]) & (self._rank[contenders] < best[1]))
            contenders, values = contenders[keep], values[keep]
            if not len(contenders):
                return best
        ranks = self._rank[contenders]
        classes: dict[int, int] = {}  # context classes of the contenders to rescore, computed a few at a time
        rescored = 0
        for queue in _best_first(values, ranks, contenders, RESCORE_HEAD):
            for position, (value, rank, slot) in enumerate(queue):
                if best is not None and (rescored >= self.rescore_limit or not _better(value, rank, best[:2])):
                    return best
                if _stale(board.entries[slot], epoch):
                    rescored += 1
                    if slot not in classes:
                        ahead = [s for _, _, s in islice(queue, position, position + max(self.rescore_limit, 1))
                                 if _stale(board.entries[s], epoch)]
                        classes.update(zip(ahead, self._classes([self._nodes[s] for s in ahead], board.pod)))
                (entry,) = self._refresh(board, [slot], epoch, classes)
                if entry.result.ok and _better(entry.score, rank, best[:2] if best else None):
                    best = (entry.score, rank, slot)
        return best

    def _resolve_best(self, best: tuple[float, int, int], states: Sequence[NodeState], slots: np.ndarray,
                      board: _Board, extra: list[tuple[int, tuple[FitResult, float]]]) -> tuple[int, FitResult]:
        """The input index and fit of the chosen node."""
        slot = best[2]
        if slot < 0:
            index = -1 - slot
            return index, dict(extra)[index][0]
        entry = board.entries[slot]
        assert entry is not None  # a chosen node was evaluated
        return int(np.flatnonzero(slots == slot)[0]), entry.result

    def _explain(self, choice: Choice, states: Sequence[NodeState], slots: np.ndarray, board: _Board,
                 extra: list[tuple[int, tuple[FitResult, float]]]) -> None:
        """Failure reasons of the candidates that do not fit."""
        failed = (board.score[np.maximum(slots, 0)] == FAIL) & (slots >= 0)
        results = [(i, entry.result) for i, entry in
                   zip(np.flatnonzero(failed).tolist(), (board.entries[s] for s in slots[failed].tolist()))
                   if entry is not None]
        results += [(i, result) for i, (result, _) in extra if not result.ok]
        for i, result in sorted(results, key=lambda r: r[0]):
            (choice.unresolvable if result.unresolvable else choice.failed)[states[i].name] = result.reason

    def scores(self, states: Sequence[NodeState], pod: PodShape) -> list[float | None]:
        """Current score of the pod on each node (None where it does not fit)."""
        epoch = self.policy.epoch
        board = self._board(pod)
        slots = np.fromiter((s.slot if self.registered(s) else -1 for s in states), np.int64, len(states))
        mine = slots[slots >= 0]
        self._prepare(board, mine, epoch, True)
        self._refresh(board, mine[(board.score[mine] > FAIL) & (board.epoch[mine] != epoch)].tolist(), epoch)
        out: list[float | None] = []
        for state, slot in zip(states, slots.tolist()):
            if slot >= 0:
                value = float(board.score[slot])
                out.append(value if value > FAIL else None)
            else:
                result, value = self.evaluate(state, pod)
                out.append(value if result.ok else None)
        return out

    # ------------------------------------------------------------------ off the request path

    def unwarmed(self, boards: int = WARM_BOARDS) -> bool:
        """Whether nodes changed since one of the `boards` most recently used boards last saw them wait for `warm`."""
        end = self._base + len(self._changes)
        return any(max(board.pos, board.warmed) < end for board in islice(reversed(self._boards.values()), boards))

    def warm(self, budget: int, boards: int = WARM_BOARDS) -> int:
        """Evaluate, for the `boards` most recently used pod shapes, the nodes changed since their last request, so
        that the next request of each finds them in the memo; at most `budget` evaluations. Returns how many were
        made (fewer than `budget`: nothing is left)."""
        epoch, made = self.policy.epoch, 0
        end = self._base + len(self._changes)
        for board in list(islice(reversed(self._boards.values()), boards)):
            pod, position = board.pod, max(board.pos, board.warmed, self._base)
            done: set[int] = set()
            while position < end:
                slot = self._changes[position - self._base]
                if slot not in done:
                    if made >= budget:
                        break
                    done.add(slot)
                    state = self._nodes[slot]
                    key = self._memo_key(state, self._classes([state], pod)[0], pod)
                    entry = self._memo.get(key)
                    if entry is None or entry.epoch != epoch or entry.fit_epoch != epoch:
                        made += 1
                    self._evaluate(state, key, pod, epoch, self.decide)
                position += 1
            board.warmed = position
            if made >= budget:
                break
        return made

    def refresh(self, budget: int) -> int:
        """Rescore up to `budget` stale results (most recently used boards first); how many were rescored."""
        epoch = self.policy.epoch
        done = 0
        for board in reversed(self._boards.values()):
            if done >= budget:
                break
            stale = np.flatnonzero((board.score > FAIL) & (board.epoch != epoch) & ~np.isnan(board.score))
            picked: list[int] = []
            for slot in stale.tolist():
                entry = board.entries[slot]
                if entry is None or entry.epoch != epoch:
                    if done >= budget:
                        break
                    done += 1
                picked.append(slot)
            self._refresh(board, picked, epoch)
        return done
