"""`vgpu demo`: a GPU-sharing cluster in a box, with sample pods and a live table.

Starts the harness of testbed/cluster.py (API-server, kubelet and kube-scheduler stand-ins around our real
extender and device plugins, all as local processes over simulated GPUs), submits sample pods (or the pods of
`--pods FILE`), and shows nodes, GPUs and pods refreshing in the terminal: what each GPU has allocated, what each
container uses against its limit (read from the device plugins' real :9394 metrics), and where a limit was hit.
`--headless` prints a summary instead and exits 0 only if every sample pod succeeded and the deliberate
over-limit allocation was refused with CUDA_ERROR_OUT_OF_MEMORY. `--real-kubernetes` runs the same samples, table
and summary on upstream Kubernetes instead of the stand-ins (testbed/demo_real.py).

Pods are submitted one at a time, each once the previous one has left Pending: when two pods bound to the same
GPU wait for Allocate at the same moment, kubelet's Allocate (device IDs only, no pod) cannot tell them apart and
the device plugin refuses to guess (the contract's rule), so a burst of identical co-located pods fails admission.
tests/e2e exercises that concurrency on purpose; the demo shows the steady state.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from vgpu import keys
from vgpu.assignment import salvage
from vgpu.errors import ConfigError, VGPUError
from vgpu.inventory import decode_volcano
from vgpu.requests import pod_requests, pod_selectors
from vgpu.resources import SharingConfig
from vgpu.testbed.cluster import LocalCluster, isolation_paths
from vgpu.testbed.machine import MachineSpecError, parse_machine_spec

__all__ = ["Snapshot", "StandIns", "check_fit", "check_gpus", "demo_webhook", "demo_workdir", "drive", "evaluate",
           "load_pods_file", "render", "report_in", "run_demo", "sample_pods", "workload_reports"]

log = logging.getLogger(__name__)

NAMESPACE = "demo"
WEBHOOK_CONFIGURATION = Path(__file__).resolve().parents[1] / "deploy" / "webhook" / "mutatingwebhookconfiguration.yaml"
# schedulerName values the demo's webhook makes ours: what the API server fills in, and Volcano's and HAMi's, so
# that their pod specs run unedited (a cluster moving from them may do the same: docs/install.md)
REPLACED_SCHEDULERS = ("default-scheduler", "volcano", "hami-scheduler")
WORKLOAD = ["python3", "-m", "vgpu.testbed.workload"]
_MARK = "VGPU-WORKLOAD "


def _make_container(name: str, args: list[str], number: int | None = None, memory: int | None = None,
               cores: int | None = None, percent: int | None = None, cpu: str = "100m", factor: int = 1) -> dict:
    limits: dict[str, str] = {}
    if number is not None:
        limits["volcano.sh/vgpu-number"] = str(number)
    if memory is not None:
        limits["volcano.sh/vgpu-memory"] = str(-(-memory // factor))  # MiB -> memory units
    if percent is not None:
        limits["volcano.sh/vgpu-memory-percentage"] = str(percent)
    if cores is not None:
        limits["volcano.sh/vgpu-cores"] = str(cores)
    return {"name": name, "image": "vgpu-sample:local", "command": WORKLOAD + args,
            "resources": {"limits": limits, "requests": {"cpu": cpu, "memory": "128Mi"}}}


def _pod(name: str, containers: list[dict], annotations: dict[str, str] | None = None,
         role: str = "sample") -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "vgpu-demo", "demo-role": role},
                         "annotations": dict(annotations or {})},
            "spec": {"schedulerName": "vgpu-scheduler", "restartPolicy": "Never", "containers": containers}}


def type_word(card_type: str) -> str:
    """The word of a card's inventory type that names its model (`NVIDIA-NVIDIA H100 80GB HBM3` -> `H100`,
    `NVIDIA-NVIDIA GeForce RTX 4090` -> `4090`, `NVIDIA-Tesla T4` -> `T4`): the first with a digit, else the last."""
    words = [w for w in re.split(r"[\s-]+", card_type) if w and w.upper() != "NVIDIA"]
    return next((w for w in words if any(c.isdigit() for c in w)), words[-1] if words else card_type)


def sample_pods(inventories: dict[str, list[Any]], hold: float, factor: int = 1) -> list[dict]:
    """The demo's sample pods; `inventories` (node -> GPUDevice list) supplies UUIDs for the pinned pods.

    Memory sizes are written in MiB here and converted to memory units of `factor` MiB (the node inventory's unit).
    """
    h = ["--hold", f"{hold:g}"]

    def _container(name: str, args: list[str], **kwargs: Any) -> dict[str, Any]:
        return _make_container(name, args, factor=factor, **kwargs)

    nodes = sorted(inventories)
    # the smallest card decides the sizes of the workloads that may land anywhere
    smallest = min((d.memory * factor for devs in inventories.values() for d in devs), default=40960)
    quarter_mib = min(5000, smallest // 5)  # within vgpu-memory-percentage 25 on any card
    exclusive_mib = min(30000, smallest * 3 // 4)
    last_node = inventories[nodes[-1]] if nodes else []
    first_node = inventories[nodes[0]] if nodes else []
    pinned = last_node[-1].uuid if last_node else ""
    shared = first_node[-1].uuid if first_node else ""
    # the type selector asks for a model the nodes have (on A100s: infer-a100, as HAMi's example writes it)
    model = type_word(first_node[0].type) if first_node else "A100"
    pods = [
        _pod("train-multi", [
            _container("trainer", ["--mib", "6000", "--kernels", "40", *h], number=2, memory=8000, cores=30),
            _container("sidecar", ["--mib", "1000", "--kernels", "5", *h], number=1, memory=2000, cores=10),
        ]),
        _pod(f"infer-{model.lower()}", [_container("server", ["--mib", "3000", "--kernels", "30", *h], number=1,
                                                   memory=4000, cores=20)], annotations={keys.USE_GPU_TYPE: model}),
        _pod("notebook-quarter", [_container("notebook", ["--mib", str(quarter_mib), "--kernels", "10", *h],
                                             number=1, percent=25, cores=10)]),
        _pod("exclusive-trainer", [_container("trainer", ["--mib", str(exclusive_mib), "--kernels", "50", *h],
                                              number=1, cores=100)]),
        _pod("cpu-only", [{"name": "main", "image": "busybox", "command": ["sleep", f"{max(1.0, hold):g}"],
                           "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}}]),
    ]
    if pinned:
        pods.append(_pod("pinned-uuid", [_container("main", ["--mib", "1000", "--kernels", "10", *h], number=1,
                                                    memory=2000, cores=10)],
                         annotations={keys.USE_GPU_UUID: pinned}))
    over_annotations = {keys.USE_GPU_UUID: shared} if shared else {}
    # over-limit allocates past its 2000 MiB and must be refused; its neighbour joins the same GPU while it runs
    pods.append(_pod("over-limit", [_container("greedy", ["--mib", "3000", "--chunk", "500", "--kernels", "5",
                                                          "--expect-oom", "--hold", f"{max(hold, 6.0):g}"],
                                               number=1, memory=2000, cores=10)],
                     annotations=over_annotations, role="over-limit"))
    neighbour = _pod("neighbour", [_container("main", ["--mib", "1500", "--kernels", "20", *h], number=1,
                                              memory=2000, cores=10)], annotations=over_annotations)
    pods.append(neighbour)
    return pods


def _size(folder: Path) -> str:
    """How much a kept work directory holds, for the line that says it is kept (a failed demo's is about 200 MB)."""
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
    return f"{total / 1e6:.0f} MB"


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML parser's error on one line: what is wrong and where."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{exc.problem or exc.context or 'malformed'} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(exc).split())


def load_pods_file(path: str) -> list[dict]:
    """Pods from a YAML file (several documents, or a List); the demo's scheduler is set where none is named.
    Raises ConfigError naming the pod, container and field of the first pod that cannot be scheduled as written."""
    try:
        docs = list(yaml.safe_load_all(Path(path).read_text()))
    except UnicodeDecodeError:
        raise ConfigError(f"--pods {path}: not a text file") from None
    except OSError as exc:
        raise ConfigError(f"--pods {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--pods {path}: not YAML: {_yaml_problem(exc)}") from None
    pods = []
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        items = doc.get("items") if doc.get("kind") == "List" else [doc]
        for item in items or ():
            if not isinstance(item, dict) or item.get("kind", "Pod") != "Pod":
                continue
            _check_pod(path, item)
            item["metadata"].setdefault("namespace", NAMESPACE)
            item["spec"].setdefault("schedulerName", "vgpu-scheduler")
            pods.append(item)
    if not pods:
        raise ConfigError(f"--pods {path}: no Pod found")
    return pods


def _check_pod(path: str, pod: dict) -> None:
    """The shape kube-apiserver validates, then what the extender reads (requests, selectors); ConfigError."""
    meta = pod.setdefault("metadata", {})
    spec = pod.setdefault("spec", {})
    name = meta.get("name") if isinstance(meta, dict) else None
    where = f"--pods {path}: pod {name!r}"
    if not isinstance(meta, dict) or not isinstance(name, str) or not name:
        raise ConfigError(f"--pods {path}: a Pod without metadata.name")
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: spec must be a mapping")
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise ConfigError(f"{where}: spec.containers must be a non-empty list")
    for field_name in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(field_name) or ()):
            if not isinstance(container, dict) or not isinstance(container.get("name"), str):
                raise ConfigError(f"{where}: spec.{field_name}[{i}] must be a mapping with a name")
    try:
        pod_requests(pod, SharingConfig())
        pod_selectors(pod)
    except VGPUError as exc:
        raise ConfigError(f"{where}: {exc}") from None


# ------------------------------------------------------------------------------------------------ observation

def report_in(text: str) -> dict | None:
    """The sample workload's JSON report: the last report line of a container's log (None without one)."""
    for line in reversed(text.splitlines()):
        if line.startswith(_MARK):
            try:
                return orjson.loads(line[len(_MARK):])
            except orjson.JSONDecodeError:
                return None
    return None


def workload_reports(workdir: Path) -> dict[tuple[str, str, str], dict]:
    """(namespace, pod, container) -> the sample workload's JSON report, from the kubelet stand-ins' pod logs."""
    out: dict[tuple[str, str, str], dict] = {}
    for log_path in workdir.glob("node-*/logs/*.log"):
        parts = log_path.stem.split("_", 2)
        if len(parts) != 3:
            continue
        try:
            report = report_in(log_path.read_text(errors="replace"))
        except OSError:
            continue
        if report is not None:
            out[(parts[0], parts[1], parts[2])] = report
    return out


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(port: int, timeout: float = 1.0) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text endpoint on localhost (empty when it does not answer)."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=timeout).text
    except httpx.HTTPError:
        return []
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        try:
            value = float(match[3])
        except ValueError:
            continue
        samples.append((match[1], dict(_LABEL.findall(match[2] or "")), value))
    return samples


@dataclass(slots=True)
class Snapshot:
    """What the live table shows, gathered from the API server, the metrics endpoints and the pod logs."""

    nodes: list[dict] = field(default_factory=list)
    pods: list[dict] = field(default_factory=list)
    usage: dict[tuple[str, str, str], float] = field(default_factory=dict)  # (ns, pod, container) -> bytes
    limits: dict[tuple[str, str, str], float] = field(default_factory=dict)
    reports: dict[tuple[str, str, str], dict] = field(default_factory=dict)
    factor: int = 1  # MiB per memory unit of the annotations

    @classmethod
    def take(cls, cluster: Any, with_metrics: bool = True) -> Snapshot:
        """Read everything once from `cluster` (StandIns, or demo_real's RealCluster)."""
        pods = cluster.pods()
        snap = cls(nodes=cluster.node_objects(), pods=pods, reports=cluster.workload_reports(pods),
                   factor=cluster.memory_factor)
        if with_metrics:
            for node in cluster.nodes:
                # the per-container series, summed over the container's devices
                for name, labels, value in scrape(node.metrics_port):
                    key = (labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", ""))
                    if name == "vgpu_container_memory_used_bytes":
                        snap.usage[key] = snap.usage.get(key, 0.0) + value
                    elif name == "vgpu_container_memory_limit_bytes":
                        snap.limits[key] = snap.limits.get(key, 0.0) + value
        return snap


def _inventory(node: dict) -> list[Any]:
    value = ((node.get("metadata") or {}).get("annotations") or {}).get(keys.NODE_REGISTER)
    try:
        return list(decode_volcano(value)) if value else []
    except Exception:
        return []


def _container_gpu_names(pod: dict) -> list[str]:
    from vgpu.requests import pod_requests
    from vgpu.resources import SharingConfig

    try:
        reqs = pod_requests(pod, SharingConfig())
    except Exception:
        return []
    return [r.container for r in reqs]


def _phase(pod: dict) -> str:
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    if phase == "Pending":
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        if (pod.get("spec") or {}).get("nodeName"):
            return f"Pending({ann.get(keys.BIND_PHASE) or 'bound'})"
        for cond in status.get("conditions") or ():
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return "Pending(unschedulable)"
    return phase


def _pending_reason(pod: dict) -> str:
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or cond.get("reason") or "")
    return ""


def allocated(snap: Snapshot) -> tuple[dict[str, list[int]], dict[str, list[str]]]:
    """Per GPU UUID: [memory MiB, cores, shares] held by pods that have not ended, and the pods holding it."""
    alloc: dict[str, list[int]] = {}
    holders: dict[str, list[str]] = {}
    for pod in snap.pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        for segment in salvage(ann.get(keys.VGPU_IDS, "")):
            for grant in segment:
                entry = alloc.setdefault(grant.uuid, [0, 0, 0])
                entry[0] += grant.memory * snap.factor
                entry[1] += grant.cores
                entry[2] += 1
                holders.setdefault(grant.uuid, []).append((pod.get("metadata") or {}).get("name", "?"))
    return alloc, holders


def update_peaks(peaks: dict[str, list[int]], snap: Snapshot) -> None:
    """Raise each GPU's peak [memory MiB, cores, shares] to what `snap` shows allocated."""
    for uuid, taken in allocated(snap)[0].items():
        peak = peaks.setdefault(uuid, [0, 0, 0])
        peaks[uuid] = [max(a, b) for a, b in zip(peak, taken)]


def render(snap: Snapshot, header: str = "", peaks: dict[str, list[int]] | None = None,
           footer: str = "") -> str:
    """The live table as text; with `peaks`, each GPU's peak allocation over the run too."""
    lines = [header] if header else []
    title = ["NODE", "GPU", "TYPE", "MEM alloc/total MiB", "CORES", "SHARES", "HEALTH", "PODS"]
    if peaks is not None:
        title[-1:-1] = ["PEAK MiB/cores/shares"]
    gpu_rows: list[tuple[str, ...]] = [tuple(title)]
    index_of: dict[str, tuple[str, int]] = {}
    alloc, holders = allocated(snap)
    for node_obj in sorted(snap.nodes, key=lambda n: n["metadata"]["name"]):
        name = node_obj["metadata"]["name"]
        devices = _inventory(node_obj)
        raw = ((node_obj.get("metadata") or {}).get("annotations") or {}).get(keys.NODE_REGISTER)
        if raw and not devices:
            gpu_rows.append((name, "-", "inventory annotation malformed", "-", "-", "-", "-", "-"))
        for i, dev in enumerate(devices):
            index_of[dev.uuid] = (name, i)
            taken = alloc.get(dev.uuid, [0, 0, 0])
            memory = f"{taken[0]}/{dev.memory * snap.factor}"
            row = [name, str(i), dev.type.removeprefix("NVIDIA-"), memory, f"{taken[1]}/100",
                   f"{taken[2]}/{dev.split}", "ok" if dev.healthy else "UNHEALTHY",
                   ",".join(sorted(set(holders.get(dev.uuid, [])))) or "-"]
            if peaks is not None:
                row[-1:-1] = ["/".join(str(v) for v in peaks.get(dev.uuid, [0, 0, 0]))]
            gpu_rows.append(tuple(row))
    lines += _table(gpu_rows)
    lines.append("")
    pod_rows: list[tuple[str, ...]] = [("POD", "PHASE", "NODE", "CONTAINER", "GPUS", "MEM used/limit MiB", "LIMIT")]
    pending = []
    for pod in sorted(snap.pods, key=lambda p: (p["metadata"].get("namespace"), p["metadata"]["name"])):
        meta = pod["metadata"]
        ns, pname = meta.get("namespace") or "default", meta["name"]
        node = (pod.get("spec") or {}).get("nodeName") or "-"
        phase = _phase(pod)
        ann = meta.get("annotations") or {}
        segments = salvage(ann.get(keys.VGPU_IDS, ""))
        names = _container_gpu_names(pod)
        if phase == "Pending(unschedulable)":
            pending.append(f"  {pname}: {_pending_reason(pod)}")
        rows_for_pod = 0
        for position, ctr in enumerate(names):
            grants = segments[position] if position < len(segments) else ()
            gpus = ",".join(str(index_of.get(g.uuid, ("", "?"))[1]) for g in grants) or "-"
            report = snap.reports.get((ns, pname, ctr)) or {}
            used: float | None
            if (ns, pname, ctr) in snap.usage and phase == "Running":
                used = snap.usage[(ns, pname, ctr)] / (1 << 20)  # live, from the node's :9394 metrics
            elif report.get("devices"):
                used = sum(d.get("allocated_mib", 0) for d in report["devices"])
            else:
                used = None
            limit = sum(g.memory for g in grants) * snap.factor if grants else None
            hit = "-"
            for dev in report.get("devices") or ():
                if dev.get("oom_at_mib"):
                    hit = f"OOM refused at {dev['oom_at_mib']} MiB"
            if report.get("result") == "limit-not-enforced":
                hit = "NOT ENFORCED"
            mem = f"{'-' if used is None else int(used)}/{'-' if limit is None else limit}"
            pod_rows.append((pname if rows_for_pod == 0 else "", phase if rows_for_pod == 0 else "",
                             node if rows_for_pod == 0 else "", ctr, gpus, mem, hit))
            rows_for_pod += 1
        if rows_for_pod == 0:
            pod_rows.append((pname, phase, node, "-", "-", "-", "-"))
    lines += _table(pod_rows)
    if pending:
        lines.append("")
        lines.append("pending:")
        lines += pending
    if footer:
        lines += ["", footer]
    return "\n".join(lines)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]


