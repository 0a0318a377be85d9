"""Preemption of GPU shares by the extender: the victims, the node, the evictions (docs/preemption.md).

kube-scheduler's own preemption cannot free GPU room the extender manages: its dry run
(pkg/scheduler/framework/preemption/preemption.go, `SelectVictimsOnNode`) runs the in-tree filters only, which do not
see GPU memory or cores, so every node "fits" without victims and is dropped ("expected at least one victim pod on
node"); an extender's preemptVerb is then never called. So the extender preempts by itself, at /filter, for a pod
that fits none of the nodes it is asked about:

- **Victims** on a node are pods charged there with a strictly lower priority (never a pod of equal or higher
  priority, never a nomination). The pod's GPUs are chosen cheapest first, a GPU's cost being the victims it needs
  alone, compared as upstream's `pickOneNodeForPreemption` compares nodes after PodDisruptionBudget violations: the
  highest victim priority, then the number of victims, then the sum of their priorities. Only victims on the GPUs
  the pod takes are considered, and each is then reprieved, the most important first, when the pod still fits
  without evicting it (as upstream reprieves), so no victim is evicted that the pod does not need.
- **Node**: the cheapest plan by the same order, ties by the placement's node order. As upstream's DefaultPreemption
  (`GetOffsetAndNumCandidates`, `DryRunPreemption`), the search starts at a random node and stops once it has
  `max(10 % of the nodes, 100)` plans, so one pod's planning costs the same on 5,000 nodes as on 1,000.
- **Evictions** go through the Eviction API (policy/v1 `pods/eviction`, pkg/registry/core/pod/storage/eviction.go),
  so PodDisruptionBudgets hold: every victim of a plan is first evicted as a dry run, and a plan with a refused
  victim is passed over for the next cheapest (at most `PLANS_TRIED`). Then the room is held for the pod in the
  ledger (a NOMINATED charge, counted as used while the victims are still charged too) and the victims are evicted
  from a thread of their own; each gets a `Preempted` event naming the pod. The nomination lasts the victims'
  longest termination grace period plus `NOMINATION_MARGIN` seconds.
- While the victims end, /filter answers the pod "waiting for N preempted pods to end" on that node; once they
  are gone its nomination gives way to a normal placement. A pod whose `preemptionPolicy` is `Never` never preempts;
  a pod is planned for at most once per `REPLAN_SECONDS`.
- **A budget that blocks every plan**: the pod is told once (a `PreemptionBlocked` event naming the refusals) and
  planned for again by the extender itself every `BLOCKED_RETRY_SECONDS` (`Preemptor.retry_blocked`), not only when
  kube-scheduler next asks: kube-scheduler retries a pod an extender turned down only on a cluster event it watches
  or after five minutes (`DefaultPodMaxInUnschedulablePodsDuration`), and a budget's change is neither. Once the
  evictions are allowed they start, and the victims' deletion brings the pod back to kube-scheduler's queue.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpu.assignment import Assignment
from vgpu.inventory import GPUDevice
from vgpu.kube.eviction import EvictionRefused
from vgpu.requests import ContainerRequest, Selectors
from vgpu.scheduler.fit import FitResult, GPUOrder, GPUUsage, fit, gpu_takes
from vgpu.scheduler.ledger import Charge, ChargeState, Ledger
from vgpu.scheduler.nodestate import NodeState

__all__ = ["BLOCKED_RETRY_SECONDS", "NOMINATION_MARGIN", "PLANS_TRIED", "REPLAN_SECONDS", "WAITING", "EvictionRefused",
           "Evictor", "Plan", "Preemptor", "plan_on_node", "plan_removal"]

log = logging.getLogger(__name__)

NOMINATION_MARGIN = 30.0  # seconds a nomination outlives the victims' longest grace period
PLANS_TRIED = 3  # plans whose victims are tried (dry run) before the pod waits for the next round
REPLAN_SECONDS = 5.0  # a pod that found no plan is planned for again after this long at the earliest
BLOCKED_RETRY_SECONDS = 10.0  # a pod whose every plan a budget refused is planned for again this often
# what /filter says of a nominated node without a plan of ours behind it (a consolidation hold, vgpu.holds)
WAITING = "waiting for the pods evicted to make room for this pod to end"
DEFAULT_GRACE = 30  # spec.terminationGracePeriodSeconds when the pod does not say
_NO_VICTIM = (-(2**63), 0, 0)  # the cost of a GPU that needs no victim
_KEPT, _KEPT_SECONDS = 10_000, 600.0  # plans remembered before old ones are dropped
# upstream's DefaultPreemptionArgs defaults: minCandidateNodesPercentage, minCandidateNodesAbsolute
CANDIDATES_PERCENT, CANDIDATES_MIN = 10, 100


# evictor(namespace, name, uid, dry_run): POST pods/eviction; raises EvictionRefused. A pod already gone is success.
Evictor = Callable[[str, str, str, bool], None]
# lookup(namespace, name) -> pod dict or None (the pod cache)
Lookup = Callable[[str, str], "Mapping[str, Any] | None"]
EventSink = Callable[[Mapping[str, str], str, str, str], None]


@dataclass(frozen=True, slots=True)
class Plan:
    """The pods to evict on one node so that the pod fits there, and the GPUs it will then take."""

    node: str
    victims: tuple[Charge, ...]
    assignment: Assignment
    cost: tuple[int, int, int]  # highest victim priority, number of victims, sum of their priorities

    def describe(self) -> str:
        """"2 pods of lower priority (ns/a, ns/b)"."""
        names = ", ".join(f"{v.namespace}/{v.name}" for v in self.victims)
        return f"{len(self.victims)} pod{'s' if len(self.victims) != 1 else ''} of lower priority ({names})"


def _cost(victims: Sequence[Charge]) -> tuple[int, int, int]:
    if not victims:
        return _NO_VICTIM
    priorities = [v.priority for v in victims]
    return max(priorities), len(priorities), sum(priorities)


def _without(index: Mapping[str, int], usage: Sequence[GPUUsage], charges: Sequence[Charge]) -> list[GPUUsage]:
    """A copy of `usage` (GPUs numbered by `index`) with the charges taken off."""
    out = [GPUUsage(u.shares, u.memory, u.cores) for u in usage]
    for charge in charges:
        for uuid, memory, cores in charge.grants:
            i = index.get(uuid)
            if i is not None:
                out[i].sub(memory, cores)
    return out


def _importance(charge: Charge) -> tuple[int, str, str]:
    """Most important first: the order victims are reprieved in."""
    return -charge.priority, charge.namespace, charge.name


def _reprieve(victims: list[Charge], still_fits: Callable[[list[Charge]], bool]) -> list[Charge]:
    """The victims left after giving back, most important first, each one the pod does not need."""
    kept = list(victims)
    for victim in sorted(victims, key=_importance):
        trial = [c for c in kept if c is not victim]
        if still_fits(trial):
            kept = trial
    return kept


def _gpu_victims(device: GPUDevice, used: GPUUsage, victims: list[Charge], ask: ContainerRequest,
                 selectors: Selectors) -> list[Charge] | None:
    """The victims this GPU needs on its own to take one container of `ask` (None: it cannot), reprieved as
    `_reprieve` does, by adding each victim's share of this GPU back in turn."""
    held = {}
    for charge in victims:
        amount = GPUUsage()
        for uuid, memory, cores in charge.grants:
            if uuid == device.uuid:
                amount.add(memory, cores)
        held[id(charge)] = amount
    amounts = held.values()
    left = GPUUsage(used.shares - sum(a.shares for a in amounts), used.memory - sum(a.memory for a in amounts),
                    used.cores - sum(a.cores for a in amounts))
    if not gpu_takes(device, left, ask, selectors):
        return None
    kept = []
    for charge in sorted(victims, key=_importance):
        amount = held[id(charge)]
        back = GPUUsage(left.shares + amount.shares, left.memory + amount.memory, left.cores + amount.cores)
        if gpu_takes(device, back, ask, selectors):
            left = back
        else:
            kept.append(charge)
    return kept


