"""Benchmark: one replay of an openb trace per policy (CPU seconds on one core and unallocated GPU %).

Prints figures, never pass/fail. Usage:
    .venv/bin/python bench/bench_replay.py [--trace default] [--policy fgd --policy fragaware] [--seed 42]
The target in issue 6 is <= 20 s per replay of the default trace with fgd or fragaware.
"""

import argparse
import os
import sys
from pathlib import Path

from vgpu.replay.run import run_one

TRACES = Path(os.environ.get("OPENB_DIR", Path(__file__).resolve().parents[2] / "shared" / "traces" / "openb"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="default", help="pod list suffix (default, gpushare20..100)")
    parser.add_argument("--policy", action="append", default=None, help="policies (default: fgd fragaware bestfit)")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    nodes = TRACES / "openb_node_list_gpu_node.csv"
    pods = TRACES / f"openb_pod_list_{args.trace}.csv"
    print(f"trace={args.trace} seed={args.seed} nodes={nodes}")
    print(f"{'policy':<10} {'pods':>6} {'cpu_s':>7} {'unalloc@100':>12} {'unalloc@130':>12} {'failed':>7}")
    for name in args.policy or ["fgd", "fragaware", "bestfit"]:
        r = run_one(str(nodes), str(pods), name, args.seed)
        print(
            f"{name:<10} {r.pods:>6} {r.seconds:>7.1f} {r.unallocated_pct_at_100:>11.2f}% "
            f"{r.unallocated_pct_at_130:>11.2f}% {r.failed_pods:>7}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
