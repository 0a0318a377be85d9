"""The simulated driver's GPU UUIDs: SIMGPU_DEVICES may name them (4th field), as the pod runner does with the UUIDs
the device plugin advertised; without one (or with a malformed one) the old derived UUID stays."""
from __future__ import annotations

import json
import subprocess
import sys

from vgpu.isolation.build import Paths

GIVEN = "GPU-6c9e5dc0-97da-5a9c-bc1b-a8a290a25129"


def nvml_uuids(libs: Paths, devices: str, tmp_path) -> list[str]:
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(libs.sim_dir), "SIMGPU_DEVICES": devices,
           "SIMGPU_STATE": str(tmp_path / "sim.state"), "LD_PRELOAD": str(libs.libvgpu),
           "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(tmp_path / "vgpu.cache"), "PYTHONPATH": ":".join(sys.path)}
    out = subprocess.run([sys.executable, "-m", "vgpu.testbed.workload", "--mib", "0", "--kernels", "0"], env=env,
                         check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.split("VGPU-WORKLOAD ", 1)[1])["nvml_uuids"]


def test_given_uuids_are_reported_and_missing_ones_derived(libs, tmp_path):
    old = nvml_uuids(libs, "Tesla T4:15360:40,Tesla T4:15360:40", tmp_path)
    assert len(set(old)) == 2 and all(u.startswith("GPU-") for u in old)
    given = nvml_uuids(libs, f"Tesla T4:15360:40:{GIVEN},Tesla T4:15360:40", tmp_path)
    assert given == [GIVEN, old[1]]
    assert nvml_uuids(libs, "Tesla T4:15360:40:GPU-not-a-uuid,Tesla T4:15360:40:GPU-6c9e5dc0", tmp_path) == old
