"""A copy of the snapshot's nodes that pods are placed on and taken off through the extender's placement loop.

Each `Simulation` registers fresh `NodeState`s (the snapshot's GPUs and allocatable, empty or with the running pods
kept where they are) with its own `scheduler.placement.Placement` in decide mode, so a pod is placed exactly as
`vgpu scheduler --mode decide` would place it under the policy. Before the extender is asked, kube-scheduler's own
filters decide which nodes are candidates; the ones that matter for GPU nodes are applied here: the node is
schedulable (`spec.unschedulable`), its labels match the pod's `nodeSelector` and required node affinity (as the
extender's /bind checks them, scheduler.constraints), the pod tolerates its NoSchedule and NoExecute taints, and it
has the pod's CPU and memory free (NodeResourcesFit). Pod (anti-)affinity and topology spread are not modelled
(docs/consolidation.md).

The policy learns the workload before the first placement: it is shown every pod the simulation will hold, as the
extender has seen them (a learning policy observes them, an oracle one is told them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpu.planning.snapshot import ClusterSnapshot, SnapshotPod
from vgpu.scheduler.constraints import constraint_failure
from vgpu.scheduler.fit import FitResult
from vgpu.scheduler.nodestate import Grant, NodeState, flat_grants, gpu_types
from vgpu.scheduler.placement import Placement
from vgpu.scheduler.policies import make_policy

__all__ = ["Placed", "Simulation", "tolerated"]

_BLOCKING = ("NoSchedule", "NoExecute")


def tolerated(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    """Whether one of the tolerations tolerates the taint (k8s.io/api core/v1 `Toleration.ToleratesTaint`): an empty
    effect or key matches any; operator Exists matches any value, Equal (or none) the same value."""
    for toleration in tolerations:
        effect, key = toleration.get("effect") or "", toleration.get("key") or ""
        if (effect and effect != taint.get("effect")) or (key and key != taint.get("key")):
            continue
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists" or (operator == "Equal" and (toleration.get("value") or "") == (taint.get("value")
                                                                                                 or "")):
            return True
    return False


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a pod was put: the node's state, its grants and its CPU and memory (what `remove` takes back)."""

    pod: SnapshotPod
    state: NodeState
    grants: tuple[Grant, ...]
    result: FitResult | None = None


class Simulation:
    """The snapshot's nodes under one policy; `keep` starts from the running pods where they are, else empty."""

    def __init__(self, snapshot: ClusterSnapshot, policy: str, keep: bool, workload: Sequence[SnapshotPod] = (),
                 gpu_policy: str = "binpack", topology: bool = True) -> None:
        self.snapshot = snapshot
        self.policy = make_policy(policy)
        pods = [*snapshot.running, *snapshot.pending, *workload]
        self.policy.set_workload((p.requests, p.context) for p in pods if p.requests)
        for pod in pods:
            if pod.requests:
                self.policy.observe(pod.requests, pod.context)
        self.placement = Placement(self.policy, gpu_policy=gpu_policy, decide=True, topology=topology)
        self.states: list[NodeState] = []
        self.by_name: dict[str, NodeState] = {}
        for source in snapshot.nodes:
            state = NodeState(name=source.name, rank=source.rank, obj=source.obj)
            state.set_devices(source.devices, source.error)
            state.set_allocatable(source.cpu_allocatable, source.memory_allocatable)
            state.set_requested(*snapshot.base_cpu_memory.get(source.name, (0, 0)))
            self.placement.register(state)
            self.states.append(state)
            self.by_name[state.name] = state
        self.policy.relearn(gpu_types(self.states))
        self.where: dict[str, Placed] = {}  # pod uid -> where it is
        self._by_node: dict[str, dict[str, Placed]] = {}  # node -> pod uid -> where it is
        if keep:
            for pod in snapshot.running:
                home = self.by_name.get(pod.node)
                if home is not None:
                    self._charge(Placed(pod, home, pod.grants))

    def _charge(self, placed: Placed, sign: int = 1) -> None:
        state, pod = placed.state, placed.pod
        state.charge(placed.grants, sign)
        state.set_requested(state.cpu_requested + sign * pod.cpu, state.memory_requested + sign * pod.memory)
        if sign > 0:
            self.where[pod.uid] = placed
            self._by_node.setdefault(state.name, {})[pod.uid] = placed
        else:
            self.where.pop(pod.uid, None)
            self._by_node.get(state.name, {}).pop(pod.uid, None)

    def candidates(self, pod: SnapshotPod) -> list[NodeState]:
        """The nodes kube-scheduler's filters leave for the pod (module docstring), in name order."""
        out = []
        for state in self.states:
            if state.error:
                continue
            node = self.snapshot.node_object(state.name)
            spec = node.get("spec") or {}
            if spec.get("unschedulable") is True:
                continue
            if pod.constraints and constraint_failure(pod.constraints, node):
                continue
            taints = [t for t in spec.get("taints") or () if isinstance(t, Mapping) and t.get("effect") in _BLOCKING]
            if any(not tolerated(t, pod.tolerations) for t in taints):
                continue
            cpu_free, memory_free = state.cpu_free, state.memory_free
            if (cpu_free is not None and cpu_free < pod.cpu) or (memory_free is not None and memory_free < pod.memory):
                continue
            out.append(state)
        return out

    def place(self, pod: SnapshotPod) -> Placed | None:
        """Place the pod where the extender would and charge it there; None when it fits nowhere."""
        shape = self.placement.shape(pod.requests, pod.selectors, pod.context)
        choice = self.placement.choose(self.candidates(pod), shape, explain=False)
        if choice.best is None or choice.result is None:
            return None
        placed = Placed(pod, choice.best, flat_grants(choice.result.assignment), choice.result)
        self._charge(placed)
        return placed

    def put(self, pod: SnapshotPod, node: str, grants: tuple[Grant, ...]) -> Placed:
        """Charge the pod with these grants on this node, whatever the policy would choose (a hold)."""
        placed = Placed(pod, self.by_name[node], grants)
        self._charge(placed)
        return placed

    def remove(self, placed: Placed) -> None:
        """Take a placed pod off its node."""
        self._charge(placed, -1)

    def on_node(self, node: str) -> list[Placed]:
        """The pods on a node, oldest first."""
        return sorted(self._by_node.get(node, {}).values(), key=lambda p: (p.pod.created, p.pod.namespace, p.pod.name))
