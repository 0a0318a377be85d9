"""Consolidation judged on the openb departures replay (replay/consolidation.py): the same runs with consolidation
off (budget 0) and on at each budget (moves per replay hour, as a share of the running pods), per seed and arrival
ratio; raw rows go to bench/results/consolidation/<trace>.json, and `--table` prints the table of
docs/consolidation.md from that file (medians over seeds, and the paired differences on - off).

Prints progress, never pass/fail. Runs are resumed: a (ratio, budget, seed) already in the file is not run again.
The openb files come from $OPENB_DIR when set, else from the cache of `vgpu replay --trace openb`.

Usage:
    nice .venv/bin/python bench/consolidation_replay.py [--trace default] [--ratio 2.0 --ratio 1.2]
        [--share 0 --share 0.05 --share 0.5] [--seeds 5] [--jobs 2]
    .venv/bin/python bench/consolidation_replay.py --table [--trace default]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
from pathlib import Path

from placement_suite import provenance, source

from vgpu.replay.consolidation import run_consolidation

OUT = Path(__file__).resolve().parent / "results" / "consolidation"
FIRST_SEED = 42
POLICY = "fragaware"


def _run(task: tuple[str, float, float, int]) -> dict[str, object]:
    trace, ratio, share, seed = task
    nodes, pods, _ = source(trace)
    return {"ratio": ratio, **run_consolidation(nodes, pods, POLICY, seed, share, ratio=ratio).summary()}


def _key(row: dict[str, object]) -> tuple[float, float, int]:
    return float(str(row["ratio"])), float(str(row["share_per_hour"])), int(str(row["seed"]))


def load(path: Path) -> list[dict[str, object]]:
    """The rows of a trace's file (none when it does not exist)."""
    return list(json.loads(path.read_text())["results"]) if path.exists() else []


def save(path: Path, trace: str, rows: list[dict[str, object]]) -> None:
    """The rows sorted by ratio, budget and seed, one per line, with their provenance."""
    lines = ",\n".join("    " + json.dumps(r, sort_keys=True) for r in sorted(rows, key=_key))
    head = f'"trace": {json.dumps(trace)}, "provenance": {json.dumps(provenance(trace), sort_keys=True)}'
    path.write_text(f'{{{head}, "results": [\n{lines}\n]}}\n')


def table(rows: list[dict[str, object]]) -> str:
    """Medians over seeds per (ratio, budget), with the paired median difference to budget 0 of the same seed."""
    off = {(float(str(r["ratio"])), int(str(r["seed"]))): r for r in rows if float(str(r["share_per_hour"])) == 0}
    groups: dict[tuple[float, float], list[dict[str, object]]] = {}
    for row in rows:
        groups.setdefault(_key(row)[:2], []).append(row)
    out = ["| arrivals | moves per hour | seeds | moves | pods placed by moves | whole-GPU pods that waited "
           "| their wait mean / p50 / p95 s | whole-GPU never placed (on - off) | all never placed (on - off) "
           "| allocated % |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (ratio, share), group in sorted(groups.items()):
        def med(field: str, g: list[dict[str, object]] = group) -> float:
            return statistics.median(float(str(r[field])) for r in g)

        def diff(field: str, g: list[dict[str, object]] = group, at: float = ratio, on: bool = share > 0) -> str:
            pairs = [float(str(r[field])) - float(str(off[(at, int(str(r["seed"])))][field])) for r in g
                     if (at, int(str(r["seed"]))) in off]
            return f" ({statistics.median(pairs):+.0f})" if pairs and on else ""

        out.append(f"| {ratio:g} x capacity | {'off' if not share else f'{100 * share:g} % of pods'} | {len(group)} "
                   f"| {med('moves'):.0f} | {med('placed_by_moves'):.0f} "
                   f"| {med('whole_waited'):.0f}{diff('whole_waited')} | {med('whole_delay_mean_s'):.2f} / "
                   f"{med('whole_delay_p50_s'):.1f} / {med('whole_delay_p95_s'):.1f} "
                   f"| {med('whole_never_placed'):.0f}{diff('whole_never_placed')} "
                   f"| {med('never_placed'):.0f}{diff('never_placed')} | {med('allocated_pct_mean'):.2f} |")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="default", help="an openb pod list (default: default)")
    parser.add_argument("--ratio", type=float, action="append", help="arrivals as a share of capacity (default 2.0)")
    parser.add_argument("--share", type=float, action="append",
                        help="moves per replay hour as a share of the running pods (default 0, 0.05, 0.5)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--table", action="store_true", help="print the table from the results file and stop")
    args = parser.parse_args()
    path = OUT / f"{args.trace}.json"
    rows = load(path)
    if args.table:
        print(table(rows))
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    done = {_key(r) for r in rows}
    tasks = [(args.trace, ratio, share, seed) for seed in range(FIRST_SEED, FIRST_SEED + args.seeds)
             for ratio in args.ratio or [2.0] for share in args.share or [0.0, 0.05, 0.5]
             if (ratio, share, seed) not in done]
    print(f"{len(tasks)} runs to do", flush=True)
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for n, row in enumerate(pool.imap_unordered(_run, tasks), start=1):
            rows.append(row)
            save(path, args.trace, rows)
            print(f"[{n}/{len(tasks)}] ratio {row['ratio']} share {row['share_per_hour']} seed {row['seed']}: "
                  f"moves {row['moves']}, whole never placed {row['whole_never_placed']}, "
                  f"whole p95 {row['whole_delay_p95_s']} s, {row['seconds']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
