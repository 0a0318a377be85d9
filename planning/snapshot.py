"""The cluster as `vgpu whatif` and `vgpu consolidate` plan over it: nodes, the vGPU pods running and pending, and
the PodDisruptionBudgets, read once (read-only) from the API or from object lists.

Nodes and what is charged on their GPUs come from the extender's own ledger (`scheduler.ledger.Ledger`, fed the
same objects its watch caches would be), so a node the extender cannot use is unusable here too and a pod's
charge is what its spec asks on the GPUs its assignment names. A vGPU pod is one of the scheduler's pods
(`spec.schedulerName`) that asks our resources; it runs when the ledger charges it, and it is pending while it is
unbound and not finished. Every other pod bound to a node (and every vGPU pod) takes its CPU and memory there, as
kube-scheduler counts them. A pending pod whose spec cannot be read is left out and listed in `unreadable`.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpu import keys
from vgpu.assignment import Assignment
from vgpu.errors import RequestError
from vgpu.requests import ContainerRequest, Selectors, pod_cpu_memory, pod_requests, pod_selectors
from vgpu.resources import SCHEDULER_NAME, SharingConfig
from vgpu.scheduler.ledger import ChargeState, Ledger, pod_key, pod_priority
from vgpu.scheduler.nodestate import Grant, NodeState
from vgpu.scheduler.policies.base import PodContext

__all__ = ["ClusterSnapshot", "SnapshotPod", "queue_order", "read_cluster", "snapshot_pod", "whole_gpu_request"]

FINISHED = ("Succeeded", "Failed")


def _timestamp(value: Any) -> float:
    """An RFC 3339 UTC timestamp of the API (`2026-12-07T15:00:00Z`) as Unix seconds; 0 when absent or malformed."""
    if not isinstance(value, str):
        return 0.0
    try:
        return float(calendar.timegm(time.strptime(value.rstrip("Z").split(".")[0], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return 0.0


def _controller(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the pod's controlling owner, None for a bare pod."""
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return str(ref.get("kind") or ""), str(ref.get("name") or "")
    return None


@dataclass(frozen=True)
class SnapshotPod:
    """One vGPU pod: what it asks, where it runs (`node` empty while pending) and what moving it would touch."""

    uid: str
    namespace: str
    name: str
    node: str
    requests: tuple[ContainerRequest, ...]
    selectors: Selectors
    cpu: int  # milli
    memory: int  # MiB
    priority: int
    created: float  # Unix seconds
    started: float  # Unix seconds (status.startTime; the creation time when absent)
    controller: tuple[str, str] | None
    labels: Mapping[str, str]
    opted_out: bool
    grants: tuple[Grant, ...] = ()  # what the ledger charges it, running pods only
    assignment: Assignment = ()
    constraints: Mapping[str, Any] = field(default_factory=dict)  # {"spec": its nodeSelector and affinity}
    tolerations: tuple[Mapping[str, Any], ...] = ()

    @property
    def ref(self) -> str:
        """namespace/name."""
        return f"{self.namespace}/{self.name}"

    @property
    def context(self) -> PodContext:
        """What the node policies read of the pod."""
        return PodContext(cpu=self.cpu, memory=self.memory, selectors=self.selectors)

    @property
    def gpus(self) -> int:
        """GPUs the pod takes, over its containers."""
        return sum(r.count for r in self.requests)

    @property
    def whole_gpus(self) -> int:
        """GPUs the pod asks wholly (all cores of each), over its containers."""
        return sum(r.count for r in self.requests if r.cores >= 100)