def evaluate(snap: Snapshot, submitted: list[dict], running_ok: bool = False) -> tuple[bool, list[str]]:
    """Did every submitted pod succeed (or run, with `running_ok`), and was every over-limit allocation refused?"""
    by_name = {(p["metadata"].get("namespace"), p["metadata"]["name"]): p for p in snap.pods}
    ok = True
    lines = []
    saw_refusal = False
    for pod in submitted:
        meta = pod["metadata"]
        key = (meta.get("namespace") or NAMESPACE, meta["name"])
        live = by_name.get(key)
        phase = (live or {}).get("status", {}).get("phase") if live else "missing"
        role = (meta.get("labels") or {}).get("demo-role")
        reports = [r for (ns, name, _), r in snap.reports.items() if (ns, name) == key]
        good = phase == "Succeeded" or (running_ok and phase == "Running")
        verdict = "ok" if good else f"FAILED ({phase})"
        if live and _phase(live) == "Pending(unschedulable)":
            verdict = f"FAILED (unschedulable: {_pending_reason(live)[:200]})"
        if not good:
            ok = False
        if role == "over-limit":
            refused = any(r.get("result") == "oom-refused" for r in reports)
            saw_refusal = saw_refusal or refused
            verdict += ", over-limit allocation refused with CUDA_ERROR_OUT_OF_MEMORY" if refused else \
                ", over-limit allocation NOT refused"
            ok = ok and refused
        node = ((live or {}).get("spec") or {}).get("nodeName") or "-"
        lines.append(f"  {key[0]}/{key[1]:<20} node={node:<8} {verdict}")
    if any((p["metadata"].get("labels") or {}).get("demo-role") == "over-limit" for p in submitted) \
            and not saw_refusal:
        ok = False
    return ok, lines


