"""The doctor's command line: one-line errors (exit 2), the time box of a hung probe, `python -m`."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
from capabilities import missing
from doctor_helpers import doctor_env, leftover_processes, run_doctor


@pytest.mark.parametrize("argv,needle", [
    (["--driver-dir", "/nonexistent/driver"], "--driver-dir /nonexistent/driver: not a directory"),
    (["--driver-dir", "/"], "--driver-dir /: no libcuda.so.1 in it"),
    (["--lib", "/nonexistent/libvgpu.so"], "--lib /nonexistent/libvgpu.so: no such file"),
    (["--probe", "no-such-probe"], "invalid choice"),
])
def test_cli_errors_are_one_line(tmp_path, argv, needle):
    res = subprocess.run([sys.executable, "-m", "vgpu.cli", "doctor", *argv], env=doctor_env(tmp_path),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vgpu doctor: ") and needle in lines[0], res.stderr


def test_json_into_a_missing_folder_is_refused_before_anything_runs(tmp_path, sim_dir):
    res = subprocess.run([sys.executable, "-m", "vgpu.cli", "doctor", "--driver-dir", str(sim_dir), "--json",
                          str(tmp_path / "no" / "such" / "doctor.json")], env=doctor_env(tmp_path),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "its directory does not exist" in res.stderr.strip()


def test_no_driver_at_all_is_one_line(tmp_path):
    env = doctor_env(tmp_path, LD_LIBRARY_PATH=str(tmp_path))
    # asked of a fresh process with the doctor's environment (this one may hold the simulated libcuda.so.1)
    probe = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libcuda.so.1')"], env=env,
                           capture_output=True, timeout=60)
    if probe.returncode == 0:
        missing("no-cuda-driver", "this machine has a CUDA driver of its own")
    res = subprocess.run([sys.executable, "-m", "vgpu.cli", "doctor", "--lib", "/bin/true"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "no usable CUDA driver" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_a_hung_probe_is_killed_at_its_time_box_and_the_run_goes_on(tmp_path, sim_dir):
    t0 = time.monotonic()
    ran = run_doctor(tmp_path, "--driver-dir", str(sim_dir), "--probe", "mem-reclaim", "--probe", "mem-alloc",
                     VGPU_DOCTOR_TEST_HANG="mem-reclaim:2")
    assert time.monotonic() - t0 < 30
    assert ran.returncode == 1, ran.stdout + ran.stderr
    hung = ran.probe("mem-reclaim")
    assert not hung["ok"] and not hung["skipped"]
    assert hung["reason"].startswith("did not finish within its time box of 2 s (killed)")
    assert 2 <= hung["seconds"] < 10
    assert ran.probe("mem-alloc")["ok"]
    assert leftover_processes(str(tmp_path)) == []


def test_python_dash_m_runs_the_same_command(tmp_path, sim_dir):
    res = subprocess.run([sys.executable, "-m", "vgpu.isolation.doctor", "--driver-dir", str(sim_dir), "--probe",
                          "meminfo-cuda"], env=doctor_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "meminfo-cuda  ok" in res.stdout
