"""The generalisation suite: every given openb trace and every variant of the default one (replay/variants.py),
replayed under the FGD protocol for each policy and seed; raw results go to one JSON file per trace. With
`--departures`, the departures replay (replay/events.py) instead, into bench/results/departures/.

Prints progress, never pass/fail. Runs are resumed: a (policy, seed) already in a trace's file is not run again,
so the suite can be stopped and restarted. The committed files (bench/results/) are what
bench/placement_tables.py turns into the tables of docs/placement.md.

The openb files come from $OPENB_DIR when set, else from the cache of `vgpu replay --trace openb`.

Usage:
    nice .venv/bin/python bench/placement_suite.py [--trace default --trace multigpu50 ...] [--policy fgd
        --policy fragaware] [--seeds 10] [--jobs 2] [--out DIR]
    nice .venv/bin/python bench/placement_suite.py --departures --trace default [--seeds 10] [--jobs 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

from vgpu.replay.events import run_departures
from vgpu.replay.run import run_one
from vgpu.replay.traces import openb
from vgpu.replay.variants import VARIANTS

OPENB_DIR = os.environ.get("OPENB_DIR")  # a folder holding the openb CSVs; unset: fetched into the cache
RESULTS = Path(__file__).resolve().parent / "results"
GIVEN = ("default", "gpushare20", "gpushare40", "gpushare60", "gpushare80", "gpushare100")
TRACES = GIVEN + tuple(VARIANTS)
FIRST_SEED = 42


def source(trace: str) -> tuple[str, str, str]:
    """(node list, pod list, variant) of a suite trace: a given pod list, or a variant of the default one. The files
    come from $OPENB_DIR, else from the cache `vgpu replay --trace openb` fills (downloaded and checked once)."""
    pods, variant = (trace, "") if trace in GIVEN else ("default", trace)
    if OPENB_DIR:
        return (str(Path(OPENB_DIR) / "openb_node_list_gpu_node.csv"),
                str(Path(OPENB_DIR) / f"openb_pod_list_{pods}.csv"), variant)
    nodes_path, pods_path = openb(pods)
    return str(nodes_path), str(pods_path), variant


def _run(task: tuple[str, str, int, bool]) -> tuple[str, dict[str, object]]:
    trace, policy, seed, departures = task
    nodes, pods, variant = source(trace)
    if departures:
        return trace, run_departures(nodes, pods, policy, seed, variant=variant).summary()
    return trace, run_one(nodes, pods, policy, seed, variant=variant).summary()


def load(path: Path) -> list[dict[str, object]]:
    """The result rows of one trace's file (none when it does not exist)."""
    if not path.exists():
        return []
    rows: list[dict[str, object]] = json.loads(path.read_text())["results"]
    return rows


def provenance(trace: str) -> dict[str, str]:
    """What produced a trace's results: the commit (with `-dirty` for uncommitted changes) and the SHA-256 of the
    node and pod lists read."""
    repo = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        res = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
        return res.stdout.strip() if res.returncode == 0 else ""

    commit = git("rev-parse", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += "-dirty"
    nodes, pods, _variant = source(trace)
    return {"commit": commit, "nodes_sha256": hashlib.sha256(Path(nodes).read_bytes()).hexdigest(),
            "pods_sha256": hashlib.sha256(Path(pods).read_bytes()).hexdigest()}


def save(path: Path, trace: str, rows: list[dict[str, object]]) -> None:
    """Write a trace's rows sorted by seed then policy, one row per line (small diffs), with their provenance."""
    rows = sorted(rows, key=lambda r: (int(str(r["seed"])), str(r["policy"])))
    lines = ",\n".join("    " + json.dumps(r, sort_keys=True) for r in rows)
    head = f'"trace": {json.dumps(trace)}, "provenance": {json.dumps(provenance(trace), sort_keys=True)}'
    path.write_text(f'{{{head}, "results": [\n{lines}\n]}}\n')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", action="append", choices=TRACES, help="traces (default: all)")
    parser.add_argument("--policy", action="append",
                        help="policies (default: fgd, fragaware; with --departures also bestfit, random)")
    parser.add_argument("--departures", action="store_true", help="the departures replay")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, help="results folder (default: bench/results/placement or departures)")
    args = parser.parse_args()
    traces = args.trace or (["default"] if args.departures else list(TRACES))
    policies = args.policy or (["fgd", "fragaware", "bestfit", "random"] if args.departures else ["fgd", "fragaware"])
    out = args.out or RESULTS / ("departures" if args.departures else "placement")
    out.mkdir(parents=True, exist_ok=True)
    rows = {t: load(out / f"{t}.json") for t in traces}
    tasks = [(t, p, s, args.departures) for s in range(FIRST_SEED, FIRST_SEED + args.seeds) for t in traces
             for p in policies if not any(r["policy"] == p and r["seed"] == s for r in rows[t])]
    print(f"{len(tasks)} runs to do", flush=True)
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for done, (trace, row) in enumerate(pool.imap_unordered(_run, tasks), start=1):
            rows[trace].append(row)
            save(out / f"{trace}.json", trace, rows[trace])
            figures = {k: v for k, v in row.items() if k not in ("policy", "seed")}
            print(f"[{done}/{len(tasks)}] {trace} {row['policy']} seed {row['seed']}: {figures}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