# --------------------------------------------------------------------------------------------------- the demo

class StandIns(LocalCluster):
    """The stand-ins' cluster as the demo drives it (demo_real.RealCluster offers the same for real Kubernetes)."""

    LOGS = ("logs", "node-*/logs")  # in the work directory: the processes' logs, the containers'

    def workload_reports(self, pods: list[dict]) -> dict[tuple[str, str, str], dict]:
        """The workload reports in the kubelet stand-ins' log files."""
        return workload_reports(self.workdir)


def check_gpus(spec: str) -> None:
    """Refuse a bad --gpus before anything starts (ConfigError)."""
    try:
        parse_machine_spec(spec)
    except MachineSpecError as exc:
        raise ConfigError(f"--gpus {spec}: {exc}") from None


def check_fit(path: str, pods: list[dict], spec: str) -> None:
    """Refuse, before anything starts, a pod of `--pods` that no node of `spec` could ever hold (ConfigError naming
    the pod, the container and what is too large): more GPUs than a node has of the types its annotations allow, or
    more memory per GPU than the largest such card."""
    entries, _numa = parse_machine_spec(spec)
    unit = SharingConfig().memory_unit
    for pod in pods:
        name = pod["metadata"]["name"]
        selectors = pod_selectors(pod)
        allowed = [e for e in entries if selectors.type_allowed(f"NVIDIA-{e.model.nvml_name}")]
        gpus = sum(e.count for e in allowed)
        largest = max((e.model.memory_mib for e in allowed), default=0)
        for request in pod_requests(pod, SharingConfig()):
            where = f"--pods {path}: pod {name!r} container {request.container!r}"
            if request.count > gpus:
                of = "" if len(allowed) == len(entries) else " of the types its GPU-type annotations allow"
                raise ConfigError(f"{where} asks {request.count} GPU(s); a node of --gpus {spec} has {gpus}{of}")
            if unit.mib(request.memory) > largest:
                raise ConfigError(f"{where} asks {unit.mib(request.memory)} MiB per GPU; the largest card of --gpus "
                                  f"{spec} it may use has {largest} MiB")


