"""The simulated GPU's time slicing (testbed/simgpu/timeslice.h; SIMGPU_TIMESLICE_NS): two processes that each
launch one kernel longer than a slice take turns on the GPU, slice by slice, a preempted kernel resuming where it
stopped; the events around a kernel read the other process's slices too (the engine reaches an event only while its
context runs), and each process's timeline holds only what it ran.  Without the setting, the one first-in-first-out
engine runs each kernel whole.  Driven directly (tests/isolation/csrc/sim_slices.c), without libvgpu.so; see
docs/testbed-fidelity.md "Time slicing"."""
from __future__ import annotations

import ctypes
import os
import subprocess
import time

import pytest
from sim_helpers import NOT_READY, kv

MS = 1_000_000
SLICE_MS = 20
KERNEL_MS = 50
LATE_MS = 5   # B submits this long after A: well inside A's first slice, whatever the start-up jitter


def _pair(sim_programs, state, **env: str) -> tuple[dict[str, str], dict[str, str], int, int, int]:
    """A and B each run one KERNEL_MS kernel, B LATE_MS after A; their outputs, pids and A's start (ns)."""
    exe = sim_programs.program("sim_slices")
    start = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + 800 * MS
    procs = [subprocess.Popen([str(exe), "run", str(start + late * MS), str(KERNEL_MS)],
                              env=sim_programs.env(state, **env), stdout=subprocess.PIPE, text=True)
             for late in (0, LATE_MS)]
    outs = [kv(p.communicate(timeout=30)[0]) for p in procs]
    for out, p in zip(outs, procs):
        assert p.returncode == 0 and "error" not in out, out
    return outs[0], outs[1], procs[0].pid, procs[1].pid, start


def _busy_ms(state, pid: int, start: int, end_ms: float) -> float:
    os.environ["SIMGPU_STATE"] = str(state)
    from vgpu.testbed.build import ensure_sim_built

    lib = ctypes.CDLL(str(ensure_sim_built().sim_libcuda))
    lib.simgpu_busy_ns.restype = ctypes.c_uint64
    lib.simgpu_busy_ns.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
    return lib.simgpu_busy_ns(0, pid, start - 50 * MS, start + int(end_ms * MS)) / MS   # whole bins: nothing cut


def test_contexts_take_turns_slice_by_slice(sim_programs, tmp_path):
    state = tmp_path / "ts.state"
    a, b, pid_a, pid_b, start = _pair(sim_programs, state, SIMGPU_TIMESLICE_NS=str(SLICE_MS * MS))
    # A [0,20) B [20,40) A [40,60) B [60,80) A [80,90): A's kernel ends at 90; B's first event is reached at 20, when
    # its context first runs, and its kernel ends at 100
    assert float(a["elapsed"]) == pytest.approx(90, abs=0.5)
    assert float(b["elapsed"]) == pytest.approx(80, abs=0.5)
    assert float(a["done"]) == pytest.approx(90, abs=3)
    assert float(b["done"]) == pytest.approx(100 - LATE_MS, abs=3)   # from its own start
    assert int(a["query"]) == int(b["query"]) == NOT_READY
    # each process's timeline holds only the 50 ms it ran
    assert _busy_ms(state, pid_a, start, 200) == pytest.approx(KERNEL_MS, abs=0.1)
    assert _busy_ms(state, pid_b, start, 200) == pytest.approx(KERNEL_MS, abs=0.1)
    assert _busy_ms(state, 0, start, 200) == pytest.approx(2 * KERNEL_MS, abs=0.1)


def test_a_context_switch_costs_the_engine_its_time(sim_programs, tmp_path):
    a, b, *_ = _pair(sim_programs, tmp_path / "sw.state", SIMGPU_TIMESLICE_NS=str(SLICE_MS * MS),
                     SIMGPU_CTXSW_NS=str(1 * MS))
    # A [0,20) sw B [21,41) sw A [42,62) sw B [63,83) sw A [84,94); sw B [95,105)
    assert float(a["elapsed"]) == pytest.approx(94, abs=0.5)
    assert float(b["elapsed"]) == pytest.approx(84, abs=0.5)


def test_without_time_slicing_each_kernel_runs_whole(sim_programs, tmp_path):
    a, b, *_ = _pair(sim_programs, tmp_path / "fifo.state")
    # one engine, submission order: A [0,50); B's first event at 50, its kernel [50,100)
    assert float(a["elapsed"]) == pytest.approx(KERNEL_MS, abs=0.5)
    assert float(b["elapsed"]) == pytest.approx(KERNEL_MS, abs=0.5)
    assert float(b["done"]) == pytest.approx(100 - LATE_MS, abs=3)
