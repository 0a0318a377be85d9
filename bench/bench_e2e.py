"""End-to-end burst figures: pods/s from submission to running, and the time from bind to Allocate answered.

Starts the cluster in a box of testbed/cluster.py (API-server, kubelet and kube-scheduler stand-ins around the
real extender and device plugins, every piece a process), submits a burst of short pods (the shapes of
tests/e2e/burst.py) and reads the timestamps the scheduler driver (bind answered) and the kubelet stand-ins
(every Allocate of the pod answered, process started) append to the cluster's trace file. Prints figures; never
passes or fails.

    .venv/bin/python bench/bench_e2e.py [--pods 300] [--nodes 3] [--gpus 4xA100-40GB] [--shape mixed|exclusive]

`mixed`: 1-2 GPUs, 1000-8000 MiB, 0-30 cores per pod (pods share GPUs); `exclusive`: one whole GPU per pod.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from burst import burst_pods, submit  # noqa: E402
from e2e_helpers import TERMINAL, container, phase, pod  # noqa: E402

from vgpu.testbed.cluster import LocalCluster  # noqa: E402


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _line(label: str, values: list[float], unit: str = "ms", scale: float = 1000.0) -> str:
    if not values:
        return f"  {label:<34} (no samples)"
    v = [x * scale for x in values]
    return (f"  {label:<34} n={len(v):<4} p50={_pct(v, 50):8.1f}{unit} p90={_pct(v, 90):8.1f}{unit} "
            f"p99={_pct(v, 99):8.1f}{unit} max={max(v):8.1f}{unit}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=300)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--gpus", default="4xA100-40GB")
    ap.add_argument("--shape", choices=("mixed", "exclusive"), default="mixed")
    ap.add_argument("--run-seconds", type=float, default=2.0, help="how long each pod's process runs")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-e2e-"))
    cluster = LocalCluster(workdir, nodes=args.nodes, gpus=args.gpus, metrics_port=0, scheduler_metrics_port=0)
    t0 = time.monotonic()
    cluster.start()
    startup = time.monotonic() - t0
    try:
        if args.shape == "mixed":
            pods = burst_pods(args.pods, cluster.memory_factor, namespace="bench", impossible=0,
                              run_seconds=args.run_seconds)
        else:
            pods = [pod(f"x{i:03d}", [container("main", ["sleep", f"{args.run_seconds}"], cores=100)],
                        namespace="bench") for i in range(args.pods)]
        submitted_at = submit(cluster, pods)
        submit_done = time.time()
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            live = [p for p in cluster.pods() if p["metadata"].get("namespace") == "bench"]
            if len(live) == len(pods) and all(phase(p) in TERMINAL for p in live):
                break
            time.sleep(1.0)
        live = [p for p in cluster.pods() if p["metadata"].get("namespace") == "bench"]
        trace = cluster.read_trace()
    finally:
        cluster.stop()

    uids = {p["metadata"]["uid"] for p in live}
    bound = {e["uid"]: e for e in trace if e.get("ev") == "bound" and e.get("uid") in uids}
    admitted = {e["uid"]: e["t"] for e in trace if e.get("ev") == "admitted" and e.get("uid") in uids}
    running = {e["uid"]: e["t"] for e in trace if e.get("ev") == "running" and e.get("uid") in uids}
    bind_to_alloc = [admitted[u] - bound[u]["bind_done"] for u in admitted if u in bound]
    sub_to_bound = [bound[u]["bind_done"] - submitted_at for u in bound]
    cycles = [bound[u]["cycle_ms"] / 1000.0 for u in bound]
    phases = Counter(phase(p) for p in live)
    reasons = Counter((p.get("status") or {}).get("reason") or "-" for p in live if phase(p) == "Failed")

    print(f"bench_e2e: {args.pods} pods ({args.shape}), {args.nodes} nodes x {args.gpus}, "
          f"memory factor {cluster.memory_factor} MiB/unit; cluster up in {startup:.1f}s; "
          f"submitted in {submit_done - submitted_at:.2f}s")
    print(f"  outcome: {dict(phases)}" + (f"; failed by reason: {dict(reasons)}" if reasons else ""))
    if running:
        span = max(running.values()) - submitted_at
        print(f"  submission -> running: {len(running)} pods in {span:.1f}s = {len(running) / span:.1f} pods/s "
              f"(first running after {min(running.values()) - submitted_at:.2f}s)")
    print(_line("submission -> bind answered", sub_to_bound, "s", 1.0))
    print(_line("scheduling cycle (filter..bind)", cycles))
    print(_line("bind answered -> Allocate answered", bind_to_alloc))
    print(f"  workdir: {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
