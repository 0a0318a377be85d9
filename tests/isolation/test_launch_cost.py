"""What a limited launch costs in driver calls: the library adds less than one call per launch on average, at any
kernel length, with memory and compute limits on (counted by the simulated driver, simgpu_calls_total)."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("kernel,launches", [("short", 20000), ("medium", 3000), ("long", 400)])
def test_at_most_one_extra_driver_call_per_launch(sim, probe_api, kernel, launches):
    out = sim.run("count", kernel, str(launches), program=probe_api, timeout=120,
                  CUDA_DEVICE_MEMORY_LIMIT="4g", CUDA_DEVICE_SM_LIMIT="50", GPU_CORE_UTILIZATION_POLICY="force")
    assert out["_rc"] == "0", out
    assert int(out["launches"]) == launches
    assert float(out["extra_per_launch"]) <= 1.0, out


def test_long_kernels_whose_length_varies_are_timed_at_every_launch(sim, probe_api):
    """1.5 ms kernels with a CV of 0.6: each launch is timed (two event records and one elapsed-time query), since
    each untimed one would leave the charge a guess about 1 ms off (before: one launch in four was timed, and the
    achieved share of such work wandered by up to 3.5 points from run to run)."""
    out = sim.run("count", "spread", "400", program=probe_api, timeout=120,
                  CUDA_DEVICE_MEMORY_LIMIT="4g", CUDA_DEVICE_SM_LIMIT="50", GPU_CORE_UTILIZATION_POLICY="force")
    assert out["_rc"] == "0", out
    assert float(out["extra_per_launch"]) >= 2.5, out
