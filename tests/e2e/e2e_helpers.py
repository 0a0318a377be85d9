"""Builders and invariant checks shared by the end-to-end tests (tests/e2e).

The invariants are read from what the cluster publishes, never from a component's insides: node inventory
annotations, pod assignment annotations and phases (API-server stand-in), the extender's :9395 metrics, and the
reports the sample workload prints from inside each pod's process.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from vgpu import keys
from vgpu.assignment import decode
from vgpu.inventory import decode_volcano
from vgpu.testbed.demo import scrape, workload_reports

WORKLOAD = ["python3", "-m", "vgpu.testbed.workload"]
TERMINAL = ("Succeeded", "Failed")


def container(name: str, command: list[str], number: int | None = 1, memory: int | None = None,
              cores: int | None = None, percent: int | None = None, env: dict[str, str] | None = None) -> dict:
    """A container asking for vGPU resources (limits), with a command."""
    limits: dict[str, str] = {}
    if number is not None:
        limits["volcano.sh/vgpu-number"] = str(number)
    if memory is not None:
        limits["volcano.sh/vgpu-memory"] = str(memory)
    if percent is not None:
        limits["volcano.sh/vgpu-memory-percentage"] = str(percent)
    if cores is not None:
        limits["volcano.sh/vgpu-cores"] = str(cores)
    ctr = {"name": name, "image": "sample", "command": command,
           "resources": {"limits": limits, "requests": {"cpu": "10m", "memory": "16Mi"}}}
    if env:
        ctr["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return ctr


def pod(name: str, containers: list[dict], namespace: str = "e2e", annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None) -> dict:
    """A pod for the vgpu-scheduler profile that runs once."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {}),
                         "labels": dict(labels or {})},
            "spec": {"schedulerName": "vgpu-scheduler", "restartPolicy": "Never", "containers": containers}}


def inventories(cluster: Any) -> dict[str, list[Any]]:
    """node -> GPUDevice list from the nodes' inventory annotations (nodes whose annotation fails are left out)."""
    out = {}
    for node in cluster.node_objects():
        value = ((node.get("metadata") or {}).get("annotations") or {}).get(keys.NODE_REGISTER)
        try:
            out[node["metadata"]["name"]] = list(decode_volcano(value))
        except Exception:
            continue
    return out


def phase(p: dict) -> str:
    """status.phase (Pending when absent)."""
    return (p.get("status") or {}).get("phase") or "Pending"


def scheduled_condition(p: dict) -> dict | None:
    """The PodScheduled condition."""
    for cond in (p.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "PodScheduled":
            return cond
    return None


@dataclass
class Violations:
    """Invariant violations seen by the sampler (empty lists when all is well)."""

    overcommit: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    samples: int = 0


def check_allocations(nodes: list[dict], pods: list[dict]) -> tuple[list[str], list[str]]:
    """(over-commitment, assignments naming GPUs not on the pod's node) over non-terminal bound pods."""
    devices: dict[str, Any] = {}
    node_of: dict[str, str] = {}
    for node in nodes:
        value = ((node.get("metadata") or {}).get("annotations") or {}).get(keys.NODE_REGISTER)
        try:
            for dev in decode_volcano(value):
                devices[dev.uuid] = dev
                node_of[dev.uuid] = node["metadata"]["name"]
        except Exception:
            continue
    used: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    holders: dict[str, list[tuple[str, int]]] = defaultdict(list)
    foreign = []
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if not node or phase(p) in TERMINAL:
            continue
        value = ((p.get("metadata") or {}).get("annotations") or {}).get(keys.VGPU_IDS)
        if not value:
            continue
        name = f"{p['metadata'].get('namespace')}/{p['metadata']['name']}"
        for segment in decode(value):
            for grant in segment:
                if grant.uuid in node_of and node_of[grant.uuid] != node:
                    foreign.append(f"{name} on {node} holds {grant.uuid} of {node_of[grant.uuid]}")
                entry = used[grant.uuid]
                entry[0] += grant.memory
                entry[1] += grant.cores
                entry[2] += 1
                holders[grant.uuid].append((name, grant.cores))
    over = []
    for uuid, (memory, cores, shares) in used.items():
        dev = devices.get(uuid)
        if dev is None:
            continue
        if memory > dev.memory or cores > 100 or shares > dev.split:
            over.append(f"{uuid}: memory {memory}/{dev.memory} cores {cores}/100 shares {shares}/{dev.split} "
                        f"held by {holders[uuid]}")
        if any(c == 100 for _, c in holders[uuid]) and shares > 1:
            over.append(f"{uuid}: exclusive holder shares the GPU: {holders[uuid]}")
    return over, foreign


class Sampler:
    """Samples node and pod annotations in the background and records every invariant violation."""

    def __init__(self, cluster: Any, interval: float = 0.3) -> None:
        self.cluster = cluster
        self.interval = interval
        self.result = Violations()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            snapshot = self.cluster.api_get("/api/v1/pods")
            nodes = self.cluster.api_get("/api/v1/nodes")
            if snapshot is not None and nodes is not None:
                over, foreign = check_allocations(nodes.get("items") or [], snapshot.get("items") or [])
                self.result.overcommit += over
                self.result.foreign += foreign
                self.result.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)


