"""The tables of docs/placement.md, regenerated from the committed raw results (bench/results/).

Each table sits in docs/placement.md between `<!-- table:NAME -->` and `<!-- /table:NAME -->`; this script prints
them all, or with `--write` replaces them in the document. tests/replay/test_placement_docs.py checks that the
committed document holds exactly what this script prints. Tables:
- `suite`: per trace (the given openb traces, then the variants of replay/variants.py) FGD and ours, unallocated
  GPU % at 100 % and 130 % arrived (mean ± sd over seeds), failed pods, and the paired difference ours - FGD with
  the sd of the differences and the seeds on which ours is better;
- `baselines`: the other policies on the default trace, against the published figures;
- `departures`: the departures replay (replay/events.py), every policy;
- `topology`: the traces whose nodes publish NVLink islands (the `nvlink` variants), every policy with and without
  topology awareness (`@flat`): the share of multi-GPU pods placed in one island, unallocated GPU %, failed pods.

Usage: .venv/bin/python bench/placement_tables.py [--write]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
DOC = Path(__file__).resolve().parents[1] / "docs" / "placement.md"
OURS, FGD = "fragaware", "fgd"
GIVEN = ("default", "gpushare20", "gpushare40", "gpushare60", "gpushare80", "gpushare100")
# published means at 100 % (fgd-benchmark.md, section 5.3) of the policies in the baselines table
PUBLISHED = {"fgd": "4.77 ± 0.11", "bestfit": "7.14 ± 0.14", "random": "13.70 ± 0.33", "dotprod": "9.38 ± 0.19",
             "packing": "8.22 ± 0.53"}


def _rows(path: Path) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = json.loads(path.read_text())["results"]
    return rows


def _values(rows: list[dict[str, object]], policy: str, key: str) -> dict[int, float]:
    return {int(str(r["seed"])): float(str(r[key])) for r in rows if r["policy"] == policy}


def _sd(x: np.ndarray) -> float:
    return float(x.std(ddof=1)) if len(x) > 1 else 0.0


def _order(names: list[str]) -> list[str]:
    """The given traces first, in their order, then the variants in name order."""
    return [t for t in GIVEN if t in names] + sorted(t for t in names if t not in GIVEN)


def suite_table(folder: Path) -> str:
    """One row per trace: FGD and ours, and the paired difference (ours - FGD)."""
    lines = [
        "| trace | seeds | FGD @100 | ours @100 | ours - FGD @100 (better on) | FGD @130 | ours @130 | ours - FGD @130 "
        "(better on) | failed pods FGD / ours (ours - FGD) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    files = {p.stem: p for p in folder.glob("*.json")}
    for trace in _order(list(files)):
        rows = _rows(files[trace])
        cells = []
        seeds: list[int] = []
        for key in ("unallocated_pct_at_100", "unallocated_pct_at_130"):
            fgd, ours = _values(rows, FGD, key), _values(rows, OURS, key)
            seeds = sorted(fgd.keys() & ours.keys())
            a, b = np.array([fgd[s] for s in seeds]), np.array([ours[s] for s in seeds])
            d = b - a
            cells += [f"{a.mean():.2f} ± {_sd(a):.2f}", f"{b.mean():.2f} ± {_sd(b):.2f}",
                      f"{d.mean():+.2f} ± {_sd(d):.2f} ({int((d < 0).sum())}/{len(d)})"]
        fgd_f, ours_f = _values(rows, FGD, "failed_pods"), _values(rows, OURS, "failed_pods")
        a = np.array([fgd_f[s] for s in seeds])
        b = np.array([ours_f[s] for s in seeds])
        cells.append(f"{a.mean():.0f} / {b.mean():.0f} ({(b - a).mean():+.1f})")
        lines.append(f"| {trace} | {len(seeds)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def baselines_table(path: Path) -> str:
    """Every policy of one trace's file: mean ± sd (median) at 100 % and 130 %, failed pods, CPU s per run."""
    rows = _rows(path)
    policies = list(dict.fromkeys(str(r["policy"]) for r in rows))
    lines = ["| policy | seeds | unalloc % @100 mean ± sd (median) | published @100 | unalloc % @130 mean ± sd "
             "(median) | failed pods | CPU s/run |", "|---|---|---|---|---|---|---|"]
    for policy in policies:
        a = np.array(list(_values(rows, policy, "unallocated_pct_at_100").values()))
        c = np.array(list(_values(rows, policy, "unallocated_pct_at_130").values()))
        failed = np.array(list(_values(rows, policy, "failed_pods").values()))
        seconds = np.array(list(_values(rows, policy, "seconds").values()))
        lines.append(f"| {policy} | {len(a)} | {a.mean():.2f} ± {_sd(a):.2f} ({np.median(a):.2f}) | "
                     f"{PUBLISHED.get(policy, '')} | {c.mean():.2f} ± {_sd(c):.2f} ({np.median(c):.2f}) | "
                     f"{failed.mean():.0f} | {seconds.mean():.1f} |")
    return "\n".join(lines)


