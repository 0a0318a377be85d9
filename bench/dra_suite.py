"""DRA mode's placement measurements: the given openb traces replayed (FGD protocol) for each (mode, policy) of
docs/dra.md, raw results into bench/results/dra/<trace>.json (rows as `vgpu replay --json` prints them, with
`mode`).

Conditions: our policy in device-plugin mode; our node choice with kube-scheduler's first-fit device choice, scored on
that choice (`dra`) or not (`dra-naive`); kube-scheduler alone in DRA mode (any feasible node, `random`, first fit);
FGD in device-plugin mode and with the allocator's choice. Runs are resumed like bench/placement_suite.py: a
(mode, policy, seed) already in a trace's file is not run again. Prints progress, never pass/fail.

`--table` prints the markdown table of docs/dra.md from the files instead of running anything.

Usage:
    nice .venv/bin/python bench/dra_suite.py [--trace default ...] [--seeds 5] [--jobs 1]
    .venv/bin/python bench/dra_suite.py --table
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
from pathlib import Path

from placement_suite import FIRST_SEED, GIVEN, RESULTS, load, save, source

from vgpu.replay.run import run_one

CONDITIONS = (
    ("deviceplugin", "fragaware"),
    ("dra", "fragaware"),
    ("dra-naive", "fragaware"),
    ("dra", "random"),
    ("deviceplugin", "fgd"),
    ("dra", "fgd"),
)


def _run(task: tuple[str, str, str, int]) -> tuple[str, dict[str, object]]:
    trace, mode, policy, seed = task
    nodes, pods, variant = source(trace)
    row = run_one(nodes, pods, policy, seed, variant=variant, mode=mode).summary()
    return trace, {"mode": mode} | row


COLUMNS = ("ours, device plugin", "ours + allocator (dra)", "ours + allocator (dra-naive)",
           "kube-scheduler alone", "FGD, device plugin", "FGD + allocator (dra)")


def table(out: Path, traces: list[str]) -> str:
    """Mean unallocated % at 100 % / 130 % arrived per trace and condition, over the seeds every condition has."""
    lines = ["| trace | seeds | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 2) + "|"]
    for trace in traces:
        rows = load(out / f"{trace}.json")
        if not rows:
            continue
        by = {c: {int(str(r["seed"])): r for r in rows if (r["mode"], r["policy"]) == c} for c in CONDITIONS}
        seeds = sorted(set.intersection(*(set(v) for v in by.values())))
        if not seeds:
            continue
        cells = []
        for condition in CONDITIONS:
            at = [statistics.mean(float(str(by[condition][s][k])) for s in seeds)
                  for k in ("unallocated_pct_at_100", "unallocated_pct_at_130")]
            cells.append(f"{at[0]:.2f} / {at[1]:.2f}")
        lines.append(f"| {trace} | {seeds[0]}-{seeds[-1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", action="append", choices=GIVEN, help="traces (default: the six given ones)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS / "dra", help="results folder")
    parser.add_argument("--table", action="store_true", help="print the table of docs/dra.md and stop")
    args = parser.parse_args()
    traces = args.trace or list(GIVEN)
    if args.table:
        print(table(args.out, traces))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    rows = {t: load(args.out / f"{t}.json") for t in traces}
    tasks = [(t, m, p, s) for s in range(FIRST_SEED, FIRST_SEED + args.seeds) for t in traces for m, p in CONDITIONS
             if not any((r["mode"], r["policy"], r["seed"]) == (m, p, s) for r in rows[t])]
    print(f"{len(tasks)} runs to do", flush=True)
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for done, (trace, row) in enumerate(pool.imap_unordered(_run, tasks), start=1):
            rows[trace].append(row)
            save(args.out / f"{trace}.json", trace, sorted(rows[trace], key=lambda r: str(r["mode"])))
            print(f"[{done}/{len(tasks)}] {trace} {row['mode']} {row['policy']} seed {row['seed']}: "
                  f"{row['unallocated_pct_at_100']} / {row['unallocated_pct_at_130']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
