"""A DRA device whose CDI edits mount the isolation library (libvgpu.so, /etc/ld.so.preload, the shared cache
directory) and set its limits runs, through the node agent, as a process with the real library preloaded over the
simulated GPU: an allocation past the memory limit is refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubelet_dra_helpers import NodeBed

from vgpu.testbed.cluster import isolation_paths
from vgpu.testbed.machine import MachineGPU
from vgpu.testbed.workload import MARKER

UUID = "GPU-0d2c3b1a-dra0-4e5f-8a9b-000000000001"


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[NodeBed]:
    b = NodeBed(tmp_path, gpus=[MachineGPU(0, UUID, "NVIDIA A100-PCIE-40GB", 40960, 108, 0x17)])
    try:
        yield b
    finally:
        b.close()


def test_cdi_mounts_and_env_enforce_the_memory_limit_with_the_real_library(bed):
    libvgpu, _ = isolation_paths()
    hook = bed.tmp / "hook"
    (hook / "cache").mkdir(parents=True)
    (hook / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")
    plugin = bed.plugin()
    plugin.spec_edits = {"mounts": [
        {"hostPath": str(libvgpu), "containerPath": "/usr/local/vgpu/libvgpu.so", "options": ["ro", "bind"]},
        {"hostPath": str(hook / "ld.so.preload"), "containerPath": "/etc/ld.so.preload", "options": ["ro", "bind"]},
    ]}
    plugin.device_edits = lambda claim, result: {
        "env": [f"NVIDIA_VISIBLE_DEVICES={UUID}", "CUDA_DEVICE_MEMORY_LIMIT_0=1000m",
                f"CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/vgpu/{claim.uid}.cache"],
        "mounts": [{"hostPath": str(hook / "cache"), "containerPath": "/tmp/vgpu", "options": ["rw", "bind"]}]}
    plugin.start()
    assert bed.wait_driver()
    claim = bed.create_claim("limited")
    ctr = {"name": "cuda", "image": "workload", "resources": {"claims": [{"name": "gpu"}]},
           "command": ["python3", "-m", "vgpu.testbed.workload", "--mib", "1500", "--chunk", "250", "--kernels", "1",
                       "--expect-oom"]}
    pod = bed.create_pod("cuda", [ctr], [{"name": "gpu", "resourceClaimName": "limited"}])
    bed.allocate(claim, pod)
    bed.bind("cuda")
    done = bed.wait_phase("cuda", ("Succeeded", "Failed"), timeout=60)
    log = (bed.workdir / "logs" / "default_cuda_cuda.log").read_text()
    report = json.loads(next(line for line in log.splitlines() if line.startswith(MARKER))[len(MARKER):])
    assert done["status"]["phase"] == "Succeeded", log[-2000:]
    assert report["result"] == "oom-refused"
    assert str(libvgpu) in report["env"]["LD_PRELOAD"]
    device = report["devices"][0]
    assert device["limit_mib"] == 1000 and device["allocated_mib"] <= 1000 and device["oom_at_mib"] is not None
    # the shared cache path was mapped to the mount's host directory, where the library keeps its accounting
    assert (hook / "cache" / f"{claim['metadata']['uid']}.cache").exists()
