"""Runs the fault suite (tests/e2e/test_e2e_faults.py) several times and prints, per fault, what the invariant
checks saw and how the batches ended: the table of docs/operations.md's evidence.

    .venv/bin/python bench/fault_table.py [RUNS]        (default 5; about 4 minutes a run on 2 cores)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    report = Path(tempfile.mkdtemp(prefix="vgpu-faults-")) / "report.jsonl"
    passed = 0
    for run in range(1, runs + 1):
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "tests/e2e/test_e2e_faults.py"], cwd=ROOT, env={**os.environ, "VGPU_FAULT_REPORT":
                                                                                str(report)},
                             capture_output=True, text=True)
        summary = (res.stdout.strip().splitlines() or ["?"])[-1]
        print(f"run {run}/{runs}: {summary}", file=sys.stderr, flush=True)
        passed += res.returncode == 0
    rows: dict[str, list[dict]] = defaultdict(list)
    for line in report.read_bytes().splitlines():
        row = orjson.loads(line)
        rows[row["namespace"]].append(row)
    print(f"{passed}/{runs} runs passed\n")
    print("| fault (namespace) | runs | violations | changes / admissions / file rounds checked (per run) "
          "| pods | succeeded (min-max) | failed (max) | ledger converged (s, max) |")
    print("|---|---|---|---|---|---|---|---|")
    for namespace, group in sorted(rows.items()):
        n = len(group)
        print(f"| {namespace} | {n} | {sum(r['violations'] for r in group)} | "
              f"{sum(r['changes'] for r in group) // n} / {sum(r['admissions'] for r in group) // n} / "
              f"{sum(r['file_reads'] for r in group) // n} | {group[0]['pods']} | "
              f"{min(r['succeeded'] for r in group)}-{max(r['succeeded'] for r in group)} | "
              f"{max(r['failed'] for r in group)} | {max(r['converged_s'] for r in group)} |")
    return 0 if passed == runs else 1


if __name__ == "__main__":
    sys.exit(main())
