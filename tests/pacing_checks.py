"""What the plugins' pacer tests share (tests/deviceplugin/test_dp_pacing.py, tests/draplugin/test_dra_pacing.py):
the probe program, the simulated GPU's timeline read from outside, and the check of two tenants at 30 and 50 %."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest

from vgpu.isolation.cuda_include import cuda_include_dir
from vgpu.testbed.build import ensure_sim_built

ROOT = Path(__file__).resolve().parents[1]
SEC = 1_000_000_000
WARMUP, WINDOW = 7.0, 4.0   # seconds before the window the shares are read over, and its length


def build_probe(folder: Path) -> Path:
    """tests/isolation/csrc/probe.c built against the simulated driver, in `folder`."""
    exe = folder / "probe"
    subprocess.run(["gcc", "-O2", "-pthread", f"-I{cuda_include_dir()}", f"-I{ROOT / 'isolation' / 'src'}", "-o",
                    str(exe), str(ROOT / "tests" / "isolation" / "csrc" / "probe.c"),
                    f"-L{ensure_sim_built().sim_dir}", "-lcuda", "-ldl"], check=True)
    return exe


def timeline() -> ctypes.CDLL:
    """The simulated driver's helpers (its clock and per-process busy time), for the node whose SIMGPU_STATE and
    SIMGPU_DEVICES the caller set in this process's environment."""
    sim = ctypes.CDLL(str(ensure_sim_built().sim_libcuda))
    sim.simgpu_busy_ns.restype = sim.simgpu_now_ns.restype = ctypes.c_uint64
    sim.simgpu_busy_ns.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
    return sim


def assert_paced(sim: ctypes.CDLL, procs: list[subprocess.Popen], t0: int, factors: list[str], uuid: str,
                 seconds: float, log: str) -> None:
    """Two tenants at 30 and 50 % (`procs`, started at `t0` on the simulated clock) each got its limit within 3
    points over the window, and the pace files read while both ran (`factors`) scaled their timings down."""
    for p in procs:
        assert p.wait(seconds + 30) == 0, p.stderr.read() if p.stderr else ""
    a, b = t0 + int(WARMUP * SEC), t0 + int((WARMUP + WINDOW) * SEC)
    shares = [sim.simgpu_busy_ns(0, p.pid, a, b) / (b - a) * 100 for p in procs]
    assert shares == [pytest.approx(30, abs=3), pytest.approx(50, abs=3)], (shares, log)
    for text in factors:   # each tenant's timings are scaled down: it was charged the other's slices
        gpu, factor = text.split()
        assert gpu == uuid and 0.3 < float(factor) < 0.95, factors
