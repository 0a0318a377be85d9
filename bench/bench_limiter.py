"""Achieved GPU share under libvgpu.so's compute limit (prints figures; never pass/fail).

Saturating workloads (tests/isolation/csrc/probe.c `mix`) run on the test bed's simulated GPU, whose kernel
durations are drawn per launch and which records its own timeline; the share each container got is read from that
timeline over a window after the warm-up.  Workloads: constant (time proportional to the grid, the old model),
varied (log-normal, CV 1.2, drifting mean), bursty (6x longer kernels every other 300 ms), mixed (30 us, 0.4 ms and
bimodal 0.3/12 ms kernels), graph (4-node graphs), streams (varied over 3 streams).  Layouts: one process; three
processes of one container; two containers (the second at 90 - limit, at least 10).

    .venv/bin/python bench/bench_limiter.py [--limits 10,30,50,70,90] [--workloads ...] [--layouts ...]
        [--seconds 5] [--library path/to/other/libvgpu.so] [--paced]
    .venv/bin/python bench/bench_limiter.py --timesliced [--slice-ms 2]

--paced runs the node's pacer (vgpu.node.pacing) beside the containers, as the device plugin does. --timesliced
prints the time-sliced table instead: the simulated GPU time-slices between processes (SIMGPU_TIMESLICE_NS), and
bench/gpu/tenants.py's scenarios (16 kernels then a wait; `long` 2.7 ms kernels as a 4096-wide product on an H100,
`medium` 0.35 ms, `short` 20 us without waits), each without and with the pacer, over 4 s after a 6 s warm-up.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import tempfile
import time
from pathlib import Path

from vgpu.isolation.build import ensure_built
from vgpu.isolation.cuda_include import cuda_include_dir
from vgpu.isolation.region import Region, RegionError
from vgpu.node.pacing import Pacer, Tenant, pace_file_text
from vgpu.testbed.build import ensure_sim_built

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("constant", "varied", "bursty", "mixed", "graph", "streams")
LAYOUTS = ("1proc", "3proc", "2ctr")
WARMUP = 1.5
PACE_SECONDS = 1.0


def build_probe(out: Path, sim_dir: Path) -> Path:
    subprocess.run(["gcc", "-O2", f"-I{cuda_include_dir()}", f"-I{ROOT / 'isolation' / 'src'}", "-o", str(out),
                    str(ROOT / "tests" / "isolation" / "csrc" / "probe.c"), f"-L{sim_dir}", "-lcuda", "-ldl"],
                   check=True)
    return out


def run_case(probe: Path, sim_dir: Path, library: Path, tmp: Path, workload: str, limits: list[int], nproc: int,
             seconds: float, timeslice_ns: int = 0, paced: bool = False, warmup: float = WARMUP) -> list[float]:
    """Share (%) of the device each container got over [warmup, seconds - 0.2]; with `timeslice_ns` the simulated
    GPU time-slices between processes, and with `paced` a pacer (vgpu.node.pacing) corrects the containers' timings
    once a second from what each really ran, as the device plugin does."""
    state = tmp / f"{workload}-{'-'.join(map(str, limits))}-{nproc}-{timeslice_ns}-{int(paced)}.state"
    os.environ["SIMGPU_STATE"] = str(state)
    sim = ctypes.CDLL(str(sim_dir / "libcuda.so.1"))
    sim.simgpu_busy_ns.restype = sim.simgpu_now_ns.restype = ctypes.c_uint64
    sim.simgpu_busy_ns.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_DEVICE_", "GPU_CORE_", "LD_PRELOAD"))}
    base.update(LD_LIBRARY_PATH=str(sim_dir), SIMGPU_STATE=str(state), LD_PRELOAD=str(library),
                CUDA_DEVICE_MEMORY_LIMIT="8g", GPU_CORE_UTILIZATION_POLICY="force",
                SIMGPU_TIMESLICE_NS=str(timeslice_ns))
    kind, streams = ("varied", "3") if workload == "streams" else (workload, "1")
    t0 = sim.simgpu_now_ns()
    procs = []
    for c, limit in enumerate(limits):
        env = dict(base, CUDA_DEVICE_SM_LIMIT=str(limit),
                   CUDA_DEVICE_MEMORY_SHARED_CACHE=str(state.with_suffix(f".{c}.cache")),
                   VGPU_PACE_FILE=str(state.with_suffix(f".{c}.pace")))
        procs += [(c, subprocess.Popen([str(probe), "mix", kind, str(seconds), streams], env=env,
                                       stdout=subprocess.DEVNULL)) for _ in range(nproc)]
    if paced:
        pace(sim, state, limits, procs)
    for _, p in procs:
        p.wait()
    a, b = t0 + int(warmup * 1e9), t0 + int((seconds - 0.2) * 1e9)
    return [sum(sim.simgpu_busy_ns(0, p.pid, a, b) for c2, p in procs if c2 == c) / (b - a) * 100
            for c in range(len(limits))]


def pace(sim: ctypes.CDLL, state: Path, limits: list[int], procs: list[tuple[int, subprocess.Popen[bytes]]]) -> None:
    """Runs a pacer until the processes end: each container's real GPU time is read from the simulated GPU's
    per-process timeline (what its NVML reports), its charge from its accounting file."""
    pacer = Pacer()
    owner = {p.pid: f"c{c}" for c, p in procs}
    last = sim.simgpu_now_ns()
    while any(p.poll() is None for _, p in procs):
        time.sleep(PACE_SECONDS)
        now = sim.simgpu_now_ns()
        tenants, uuid = [], ""
        for c, limit in enumerate(limits):
            try:
                with Region.open(state.with_suffix(f".{c}.cache")) as region:
                    device = region.devices()[0]
            except (OSError, RegionError, IndexError):
                continue
            uuid = device.uuid
            tenants.append(Tenant(f"c{c}", uuid, limit, device.charged_ns, read_ns=device.read_ns))
        running = {p.pid: sim.simgpu_busy_ns(0, p.pid, last, now) / (now - last) * 100 for _, p in procs}
        last = now
        factors = pacer.step(tenants, lambda _uuid, seen=running: seen, owner.get)
        for c in range(len(limits)):
            if (f"c{c}", uuid) in factors:
                path = state.with_suffix(f".{c}.pace")
                path.with_suffix(".tmp").write_text(pace_file_text({uuid: factors[(f"c{c}", uuid)]}))
                os.replace(path.with_suffix(".tmp"), path)


TIMESLICED = (  # scenario, workload, limits
    ("large 30+50", "long", [30, 50]),
    ("large 50+50", "long", [50, 50]),
    ("large 20+20+20", "long", [20, 20, 20]),
    ("medium 30+50", "medium", [30, 50]),
    ("short 30+50", "short", [30, 50]),
    ("large alone 30", "long", [30]),
)


def timesliced_table(probe: Path, sim_dir: Path, library: Path, tmp: Path, slice_ms: float) -> None:
    """The time-sliced table: each scenario without and with the pacer."""
    print(f"time-sliced GPU (slice {slice_ms} ms): share (%) per tenant, window 6..10 s; library {library}")
    print(f"{'scenario':16} {'limits':10} {'without pacing':>22} {'with pacing':>22} {'max |error| paced':>18}")
    for name, workload, limits in TIMESLICED:
        cells = []
        for paced in (False, True):
            got = run_case(probe, sim_dir, library, tmp, workload, limits, 1, 10.2, int(slice_ms * 1e6), paced, 6.0)
            cells.append(got)
        worst = max(abs(g - lim) for g, lim in zip(cells[1], limits))
        text = ["+".join(f"{g:.1f}" for g in c) + f" ({sum(c):.1f})" for c in cells]
        print(f"{name:16} {'+'.join(map(str, limits)):10} {text[0]:>22} {text[1]:>22} {worst:18.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limits", default="10,30,50,70,90")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--library", type=Path, default=None, help="another libvgpu.so to measure (default: ours)")
    ap.add_argument("--paced", action="store_true", help="run the node's pacer beside the containers")
    ap.add_argument("--timesliced", action="store_true", help="the time-sliced table instead")
    ap.add_argument("--slice-ms", type=float, default=2.0, help="the time slice of --timesliced")
    a = ap.parse_args()
    library = a.library or ensure_built().libvgpu
    sim_dir = ensure_sim_built().sim_dir
    limits = [int(x) for x in a.limits.split(",")]
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        probe = build_probe(tmp / "probe", sim_dir)
        if a.timesliced:
            timesliced_table(probe, sim_dir, library, tmp, a.slice_ms)
            return
        warmup = 4.0 if a.paced else WARMUP   # the pacer's factors settle within a few seconds
        print(f"{'paced; ' if a.paced else ''}achieved share (%) per limit, window {warmup}..{a.seconds - 0.2} s; "
              f"library {library}")
        print(f"{'workload':10} {'layout':7} " + " ".join(f"{lim:>12}" for lim in limits) + "   max |error|")
        for workload in a.workloads.split(","):
            for layout in a.layouts.split(","):
                cells, worst = [], 0.0
                for limit in limits:
                    if layout == "2ctr":
                        pair = [limit, max(10, 90 - limit)]
                        got = run_case(probe, sim_dir, library, tmp, workload, pair, 1, a.seconds, 0, a.paced, warmup)
                        cells.append(f"{got[0]:5.1f}/{got[1]:<5.1f}")
                        worst = max(worst, *(abs(g - lim) for g, lim in zip(got, pair)))
                    else:
                        got = run_case(probe, sim_dir, library, tmp, workload, [limit], 3 if layout == "3proc" else 1,
                                       a.seconds, 0, a.paced, warmup)
                        cells.append(f"{got[0]:5.1f}")
                        worst = max(worst, abs(got[0] - limit))
                print(f"{workload:10} {layout:7} " + " ".join(f"{c:>12}" for c in cells) + f"   {worst:5.1f}",
                      flush=True)


if __name__ == "__main__":
    main()
