"""Memory of the scheduler extender under churn (prints figures; never pass/fail).

One process: the extender over a ledger of N nodes x 8 GPUs (as bench/bench_extender.py builds it), and C cycles of
a pod created (the pod watch shows it), taken through /filter, /prioritize and /bind, then deleted (the watch shows
the deletion). Every `--every` cycles: the resident memory, and how many entries the per-pod structures hold (the
pods the extender has seen, the ledger's charges and its expiry queue). Flat figures mean nothing is kept per pod
once the pod is gone.

Run: nice .venv/bin/python bench/soak_extender.py [--nodes 100] [--cycles 100000] [--every 10000]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_extender import SHAPES, build, node_name, pod_dict, rss_mib


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--cycles", type=int, default=100_000)
    ap.add_argument("--every", type=int, default=10_000)
    args = ap.parse_args()
    if args.nodes < 1 or args.cycles < 1 or args.every < 1:
        ap.error("--nodes, --cycles and --every must be at least 1")
    from vgpu.scheduler.policies import DEFAULT_NODE_POLICY

    ledger, ext, _ = build(args.nodes, 0, "decide", DEFAULT_NODE_POLICY)
    names = [node_name(n) for n in range(args.nodes)]
    print(f"{args.nodes} nodes x 8 GPUs, node policy {DEFAULT_NODE_POLICY}: create -> /filter -> /prioritize -> "
          f"/bind -> delete, {args.cycles} cycles")
    print(f"{'cycles':>8} {'RSS MiB':>8} {'seen pods':>10} {'charges':>8} {'expiry queue':>13} {'cycles/s':>9}")
    bound = 0
    start = last = time.perf_counter()
    for i in range(1, args.cycles + 1):
        pod = pod_dict(f"soak-{i}", SHAPES[i % len(SHAPES)])
        ledger.on_pod(pod)
        out = ext.filter({"Pod": pod, "NodeNames": names})
        if out["NodeNames"]:
            scores = ext.prioritize({"Pod": pod, "NodeNames": out["NodeNames"]})
            best = max(scores, key=lambda h: (h["Score"], h["Host"]))["Host"]
            meta = pod["metadata"]
            if not ext.bind({"PodName": meta["name"], "PodNamespace": "bench", "PodUID": meta["uid"],
                             "Node": best})["Error"]:
                bound += 1
        ledger.on_pod_delete(pod)
        if i % args.every == 0 or i == args.cycles:
            gc.collect()
            now = time.perf_counter()
            rate = args.every / (now - last) if i % args.every == 0 else 0.0
            last = now
            print(f"{i:>8} {rss_mib(os.getpid()):>8.1f} {len(ext._seen):>10} {len(ledger.charges):>8} "
                  f"{len(ledger._expiry):>13} {rate:>9.0f}", flush=True)
    print(f"{bound} of {args.cycles} pods bound in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
