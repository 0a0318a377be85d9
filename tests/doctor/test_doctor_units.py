"""The doctor's pure parts: judging an allocation run, settings, probe selection, environments, hooks, verdicts."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from vgpu.isolation.doctor import discover, envs
from vgpu.isolation.doctor.catalog import CLOCK, NAMES, PROBES, Settings, select
from vgpu.isolation.doctor.cuda import ERROR_OUT_OF_MEMORY, error_name
from vgpu.isolation.doctor.outcome import Outcome
from vgpu.isolation.doctor.probes_memory import PAGE, fill, judge
from vgpu.isolation.doctor.session import hang_hook
from vgpu.isolation.doctor.spawn import Worker, exit_text

MiB, GiB = 1 << 20, 1 << 30


def steps(sizes: list[int], refusal: int = ERROR_OUT_OF_MEMORY):
    """A fake allocation path: succeeds with these sizes, then refuses."""
    it = iter(sizes)

    def step() -> tuple[int, int]:
        size = next(it, None)
        return (0, size) if size is not None else (refusal, 64 * MiB)
    return step


def test_an_exact_stop_at_the_limit_passes():
    out = judge("x", fill(steps([64 * MiB] * 16), GiB), GiB)
    assert out.ok and out.figures["allocated_bytes"] == GiB and out.figures["allocations"] == 16


def test_a_stop_within_one_step_and_a_page_passes():
    assert judge("x", fill(steps([64 * MiB] * 15 + [62 * MiB]), GiB), GiB).ok


def test_a_path_that_never_refuses_is_stopped_one_step_past_the_limit():
    f = fill(steps([64 * MiB] * 1000), GiB)
    assert f.total == GiB + 64 * MiB and f.count == 17
    out = judge("cuMemAlloc_v2", f, GiB)
    assert not out.ok and "past the 1024 MiB limit" in out.reason


def test_a_refusal_other_than_out_of_memory_fails():
    out = judge("x", fill(steps([64 * MiB] * 16, refusal=1), GiB), GiB)
    assert not out.ok and error_name(1) in out.reason


def test_an_early_refusal_fails():
    out = judge("x", fill(steps([64 * MiB] * 14), GiB), GiB)
    assert not out.ok and "refused early" in out.reason


def test_the_slack_is_one_step_and_one_page():
    """Held when refused: more than the limit less the largest step and one 2 MiB page."""
    assert judge("x", fill(steps([64 * MiB] * 14 + [62 * MiB + 1]), GiB), GiB).ok
    assert not judge("x", fill(steps([64 * MiB] * 14 + [62 * MiB]), GiB), GiB).ok
    assert 2 * MiB == PAGE


def test_settings():
    s = Settings.choose(False, 80 * GiB, 2)
    assert (s.limit, s.devices, s.chunk, s.warmup, s.window) == (GiB, 2, 64 * MiB, 1.0, 3.0)
    q = Settings.choose(True, 2 * GiB, 1)
    assert q.limit == 512 * MiB and q.window < s.window and q.quick


def test_selection_keeps_catalog_order_and_adds_the_kernel_clock_where_needed():
    assert [p.name for p in select(None)] == list(NAMES)
    assert [p.name for p in select(["share-short-60", "mem-alloc"])] == ["mem-alloc", CLOCK, "share-short-60"]
    assert [p.name for p in select(["mem-pool"])] == ["mem-pool"]
    assert len(set(NAMES)) == len(NAMES) == len(PROBES)


def test_environments_drop_what_configures_the_library(tmp_path):
    inherited = {"PATH": "/bin", "LD_PRELOAD": "/x/libvgpu.so", "CUDA_DEVICE_MEMORY_LIMIT": "1g",
                 "CUDA_DEVICE_MEMORY_LIMIT_3": "2g", "CUDA_DEVICE_SM_LIMIT": "10",
                 "GPU_CORE_UTILIZATION_POLICY": "disable",
                 "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/pod.cache", "VGPU_ISOLATION_FAIL_OPEN": "1",
                 "LD_LIBRARY_PATH": "/usr/lib", "CUDA_VISIBLE_DEVICES": "1"}
    ref = envs.reference_env(inherited, "/drv")
    assert ref == {"PATH": "/bin", "LD_LIBRARY_PATH": "/drv:/usr/lib", "CUDA_VISIBLE_DEVICES": "1"}
    lim = envs.limited_env(inherited, None, "/lib/libvgpu.so", tmp_path / "c.cache", GiB, 2, cores=30)
    assert lim["LD_PRELOAD"] == "/lib/libvgpu.so" and lim["LD_LIBRARY_PATH"] == "/usr/lib"
    assert lim["CUDA_DEVICE_MEMORY_LIMIT_0"] == lim["CUDA_DEVICE_MEMORY_LIMIT_1"] == "1024m"
    assert "CUDA_DEVICE_MEMORY_LIMIT" not in lim and "CUDA_DEVICE_MEMORY_LIMIT_3" not in lim
    assert (lim["CUDA_DEVICE_SM_LIMIT"], lim["GPU_CORE_UTILIZATION_POLICY"]) == ("30", "force")
    assert lim["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == str(tmp_path / "c.cache")
    assert "VGPU_ISOLATION_FAIL_OPEN" not in lim
    assert "CUDA_DEVICE_SM_LIMIT" not in envs.limited_env({}, None, "/l.so", tmp_path / "c", GiB, 1)


def test_the_library_is_the_flag_then_the_installed_copy_then_our_build(tmp_path, monkeypatch):
    lib = tmp_path / "libvgpu.so"
    lib.write_bytes(b"")
    assert discover.find_library(str(lib)) == discover.Library(str(lib), "--lib")
    monkeypatch.setattr(discover, "INSTALLED_LIB", lib)
    assert discover.find_library(None).source == "installed by the device plugin"
    monkeypatch.setattr(discover, "INSTALLED_LIB", tmp_path / "absent.so")
    assert discover.find_library(None).source == "built from this package"


def test_hang_hook():
    assert hang_hook(None) == {}
    assert hang_hook("mem-alloc:2, share-long-30") == {"mem-alloc": 2.0, "share-long-30": 5.0}


def test_outcomes_round_trip_through_json():
    for out in (Outcome.passed("fine", a=1), Outcome.failed("broken", b=[1]), Outcome.skip("no torch")):
        assert Outcome.from_json(out.to_json()) == out
    assert Outcome.skip("x").ok and not Outcome.failed("x").ok


def test_a_worker_reports_an_unknown_action(tmp_path):
    with Worker("no-such-action", {}, dict(os.environ), tmp_path, session=True) as w:
        out = w.result(60)
    assert not out.ok and "unknown action" in out.reason


def test_a_worker_that_dies_gives_a_verdict_saying_how(tmp_path):
    with Worker("info", {"hang": True}, dict(os.environ), tmp_path, session=True) as w:
        time.sleep(0.5)
        os.kill(w.pid, signal.SIGKILL)
        out = w.result(30)
    assert not out.ok and out.reason.startswith("worker ended with signal SIGKILL and gave no verdict")
    assert exit_text(3) == "exit status 3"


@pytest.mark.parametrize("path", [Path("/nonexistent"), Path("/")])
def test_driver_dir_checks(path):
    with pytest.raises(discover.DoctorError):
        discover.check_driver_dir(str(path))
