"""What the doctor prints and writes: a progress line per probe, the summary table, the JSON document."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vgpu import __version__
from vgpu.isolation.doctor.outcome import mib
from vgpu.isolation.doctor.session import Result, Run

OK, FAILED, SKIPPED = "ok", "FAILED", "skipped"


def status(result: Result) -> str:
    """ok, FAILED or skipped."""
    if result.outcome.skipped:
        return SKIPPED
    return OK if result.outcome.ok else FAILED


def detail(result: Result) -> str:
    """The summary of a passed probe, the reason of any other."""
    out = result.outcome
    return out.summary if out.ok and not out.skipped else out.reason


def progress_line(i: int, n: int, result: Result) -> str:
    """`vgpu doctor: [ 3/24] mem-pitch: ok (0.4 s)`, with the reason when it did not pass."""
    width = len(str(n))
    line = f"vgpu doctor: [{i:>{width}}/{n}] {result.probe.name}: {status(result)} ({result.seconds:.1f} s)"
    return line if status(result) == OK else f"{line}: {result.outcome.reason}"


def header(run: Run) -> str:
    """The driver, the devices, the library and the limits used."""
    f = run.facts
    nvml = f.get("nvml_driver_version") or f"no NVML ({f.get('nvml_error')})"
    lines = [f"driver   CUDA {f['cuda_version']} (cuDriverGetVersion {f['cuda_driver_version']}), NVIDIA {nvml}",
             f"         libcuda: {f.get('libcuda')}" + (f"  (--driver-dir {run.driver_dir})" if run.driver_dir else "")]
    for d in f["devices"]:
        lines.append(f"device {d['index']} {d['name']}  {d['uuid']}  {mib(d['total_bytes'])}  {d['sm_count']} SMs  "
                     f"cc {d['compute_capability']}")
    lines.append(f"library  {run.library.path} ({run.library.source})")
    s = run.settings
    lines.append(f"limits   memory {mib(s.limit)} per device (steps of {mib(s.chunk)}); timed windows "
                 f"{s.warmup:g} s warm-up + {s.window:g} s{' (--quick)' if s.quick else ''}")
    if f.get("ld_so_preload"):
        lines.append(f"note     /etc/ld.so.preload loads {' '.join(f['ld_so_preload'])} into every process, "
                     "the runs without the library too")
    return "\n".join(lines)


def table(results: Sequence[Result]) -> str:
    """One row per probe: name, result, seconds, what it found."""
    name_w = max([len("PROBE"), *(len(r.probe.name) for r in results)])
    rows = [f"{'PROBE':<{name_w}}  {'RESULT':<7}  {'SECONDS':>7}  DETAILS"]
    for r in results:
        rows.append(f"{r.probe.name:<{name_w}}  {status(r):<7}  {r.seconds:>7.1f}  {detail(r)}")
    return "\n".join(rows)


def verdict(results: Sequence[Result], seconds: float) -> str:
    """The last line: counts and total time."""
    counts = {s: sum(1 for r in results if status(r) == s) for s in (OK, FAILED, SKIPPED)}
    head = "limits hold" if not counts[FAILED] else "LIMITS BROKEN"
    return (f"{head}: {counts[OK]} ok, {counts[FAILED]} failed, {counts[SKIPPED]} skipped "
            f"in {seconds:.1f} s")


def document(run: Run, results: Sequence[Result], seconds: float, exit_status: int) -> dict[str, Any]:
    """The --json document: {"driver", "library", "settings", "probes", ...}."""
    s = run.settings
    return {
        "doctor": {"version": __version__, "seconds": round(seconds, 2), "exit_status": exit_status},
        "driver": run.facts,
        "library": {"path": run.library.path, "source": run.library.source},
        "settings": {"quick": s.quick, "memory_limit_bytes": s.limit, "chunk_bytes": s.chunk,
                     "warmup_s": s.warmup, "window_s": s.window},
        "probes": [{"name": r.probe.name, "group": r.probe.group, "what": r.probe.what, **r.outcome.to_json(),
                    "seconds": round(r.seconds, 3)} for r in results],
    }


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write the document (indented, UTF-8)."""
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
