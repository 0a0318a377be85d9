"""`vgpu whatif`: the cluster's pods placed again under each policy, and what each placement leaves.

Rows (`whatif`):
- `kept`: the running pods stay where they are and the pending pods (then the hypothetical ones of `--pods`) are
  placed in kube-scheduler's queue order (higher priority first, then the older) under the extender's policy;
- one row per policy (`POLICIES` by default): every pod placed again on empty nodes, the running ones first in
  the order they were created, then the pending and hypothetical ones in queue order.
Each row says how many pending and hypothetical pods found room, how many running pods would no longer have it
(`displaced`, re-placement only), the GPUs wholly free, the unallocated GPU share (free share of the healthy GPUs,
scheduler.policies.shares.idle_milli) and the fragmented share: FGD's measure (scheduler.policies.fragtable), the
free share that the cluster's own workload (every pod of the snapshot, types weighted by how many pods have them)
cannot use, summed over the nodes, as a share of the GPUs. The same workload weighs every row, so rows compare.
Nothing is written to the cluster.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vgpu.errors import ConfigError, RequestError
from vgpu.planning.simulation import Simulation
from vgpu.planning.snapshot import ClusterSnapshot, SnapshotPod, queue_order, snapshot_pod
from vgpu.requests import pod_requests
from vgpu.scheduler.policies.fragtable import TypeTable
from vgpu.scheduler.policies.shares import MILLI, idle_milli
from vgpu.scheduler.policies.workload import pod_type, typical_types

__all__ = ["KEPT", "POLICIES", "Outcome", "cluster_measures", "load_extra_pods", "render_table", "whatif"]

KEPT = "kept"
POLICIES = ("fragaware", "fgd", "binpack", "spread")
WORKLOAD_KINDS = {"Deployment": "replicas", "ReplicaSet": "replicas", "StatefulSet": "replicas", "Job": "parallelism"}
MAX_EXTRA_PODS = 100_000


@dataclass
class Outcome:
    """One row: a policy's placement and what it leaves."""

    policy: str
    pending: int
    pending_placed: int
    extra: int
    extra_placed: int
    running: int
    displaced: int
    gpus: int
    gpus_free: int
    unallocated_pct: float
    fragmented_pct: float
    waiting: list[str] = field(default_factory=list)  # pending and hypothetical pods that found no room
    displaced_pods: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The JSON row of `vgpu whatif --json`."""
        return {
            "policy": self.policy, "pending": self.pending, "pending_placed": self.pending_placed,
            "extra": self.extra, "extra_placed": self.extra_placed, "running": self.running,
            "displaced": self.displaced, "gpus": self.gpus, "gpus_free": self.gpus_free,
            "unallocated_pct": round(self.unallocated_pct, 2), "fragmented_pct": round(self.fragmented_pct, 2),
            "waiting": self.waiting, "displaced_pods": self.displaced_pods,
        }


def _workload_table(pods: Iterable[SnapshotPod]) -> TypeTable:
    """FGD's target workload: every pod's type, weighted by how many pods have it."""
    counts = Counter(pod_type(p.requests, p.context) for p in pods)
    return TypeTable(typical_types(counts, 1.0))


def cluster_measures(simulation: Simulation, table: TypeTable) -> tuple[int, int, float, float]:
    """GPUs (healthy, on nodes that take vGPU pods), those wholly free, the unallocated share (%) and the
    fragmented share (%) of them."""
    gpus = free = idle = 0
    fragmented = 0.0
    for state in simulation.states:
        if state.error:
            continue
        for device, used in zip(state.devices, state.usage):
            if device.healthy:
                gpus += 1
                free += used.shares == 0
                idle += idle_milli(device, used)
        fragmented += table.fragment(state.devices, state.usage, state.cpu_free)
    if not gpus:
        return 0, 0, 0.0, 0.0
    return gpus, free, 100.0 * idle / (MILLI * gpus), 100.0 * fragmented / (MILLI * gpus)


def _run(snapshot: ClusterSnapshot, policy: str, keep: bool, extra: Sequence[SnapshotPod], table: TypeTable,
         label: str) -> Outcome:
    simulation = Simulation(snapshot, policy, keep, extra)
    displaced = []
    if not keep:
        for pod in snapshot.running:
            if simulation.place(pod) is None:
                displaced.append(pod.ref)
    waiting, placed = [], {"pending": 0, "extra": 0}
    queue = sorted([*((p, "pending") for p in snapshot.pending), *((p, "extra") for p in extra)],
                   key=lambda item: queue_order(item[0]))
    for pod, kind in queue:
        if simulation.place(pod) is None:
            waiting.append(pod.ref)
        else:
            placed[kind] += 1
    gpus, free, unallocated, fragmented = cluster_measures(simulation, table)
    return Outcome(label, len(snapshot.pending), placed["pending"], len(extra), placed["extra"],
                   len(snapshot.running), len(displaced), gpus, free, unallocated, fragmented, waiting, displaced)


def whatif(snapshot: ClusterSnapshot, policies: Sequence[str] = POLICIES, current: str = "fragaware",
           extra: Sequence[SnapshotPod] = ()) -> list[Outcome]:
    """The `kept` row (the running pods stay, the rest placed under `current`, the extender's policy) and one
    re-placement row per policy."""
    table = _workload_table([*snapshot.running, *snapshot.pending, *extra])
    rows = [_run(snapshot, current, True, extra, table, KEPT)]
    rows += [_run(snapshot, policy, False, extra, table, policy) for policy in policies]
    return rows


def render_table(rows: Sequence[Outcome]) -> str:
    """The rows as the `vgpu whatif` table."""
    header = ("POLICY", "PENDING PLACED", "EXTRA PLACED", "DISPLACED", "FREE GPUS", "UNALLOCATED", "FRAGMENTED")
    body = [(r.policy, f"{r.pending_placed}/{r.pending}", f"{r.extra_placed}/{r.extra}",
             "-" if r.policy == KEPT else str(r.displaced), f"{r.gpus_free}/{r.gpus}", f"{r.unallocated_pct:.1f}%",
             f"{r.fragmented_pct:.1f}%") for r in rows]
    widths = [max(len(row[i]) for row in (header, *body)) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in (header, *body)]
    return "\n".join(lines) + "\n"


def _pods_of(doc: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    """The pods one YAML document stands for: a Pod, a List of documents, or a workload's template times its
    replicas (Deployment, ReplicaSet, StatefulSet) or parallelism (Job)."""
    kind = doc.get("kind")
    if kind == "List":
        return [pod for i, item in enumerate(doc.get("items") or ()) if isinstance(item, Mapping)
                for pod in _pods_of(item, f"{where} item {i + 1}")]
    if kind == "Pod":
        return [dict(doc)]
    if kind in WORKLOAD_KINDS:
        spec = doc.get("spec") or {}
        template = spec.get("template") or {}
        count = spec.get(WORKLOAD_KINDS[kind], 1)
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_EXTRA_PODS:
            raise ConfigError(f"--pods: {where}: {kind} {WORKLOAD_KINDS[kind]} is not a whole number of pods")
        meta = doc.get("metadata") or {}
        name = str(meta.get("name") or kind.lower())
        template_meta = template.get("metadata") or {}
        return [{"kind": "Pod", "metadata": {**template_meta, "name": f"{name}-{i}",
                                             "namespace": meta.get("namespace") or "default"},
                 "spec": template.get("spec") or {}} for i in range(count)]
    raise ConfigError(f"--pods: {where}: kind {kind!r} is not a Pod, List, Deployment, ReplicaSet, StatefulSet or Job")


def load_extra_pods(path: str | Path, snapshot: ClusterSnapshot) -> list[SnapshotPod]:
    """The hypothetical pods of a YAML file (one or more documents), as pending vGPU pods created now; a pod that
    asks none of our resources is left out, one whose requests do not parse is an error naming it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except OSError as exc:
        raise ConfigError(f"--pods: cannot read {path}: {exc.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--pods: {path} is not YAML ({type(exc).__name__})") from None
    out: list[SnapshotPod] = []
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for d, doc in enumerate(docs):
        if not isinstance(doc, Mapping):
            raise ConfigError(f"--pods: {path} document {d + 1} is not a mapping")
        for n, pod in enumerate(_pods_of(doc, f"{path} document {d + 1}")):
            meta = pod.setdefault("metadata", {})
            meta.setdefault("name", f"extra-{d + 1}-{n + 1}")
            meta.setdefault("namespace", "default")
            meta["uid"] = f"whatif/{meta['namespace']}/{meta['name']}/{len(out)}"
            meta["creationTimestamp"] = now
            try:
                requests = pod_requests(pod, snapshot.config)
            except RequestError as exc:
                raise ConfigError(f"--pods: {meta['namespace']}/{meta['name']}: {exc}") from None
            if requests:
                out.append(snapshot_pod(pod, requests, ""))
            if len(out) > MAX_EXTRA_PODS:
                raise ConfigError(f"--pods: more than {MAX_EXTRA_PODS} pods")
    return out