def plan_on_node(state: NodeState, charges: Sequence[Charge], requests: Sequence[ContainerRequest],
                 selectors: Selectors, priority: int, order: GPUOrder) -> Plan | None:
    """The cheapest victims on this node that let the pod fit, or None when evicting every pod of lower priority
    would not make room (or there is none). `charges` are the node's; `order` the placement's GPU order."""
    lower = [c for c in charges if c.priority < priority and c.state != ChargeState.NOMINATED]
    return plan_removal(state, lower, requests, selectors, order, _cost)


def plan_removal(state: NodeState, lower: Sequence[Charge], requests: Sequence[ContainerRequest],
                 selectors: Selectors, order: GPUOrder,
                 cost: Callable[[Sequence[Charge]], tuple[int, int, int]]) -> Plan | None:
    """The pods of `lower` (charged on this node) whose removal lets the pod fit, cheapest GPUs first by `cost` of
    the pods each GPU needs alone, none that the pod does not need; None when removing them all would not make room
    or when it fits without removing any. Preemption's victims (`plan_on_node`) and consolidation's moves
    (vgpu.planning.consolidate) are both chosen here."""
    devices, usage, index = state.devices, state.usage, state.index
    if not lower or not devices:
        return None
    on_gpu: list[list[Charge]] = [[] for _ in devices]
    for charge in lower:
        for i in sorted({index[u] for u, _, _ in charge.grants if u in index}):
            on_gpu[i].append(charge)
    largest = max(requests, key=lambda r: (r.memory, r.memory_percent, r.cores))
    ask = dataclasses.replace(largest, count=1)
    needs = [_gpu_victims(device, usage[i], on_gpu[i], ask, selectors) for i, device in enumerate(devices)]
    costs = [None if need is None else cost(need) for need in needs]
    worst = (2**63, 0, 0)

    def cheapest_first(devs: Sequence[GPUDevice], used: Sequence[GPUUsage], request: ContainerRequest,
                       candidates: list[int]) -> list[int]:
        return sorted(order(devs, used, request, candidates), key=lambda i: costs[i] or worst)

    def fitted(gone: list[Charge]) -> FitResult:
        return fit(devices, _without(index, usage, gone), requests, selectors, cheapest_first)

    first = fitted(list(lower))
    if not first.ok:
        return None
    taken = {i for indices in first.placement for i in indices}
    victims = [c for c in lower if any(index.get(u) in taken for u, _, _ in c.grants)]
    # what each taken GPU needs on its own is usually enough (each victim is then checked once more); else all
    needed = {id(c) for i in taken for c in needs[i] or ()}
    likely = [c for c in victims if id(c) in needed]
    kept = _reprieve(likely if len(likely) < len(victims) and fitted(likely).ok else victims,
                     lambda gone: fitted(gone).ok)
    if not kept:  # it fits without evicting anyone: not a preemption (the placement would have taken it)
        return None
    kept.sort(key=lambda c: (c.priority, c.namespace, c.name))  # evicted least important first
    return Plan(state.name, tuple(kept), fitted(kept).assignment, cost(kept))


