"""`vgpu demo --dra`: the sample workload through ResourceClaims, in a cluster in a box.

The same harness as `vgpu demo` (testbed/cluster.py) in DRA mode: each node runs our real `vgpu dra-plugin`
(publishing a ResourceSlice, preparing claims into CDI specs) registered with the kubelet stand-in, which prepares a
pod's claims before its containers start and applies the CDI edits, so `libvgpu.so` enforces the claimed limits over
the simulated driver. The kube-scheduler stand-in allocates claims as kube-scheduler's structured-parameters
allocator does. The DeviceClasses are deploy/dra/'s.

The samples, sized to the cluster's G GPUs and its smallest card (C MiB):
  * `share-<i>`, 2 x G pods, each with a claim (from a ResourceClaimTemplate) of 40 % of C and 30 % of the cores:
    two claims share every GPU; `share-0` also tries to allocate past its claim, which must be refused with
    CUDA_ERROR_OUT_OF_MEMORY;
  * `one-too-many`, submitted once the shares are placed, with the same claim: it does not fit anywhere, must stay
    pending with kube-scheduler's reason while the shares hold their GPUs, and runs once they end;
  * `plain-limits`, a pod asking `volcano.sh/vgpu-number: 1` in `resources.limits` only: served through the
    DeviceClass with `extendedResourceName` (a whole GPU), and runs when one is free.
`--headless` prints the summary and exits 0 only when all of that was observed. On a terminal (without
`--headless`) the demo is live, as `vgpu demo` is: a table of the pods and what their claims were allocated (GPU,
memory, cores) is redrawn every second until Ctrl-C or `--duration`, after the samples end too; `--duration` keeps
the cluster up that long in every mode.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vgpu.errors import ConfigError
from vgpu.testbed.demo import NAMESPACE, WORKLOAD, workload_reports

__all__ = ["DemoState", "render_claims", "run_dra_demo", "sample_claim_pods"]

TEMPLATE = "gpu-share"
SHARE_CORES = 30
DEFAULT_NODES, DEFAULT_GPUS = 1, "1xA100-40GB"


def _deploy_dir() -> Path:
    from vgpu.testbed.scheduler_driver import find_deploy_config

    config = find_deploy_config()
    if config is None:
        raise RuntimeError("deploy/ is not in this tree: the DRA demo needs deploy/dra/deviceclasses.yaml")
    for parent in Path(config).resolve().parents:
        if (parent / "dra" / "deviceclasses.yaml").exists():
            return parent
    raise RuntimeError("deploy/dra/deviceclasses.yaml is missing")


def device_classes() -> list[dict[str, Any]]:
    """deploy/dra/'s DeviceClasses, as the demo applies them."""
    docs = yaml.safe_load_all((_deploy_dir() / "dra" / "deviceclasses.yaml").read_text())
    return [d for d in docs if isinstance(d, dict) and d.get("kind") == "DeviceClass"]


def claim_template(share_mib: int) -> dict[str, Any]:
    """The ResourceClaimTemplate of the share pods: `share_mib` MiB and SHARE_CORES % of one GPU."""
    from vgpu.dra import DEVICE_CLASS

    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": TEMPLATE, "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount", "count": 1,
                "capacity": {"requests": {"memory": f"{share_mib}Mi", "cores": str(SHARE_CORES)}}}}]}}}}


def _pod(name: str, args: list[str], role: str, claim: bool = True) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "vgpu-sample:local", "command": WORKLOAD + args,
                                 "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}
    spec: dict[str, Any] = {"schedulerName": "vgpu-scheduler", "restartPolicy": "Never", "containers": [container]}
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}]
        container["resources"]["claims"] = [{"name": "gpu"}]
    else:
        container["resources"]["limits"] = {"volcano.sh/vgpu-number": "1"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "vgpu-demo", "demo-role": role}},
            "spec": spec}