def wait_until(what: str, predicate: Callable[[], Any], timeout: float, interval: float = 0.3) -> Any:
    """Poll until truthy or fail with `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s: {what}")


def settled(pods: list[dict], names: set[tuple[str, str]] | None = None) -> tuple[bool, list[str]]:
    """Every (selected) pod is finished, running, or pending with a reason; returns (all settled, offenders)."""
    offenders = []
    for p in pods:
        key = (p["metadata"].get("namespace"), p["metadata"]["name"])
        if names is not None and key not in names:
            continue
        ph = phase(p)
        if ph in TERMINAL or ph == "Running":
            continue
        if (p.get("spec") or {}).get("nodeName"):
            offenders.append(f"{key[0]}/{key[1]}: bound, {ph}, bind-phase "
                             f"{(p['metadata'].get('annotations') or {}).get(keys.BIND_PHASE)}")
            continue
        cond = scheduled_condition(p)
        if not cond or cond.get("status") != "False" or not cond.get("message"):
            offenders.append(f"{key[0]}/{key[1]}: pending without a reason")
    return not offenders, offenders


def stuck_allocating(pods: list[dict]) -> list[str]:
    """Pods bound with bind-phase=allocating that are not running and carry no reason."""
    out = []
    for p in pods:
        ann = (p.get("metadata") or {}).get("annotations") or {}
        if ann.get(keys.BIND_PHASE) == keys.BIND_PHASE_ALLOCATING and phase(p) == "Pending" \
                and not (p.get("status") or {}).get("reason"):
            out.append(f"{p['metadata'].get('namespace')}/{p['metadata']['name']}")
    return out


def extender_usage(cluster: Any) -> dict[str, tuple[float, float, float]] | None:
    """uuid -> (memory, cores, shares) allocated, as the extender's :9395 metrics say (None: no answer)."""
    samples = scrape(cluster.scheduler_metrics_port, timeout=3)
    if not samples:
        return None
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    names = {"vgpu_scheduler_device_memory_allocated_bytes": 0, "vgpu_scheduler_device_cores_allocated_percent": 1,
             "vgpu_scheduler_device_shares_allocated": 2}
    unit = cluster.memory_factor << 20  # the metric is in bytes, the annotations in memory units
    for name, labels, value in samples:
        if name in names and labels.get("device_uuid"):
            out[labels["device_uuid"]][names[name]] = value / unit if names[name] == 0 else value
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def held_usage(pods: list[dict]) -> dict[str, tuple[float, float, float]]:
    """uuid -> (memory, cores, shares) held by non-terminal bound pods, from their assignment annotations."""
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for p in pods:
        if not (p.get("spec") or {}).get("nodeName") or phase(p) in TERMINAL:
            continue
        value = ((p.get("metadata") or {}).get("annotations") or {}).get(keys.VGPU_IDS)
        if not value:
            continue
        for segment in decode(value):
            for grant in segment:
                entry = out[grant.uuid]
                entry[0] += grant.memory
                entry[1] += grant.cores
                entry[2] += 1
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def usage_diff(cluster: Any) -> dict[str, tuple[Any, Any]] | None:
    """GPUs where the extender's usage differs from what the pods hold: uuid -> (extender, pods); None: no answer."""
    seen = extender_usage(cluster)
    if seen is None:
        return None
    held = held_usage(cluster.pods())
    return {uuid: (seen.get(uuid, (0, 0, 0)), held.get(uuid, (0, 0, 0))) for uuid in set(seen) | set(held)
            if tuple(seen.get(uuid, (0, 0, 0))) != tuple(held.get(uuid, (0, 0, 0)))}


def usage_converged(cluster: Any) -> bool:
    """The extender's per-GPU usage equals what the pods hold (GPUs absent on one side count as zero)."""
    return usage_diff(cluster) == {}


def assert_usage_converges(cluster: Any, timeout: float = 40) -> None:
    """Wait until the extender's accounting equals what the pods hold; fail with the differences."""
    deadline = time.monotonic() + timeout
    diff = None
    while time.monotonic() < deadline:
        diff = usage_diff(cluster)
        if diff == {}:
            return
        time.sleep(0.5)
    raise AssertionError(f"extender usage did not converge to what pods hold in {timeout:.0f}s: "
                         f"(extender, pods) per GPU: {diff}")


def reports(cluster: Any) -> dict[tuple[str, str, str], dict]:
    """(namespace, pod, container) -> the workload's report from inside the process."""
    return workload_reports(cluster.workdir)


def http_ok(url: str) -> bool:
    """GET answers 200."""
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