def departures_table(folder: Path) -> str:
    """Per trace and policy: allocated % (whole run and last quarter), never placed, queueing delay."""
    lines = ["| trace | policy | seeds | allocated % mean ± sd | last 25 % of the run | waiting % | never placed "
             "(ours - policy) | delay mean / p95 s |", "|---|---|---|---|---|---|---|---|"]
    for path in sorted(folder.glob("*.json")):
        rows = _rows(path)
        policies = list(dict.fromkeys(str(r["policy"]) for r in rows))
        ours_never = _values(rows, OURS, "never_placed")
        for policy in policies:
            figure = {k: _values(rows, policy, k) for k in ("allocated_pct_mean", "allocated_pct_end",
                                                           "waiting_pct_mean", "never_placed", "delay_mean_s",
                                                           "delay_p95_s")}
            seeds = sorted(figure["allocated_pct_mean"])
            m = {k: np.array([v[s] for s in seeds]) for k, v in figure.items()}
            paired = ""
            if policy != OURS and set(seeds) <= ours_never.keys():
                paired = f" ({np.mean([ours_never[s] - figure['never_placed'][s] for s in seeds]):+.1f})"
            lines.append(
                f"| {path.stem} | {policy} | {len(seeds)} | {m['allocated_pct_mean'].mean():.2f} ± "
                f"{_sd(m['allocated_pct_mean']):.2f} | {m['allocated_pct_end'].mean():.2f} ± "
                f"{_sd(m['allocated_pct_end']):.2f} | {m['waiting_pct_mean'].mean():.2f} | "
                f"{m['never_placed'].mean():.0f}{paired} | {m['delay_mean_s'].mean():.1f} / "
                f"{m['delay_p95_s'].mean():.1f} |")
    return "\n".join(lines)


def topology_table(folder: Path) -> str:
    """Per topology trace and policy: multi-GPU pods in one island, unallocated % at 100 and 130, failed pods (with
    the paired difference to ours with topology) and CPU seconds per run."""
    lines = ["| trace | policy | topology | seeds | multi-GPU pods in one island % (pods per run) | unalloc % @100 "
             "(- ours) | unalloc % @130 (- ours) | failed pods (- ours) | CPU s/run |",
             "|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(folder.glob("*.json")):
        rows = _rows(path)
        if not any("island_pods" in r for r in rows):
            continue
        ours = {k: _values(rows, OURS, k) for k in ("unallocated_pct_at_100", "unallocated_pct_at_130", "failed_pods")}
        for policy in sorted(dict.fromkeys(str(r["policy"]) for r in rows), key=lambda p: (p.split("@")[0] != OURS, p)):
            mine = [r for r in rows if r["policy"] == policy]
            seeds = sorted(int(str(r["seed"])) for r in mine)
            local = np.array([100 * float(str(r.get("island_local", 0))) / max(1, int(str(r.get("island_pods", 0))))
                              for r in mine])
            pods = np.mean([int(str(r.get("island_pods", 0))) for r in mine])
            cells = []
            for key in ("unallocated_pct_at_100", "unallocated_pct_at_130", "failed_pods"):
                values = _values(rows, policy, key)
                a = np.array([values[s] for s in seeds])
                cell = f"{a.mean():.0f}" if key == "failed_pods" else f"{a.mean():.2f} ± {_sd(a):.2f}"
                if key in ours and policy != OURS and set(seeds) <= ours[key].keys():
                    d = a - np.array([ours[key][s] for s in seeds])
                    cell += f" ({d.mean():+.1f})" if key == "failed_pods" else f" ({d.mean():+.2f})"
                cells.append(cell)
            name, _, flat = policy.partition("@")
            seconds = np.mean(list(_values(rows, policy, "seconds").values()))
            lines.append(f"| {path.stem} | {name} | {'off' if flat else 'on'} | {len(seeds)} | {local.mean():.1f} "
                         f"({pods:.0f}) | " + " | ".join(cells) + f" | {seconds:.1f} |")
    return "\n".join(lines)


def tables(results: Path = RESULTS) -> dict[str, str]:
    """Every table of docs/placement.md by name."""
    return {
        "suite": suite_table(results / "placement"),
        "baselines": baselines_table(results / "baselines" / "default.json"),
        "departures": departures_table(results / "departures"),
        "topology": topology_table(results / "placement"),
    }


def blocks(text: str) -> dict[str, str]:
    """The tables between the markers of a document, by name."""
    return {m.group(1): m.group(2).strip("\n")
            for m in re.finditer(r"<!-- table:(\w+) -->\n(.*?)<!-- /table:\1 -->", text, re.S)}


def write(doc: Path, new: dict[str, str]) -> str:
    """The document with every marked table replaced by `new`'s."""
    text = doc.read_text()
    for name, table in new.items():
        text = re.sub(rf"(<!-- table:{name} -->\n).*?(<!-- /table:{name} -->)",
                      lambda m, t=table: f"{m.group(1)}{t}\n{m.group(2)}", text, flags=re.S)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"replace the tables in {DOC}")
    args = parser.parse_args()
    new = tables()
    if args.write:
        DOC.write_text(write(DOC, new))
    else:
        for name, table in new.items():
            print(f"<!-- table:{name} -->\n{table}\n<!-- /table:{name} -->\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
