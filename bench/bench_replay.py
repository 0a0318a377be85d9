"""Benchmark: replays of an openb trace per policy, CPU seconds against FGD's, and what the extender's learner
thread changes (prints figures, never pass/fail).

Rows: `fgd` and `fragaware` as `vgpu replay` runs them (stale results rescored only within the request budget,
`replay.run.replay(background=0)`), and `fragaware, learner keeping up`: every stale result rescored between pods,
which is what the extender does when its learner thread finishes before the next request (the setting of
tests/replay/test_replay_extender.py). Issues 20 and 32's goal: one replay of ours within 1.5 x FGD's time.
Beside the time, placement's work (`replay.run.WORK`): node states evaluated (results not in the memo), fits and
scores computed, in thousands per run; the time follows the states evaluated (docs/placement.md, Performance).

Usage: nice .venv/bin/python bench/bench_replay.py [--trace default] [--seeds 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from placement_suite import TRACES, source

from vgpu.replay.arrivals import arrival_sequence
from vgpu.replay.run import WORK, curve, load_trace, prepare_policy, replay

ROWS = (("fgd", "fgd", 0), ("fragaware", "fragaware", 0), ("fragaware, learner keeping up", "fragaware", 1 << 62))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="default", choices=TRACES)
    parser.add_argument("--seeds", type=int, default=3, help="seeds 42, 43, ...")
    args = parser.parse_args()
    nodes, pods, variant = source(args.trace)
    trace, cluster = load_trace(nodes, pods, variant)
    figures: dict[str, list[tuple[float, ...]]] = {label: [] for label, _, _ in ROWS}
    for seed in range(42, 42 + args.seeds):
        sequence, rank = arrival_sequence(trace.pods, cluster.capacity_milli, len(trace.nodes), seed)
        for label, name, background in ROWS:
            policy = prepare_policy(name, trace.pods, seed)
            work: dict[str, int] = {}
            start = time.process_time()
            arrived, allocated, where = replay(cluster, trace.pods, sequence, rank, policy, seed,
                                               background=background, work=work)
            seconds = time.process_time() - start
            unalloc = curve(arrived, allocated, cluster.capacity_milli)
            figures[label].append((seconds, float(unalloc[100]), float(unalloc[130]), int((where < 0).sum()),
                                   *(work[name] / 1000 for name in WORK)))
    fgd = [float(np.mean(column)) for column in zip(*figures["fgd"])]
    print(f"trace {args.trace}, seeds 42..{41 + args.seeds}, {len(sequence)} pods in the last run; means over seeds")
    print(f"{'policy':<32} {'CPU s':>6} {'x fgd':>6} {'unalloc@100':>12} {'unalloc@130':>12} {'failed':>7} "
          f"{'states k':>8} {'x fgd':>6} {'fits k':>7} {'scores k':>8}")
    for label, runs in figures.items():
        s, u100, u130, failed, evaluated, fits, scores = (float(np.mean(column)) for column in zip(*runs))
        print(f"{label:<32} {s:>6.2f} {s / fgd[0]:>6.2f} {u100:>11.2f}% {u130:>11.2f}% {failed:>7.0f} "
              f"{evaluated:>8.1f} {evaluated / fgd[4]:>6.2f} {fits:>7.1f} {scores:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
