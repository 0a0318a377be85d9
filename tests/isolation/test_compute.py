"""Compute (SM) limit: container-wide budget, achieved share read from the simulated device's own timeline.

Kernel durations are drawn by the simulated GPU per launch (its module format; the probe's `mix` workloads):
"varied" (log-normal, CV 1.2, mean drifting over time, plus a uniform short kernel), "mixed" (short kernels and
bimodal ones of 0.3 or 12 ms), "bursty" (kernels 6x longer every other 300 ms), "graph" (4-node graphs),
"constant" (the old model: time proportional to the grid).  Bounds are on the achieved share over a simulated
timeline, not on wall-clock timings of our code.
"""
from __future__ import annotations

import pytest

from vgpu.isolation.region import Region

SEC = 1_000_000_000
WARMUP = 2
MIX_WARMUP = 1.2
MIX_WINDOW = 2.2
TOLERANCE = 3


def run_mix(sim, workload: str, limits: list[int], nproc: int = 1, streams: int = 1,
            extra_env: dict[str, str] | None = None) -> list[float]:
    """One container per limit, `nproc` saturating processes each; the share (%) of the device each container
    got over the window after the warm-up."""
    helpers = sim.helpers()
    seconds = MIX_WARMUP + MIX_WINDOW + 0.3
    t0 = helpers.simgpu_now_ns()
    procs = []
    for c, limit in enumerate(limits):
        env = dict(CUDA_DEVICE_SM_LIMIT=str(limit), CUDA_DEVICE_MEMORY_LIMIT="8g", GPU_CORE_UTILIZATION_POLICY="force",
                   CUDA_DEVICE_MEMORY_SHARED_CACHE=str(sim.cache.with_suffix(f".{c}.cache")), **(extra_env or {}))
        procs += [(c, sim.popen("mix", workload, str(seconds), str(streams), **env)) for _ in range(nproc)]
    for _, p in procs:
        out, err = p.communicate(timeout=seconds + 30)
        assert p.returncode == 0, err
        assert int(sim.parse(out)["launches"]) > 0
    a, b = t0 + int(MIX_WARMUP * SEC), t0 + int((MIX_WARMUP + MIX_WINDOW) * SEC)
    return [sum(helpers.simgpu_busy_ns(0, p.pid, a, b) for c2, p in procs if c2 == c) / (b - a) * 100
            for c in range(len(limits))]


@pytest.mark.parametrize("workload,limit", [
    *(("varied", limit) for limit in (10, 30, 50, 70, 90)),
    *(("mixed", limit) for limit in (10, 50, 90)),
    ("bursty", 30), ("bursty", 70), ("graph", 40), ("constant", 60),
])
def test_limit_holds_when_kernel_time_varies(sim, workload, limit):
    share = run_mix(sim, workload, [limit])[0]
    assert abs(share - limit) <= TOLERANCE, (workload, limit, share)


def test_event_time_is_not_charged_to_short_kernels(sim):
    """A real GPU spends device time on the limiter's own timing events (an empty pair read 1.25 us on an H100,
    bench/results/gpu/h100-run2/event_timing.txt); the limiter takes the least an empty pair reads off each timing,
    so 20 us kernels still get their limit (charged with the events' time they would get 60 x 20 / 21.3 = 56 %)."""
    share = run_mix(sim, "short", [60], extra_env={"SIMGPU_EVENT_NS": "1300"})[0]
    assert abs(share - 60) <= TOLERANCE, share


def test_limit_holds_over_several_streams(sim):
    share = run_mix(sim, "varied", [50], streams=3)[0]
    assert abs(share - 50) <= TOLERANCE, share


@pytest.mark.parametrize("workload,limit", [("bursty", 30), ("mixed", 70), ("varied", 90)])
def test_processes_of_one_container_share_one_budget(sim, workload, limit):
    share = run_mix(sim, workload, [limit], nproc=3)[0]
    assert abs(share - limit) <= TOLERANCE, (workload, limit, share)


@pytest.mark.parametrize("workload,limits", [("varied", [20, 60]), ("mixed", [50, 30]), ("varied", [10, 80])])
def test_two_containers_each_get_their_own_limit(sim, workload, limits):
    """Each container is capped at its own limit; the share neither uses stays idle (limits are caps)."""
    shares = run_mix(sim, workload, limits, nproc=2)
    assert all(abs(s - lim) <= TOLERANCE for s, lim in zip(shares, limits)), (limits, shares)