def snapshot_pod(pod: Mapping[str, Any], requests: tuple[ContainerRequest, ...], node: str,
                 grants: tuple[Grant, ...] = (), assignment: Assignment = ()) -> SnapshotPod:
    """A pod object as the snapshot holds it (`node` empty while pending; `grants` what the ledger charges it)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    created = _timestamp(meta.get("creationTimestamp"))
    started = _timestamp((pod.get("status") or {}).get("startTime")) or created
    cpu, memory = pod_cpu_memory(pod)
    tolerations = spec.get("tolerations")
    return SnapshotPod(
        uid=pod_key(pod), namespace=str(meta.get("namespace") or "default"), name=str(meta.get("name") or ""),
        node=node, requests=requests, selectors=pod_selectors(pod), cpu=cpu, memory=memory,
        priority=pod_priority(pod), created=created, started=started, controller=_controller(meta),
        labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        opted_out=str((meta.get("annotations") or {}).get(keys.NO_CONSOLIDATE, "")).strip().lower() == "true",
        grants=grants, assignment=assignment,
        constraints={"spec": {k: spec[k] for k in ("nodeSelector", "affinity") if isinstance(spec.get(k), Mapping)}},
        tolerations=tuple(t for t in tolerations if isinstance(t, Mapping)) if isinstance(tolerations, list) else (),
    )


@dataclass
class ClusterSnapshot:
    """Nodes (the ledger's view, usage included), the vGPU pods running and pending, the other pods' CPU and
    memory per node, and the PodDisruptionBudgets."""

    config: SharingConfig
    nodes: list[NodeState]
    running: list[SnapshotPod]
    pending: list[SnapshotPod]
    base_cpu_memory: dict[str, tuple[int, int]]  # node -> CPU milli, memory MiB of its pods that are not vGPU pods
    node_objects: dict[str, Mapping[str, Any]]
    budgets: list[Mapping[str, Any]] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # pending pods left out: "ns/name: why"

    @classmethod
    def from_objects(cls, nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                     budgets: Iterable[Mapping[str, Any]] = (), config: SharingConfig | None = None,
                     scheduler_names: frozenset[str] = frozenset({SCHEDULER_NAME})) -> ClusterSnapshot:
        """A snapshot of API objects (plain dicts as the API returns them)."""
        config = config or SharingConfig()
        ledger = Ledger(config, scheduler_names=scheduler_names)
        node_objects: dict[str, Mapping[str, Any]] = {}
        for node_object in nodes:
            ledger.on_node(node_object)
            name = (node_object.get("metadata") or {}).get("name")
            if name:
                node_objects[str(name)] = node_object
        pods = [p for p in pods if (p.get("status") or {}).get("phase") not in FINISHED]
        for pod in pods:
            ledger.on_pod(pod)
        running, pending, unreadable = [], [], []
        base: dict[str, list[int]] = {}
        for pod in pods:
            meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
            node = spec.get("nodeName")
            charge = ledger.charges.get(pod_key(pod))
            ours = (spec.get("schedulerName") or "default-scheduler") in scheduler_names
            if node and charge is not None and charge.state == ChargeState.OBSERVED and charge.node in ledger.nodes:
                try:
                    requests = pod_requests(pod, config)
                except RequestError:
                    requests = ()
                running.append(snapshot_pod(pod, requests, str(node), charge.grants, charge.assignment))
                continue
            if node:
                taken = base.setdefault(str(node), [0, 0])
                cpu, memory = pod_cpu_memory(pod)
                taken[0] += cpu
                taken[1] += memory
                continue
            if not ours or meta.get("deletionTimestamp"):
                continue
            try:
                requests = pod_requests(pod, config)
            except RequestError as exc:
                unreadable.append(f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}: {exc}")
                continue
            if requests:
                pending.append(snapshot_pod(pod, requests, ""))
        ledger.rank_nodes()
        states = [ledger.nodes[name] for name in sorted(ledger.nodes)]
        for state in states:
            state.changes = None  # the snapshot's own: copies are registered with the simulations' placements
        pending.sort(key=queue_order)
        running.sort(key=lambda p: (p.created, p.namespace, p.name))
        return cls(config, states, running, pending, {n: (c, m) for n, (c, m) in base.items()}, node_objects,
                   list(budgets), unreadable)

    def node_object(self, name: str) -> Mapping[str, Any]:
        """The node's API object ({} when unknown)."""
        return self.node_objects.get(name) or {}


def queue_order(pod: SnapshotPod) -> tuple[int, float, str, str]:
    """kube-scheduler's default queue order (PrioritySort): higher priority first, then the older pod."""
    return (-pod.priority, pod.created, pod.namespace, pod.name)


def read_cluster(api: Any, config: SharingConfig | None = None,
                 scheduler_names: frozenset[str] = frozenset({SCHEDULER_NAME})) -> ClusterSnapshot:
    """List nodes, pods and PodDisruptionBudgets through `api` (a kubernetes ApiClient) and snapshot them; only
    reads. An API failure is raised as `vgpu.kube.errors.ApiError` naming what was being read."""
    from kubernetes import client as k8s

    from vgpu.kube.client import read_json
    from vgpu.kube.errors import translate

    core, policy = k8s.CoreV1Api(api), k8s.PolicyV1Api(api)
    lists: dict[str, Any] = {}
    for what, call in (("nodes", lambda: core.list_node(_preload_content=False, _request_timeout=30)),
                       ("pods", lambda: core.list_pod_for_all_namespaces(_preload_content=False,
                                                                         _request_timeout=60)),
                       ("poddisruptionbudgets", lambda: policy.list_pod_disruption_budget_for_all_namespaces(
                           _preload_content=False, _request_timeout=30))):
        try:
            lists[what] = read_json(call()) or {}
        except Exception as exc:
            raise translate(exc, f"list {what}") from exc
    return ClusterSnapshot.from_objects(lists["nodes"].get("items") or (), lists["pods"].get("items") or (),
                                        lists["poddisruptionbudgets"].get("items") or (), config, scheduler_names)


def whole_gpu_request(cores: int = 100) -> ContainerRequest:
    """One container asking one whole GPU (all its memory and `cores` % of it)."""
    return ContainerRequest(container="gpu", init=False, count=1, memory=0, memory_percent=100, cores=cores)

