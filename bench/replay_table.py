"""Turn `vgpu replay --json` outputs into the markdown results table of docs/placement.md.

Usage: .venv/bin/python bench/replay_table.py default.json gpushare20.json ...   (trace name = file stem)

Rows per policy come from `vgpu.replay.report.summarise`; when a file holds both `fgd` and `fragaware`, a row with the
paired difference (ours - fgd, same seeds) follows.
"""

import json
import sys
from pathlib import Path

from vgpu.replay.report import summarise
from vgpu.replay.run import RunResult

HEADER = (
    "| trace | policy | seeds | unalloc % @100 mean ± sd (median) | unalloc % @130 mean ± sd (median) "
    "| failed pods | s/run |\n|---|---|---|---|---|---|---|"
)


def load(path: Path) -> list[RunResult]:
    """The runs of one `--json` output."""
    return [RunResult(**row) for row in json.loads(path.read_text())["results"]]


def paired(runs: list[RunResult], key: str) -> tuple[float, int, int]:
    """Mean of ours - fgd over the seeds both ran, seeds where ours is lower, and the number of pairs."""
    fgd = {r.seed: getattr(r, key) for r in runs if r.policy == "fgd"}
    ours = {r.seed: getattr(r, key) for r in runs if r.policy == "fragaware"}
    diffs = [ours[s] - fgd[s] for s in sorted(fgd.keys() & ours.keys())]
    return sum(diffs) / len(diffs), sum(d < 0 for d in diffs), len(diffs)


def table(paths: list[Path]) -> str:
    lines = [HEADER]
    for path in paths:
        runs = load(path)
        policies = list(dict.fromkeys(r.policy for r in runs))
        for row in summarise(runs, policies):
            lines.append(
                f"| {path.stem} | {row['policy']} | {row['seeds']} "
                f"| {row['mean_100']:.2f} ± {row['sd_100']:.2f} ({row['median_100']:.2f}) "
                f"| {row['mean_130']:.2f} ± {row['sd_130']:.2f} ({row['median_130']:.2f}) "
                f"| {row['failed_pods']:.0f} | {row['seconds']:.1f} |"
            )
        if {"fgd", "fragaware"} <= set(policies):
            d100, wins, n = paired(runs, "unallocated_pct_at_100")
            d130, _, _ = paired(runs, "unallocated_pct_at_130")
            lines.append(f"|  | paired ours - fgd | | {d100:+.2f} (ours better on {wins}/{n} seeds) | "
                         f"{d130:+.2f} | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table([Path(p) for p in sys.argv[1:] if Path(p).stat().st_size > 0]))