def sample_claim_pods(gpus: int, card_mib: int, hold: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(the share pods, the pods submitted once they are placed, the share in MiB) for `gpus` GPUs whose smallest
    card has `card_mib` MiB."""
    share = card_mib * 2 // 5
    h = ["--hold", f"{hold:g}"]
    shares = [_pod("share-0", ["--mib", str(share + 1000), "--chunk", "500", "--kernels", "5", "--expect-oom", *h],
                   "over-limit")]
    shares += [_pod(f"share-{i}", ["--mib", str(share // 2), "--kernels", "10", *h], "share")
               for i in range(1, 2 * gpus)]
    later = [_pod("one-too-many", ["--mib", str(share // 2), "--kernels", "5", "--hold", "1"], "waits"),
             _pod("plain-limits", ["--mib", "2000", "--kernels", "5", "--hold", "1"], "plain", claim=False)]
    return shares, later, share


@dataclass
class DemoState:
    """What the demo saw while it ran."""

    shared_devices: set[str] = field(default_factory=set)  # pool/device that held two claims at once
    waiting_reason: str = ""  # one-too-many's pending reason while the shares held their GPUs
    plain_claim: str = ""  # the claim kube-scheduler made for plain-limits

    def observe(self, pods: dict[str, dict[str, Any]], claims: list[dict[str, Any]]) -> None:
        """Record sharing, the waiting pod's reason and the extended-resource claim from one look at the API."""
        holders: dict[str, set[str]] = {}
        for claim in claims:
            status = claim.get("status") or {}
            if not status.get("reservedFor"):
                continue
            for result in ((status.get("allocation") or {}).get("devices") or {}).get("results") or ():
                holders.setdefault(f"{result.get('pool')}/{result.get('device')}", set()).add(
                    claim["metadata"]["uid"])
            annotations = claim["metadata"].get("annotations") or {}
            owners = {o.get("name") for o in claim["metadata"].get("ownerReferences") or ()}
            if annotations.get("resource.kubernetes.io/extended-resource-claim") == "true" \
                    and "plain-limits" in owners:
                self.plain_claim = claim["metadata"]["name"]
        self.shared_devices |= {device for device, uids in holders.items() if len(uids) >= 2}
        waiting = pods.get("one-too-many")
        if waiting and not (waiting.get("spec") or {}).get("nodeName"):
            for cond in (waiting.get("status") or {}).get("conditions") or ():
                if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("message"):
                    self.waiting_reason = str(cond["message"])


def _phase(pod: dict[str, Any] | None) -> str:
    return str(((pod or {}).get("status") or {}).get("phase") or "missing")


def render_claims(pods: dict[str, dict[str, Any]], claims: list[dict[str, Any]], header: str, footer: str = "") -> str:
    """The live table: each pod, its phase and node, and per allocated device of its claims the GPU, memory and
    cores it consumes (a whole device when the claim consumes no capacity)."""
    allocated: dict[str, list[str]] = {}
    for claim in claims:
        owners = [o.get("name") for o in claim["metadata"].get("ownerReferences") or () if o.get("kind") == "Pod"]
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or ()
        for result in results:
            used = result.get("consumedCapacity") or {}
            share = " ".join(f"{k.rsplit('/', 1)[-1]}={v}" for k, v in sorted(used.items())) or "whole device"
            for owner in owners:
                allocated.setdefault(owner, []).append(f"{result.get('pool')}/{result.get('device')} {share}")
    lines = [header, "", f"{'POD':<14} {'PHASE':<10} {'NODE':<8} CLAIMED"]
    for name in sorted(pods):
        pod = pods[name]
        node = (pod.get("spec") or {}).get("nodeName") or "-"
        devices = allocated.get(name) or ["-"]
        lines.append(f"{name:<14} {_phase(pod):<10} {node:<8} {devices[0]}")
        lines += [f"{'':<34} {more}" for more in devices[1:]]
    return "\n".join(lines + ([ "", footer] if footer else []))


def evaluate(state: DemoState, pods: dict[str, dict[str, Any]], submitted: list[dict[str, Any]],
             reports: dict[tuple[str, str, str], dict[str, Any]], share_mib: int) -> tuple[bool, list[str]]:
    """Did every sample behave as the module docstring says? (ok, one line per check)."""
    lines = []
    ok = True

    def check(good: bool, text: str) -> None:
        nonlocal ok
        ok = ok and good
        lines.append(f"  {'ok  ' if good else 'FAIL'} {text}")

    for pod in submitted:
        name = pod["metadata"]["name"]
        live = pods.get(name)
        node = ((live or {}).get("spec") or {}).get("nodeName") or "-"
        check(_phase(live) == "Succeeded", f"{NAMESPACE}/{name:<13} node={node:<7} {_phase(live)}")
    over = reports.get((NAMESPACE, "share-0", "main")) or {}
    limits = over.get("limits") or {}
    check(over.get("result") == "oom-refused" and limits.get("CUDA_DEVICE_MEMORY_LIMIT_0") == f"{share_mib}m",
          f"share-0: limit {limits.get('CUDA_DEVICE_MEMORY_LIMIT_0', '?')} from its claim, an allocation past it "
          f"refused with CUDA_ERROR_OUT_OF_MEMORY ({over.get('result', 'no report')})")
    check(bool(state.shared_devices), "two claims shared one GPU: " + (", ".join(sorted(state.shared_devices))
                                                                      or "never seen"))
    check(bool(state.waiting_reason), "one-too-many waited while the GPUs were full: "
          + (state.waiting_reason[:160] or "never seen pending with a reason"))
    check(bool(state.plain_claim), "plain-limits (volcano.sh/vgpu-number: 1) was served through a claim: "
          + (state.plain_claim or "no extended-resource claim seen"))
    return ok, lines


def _smallest_card(slices: list[dict[str, Any]]) -> tuple[int, int]:
    from vgpu.dra import slice_devices

    devices = [d for s in slices for d in slice_devices(s)]
    return len(devices), min((d.memory_mib for d in devices), default=0)


def run_dra_demo(args: argparse.Namespace) -> int:
    """Start the cluster in DRA mode, run the samples, print the summary; the exit status."""
    from vgpu.testbed.cluster import LocalCluster, isolation_paths
    from vgpu.testbed.machine import MachineSpecError, parse_machine_spec

    if args.pods:
        print("vgpu demo: --pods is not supported with --dra (the DRA samples create their own claims)",
              file=sys.stderr)
        return 2
    nodes = args.nodes or DEFAULT_NODES
    gpus = args.gpus or DEFAULT_GPUS
    try:  # bad input fails before anything starts
        parse_machine_spec(gpus)
    except MachineSpecError as exc:
        raise ConfigError(f"--gpus {gpus}: {exc}") from None
    isolation_paths()
    classes = device_classes()
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="vgpu-demo-dra-"))
    workdir.mkdir(parents=True, exist_ok=True)
    out = sys.stdout
    interactive = not args.headless and out.isatty()
    cluster = LocalCluster(workdir, nodes=nodes, gpus=gpus, log_level="INFO", dra=True)
    status = 1
    old_term = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        print(f"vgpu demo: starting {nodes} node(s) x {gpus} in {workdir}", file=out, flush=True)
        cluster.start()
        print(f"vgpu demo: up; API server {cluster.url}; kubeconfig {cluster.kubeconfig}", file=out, flush=True)
        for body in classes:
            cluster.api_post("/apis/resource.k8s.io/v1/deviceclasses", body)
        count, card = _smallest_card(cluster.resource_get("resourceslices"))
        hold = args.hold if args.hold is not None else 6.0
        shares, later, share_mib = sample_claim_pods(count, card, hold)
        cluster.api_post(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates",
                         claim_template(share_mib))
        print(f"vgpu demo: {count} GPU(s); {len(shares)} pods claim {share_mib} MiB and {SHARE_CORES} % each",
              file=out, flush=True)
        for pod in shares:
            cluster.create_pod(pod)
        state = DemoState()
        submitted = shares + later
        t0 = time.monotonic()
        deadline = t0 + (args.duration or (1e9 if interactive else 240.0))
        footer = (f"kubeconfig {cluster.kubeconfig}\nCtrl-C stops; the work directory {workdir} is "
                  + ("kept" if args.workdir or args.keep_workdir else "removed (--keep-workdir keeps it)"))
        queued = list(later)
        while time.monotonic() < deadline:
            pods = {p["metadata"]["name"]: p for p in cluster.pods()
                    if p["metadata"].get("namespace") == NAMESPACE}
            claims = cluster.resource_get("resourceclaims")
            state.observe(pods, claims)
            if interactive:
                header = f"vgpu demo --dra  nodes={nodes} gpus={gpus}  t={time.monotonic() - t0:.0f}s"
                out.write("\x1b[H\x1b[2J" + render_claims(pods, claims, header, footer) + "\n")
                out.flush()
            if queued and all((pods.get(p["metadata"]["name"], {}).get("spec") or {}).get("nodeName")
                              for p in shares):
                for pod in queued:
                    cluster.create_pod(pod)
                    print(f"vgpu demo: submitted {pod['metadata']['name']}", file=out, flush=True)
                queued = []
            if not queued and not interactive and not args.duration and all(
                    _phase(pods.get(p["metadata"]["name"])) in ("Succeeded", "Failed") for p in submitted):
                break
            for proc in cluster.processes():
                if not proc.alive:
                    raise RuntimeError(f"{proc.name} exited unexpectedly:\n{proc.tail()}")
            time.sleep(1.0 if interactive else 0.3)
        pods = {p["metadata"]["name"]: p for p in cluster.pods() if p["metadata"].get("namespace") == NAMESPACE}
        ok, lines = evaluate(state, pods, submitted, workload_reports(workdir), share_mib)
        print("\nsummary:", file=out)
        for line in lines:
            print(line, file=out)
        kept = args.workdir or args.keep_workdir or not ok
        where = f"logs in {workdir}/logs and {workdir}/node-*/logs" if kept else "--keep-workdir keeps the logs"
        print(f"vgpu demo: {'PASS' if ok else 'FAIL'}: {len(submitted)} pod(s); {where}", file=out, flush=True)
        status = 0 if ok else 1
    except KeyboardInterrupt:
        print("\nvgpu demo: interrupted, stopping", file=out, flush=True)
        status = 130
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"vgpu demo: {exc}", file=sys.stderr, flush=True)
        status = 1
    finally:
        cluster.stop()
        signal.signal(signal.SIGTERM, old_term)
        if not args.workdir and not args.keep_workdir and status == 0:
            shutil.rmtree(workdir, ignore_errors=True)
    return status
