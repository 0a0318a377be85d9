"""The one node-selection loop: the extender's /filter, /prioritize and /bind and the trace replay place through it.

For a pod (`PodShape`) and candidate nodes (`NodeState`s), each node is fitted (`scheduler.fit`) and scored by the
node policy, through memos keyed by the node's GPU state with the UUIDs left out (`nodestate.gpu_state`), the
policy's context class of the node for this pod (free CPU and memory; `NodePolicy.context_bins`) and the pod's
signature (its requests, selectors and, for policies that use node context, CPU request). Nodes that share all
three are evaluated once; a node whose GPUs change gets a new key (`NodeState.touch`). Fits are shared across
context classes unless the policy's GPU order reads the context. A pod that names GPU UUIDs is evaluated per node.
The fit is stored with GPU indices; the chosen node's grants are rebuilt with its own UUIDs.

Comparison: the higher score wins, then the lower `NodeState.rank` (the extender's ledger ranks nodes by name, the
replay by the seed's random order; candidates must have distinct ranks); a policy with `tie_break = "random"`
draws uniformly among the best instead.

Learning policies: a score computed before the policy's `epoch` changed is stale. Decide mode (the extender's
default, and the replay) refreshes at most `refresh_budget` stale groups per request in node order, then rescores
the best-ranked stale ones until a current score is the best (at most `rescore_limit`), so a change of target
never stalls one request and the chosen node always has a current score. Score mode reports feasibility from the
stored fits and rescores at /prioritize.

Not thread-safe: callers serialise (the extender holds its ledger's lock).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vgpu.requests import ContainerRequest, Selectors
from vgpu.scheduler.fit import GPU_ORDERS, FitResult, GPUOrder, fit, grants_on
from vgpu.scheduler.nodestate import NodeState, gpu_state
from vgpu.scheduler.policies.base import NodePolicy, PodContext

__all__ = ["REFRESH_BUDGET", "RESCORE_LIMIT", "Choice", "Evaluation", "Placement", "PodShape"]

# Decide mode, after a change of learned target: stale groups refreshed per request in node order, then stale
# groups rescored best first until a current score is the best.
REFRESH_BUDGET = 2
RESCORE_LIMIT = 4
MEMO_LIMIT = 200_000  # evaluations kept before the memo starts over
KEY_LIMIT = 200_000  # distinct GPU states (and pod signatures) numbered before the numbering starts over
NO_CONTEXT = -(2**62)  # the context class of a node that reports no allocatable CPU and memory


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
    def per_node(self) -> bool:
        """The pod names GPU UUIDs, so its fit depends on more than the GPU state."""
        return bool(self.selectors.use_uuids or self.selectors.nouse_uuids)


@dataclass(slots=True)
class Evaluation:
    """A fit (GPU indices) and its score for one memo key; `epoch` is the policy epoch of the score (-1: none), or of
    the fit when it failed."""

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


def _better(score: float, rank: int, best: tuple[float, int] | None) -> bool:
    return best is None or score > best[0] or (score == best[0] and rank < best[1])


class Placement:
    """Fits, scores and compares nodes for pods under one node policy; see the module docstring."""

    def __init__(self, policy: NodePolicy, *, gpu_policy: str = "binpack", decide: bool = True,
                 refresh_budget: int = REFRESH_BUDGET, rescore_limit: int = RESCORE_LIMIT, seed: int = 0) -> None:
        self.policy = policy
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
        self.evaluations = 0  # fits computed (for benchmarks)

    # ------------------------------------------------------------------ keys

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
            sig = self._signatures[raw] = len(self._signatures)
        return sig

    def _sig(self, pod: PodShape) -> int:
        return pod.signature if pod.numbering == self._numbering else self._signature(pod.raw)

    def _key(self, state: NodeState) -> int:
        if state.key_tag == self._tag:
            return state.key
        raw = gpu_state(state.devices, state.usage)
        key = self._keys.get(raw)
        if key is None:
            if len(self._keys) >= KEY_LIMIT:
                self._keys = {}
                self._memo, self._fits = {}, {}
                self._tag = (id(self), self._tag[1] + 1)
            key = self._keys[raw] = len(self._keys)
        state.key, state.key_tag = key, self._tag
        return key

    def _classes(self, states: Sequence[NodeState], pod: PodShape,
                 free: tuple[np.ndarray, np.ndarray] | None) -> list[int] | None:
        """The policy's context class of each node for this pod; None when the policy uses no node context.
        `free`: the nodes' free CPU and memory as arrays, when the caller keeps them (all nodes report them)."""
        if not self.contextual:
            return None
        if free is not None:
            return [int(c) for c in self.policy.context_bins(free[0], free[1], pod.context)]
        classes = [NO_CONTEXT] * len(states)
        known = [i for i, s in enumerate(states) if s.cpu_allocatable is not None and s.memory_allocatable is not None]
        if known:
            cpu = np.array([states[i].cpu_free for i in known], dtype=np.int64)
            memory = np.array([states[i].memory_free for i in known], dtype=np.int64)
            for i, cls in zip(known, self.policy.context_bins(cpu, memory, pod.context).tolist()):
                classes[i] = int(cls)
        return classes

    def _memo_key(self, state: NodeState, cls: int, pod: PodShape) -> tuple[Any, int, int]:
        return (state.name if pod.per_node else self._key(state), cls, self._sig(pod))

    # ------------------------------------------------------------------ evaluation

    def _evaluate(self, state: NodeState, key: tuple[Any, int, int], pod: PodShape, epoch: int,
                  want_score: bool) -> Evaluation:
        entry = self._memo.get(key)
        node = state.context() if self.contextual else None
        if entry is None or entry.fit_epoch != epoch:  # a learning policy's GPU order may have changed too
            fit_key = key if self.policy.gpu_order_uses_context else (key[0], 0, key[2])
            known = self._fits.get(fit_key)
            if known is None or known[1] != epoch:
                order = self.policy.gpu_order(node, pod.context) or self.default_order
                known = (fit(state.devices, state.usage, pod.requests, pod.selectors, order), epoch)
                self.evaluations += 1
                if len(self._fits) >= MEMO_LIMIT:
                    self._fits = {}
                self._fits[fit_key] = known
            entry = Evaluation(known[0], epoch)
            if len(self._memo) >= MEMO_LIMIT:
                self._memo = {}
            self._memo[key] = entry
        if not entry.result.ok:
            entry.epoch = epoch  # nothing to score: current as soon as its fit is
        elif want_score and entry.epoch != epoch:
            entry.score = float(self.policy.score(state.devices, state.usage, pod.requests, entry.result, node=node,
                                                  pod=pod.context))
            entry.epoch = epoch
        return entry

    def evaluate(self, state: NodeState, pod: PodShape, want_score: bool = True) -> tuple[FitResult, float]:
        """Fit (with this node's grants) and score of a pod on one node, without choosing."""
        classes = self._classes([state], pod, None)
        key = self._memo_key(state, classes[0] if classes else 0, pod)
        entry = self._evaluate(state, key, pod, self.policy.epoch, want_score)
        return self.on_node(state, pod, entry.result), entry.score

    @staticmethod
    def on_node(state: NodeState, pod: PodShape, result: FitResult) -> FitResult:
        """`result` (possibly computed on another node in the same state) with this node's GPU UUIDs."""
        if not result.ok or not result.placement:
            return result
        return FitResult(ok=True, placement=result.placement,
                         assignment=grants_on(state.devices, pod.requests, result.placement))

    def _groups(self, states: Sequence[NodeState], pod: PodShape,
                free: tuple[np.ndarray, np.ndarray] | None = None) -> _Groups:
        """Candidates grouped by memo key, in the order of each group's first node (the hot part of a request)."""
        n = len(states)
        sig = self._sig(pod)
        classes = self._classes(states, pod, free)
        if pod.per_node:
            node_keys: list[Any] = [s.name for s in states]
            combined = np.arange(n, dtype=np.int64)
        else:
            tag, key_of = self._tag, self._key
            node_keys = [s.key if s.key_tag is tag else key_of(s) for s in states]
            combined = np.array(node_keys, dtype=np.int64)
        if classes is not None and not pod.per_node:
            _, dense = np.unique(np.asarray(classes, dtype=np.int64), return_inverse=True)
            combined = combined * (int(dense.max(initial=0)) + 1) + dense.reshape(-1)
        ranks = np.array([s.rank for s in states], dtype=np.int64)
        _, first, inverse = np.unique(combined, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        order = np.lexsort((ranks, inverse))  # by group, the lowest rank first within each
        ends = np.cumsum(np.bincount(inverse))
        starts = ends - np.bincount(inverse)
        by_first = np.argsort(first, kind="stable")  # groups in the order of their first node
        firsts = first[by_first].tolist()
        if pod.per_node:
            group_nodes: list[Any] = [node_keys[i] for i in firsts]
        else:
            group_nodes = np.array(node_keys, dtype=np.int64)[first[by_first]].tolist()
        group_classes = [0] * len(firsts) if classes is None else [classes[i] for i in firsts]
        return _Groups(
            keys=list(zip(group_nodes, group_classes, [sig] * len(firsts))),
            leads=order[starts[by_first]].tolist(),
            starts=starts[by_first].tolist(),
            ends=ends[by_first].tolist(),
            order=order.tolist(),
        )

    def scores(self, states: Sequence[NodeState], pod: PodShape) -> list[float | None]:
        """Current score of the pod on each node (None where it does not fit)."""
        epoch = self.policy.epoch
        out: list[float | None] = [None] * len(states)
        groups = self._groups(states, pod)
        for g, (key, lead) in enumerate(zip(groups.keys, groups.leads)):
            entry = self._memo.get(key)
            if entry is None or entry.epoch != epoch:
                entry = self._evaluate(states[lead], key, pod, epoch, True)
            if entry.result.ok:
                for i in groups.members(g):
                    out[i] = entry.score
        return out

    def choose(self, states: Sequence[NodeState], pod: PodShape,
               free: tuple[np.ndarray, np.ndarray] | None = None, explain: bool = True) -> Choice:
        """Feasible nodes, failure reasons and, in decide mode, the best node for the pod. `free`: the nodes' free
        CPU and memory, when the caller keeps them as arrays (the replay); `explain=False` leaves out the failure
        reasons (the replay needs only the choice)."""
        epoch = self.policy.epoch
        decide = self.decide
        refresh = self.refresh_budget
        choice = Choice()
        groups = self._groups(states, pod, free)
        ok: dict[int, Evaluation] = {}  # group -> its evaluation, for the groups that fit
        best: tuple[float, int] | None = None  # (score, rank of the group's lead)
        best_group = -1
        stale: list[tuple[float, int, int]] = []  # (-score, lead rank, group) of groups scored on an earlier target

        def fail(g: int, result: FitResult) -> None:
            if explain:
                reasons = choice.unresolvable if result.unresolvable else choice.failed
                for i in groups.members(g):
                    reasons[states[i].name] = result.reason

        memo_get = self._memo.get
        for g, (key, lead) in enumerate(zip(groups.keys, groups.leads)):
            entry = memo_get(key)
            if entry is None:
                entry = self._evaluate(states[lead], key, pod, epoch, decide)
            elif decide and entry.epoch != epoch and (entry.epoch < 0 or not entry.result.ok or refresh > 0):
                refresh -= entry.epoch >= 0 and entry.result.ok  # refitting a failed fit is not a rescore
                entry = self._evaluate(states[lead], key, pod, epoch, decide)
            if not entry.result.ok:
                fail(g, entry.result)
                continue
            ok[g] = entry
            if not decide or (best is not None and entry.score < best[0]):
                continue  # a current score already beats it (a stale one too: it is not rescored)
            rank = states[lead].rank
            if entry.epoch != epoch:
                stale.append((-entry.score, rank, g))
            elif _better(entry.score, rank, best):
                best, best_group = (entry.score, rank), g
        if stale:  # a group ranked on an earlier target's score wins only once rescored with the current one
            heapq.heapify(stale)
            rescored = 0
            while stale:
                negated, rank, g = heapq.heappop(stale)
                if best is not None and (rescored >= self.rescore_limit or not _better(-negated, rank, best)):
                    break
                rescored += 1
                entry = self._evaluate(states[groups.leads[g]], groups.keys[g], pod, epoch, True)
                if not entry.result.ok:  # a greedy multi-container fit may fail in the new GPU order
                    del ok[g]
                    fail(g, entry.result)
                    continue
                ok[g] = entry
                if _better(entry.score, rank, best):
                    best, best_group = (entry.score, rank), g
        if not decide:
            choice.feasible = [states[i] for i in sorted(i for g in ok for i in groups.members(g))]
            return choice
        if best is None:
            return choice
        if self.policy.tie_break == "random":
            tied = sorted((i, g) for g, entry in ok.items() if entry.epoch == epoch and entry.score == best[0]
                          for i in groups.members(g))
            index, best_group = tied[self.rng.randrange(len(tied))]
        else:
            index = groups.leads[best_group]
        chosen = states[index]
        choice.best, choice.best_index = chosen, index
        choice.result = self.on_node(chosen, pod, ok[best_group].result)
        choice.feasible = [chosen]
        return choice


@dataclass(slots=True)
class _Groups:
    """Candidate nodes grouped by memo key, in the order of each group's first node: group g's members are
    `order[starts[g]:ends[g]]`, lowest rank first; `leads[g]` is the first of them (it breaks ties for the group)."""

    keys: list[tuple[Any, int, int]]
    leads: list[int]
    starts: list[int]
    ends: list[int]
    order: list[int]

    def members(self, g: int) -> list[int]:
        """The members of group g."""
        return self.order[self.starts[g]:self.ends[g]]
