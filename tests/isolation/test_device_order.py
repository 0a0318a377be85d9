"""Per-GPU limits reach the GPU they were granted for, whatever order CUDA gives the devices (fastest first, then
PCI bus, as CUDA_DEVICE_ORDER documents; the simulated driver orders them so)."""
from __future__ import annotations

from vgpu.isolation.region import Region

MiB = 1 << 20
SLOW = "GPU-5105a000-0000-4000-8000-000000000001"    # granted first, but CUDA puts it second: fewer SMs
FAST = "GPU-fa570000-0000-4000-8000-000000000002"


def test_limits_follow_the_granted_uuid_not_the_cuda_ordinal(sim, probe_api):
    out = sim.run("devices", "100", program=probe_api,
                  SIMGPU_DEVICES=f"Sim-T4:15360:40:{SLOW},Sim-A100-40GB:40960:108:{FAST}",
                  VGPU_DEVICE_UUIDS=f"{SLOW},{FAST}", NVIDIA_VISIBLE_DEVICES=f"{SLOW},{FAST}",
                  CUDA_DEVICE_MEMORY_LIMIT_0="1000m", CUDA_DEVICE_MEMORY_LIMIT_1="3000m",
                  CUDA_DEVICE_SM_LIMIT_0="20", CUDA_DEVICE_SM_LIMIT_1="60")
    assert out["_rc"] == "0", out
    assert out["uuid0"] == FAST and out["uuid1"] == SLOW          # CUDA's order, not the grant's
    assert int(out["total0"]) == int(out["bytes0"]) == 3000 * MiB
    assert int(out["total1"]) == int(out["bytes1"]) == 1000 * MiB
    with Region.open(sim.cache) as r:
        rows = {d.uuid: (d.limit, d.sm_limit) for d in r.devices()}
    assert rows == {SLOW: (1000 * MiB, 20), FAST: (3000 * MiB, 60)}


def test_uuids_from_nvidia_visible_devices_when_ours_are_absent(sim, probe_api):
    """Volcano's and HAMi's device plugins name the GPUs only in NVIDIA_VISIBLE_DEVICES."""
    out = sim.run("devices", "100", program=probe_api,
                  SIMGPU_DEVICES=f"Sim-T4:15360:40:{SLOW},Sim-A100-40GB:40960:108:{FAST}",
                  NVIDIA_VISIBLE_DEVICES=f"{SLOW},{FAST}",
                  CUDA_DEVICE_MEMORY_LIMIT_0="1000m", CUDA_DEVICE_MEMORY_LIMIT_1="3000m")
    assert out["_rc"] == "0", out
    assert out["uuid0"] == FAST and int(out["bytes0"]) == 3000 * MiB
    assert out["uuid1"] == SLOW and int(out["bytes1"]) == 1000 * MiB