def demo_webhook() -> dict:
    """The MutatingWebhookConfiguration the plain manifests install (deploy/webhook), which the demo registers for
    its own `vgpu webhook`, so that pods written for HAMi or Volcano are opted in as in a cluster."""
    return yaml.safe_load(WEBHOOK_CONFIGURATION.read_text())


def demo_workdir(args: argparse.Namespace) -> Path | None:
    """The work directory, made empty (a previous demo's is cleared); None when --workdir names another folder."""
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="vgpu-demo-"))
    if args.workdir and workdir.exists() and any(workdir.iterdir()):
        if not any((workdir / name).exists() for name in ("kubeconfig", "kubeconfig-admin", "apiserver.json")):
            print(f"vgpu demo: --workdir {workdir} is not empty and not a previous demo's; refusing to use it",
                  file=sys.stderr)
            return None
        shutil.rmtree(workdir)  # a previous demo's state: start afresh
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir


def run_demo(args: argparse.Namespace) -> int:
    """The demo on the stand-ins; the exit status."""
    check_gpus(args.gpus)
    given_pods = load_pods_file(args.pods) if args.pods else None
    if given_pods:
        check_fit(args.pods, given_pods, args.gpus)
    isolation_paths()  # builds libvgpu.so and the simulated driver now, or fails with BuildError
    workdir = demo_workdir(args)
    if workdir is None:
        return 2
    cluster = StandIns(workdir, nodes=args.nodes, gpus=args.gpus, log_level="INFO",
                       webhook_configuration=demo_webhook(),
                       webhook_args=["--replace-scheduler-names", ",".join(REPLACED_SCHEDULERS)])
    return drive(args, cluster, given_pods)