def run_spin(sim, limit: int | None, nproc: int, seconds: float, kind: str = "kernel", windows: int = 2,
             **env: str) -> list[float]:
    """Start `nproc` saturating processes; return device utilisation (%) per 1 s window after the warm-up."""
    helpers = sim.helpers()
    if limit is not None:
        env.setdefault("CUDA_DEVICE_SM_LIMIT", str(limit))
    env.setdefault("CUDA_DEVICE_MEMORY_LIMIT", "8g")
    t0 = helpers.simgpu_now_ns()
    procs = [sim.popen("spin", kind, "100", "1000", str(seconds), **env) for _ in range(nproc)]
    for p in procs:
        out, err = p.communicate(timeout=seconds + 30)
        assert p.returncode == 0, err
        assert int(sim.parse(out)["launches"]) > 0
    return [helpers.simgpu_busy_ns(0, 0, t0 + (WARMUP + w) * SEC, t0 + (WARMUP + w + 1) * SEC) / SEC * 100
            for w in range(windows)]


@pytest.mark.parametrize("nproc,limit", [(1, 10), (1, 90), (4, 30)])
def test_constant_time_kernels_are_limited(sim, limit, nproc):
    utils = run_spin(sim, limit, nproc, WARMUP + 2.2, GPU_CORE_UTILIZATION_POLICY="force")
    assert all(abs(u - limit) <= TOLERANCE for u in utils), (limit, nproc, utils)


@pytest.mark.parametrize("kind", ["ex", "coop", "graph"])
def test_every_launch_path_is_limited(sim, kind):
    utils = run_spin(sim, 30, 1, WARMUP + 1.2, kind=kind, windows=1, GPU_CORE_UTILIZATION_POLICY="force")
    assert abs(utils[0] - 30) <= TOLERANCE, (kind, utils)


def test_unlimited_workload_saturates_the_device(sim):
    utils = run_spin(sim, None, 1, WARMUP + 1.2, windows=1)
    assert utils[0] > 95


def test_policy_disable_turns_the_limit_off(sim):
    utils = run_spin(sim, 30, 1, WARMUP + 1.2, windows=1, GPU_CORE_UTILIZATION_POLICY="disable")
    assert utils[0] > 95


def test_policy_default_follows_the_monitor_switch(sim):
    # default limits while utilization_switch == 1 (its initial value) ...
    assert abs(run_spin(sim, 30, 1, WARMUP + 1.2, windows=1)[0] - 30) <= 5
    # ... and not once a monitor sets it to 0 (no other tenant on the GPU); `force` ignores the switch
    with Region.open(sim.cache, readonly=False) as r:
        r.set_utilization_switch(False)
    assert run_spin(sim, 30, 1, WARMUP + 1.2, windows=1)[0] > 95
    assert abs(run_spin(sim, 30, 1, WARMUP + 1.2, windows=1, GPU_CORE_UTILIZATION_POLICY="force")[0] - 30) <= 5


def test_budget_counters_are_visible_in_the_region(sim):
    run_spin(sim, 50, 2, WARMUP + 1.2, windows=1, GPU_CORE_UTILIZATION_POLICY="force")
    with Region.open(sim.cache) as r:
        st = r.sm_state(0)
        snap = r.snapshot()
    assert st["launches"] > 0 and st["throttled_ns"] > 0 and st["measured_ns"] > 0
    assert snap.last_kernel_time > 0 and snap.devices[0].sm_limit == 50


def test_process_sm_util_is_published_for_the_monitor(sim):
    import time
    p = sim.popen("spin", "kernel", "100", "1000", "3.5", CUDA_DEVICE_SM_LIMIT="50",
                  GPU_CORE_UTILIZATION_POLICY="force", CUDA_DEVICE_MEMORY_LIMIT="8g")
    try:
        time.sleep(2.6)
        with Region.open(sim.cache) as r:
            procs = r.processes()
            dev = r.devices()[0]
        assert [x.pid for x in procs] == [p.pid]
        assert 40 <= procs[0].sm_util[0] <= 60, procs
        assert dev.sm_util == procs[0].sm_util[0]
    finally:
        p.communicate(timeout=30)


def test_the_cuda2_launch_api_is_limited(sim, probe_api):
    """cuParamSetv + cuLaunchGrid (parameters set beforehand, the legacy default stream) count like any launch."""
    out = sim.run("oldlaunch", "3", program=probe_api, timeout=60, CUDA_DEVICE_MEMORY_LIMIT="4g",
                  CUDA_DEVICE_SM_LIMIT="30", GPU_CORE_UTILIZATION_POLICY="force")
    assert out["_rc"] == "0", out
    share = int(out["launches"]) * int(out["kernel_ns"]) / 1e9 / float(out["seconds"]) * 100
    assert abs(share - 30) <= 3, share
