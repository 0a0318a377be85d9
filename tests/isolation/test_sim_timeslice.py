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
SLICE_MS = 50
KERNEL_MS = 125
LATE_MS = 5   # B submits this long after A: inside A's first slice with 45 ms to spare for a loaded machine's jitter


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
    # A [0,50) B [50,100) A [100,150) B [150,200) A [200,225): A's kernel ends at 225; B's first event is reached at
    # 50, when its context first runs, and its kernel ends at 250
    assert float(a["elapsed"]) == pytest.approx(225, abs=0.5)
    assert float(b["elapsed"]) == pytest.approx(200, abs=0.5)
    assert float(a["done"]) == pytest.approx(225, abs=10)   # host clock: a loaded machine wakes it late
    assert float(b["done"]) == pytest.approx(250 - LATE_MS, abs=10)   # from its own start
    assert int(a["query"]) == int(b["query"]) == NOT_READY
    # each process's timeline holds only the 125 ms it ran
    assert _busy_ms(state, pid_a, start, 400) == pytest.approx(KERNEL_MS, abs=0.1)
    assert _busy_ms(state, pid_b, start, 400) == pytest.approx(KERNEL_MS, abs=0.1)
    assert _busy_ms(state, 0, start, 400) == pytest.approx(2 * KERNEL_MS, abs=0.1)


def test_a_context_switch_costs_the_engine_its_time(sim_programs, tmp_path):
    a, b, *_ = _pair(sim_programs, tmp_path / "sw.state", SIMGPU_TIMESLICE_NS=str(SLICE_MS * MS),
                     SIMGPU_CTXSW_NS=str(1 * MS))
    # A [0,50) sw B [51,101) sw A [102,152) sw B [153,203) sw A [204,229); sw B [230,255)
    assert float(a["elapsed"]) == pytest.approx(229, abs=0.5)
    assert float(b["elapsed"]) == pytest.approx(204, abs=0.5)


def test_without_time_slicing_each_kernel_runs_whole(sim_programs, tmp_path):
    a, b, *_ = _pair(sim_programs, tmp_path / "fifo.state")
    # one engine, submission order: A [0,125); B's first event at 125, its kernel [125,250)
    assert float(a["elapsed"]) == pytest.approx(KERNEL_MS, abs=0.5)
    assert float(b["elapsed"]) == pytest.approx(KERNEL_MS, abs=0.5)
    assert float(b["done"]) == pytest.approx(250 - LATE_MS, abs=10)