def drive(args: argparse.Namespace, cluster: Any, given_pods: list[dict] | None) -> int:
    """Start `cluster` (StandIns or demo_real.RealCluster) in its work directory, submit the pods, show the table
    (or the summary), stop everything; the exit status."""
    workdir = cluster.workdir
    out = sys.stdout
    interactive = not args.headless and out.isatty()
    stopping = {"signal": 0}

    def on_signal(signum: int, _frame: Any) -> None:
        stopping["signal"] = signum
        raise KeyboardInterrupt

    # Ctrl-C, a SIGTERM, or the terminal closing (SIGHUP): each stops the cluster and its pods' processes, and
    # removes the work directory as at the end
    old_term = signal.signal(signal.SIGTERM, on_signal)
    old_hup = signal.signal(signal.SIGHUP, on_signal)
    status = 1
    said_where = False
    try:
        print(f"vgpu demo: starting {args.nodes} node(s) x {args.gpus} in {workdir}", file=out, flush=True)
        t0 = time.monotonic()
        cluster.start()
        ports = ", ".join(f"{n.name} :{n.metrics_port}" for n in cluster.nodes)
        print(f"vgpu demo: up in {time.monotonic() - t0:.1f}s; API server {cluster.url}; node metrics {ports}; "
              f"scheduler metrics :{cluster.scheduler_metrics_port}; extender :{cluster.extender_port}",
              file=out, flush=True)
        print(f"vgpu demo: kubeconfig {cluster.kubeconfig} (try: vgpu inspect --kubeconfig {cluster.kubeconfig})",
              file=out, flush=True)
        inventories = {n["metadata"]["name"]: _inventory(n) for n in cluster.node_objects()}
        hold = args.hold if args.hold is not None else (2.0 if args.headless else 20.0)
        pods = given_pods or sample_pods(inventories, hold, cluster.memory_factor)
        # One pod at a time: each is submitted once the previous one has left Pending (or was found unschedulable).
        # See the module docstring for why the sample pods do not arrive all at once.
        queue = list(pods)
        current: dict | None = None
        current_since = 0.0
        deadline = time.monotonic() + (args.duration if args.duration else (180.0 if args.headless else 1e9))
        header_base = f"vgpu demo  nodes={args.nodes} gpus={args.gpus}"
        footer = (f"kubeconfig {cluster.kubeconfig}\nnode metrics {ports}; scheduler metrics "
                  f":{cluster.scheduler_metrics_port}\nCtrl-C stops; the work directory {workdir} is "
                  + ("kept" if args.workdir or args.keep_workdir else "removed (--keep-workdir keeps it)"))
        steady = interactive and not given_pods  # the live samples run again after they end, until Ctrl-C
        ended_at: dict[str, float] = {}
        peaks: dict[str, list[int]] = {}
        snap = Snapshot()
        while time.monotonic() < deadline:
            snap = Snapshot.take(cluster, with_metrics=interactive)
            update_peaks(peaks, snap)
            while queue and (current is None or _left_pending(snap, [current])
                             or time.monotonic() - current_since > 30):
                current, current_since = queue.pop(0), time.monotonic()
                cluster.create_pod(current)
                if not interactive:
                    print(f"vgpu demo: submitted {current['metadata']['name']}", file=out, flush=True)
                break
            if steady and not queue:
                _rerun_ended(cluster, snap, pods, ended_at)
            done = not queue and _all_done(snap, pods, running_is_done=bool(given_pods))
            if interactive:
                text = render(snap, f"{header_base}  t={time.monotonic() - t0:.0f}s", peaks, footer)
                out.write("\x1b[H\x1b[2J" + text + "\n")
                out.flush()
            if done and (args.headless or not interactive) and not args.duration:
                break
            for proc in cluster.processes():
                if not proc.alive:
                    raise RuntimeError(f"{proc.name} exited unexpectedly:\n{proc.tail()}")
            time.sleep(1.0 if interactive else 0.5)
        snap = Snapshot.take(cluster, with_metrics=True)
        update_peaks(peaks, snap)
        print(render(snap, header_base, peaks), file=out)
        ok, lines = evaluate(snap, pods, running_ok=bool(given_pods))
        print("\nsummary:", file=out)
        for line in lines:
            print(line, file=out)
        kept = args.workdir or args.keep_workdir or not ok
        logs = " and ".join(f"{workdir}/{folder}" for folder in cluster.LOGS)
        where = f"logs in {logs} ({_size(workdir)}; remove the folder when done)" if kept \
            else "--keep-workdir keeps the logs"
        print(f"vgpu demo: {'PASS' if ok else 'FAIL'}: {len(pods)} pod(s); {where}", file=out, flush=True)
        status = 0 if ok else 1
        said_where = True
    except KeyboardInterrupt:
        status = 128 + (stopping["signal"] or signal.SIGINT)
        with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
            print("\nvgpu demo: interrupted, stopping", file=out, flush=True)
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"vgpu demo: {exc}", file=sys.stderr, flush=True)
        status = 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second signal must not cut the clean-up short
            signal.signal(sig, signal.SIG_IGN)
        cluster.stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGHUP, old_hup)
        if not args.workdir and not args.keep_workdir and status in (0, 129, 130, 143):
            shutil.rmtree(workdir, ignore_errors=True)
        elif not said_where:
            print(f"vgpu demo: the work directory {workdir} is kept (logs in {workdir}/logs; {_size(workdir)}, "
                  "remove it when done)", file=sys.stderr,
                  flush=True)
    return status