class Preemptor:
    """Plans preemptions for the extender and carries them out; see the module docstring."""

    def __init__(self, ledger: Ledger, evictor: Evictor, lookup: Lookup, events: EventSink,
                 clock: Callable[[], float] = time.monotonic,
                 counted: Callable[[str], None] = lambda outcome: None) -> None:
        self.ledger = ledger
        self.evictor = evictor
        self.lookup = lookup
        self.events = events
        self.clock = clock
        self.counted = counted  # called with "evicted" or "refused" after each real eviction
        # per pod (ledger key): when it was last planned for, and the plan carried out (None: none found); an entry
        # goes with the pod's deletion or placement, and entries older than `_KEPT_SECONDS` when over `_KEPT`
        self._planned: dict[str, tuple[float, Plan | None]] = {}
        self._blocked: dict[str, str] = {}  # per pod: why its preemption was last refused (said once per change)
        self._retries: dict[str, Callable[[], Any]] = {}  # per blocked pod: how to plan for it again
        self._lock = threading.Lock()
        self.random = random.Random()

    def due(self, key: str) -> bool:
        """Whether the pod may be planned for now (not within `REPLAN_SECONDS` of its last plan)."""
        with self._lock:
            last = self._planned.get(key)
        return last is None or self.clock() - last[0] >= REPLAN_SECONDS

    def started(self, key: str, plan: Plan | None) -> None:
        """Record that the pod was planned for, with the plan carried out (None: none was)."""
        now = self.clock()
        with self._lock:
            self._planned[key] = (now, plan)
            self._retries.pop(key, None)  # planned again: `blocked` names a new retry if it is still due
            if len(self._planned) > _KEPT:
                for old in [k for k, (when, _) in self._planned.items() if now - when > _KEPT_SECONDS]:
                    del self._planned[old]

    def forget(self, key: str) -> None:
        """The pod was placed or deleted."""
        with self._lock:
            self._planned.pop(key, None)
            self._blocked.pop(key, None)
            self._retries.pop(key, None)

    def blocked(self, key: str, why: str, retry: Callable[[], Any]) -> bool:
        """Record why the pod's preemption was refused, and `retry`, which plans for it again (`retry_blocked`);
        True when the reason differs from what was recorded last (the reason to tell the pod), False for the same
        reason again."""
        with self._lock:
            if len(self._retries) < _KEPT:
                self._retries[key] = retry
            if self._blocked.get(key) == why:
                return False
            self._blocked[key] = why
            if len(self._blocked) > _KEPT:  # pods that went without being forgotten: keep the newest half
                for old in list(self._blocked)[: _KEPT // 2]:
                    del self._blocked[old]
            return True

    def retry_blocked(self) -> int:
        """Plan again for each blocked pod last planned for `BLOCKED_RETRY_SECONDS` ago or more (the extender's
        leader calls this every second); how many were planned for. A failing retry is logged and dropped."""
        now = self.clock()
        with self._lock:
            due = [(key, retry) for key, retry in self._retries.items()
                   if now - self._planned.get(key, (-float("inf"), None))[0] >= BLOCKED_RETRY_SECONDS]
        for key, retry in due:
            try:
                retry()
            except Exception:  # one pod's failing retry must not stop the others'
                log.exception("event=preemption_retry_failed pod=%s", key)
                with self._lock:
                    self._retries.pop(key, None)
        return len(due)

    def waiting_message(self, key: str) -> str:
        """What /filter says of the node the pod is nominated on, while its victims end (`WAITING` when no plan of
        this preemptor is behind the nomination)."""
        with self._lock:
            entry = self._planned.get(key)
        plan = entry[1] if entry is not None else None
        if plan is None:
            return WAITING
        with self.ledger.lock:
            left = sum(1 for v in plan.victims if v.uid in self.ledger.charges)
        return f"waiting for {left} of {len(plan.victims)} pods preempted for this pod to end on {plan.node}"

    def nomination_ttl(self, plan: Plan) -> float:
        """How long the room is held: the victims' longest termination grace period plus the margin."""
        return self.grace(plan) + NOMINATION_MARGIN

    def plans(self, states: Sequence[NodeState], requests: Sequence[ContainerRequest], selectors: Selectors,
              priority: int, order: GPUOrder) -> list[Plan]:
        """The plans of up to `max(10 % of the nodes, 100)` nodes, from a random one on, cheapest first (ties: the
        order of `states`). Each node is planned under the ledger's lock in turn (callers do not hold it), so that
        other requests get through between nodes; a plan is checked again before it is carried out."""
        wanted = max(len(states) * CANDIDATES_PERCENT // 100, CANDIDATES_MIN)
        offset = self.random.randrange(len(states)) if states else 0
        found = []
        for step in range(len(states)):
            position = (offset + step) % len(states)
            state = states[position]
            with self.ledger.lock:
                plan = plan_on_node(state, self.ledger.on_node_charges(state.name), requests, selectors, priority,
                                    order)
            if plan is not None:
                found.append((plan.cost, position, plan))
                if len(found) >= wanted:
                    break
        found.sort(key=lambda entry: (entry[0], entry[1]))
        return [plan for _, _, plan in found]

    def admissible(self, plan: Plan) -> str:
        """"" when the API server would evict every victim of the plan now (a dry run), else why not."""
        for victim in plan.victims:
            try:
                self.evictor(victim.namespace, victim.name, victim.uid, True)
            except EvictionRefused as exc:
                return f"cannot evict {victim.namespace}/{victim.name}: {exc}"
        return ""

    def grace(self, plan: Plan) -> float:
        """The victims' longest termination grace period, in seconds."""
        longest = 0
        for victim in plan.victims:
            pod = self.lookup(victim.namespace, victim.name) or {}
            value = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE)
            if isinstance(value, int) and not isinstance(value, bool):
                longest = max(longest, value)
        return float(longest)

    def carry_out(self, plan: Plan, pod: Mapping[str, str]) -> threading.Thread:
        """Evict the plan's victims from a thread of their own; the nomination is released if one is refused."""
        thread = threading.Thread(target=self._evict, args=(plan, dict(pod)), name="vgpu-preemption", daemon=True)
        thread.start()
        return thread

    def _evict(self, plan: Plan, pod: dict[str, str]) -> None:
        for victim in plan.victims:
            ref = {"namespace": victim.namespace, "name": victim.name, "uid": victim.uid}
            try:
                self.evictor(victim.namespace, victim.name, victim.uid, False)
            except EvictionRefused as exc:
                self.counted("refused")
                message = f"preemption on {plan.node} stopped: cannot evict {victim.namespace}/{victim.name}: {exc}"
                log.warning("event=preemption_failed pod=%s/%s node=%s reason=%r", pod["namespace"], pod["name"],
                            plan.node, str(exc))
                self.events(pod, "Warning", "PreemptionFailed", message)
                held = self.ledger.charges.get(pod["uid"] or f"{pod['namespace']}/{pod['name']}")
                if held is not None and held.state == ChargeState.NOMINATED:
                    self.ledger.release(held.uid)
                return
            self.counted("evicted")
            log.info("event=preempted victim=%s/%s pod=%s/%s node=%s", victim.namespace, victim.name,
                     pod["namespace"], pod["name"], plan.node)
            self.events(ref, "Normal", "Preempted", f"Preempted by pod {pod['uid']} on node {plan.node}")
