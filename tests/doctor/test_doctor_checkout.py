"""The doctor from a plain checkout (the real-GPU machine: nothing installed, no network): it and its worker
import only the standard library and light modules of ours, and bench/gpu/doctor.sh runs it end to end."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from doctor_helpers import doctor_env

from vgpu.isolation.cuda_include import cuda_include_dir

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("pydantic", "kubernetes", "fastapi", "numpy", "cffi", "grpc", "yaml", "orjson", "prometheus_client")


def plain_python(tmp: Path) -> Path:
    """This interpreter without site-packages (so without the installed `vgpu`), as one executable."""
    wrapper = tmp / "python-nosite"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_the_doctor_and_its_worker_import_only_light_modules(tmp_path):
    view = tmp_path / "path" / "vgpu"
    view.mkdir(parents=True)
    for entry in (ROOT / "vgpu").iterdir():
        (view / entry.name).symlink_to(entry)
    (view / "isolation").symlink_to(ROOT / "isolation")
    modules = sorted(p.stem for p in (ROOT / "isolation" / "doctor").glob("*.py") if p.stem != "__main__")
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module('vgpu.isolation.doctor.' + m)\n"
        "from vgpu.isolation.doctor import worker; worker.actions()\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    res = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "path")}, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_bench_script_runs_the_doctor_from_the_checkout(tmp_path, sim_dir):
    out = tmp_path / "out"
    env = doctor_env(tmp_path, OUT=str(out), PYTHON=str(plain_python(tmp_path)), DOCTOR_TIMEOUT="120",
                     CUDA_INCLUDE=str(cuda_include_dir()))  # cuda.h: this machine may have no CUDA toolkit
    env.pop("PYTHONPATH", None)
    res = subprocess.run([str(ROOT / "bench" / "gpu" / "doctor.sh"), "--driver-dir", str(sim_dir), "--quick",
                          "--probe", "mem-alloc", "--probe", "meminfo-nvml"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads((out / "doctor.json").read_text())
    assert [p["name"] for p in doc["probes"]] == ["mem-alloc", "meminfo-nvml"]
    assert all(p["ok"] and not p["skipped"] for p in doc["probes"])
    assert doc["library"]["source"] == "--lib"
    assert "limits hold" in (out / "doctor.txt").read_text()
    assert "== python" in (out / "system.txt").read_text()


def test_gpu_machine_script_runs_the_doctor_and_the_nvml_backend(tmp_path, sim_dir):
    out = tmp_path / "out"
    env = doctor_env(tmp_path, OUT=str(out), PYTHON=sys.executable, DOCTOR_TIMEOUT="120",
                     LD_LIBRARY_PATH=str(sim_dir), CUDA_INCLUDE=str(cuda_include_dir()))
    env.pop("PYTHONPATH", None)
    res = subprocess.run([str(ROOT / "bench" / "gpu" / "h100.sh"), "--driver-dir", str(sim_dir), "--quick",
                          "--probe", "mem-alloc"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert [p["name"] for p in json.loads((out / "doctor.json").read_text())["probes"]] == ["mem-alloc"]
    nvml = json.loads((out / "nvml_backend.json").read_text())
    assert nvml["init_error"] is None
    assert [g["name"] for g in nvml["gpus"]] and all(g["uuid"].startswith("GPU-") for g in nvml["gpus"])
    assert nvml["health_events_1s"] == []
    log = (out / "h100.log").read_text()
    assert "nvml backend: exit 0" in log and "event timing: exit 0" in log
    assert "gated pairs" in (out / "event_timing.txt").read_text()