def _rerun_ended(cluster: Any, snap: Snapshot, pods: list[dict], ended_at: dict[str, float],
                 pause: float = 5.0) -> None:
    """Keep the live demo busy: a sample pod that ended `pause` seconds ago is deleted and submitted again."""
    specs = {p["metadata"]["name"]: p for p in pods}
    now = time.monotonic()
    for pod in snap.pods:
        name = pod["metadata"]["name"]
        if name not in specs or (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            continue
        since = ended_at.setdefault(name, now)
        if now - since >= pause:
            cluster.delete_pod(pod["metadata"].get("namespace") or NAMESPACE, name)
            cluster.create_pod(specs[name])
            del ended_at[name]


def _left_pending(snap: Snapshot, submitted: list[dict]) -> bool:
    wanted = {(p["metadata"].get("namespace") or NAMESPACE, p["metadata"]["name"]) for p in submitted}
    moved = {(p["metadata"].get("namespace"), p["metadata"]["name"]) for p in snap.pods
             if (p.get("status") or {}).get("phase") not in (None, "Pending")
             or _phase(p) == "Pending(unschedulable)"}
    return wanted <= moved


def _all_done(snap: Snapshot, submitted: list[dict], running_is_done: bool = False) -> bool:
    """Every submitted pod has ended (or runs, with `running_is_done`), or can never be placed: the extender found
    it unschedulable while no other pod holds anything that could still free up."""
    wanted = {(p["metadata"].get("namespace") or NAMESPACE, p["metadata"]["name"]) for p in submitted}
    final = ("Succeeded", "Failed", "Running") if running_is_done else ("Succeeded", "Failed")
    ours = [p for p in snap.pods if (p["metadata"].get("namespace"), p["metadata"]["name"]) in wanted]
    done = {(p["metadata"].get("namespace"), p["metadata"]["name"]) for p in ours
            if (p.get("status") or {}).get("phase") in final}
    holding = any((p.get("spec") or {}).get("nodeName") and (p.get("status") or {}).get("phase") not in final
                  for p in ours)
    if not holding:
        done |= {(p["metadata"].get("namespace"), p["metadata"]["name"]) for p in ours
                 if _phase(p) == "Pending(unschedulable)"}
    return wanted <= done
