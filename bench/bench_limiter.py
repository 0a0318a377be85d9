"""Achieved GPU share under libvgpu.so's compute limit (prints figures; never pass/fail).

Saturating workloads (tests/isolation/csrc/probe.c `mix`) run on the test bed's simulated GPU, whose kernel
durations are drawn per launch and which records its own timeline; the share each container got is read from that
timeline over a window after the warm-up.  Workloads: constant (time proportional to the grid, the old model),
varied (log-normal, CV 1.2, drifting mean), bursty (6x longer kernels every other 300 ms), mixed (30 us, 0.4 ms and
bimodal 0.3/12 ms kernels), graph (4-node graphs), streams (varied over 3 streams).  Layouts: one process; three
processes of one container; two containers (the second at 90 - limit, at least 10).

    .venv/bin/python bench/bench_limiter.py [--limits 10,30,50,70,90] [--workloads ...] [--layouts ...]
        [--seconds 5] [--library path/to/other/libvgpu.so]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import tempfile
from pathlib import Path

from vgpu.isolation.build import ensure_built
from vgpu.isolation.cuda_include import cuda_include_dir
from vgpu.testbed.build import ensure_sim_built

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("constant", "varied", "bursty", "mixed", "graph", "streams")
LAYOUTS = ("1proc", "3proc", "2ctr")
WARMUP = 1.5


def build_probe(out: Path, sim_dir: Path) -> Path:
    subprocess.run(["gcc", "-O2", f"-I{cuda_include_dir()}", f"-I{ROOT / 'isolation' / 'src'}", "-o", str(out),
                    str(ROOT / "tests" / "isolation" / "csrc" / "probe.c"), f"-L{sim_dir}", "-lcuda", "-ldl"],
                   check=True)
    return out


def run_case(probe: Path, sim_dir: Path, library: Path, tmp: Path, workload: str, limits: list[int], nproc: int,
             seconds: float) -> list[float]:
    """Share (%) of the device each container got over [WARMUP, seconds - 0.2]."""
    state = tmp / f"{workload}-{'-'.join(map(str, limits))}-{nproc}.state"
    os.environ["SIMGPU_STATE"] = str(state)
    sim = ctypes.CDLL(str(sim_dir / "libcuda.so.1"))
    sim.simgpu_busy_ns.restype = sim.simgpu_now_ns.restype = ctypes.c_uint64
    sim.simgpu_busy_ns.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_DEVICE_", "GPU_CORE_", "LD_PRELOAD"))}
    base.update(LD_LIBRARY_PATH=str(sim_dir), SIMGPU_STATE=str(state), LD_PRELOAD=str(library),
                CUDA_DEVICE_MEMORY_LIMIT="8g", GPU_CORE_UTILIZATION_POLICY="force")
    kind, streams = ("varied", "3") if workload == "streams" else (workload, "1")
    t0 = sim.simgpu_now_ns()
    procs = []
    for c, limit in enumerate(limits):
        env = dict(base, CUDA_DEVICE_SM_LIMIT=str(limit),
                   CUDA_DEVICE_MEMORY_SHARED_CACHE=str(state.with_suffix(f".{c}.cache")))
        procs += [(c, subprocess.Popen([str(probe), "mix", kind, str(seconds), streams], env=env,
                                       stdout=subprocess.DEVNULL)) for _ in range(nproc)]
    for _, p in procs:
        p.wait()
    a, b = t0 + int(WARMUP * 1e9), t0 + int((seconds - 0.2) * 1e9)
    return [sum(sim.simgpu_busy_ns(0, p.pid, a, b) for c2, p in procs if c2 == c) / (b - a) * 100
            for c in range(len(limits))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limits", default="10,30,50,70,90")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--library", type=Path, default=None, help="another libvgpu.so to measure (default: ours)")
    a = ap.parse_args()
    library = a.library or ensure_built().libvgpu
    sim_dir = ensure_sim_built().sim_dir
    limits = [int(x) for x in a.limits.split(",")]
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        probe = build_probe(tmp / "probe", sim_dir)
        print(f"achieved share (%) per limit, window {WARMUP}..{a.seconds - 0.2} s; library {library}")
        print(f"{'workload':10} {'layout':7} " + " ".join(f"{lim:>12}" for lim in limits) + "   max |error|")
        for workload in a.workloads.split(","):
            for layout in a.layouts.split(","):
                cells, worst = [], 0.0
                for limit in limits:
                    if layout == "2ctr":
                        pair = [limit, max(10, 90 - limit)]
                        got = run_case(probe, sim_dir, library, tmp, workload, pair, 1, a.seconds)
                        cells.append(f"{got[0]:5.1f}/{got[1]:<5.1f}")
                        worst = max(worst, *(abs(g - lim) for g, lim in zip(got, pair)))
                    else:
                        got = run_case(probe, sim_dir, library, tmp, workload, [limit], 3 if layout == "3proc" else 1,
                                       a.seconds)
                        cells.append(f"{got[0]:5.1f}")
                        worst = max(worst, abs(got[0] - limit))
                print(f"{workload:10} {layout:7} " + " ".join(f"{c:>12}" for c in cells) + f"   {worst:5.1f}",
                      flush=True)


if __name__ == "__main__":
    main()
