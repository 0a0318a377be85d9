"""`vgpu consolidate`: the fewest moves that make room for the pending pods that fit nowhere, or free whole GPUs.

A move is the eviction of a running vGPU pod whose controller re-creates it, so that the extender places the
replacement elsewhere. The plan is made on a `Simulation` of the cluster as it is (the running pods where they
are, the pending pods that fit already placed as the extender would place them), under the extender's policy:

1. Targets: each pending pod that fits nowhere, in kube-scheduler's queue order; or, with `free_gpus` N, whole
   GPUs until N are wholly free (those already free count and are kept free).
2. On every node the pod could use (kube-scheduler's filters, scheduler.planning.simulation), the pods to move are
   chosen as preemption chooses its victims (`scheduler.preemption.plan_removal`: the GPUs that need the fewest
   moves first, no move the pod does not need), among the movable pods (`blocker`): owned by a controller that
   re-creates them elsewhere (never a bare pod, a DaemonSet's or a node's static pod), not annotated
   `vgpu-sharing.io/no-consolidate: "true"`, running for at least `min_age` seconds, of no higher priority than
   the pod the room is for, and with every PodDisruptionBudget that selects them still allowing a disruption
   (`status.disruptionsAllowed`, less the moves already planned).
3. The room is held for the pod (as `vgpu consolidate --execute` holds it through the node annotation the extender
   reads) and every moved pod is placed again by the policy; a node whose moved pods do not all find room is no
   plan (no move leaves a pod waiting). Nodes are tried cheapest first (the fewest moves, then the lowest highest
   priority moved, then the node order) and the first that holds is the step.
4. The chosen step is applied to the simulation and the next target is planned on the result; a pod is moved at
   most once. `max_moves` bounds the moves of the whole plan.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vgpu.assignment import Assignment
from vgpu.planning.simulation import Placed, Simulation
from vgpu.planning.snapshot import ClusterSnapshot, SnapshotPod, whole_gpu_request
from vgpu.requests import Selectors
from vgpu.scheduler.constraints import expression_holds
from vgpu.scheduler.fit import GPU_ORDERS
from vgpu.scheduler.ledger import Charge, ChargeState
from vgpu.scheduler.nodestate import flat_grants
from vgpu.scheduler.preemption import plan_removal

__all__ = ["ConsolidationPlan", "Move", "Step", "blocker", "plan_consolidation", "selects"]

LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")  # a label selector's (Gt and Lt are node selectors')
UNMOVABLE_OWNERS = {"DaemonSet": "a DaemonSet's pod comes back on the same node",
                    "Node": "a static pod belongs to its node"}


@dataclass(frozen=True)
class Move:
    """One pod to evict from `source`, and where the plan expects its replacement (node, GPUs)."""

    pod: SnapshotPod
    source: str
    target: str
    gpus: tuple[str, ...]
    assignment: Assignment = ()  # its grants there, as the plan placed it


@dataclass
class Step:
    """Moves that make room on `node` for `beneficiary` (None: a GPU freed for `--free-gpus`), held as `hold`."""

    beneficiary: SnapshotPod | None
    node: str
    hold: Assignment
    moves: list[Move]

    @property
    def gpus(self) -> tuple[str, ...]:
        """The GPUs whose room is held."""
        return tuple(dict.fromkeys(g.uuid for segment in self.hold for g in segment))

    def summary(self) -> dict[str, Any]:
        """The JSON form of the step."""
        return {"for": self.beneficiary.ref if self.beneficiary else None, "node": self.node, "gpus": list(self.gpus),
                "moves": [{"pod": m.pod.ref, "from": m.source, "to": m.target, "gpus": list(m.gpus)}
                          for m in self.moves]}


@dataclass
class ConsolidationPlan:
    """The steps, what is left without a plan and why, and the expected result."""

    steps: list[Step]
    unmet: list[tuple[str, str]]  # (pod or "GPU n", why no plan)
    fitting: list[str]  # pending pods that fit without any move
    gpus: int
    gpus_free_before: int
    gpus_free_after: int
    pending: int
    pending_placed_before: int
    pending_placed_after: int
    policy: str
    held: list[str] = field(default_factory=list)  # GPUs already free, kept free (`--free-gpus`)

    @property
    def moves(self) -> int:
        """Pods moved over all steps."""
        return sum(len(step.moves) for step in self.steps)

    def summary(self) -> dict[str, Any]:
        """The JSON form of the plan (`vgpu consolidate --json`)."""
        return {"policy": self.policy, "moves": self.moves, "steps": [s.summary() for s in self.steps],
                "unmet": [{"target": t, "why": w} for t, w in self.unmet], "fitting": self.fitting,
                "gpus": self.gpus, "gpus_free_before": self.gpus_free_before, "gpus_free_after": self.gpus_free_after,
                "pending": self.pending, "pending_placed_before": self.pending_placed_before,
                "pending_placed_after": self.pending_placed_after}


def selects(selector: Any, labels: Mapping[str, str]) -> bool:
    """Whether a label selector (matchLabels, matchExpressions) selects these labels; a null selector selects
    nothing, an empty one everything (policy/v1 PodDisruptionBudget)."""
    if not isinstance(selector, Mapping):
        return False
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    return all(isinstance(e, Mapping) and e.get("operator") in LABEL_OPERATORS and expression_holds(e, labels)
               for e in selector.get("matchExpressions") or ())


def blocker(pod: SnapshotPod, now: float, min_age: float) -> str:
    """Why the pod may never be moved ("" when it may, budgets and priorities aside)."""
    if pod.controller is None:
        return "a bare pod (no controller re-creates it)"
    if pod.controller[0] in UNMOVABLE_OWNERS:
        return UNMOVABLE_OWNERS[pod.controller[0]]
    if pod.opted_out:
        return "opted out (vgpu-sharing.io/no-consolidate)"
    if now - pod.started < min_age:
        return f"running for less than {min_age:g} s"
    return ""


class _Budgets:
    """What each PodDisruptionBudget still allows, less the moves planned."""

    def __init__(self, budgets: Sequence[Mapping[str, Any]]) -> None:
        self.budgets = []
        for budget in budgets:
            meta = budget.get("metadata") or {}
            allowed = (budget.get("status") or {}).get("disruptionsAllowed")
            self.budgets.append([str(meta.get("namespace") or "default"), str(meta.get("name") or ""),
                                 (budget.get("spec") or {}).get("selector"),
                                 allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0])

    def covering(self, pod: SnapshotPod) -> list[list[Any]]:
        return [b for b in self.budgets if b[0] == pod.namespace and selects(b[2], pod.labels)]

    def refusal(self, pods: Sequence[SnapshotPod]) -> str:
        """Why the budgets do not let all of these pods go ("" when they do)."""
        taken: dict[int, int] = {}
        for pod in pods:
            for budget in self.covering(pod):
                taken[id(budget)] = taken.get(id(budget), 0) + 1
                if taken[id(budget)] > budget[3]:
                    return f"PodDisruptionBudget {budget[0]}/{budget[1]} allows {budget[3]} more disruption(s)"
        return ""

    def spend(self, pods: Sequence[SnapshotPod]) -> None:
        for pod in pods:
            for budget in self.covering(pod):
                budget[3] -= 1


def _moves_cost(victims: Sequence[Charge]) -> tuple[int, int, int]:
    """Fewest moves, then the lowest priorities moved."""
    if not victims:
        return 0, -(2**62), 0
    return len(victims), max(v.priority for v in victims), sum(v.priority for v in victims)


class _Planner:
    def __init__(self, simulation: Simulation, budgets: _Budgets, now: float, min_age: float, max_moves: int,
                 gpu_policy: str) -> None:
        self.sim = simulation
        self.budgets = budgets
        self.now, self.min_age = now, min_age
        self.moves_left = max_moves
        self.moved: set[str] = set()
        self.order = GPU_ORDERS[gpu_policy]

    def _movable(self, placed: Placed, priority: int | None) -> bool:
        pod = placed.pod
        return (pod.uid not in self.moved and not pod.uid.startswith("consolidate/") and not blocker(
            pod, self.now, self.min_age) and (priority is None or pod.priority <= priority)
            and not self.budgets.refusal([pod]))

    def step_for(self, pod: SnapshotPod, priority: int | None) -> tuple[Step | None, str]:
        """The cheapest step that makes room for `pod` (and why there is none): every node's moves are found
        first, then tried cheapest first (the moved pods placed again) until one holds."""
        why = "no node has movable pods whose moves would make room"
        anywhere = replace(pod, cpu=0, memory=0)  # the CPU and memory the moves free are checked after
        plans = []
        for state in self.sim.candidates(anywhere):
            charges = [Charge(p.pod.uid, p.pod.namespace, p.pod.name, state.name, p.grants, p.pod.assignment,
                              ChargeState.OBSERVED, priority=p.pod.priority)
                       for p in self.sim.on_node(state.name) if self._movable(p, priority)]
            plan = plan_removal(state, charges, pod.requests, pod.selectors, self.order, _moves_cost)
            if plan is None:
                continue
            if len(plan.victims) > self.moves_left:
                why = f"every plan needs more moves than the {self.moves_left} left (--max-moves)"
                continue
            plans.append((plan.cost, state.rank, state.name, plan))
        plans.sort(key=lambda item: item[:3])
        for _, _, node, plan in plans:
            step, reason = self._try(pod, node, plan.assignment, {c.uid for c in plan.victims})
            if step is not None:
                self._apply(step, pod)
                return step, ""
            why = reason
        return None, why

    def _try(self, pod: SnapshotPod, node: str, hold: Assignment, victims: set[str]) -> tuple[Step | None, str]:
        """Move the victims, hold the room and place the moved pods again; undone before returning."""
        sim = self.sim
        gone = [p for p in sim.on_node(node) if p.pod.uid in victims]
        refusal = self.budgets.refusal([p.pod for p in gone])
        if refusal:
            return None, refusal
        for placed in gone:
            sim.remove(placed)
        state = sim.by_name[node]
        undo: list[Placed] = []
        try:
            if ((state.cpu_free is not None and state.cpu_free < pod.cpu)
                    or (state.memory_free is not None and state.memory_free < pod.memory)):
                return None, f"moving pods off {node} leaves too little CPU or memory for the pod"
            undo.append(sim.put(pod, node, flat_grants(hold)))
            moves = []
            for placed in sorted(gone, key=lambda p: (-p.pod.gpus, p.pod.created)):
                again = sim.place(placed.pod)
                if again is None:
                    return None, f"{placed.pod.ref} would find no room elsewhere"
                undo.append(again)
                assignment = again.result.assignment if again.result is not None else ()
                moves.append(Move(placed.pod, node, again.state.name,
                                  tuple(dict.fromkeys(g[0] for g in again.grants)), assignment))
            return Step(None if pod.uid.startswith("consolidate/") else pod, node, hold, moves), ""
        finally:
            for placed in reversed(undo):
                sim.remove(placed)
            for placed in gone:
                sim.put(placed.pod, placed.state.name, placed.grants)

    def _apply(self, step: Step, holder: SnapshotPod) -> None:
        """Carry the step out on the simulation, as the trial did: the moved pods off, the room held for `holder`,
        the moved pods placed again (the same choices: placement is deterministic)."""
        sim = self.sim
        uids = {m.pod.uid for m in step.moves}
        for placed in [p for p in sim.on_node(step.node) if p.pod.uid in uids]:
            sim.remove(placed)
        sim.put(holder, step.node, flat_grants(step.hold))
        for move in step.moves:
            again = sim.place(move.pod)
            if again is None or again.state.name != move.target:
                raise AssertionError(f"{move.pod.ref} was placed otherwise than in its trial")
        self.moved |= uids
        self.budgets.spend([m.pod for m in step.moves])
        self.moves_left -= len(step.moves)


def _free_gpus(simulation: Simulation) -> list[tuple[str, str]]:
    """(node, GPU UUID) of the healthy GPUs no pod shares, on nodes that take vGPU pods."""
    return [(state.name, device.uuid) for state in simulation.states if not state.error
            for device, used in zip(state.devices, state.usage) if device.healthy and used.shares == 0]


def _placed_pending(snapshot: ClusterSnapshot, simulation: Simulation) -> int:
    return sum(1 for p in snapshot.pending if p.uid in simulation.where)


def plan_consolidation(snapshot: ClusterSnapshot, policy: str = "fragaware", *, now: float, min_age: float = 0.0,
                       free_gpus: int | None = None, max_moves: int = 20, gpu_policy: str = "binpack",
                       targets: Collection[str] | None = None,
                       on_target: Callable[[str], None] | None = None) -> ConsolidationPlan:
    """The plan (module docstring); `targets`, when given, the UIDs of the only pending pods room is made for (the
    others are placed where they fit, and otherwise left waiting); `on_target(name)` is called as each target is
    planned for (progress)."""
    simulation = Simulation(snapshot, policy, True, gpu_policy=gpu_policy)
    gpus = sum(1 for s in simulation.states if not s.error for d in s.devices if d.healthy)
    free_before = len(_free_gpus(simulation))
    planner = _Planner(simulation, _Budgets(snapshot.budgets), now, min_age, max_moves, gpu_policy)
    steps: list[Step] = []
    unmet: list[tuple[str, str]] = []
    fitting: list[str] = []
    held: list[str] = []
    if free_gpus is None:
        for pod in snapshot.pending:
            if on_target:
                on_target(pod.ref)
            if simulation.place(pod) is not None:
                fitting.append(pod.ref)
                continue
            if targets is not None and pod.uid not in targets:
                continue
            if planner.moves_left <= 0:
                unmet.append((pod.ref, "no moves left (--max-moves)"))
                continue
            step, why = planner.step_for(pod, pod.priority)
            if step is None:
                unmet.append((pod.ref, why))
            else:
                steps.append(step)
        placed_before = len(fitting)
    else:
        placed_before = 0
        for n, (node, uuid) in enumerate(_free_gpus(simulation)[:free_gpus]):
            simulation.put(_gpu_holder(n, uuid), node, ((uuid, simulation.by_name[node].devices[
                simulation.by_name[node].index[uuid]].memory, 100),))
            held.append(uuid)
        for n in range(len(held), free_gpus):
            if on_target:
                on_target(f"GPU {n + 1}")
            step, why = planner.step_for(_gpu_holder(n, ""), None)
            if step is None:
                unmet.append((f"GPU {n + 1} of {free_gpus}", why))
                break
            steps.append(step)
    stand_ins = len(held) + sum(len(s.gpus) for s in steps if s.beneficiary is None)
    free_after = len(_free_gpus(simulation)) + stand_ins  # the GPUs held for `--free-gpus` are free once it is done
    return ConsolidationPlan(steps, unmet, fitting, gpus, free_before, free_after, len(snapshot.pending),
                             placed_before, placed_before + len(steps), policy, held)


def _gpu_holder(n: int, uuid: str) -> SnapshotPod:
    """A stand-in pod asking one whole GPU, for `--free-gpus` (never moved, never evicted: its UID says so)."""
    return SnapshotPod(uid=f"consolidate/gpu-{n}-{uuid}", namespace="", name=f"free GPU {n + 1}", node="",
                       requests=(whole_gpu_request(),), selectors=Selectors(), cpu=0, memory=0, priority=2**31,
                       created=0.0, started=0.0, controller=None, labels={}, opted_out=True)
