"""vgpu.isolation.build.ensure_built: builds on demand, concurrent callers are safe, rebuilds when sources change."""
from __future__ import annotations

import os
import subprocess
import sys

from vgpu.isolation.build import ensure_built


def test_concurrent_builds_into_a_fresh_directory(tmp_path):
    out = tmp_path / "build"
    env = dict(os.environ, VGPU_ISOLATION_BUILD_DIR=str(out))
    code = "from vgpu.isolation.build import ensure_built; print(ensure_built().libvgpu)"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        assert stdout.strip() == str(out / "libvgpu.so")
    assert (out / "libvgpu.so").stat().st_size > 0


def test_up_to_date_outputs_are_not_rebuilt(libs):
    before = libs.libvgpu.stat().st_mtime_ns
    assert ensure_built().libvgpu.stat().st_mtime_ns == before


def test_libvgpu_does_not_depend_on_the_driver(libs):
    """Loaded by /etc/ld.so.preload into every process, it must not pull in libcuda or NVML."""
    needed = subprocess.run(["readelf", "-d", str(libs.libvgpu)], capture_output=True, text=True).stdout
    assert "libcuda" not in needed and "nvidia-ml" not in needed
    res = subprocess.run(["sh", "-c", "echo ok"], env=dict(os.environ, LD_PRELOAD=str(libs.libvgpu),
                                                          CUDA_DEVICE_MEMORY_LIMIT="1g"),
                         capture_output=True, text=True)
    assert res.stdout == "ok\n" and res.stderr == ""
