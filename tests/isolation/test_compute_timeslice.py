"""The compute limit on a GPU that time-slices between contexts (the simulated GPU with SIMGPU_TIMESLICE_NS = 2 ms,
a slice as the H100's contention figures imply), with tenants running bench/gpu/tenants.py's loop (16 kernels, then
a wait) of 2.7 ms kernels (a 4096-wide float32 matrix product on an H100) or 0.35 ms ones (2048-wide).

Without pacing the library charges long kernels the other tenants' slices too, and the tenants get what they got on
the H100 (bench/results/gpu/h100-run5): that failure is pinned here, so that the simulated GPU keeps showing it.
With the node's pacer (vgpu.node.pacing, run here as the device plugin runs it, from each tenant's real GPU time in
the simulated GPU's per-process timeline and its charge in its accounting file) every tenant gets its limit, within
3 points, and two at 50 + 50 keep the GPU busy.  Shares are read from the simulated GPU's own timeline."""
from __future__ import annotations

import os
import time

import pytest

from vgpu.isolation.region import Region, RegionError
from vgpu.node.pacing import OVER_LIMIT, Pacer, Tenant, pace_file_text

SEC = 1_000_000_000
SLICE_NS = 2_000_000
TOLERANCE = 3
H100 = {  # bench/results/gpu/h100-run5/tenants.json: share (%) per tenant, 4096-wide products
    (30, 50): [19.2, 42.4],
    (50, 50): [33.9, 37.5],
    (20, 20, 20): [15.3, 15.9, 13.3],
}


def run_tenants(sim, workload: str, limits: list[int], paced: bool, warmup: float, window: float,
                factors: list[dict] | None = None) -> list[float]:
    """One process per limit, each a container of its own; the share (%) of the GPU each got over the window.  The
    pacer's factors, period by period, are appended to `factors`."""
    helpers = sim.helpers()
    seconds = warmup + window + 0.3
    t0 = helpers.simgpu_now_ns()
    procs = []
    for c, limit in enumerate(limits):
        env = dict(CUDA_DEVICE_SM_LIMIT=str(limit), CUDA_DEVICE_MEMORY_LIMIT="8g", GPU_CORE_UTILIZATION_POLICY="force",
                   CUDA_DEVICE_MEMORY_SHARED_CACHE=str(sim.cache.with_suffix(f".{c}.cache")),
                   VGPU_PACE_FILE=str(sim.cache.with_suffix(f".{c}.pace")), SIMGPU_TIMESLICE_NS=str(SLICE_NS))
        procs.append(sim.popen("mix", workload, str(seconds), "1", **env))
    if paced:
        _pace(sim, helpers, procs, limits, [] if factors is None else factors)
    for p in procs:
        _, err = p.communicate(timeout=seconds + 30)
        assert p.returncode == 0, err
    a, b = t0 + int(warmup * SEC), t0 + int((warmup + window) * SEC)
    return [helpers.simgpu_busy_ns(0, p.pid, a, b) / (b - a) * 100 for p in procs]


def _pace(sim, helpers, procs, limits: list[int], history: list[dict]) -> None:
    """The pacer, once a second until the tenants end; its factors of each period are appended to `history`."""
    pacer = Pacer()
    owner = {p.pid: f"c{c}" for c, p in enumerate(procs)}
    last = helpers.simgpu_now_ns()
    while any(p.poll() is None for p in procs):
        time.sleep(1.0)
        now = helpers.simgpu_now_ns()
        tenants = []
        for c, limit in enumerate(limits):
            try:
                with Region.open(sim.cache.with_suffix(f".{c}.cache")) as region:
                    device = region.devices()[0]
            except (OSError, RegionError, IndexError):
                continue
            tenants.append(Tenant(f"c{c}", device.uuid, limit, device.charged_ns, read_ns=device.read_ns))
        running = {p.pid: helpers.simgpu_busy_ns(0, p.pid, last, now) / (now - last) * 100 for p in procs}
        last = now
        factors = pacer.step(tenants, lambda _uuid, seen=running: seen, owner.get)
        history.append(factors)
        for tenant in tenants:
            path = sim.cache.with_suffix(f".{tenant.key[1:]}.pace")
            path.with_suffix(".tmp").write_text(pace_file_text({tenant.uuid: factors[(tenant.key, tenant.uuid)]}))
            os.replace(path.with_suffix(".tmp"), path)


def paced_twice(sim, workload: str, limits: list[int], warmup: float, window: float, ok) -> list[float]:
    """The paced shares, taken a second time when the first run's fail `ok`: the tenants submit from ordinary
    threads, and a machine busy with other tests can starve them (both then fall short together, the pacer no
    matter), so one retry separates a busy machine from a pacer that does not hold."""
    shares = run_tenants(sim, workload, limits, paced=True, warmup=warmup, window=window)
    return shares if ok(shares) else run_tenants(sim, workload, limits, paced=True, warmup=warmup, window=window)


@pytest.mark.parametrize("limits", [(30, 50), (50, 50)])
def test_without_pacing_long_kernels_get_what_they_got_on_the_h100(sim, limits):
    # (three tenants at 20 % leave the GPU idle 40 % of the time, and on the simulated GPU, whose kernels all last
    # exactly 2.7 ms, their bursts can fall into turns that never overlap: then nothing is miscounted; the H100's
    # overlapped.  Only layouts that must overlap are pinned.)
    shares = run_tenants(sim, "long", list(limits), paced=False, warmup=1.5, window=2.5)
    for got, h100, limit in zip(shares, H100[limits], limits):
        assert got == pytest.approx(h100, abs=5), (shares, H100[limits])
        assert got < limit - 3, shares   # well under the limit, as on the H100


@pytest.mark.parametrize("limits", list(H100))
def test_with_pacing_long_kernels_get_their_limits(sim, limits):
    # two tenants at 50 + 50 fill the GPU only while each has work queued: whenever both wait on their limiters or
    # their syncs the GPU idles, so each gets about 47.3 (46.6 to 48.2 over ten runs here), a point more leeway
    slack = TOLERANCE + 1 if limits == (50, 50) else TOLERANCE
    shares = paced_twice(sim, "long", list(limits), 6, 4,
                         lambda got: all(abs(g - lim) <= slack for g, lim in zip(got, limits)))
    for got, limit in zip(shares, limits):
        assert got == pytest.approx(limit, abs=slack), shares
    if limits == (50, 50):
        assert sum(shares) >= 93, shares


@pytest.mark.parametrize("workload,limits", [("medium", [30, 50]), ("varied", [30, 50]), ("varied", [30])])
def test_with_pacing_short_kernels_and_a_tenant_alone_keep_their_limits(sim, workload, limits):
    shares = paced_twice(sim, workload, limits, 4, 3,
                         lambda got: all(abs(g - lim) <= TOLERANCE for g, lim in zip(got, limits)))
    for got, limit in zip(shares, limits):
        assert got == pytest.approx(limit, abs=TOLERANCE), shares


def test_a_tenant_alone_with_long_kernels_is_left_uncorrected(sim):
    """Alone, nothing preempts its kernels, so its timings are right and its factor stays about 1 once it runs
    (the first periods see the first kernels charged before they ran, which the pacer's window keeps for a while;
    the last one its queued kernels dropped at exit).  Its share is not asserted: a loop that waits for every 16
    kernels leaves the GPU idle whenever a busy test machine is slow to wake it, which is the machine's doing, not
    the limiter's."""
    history: list[dict] = []
    run_tenants(sim, "long", [30], paced=True, warmup=7, window=1, factors=history)
    middle = [f for step in history[4:-1] for f in step.values()]   # past the start's window of periods
    assert middle and all(f == pytest.approx(1.0, abs=0.1) for f in middle), history


def _sim_uuid(name: str = "Sim-A100-40GB", position: int = 0) -> str:
    """The UUID the simulated GPU derives for a listed GPU without one (gpusim.h gs_parse_devices)."""
    h = 1469598103934665603
    for c in name.encode():
        h = ((h ^ c) * 1099511628211) % (1 << 64)
    return f"GPU-{h >> 32:08x}-{h & 0xffff:04x}-4d53-9000-{0xa11ce0000 + position:012x}"


UUID = _sim_uuid()


@pytest.mark.parametrize("text,age,expected", [
    (f"{UUID} 0.5\n", 0, 20),             # timings halved: twice the share
    (f"{UUID} 0.01\n", 0, 50),            # held at the library's bound, 0.2
    (f"{UUID} 0.5\n", 60, 10),            # a stale file (the pacer stopped): the uncorrected timing
    ("GPU-other 0.5\nnot a line\n", 0, 10),   # no line for this GPU: the uncorrected timing
])
def test_the_library_applies_a_fresh_pace_file_within_its_bounds(sim, text, age, expected):
    """One process at a 10 % limit on a first-in-first-out GPU, whose timings are exact; the pace file says how its
    timings are to be scaled."""
    pace = sim.cache.with_suffix(".0.pace")
    pace.write_text(text)
    if age:
        os.utime(pace, (time.time() - age, time.time() - age))
    helpers = sim.helpers()
    t0 = helpers.simgpu_now_ns()
    p = sim.popen("mix", "varied", "3.5", "1", CUDA_DEVICE_SM_LIMIT="10", GPU_CORE_UTILIZATION_POLICY="force",
                  CUDA_DEVICE_MEMORY_LIMIT="8g", CUDA_DEVICE_MEMORY_SHARED_CACHE=str(sim.cache.with_suffix(".0.cache")),
                  VGPU_PACE_FILE=str(pace))
    _, err = p.communicate(timeout=40)
    assert p.returncode == 0, err
    a, b = t0 + int(1.5 * SEC), t0 + int(3.2 * SEC)
    assert helpers.simgpu_busy_ns(0, p.pid, a, b) / (b - a) * 100 == pytest.approx(expected, abs=TOLERANCE)


def test_an_idle_share_is_lent_up_to_the_ceiling_and_taken_back_when_the_neighbour_returns(sim):
    """Idle share (a tenant with a ceiling above its limit): A, limited to 30 % with a ceiling of 80 %, runs alone
    and gets its ceiling; B (50 %) starts 6 s later, and within two pacer periods A is back at its limit and B gets
    its own. Long kernels on the time-sliced GPU, so the correction is at work too."""
    helpers = sim.helpers()
    start_b, seconds = 6.0, 17.0
    t0 = helpers.simgpu_now_ns()

    def tenant(c: int, limit: int, run: float):
        env = dict(CUDA_DEVICE_SM_LIMIT=str(limit), CUDA_DEVICE_MEMORY_LIMIT="8g", GPU_CORE_UTILIZATION_POLICY="force",
                   CUDA_DEVICE_MEMORY_SHARED_CACHE=str(sim.cache.with_suffix(f".{c}.cache")),
                   VGPU_PACE_FILE=str(sim.cache.with_suffix(f".{c}.pace")), SIMGPU_TIMESLICE_NS=str(SLICE_NS))
        return sim.popen("mix", "long", str(run), "1", **env)

    procs = {0: tenant(0, 30, seconds)}
    pacer, owner, last, started, b_start = Pacer(), {}, t0, time.monotonic(), 0.0
    while any(p.poll() is None for p in procs.values()):
        time.sleep(1.0)
        if 1 not in procs and time.monotonic() - started >= start_b:
            procs[1] = tenant(1, 50, seconds - start_b)
            b_start = (helpers.simgpu_now_ns() - t0) / SEC
        owner = {p.pid: f"c{c}" for c, p in procs.items()}
        now = helpers.simgpu_now_ns()
        tenants = []
        for c, (limit, ceiling) in ((0, (30, 80)), (1, (50, 0))):
            try:
                with Region.open(sim.cache.with_suffix(f".{c}.cache")) as region:
                    device = region.devices()[0]
            except (OSError, RegionError, IndexError):
                continue
            tenants.append(Tenant(f"c{c}", device.uuid, limit, device.charged_ns, ceiling_pct=ceiling,
                                  read_ns=device.read_ns))
        running = {p.pid: helpers.simgpu_busy_ns(0, p.pid, last, now) / (now - last) * 100 for p in procs.values()}
        last = now
        factors = pacer.step(tenants, lambda _uuid, seen=running: seen, owner.get)
        for t in tenants:
            path = sim.cache.with_suffix(f".{t.key[1:]}.pace")
            path.with_suffix(".tmp").write_text(pace_file_text({t.uuid: factors[(t.key, t.uuid)]}))
            os.replace(path.with_suffix(".tmp"), path)
    for p in procs.values():
        _, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
    def share(c: int, a: float, b: float) -> float:
        lo, hi = t0 + int(a * SEC), t0 + int(b * SEC)
        return helpers.simgpu_busy_ns(0, procs[c].pid, lo, hi) / (hi - lo) * 100

    # alone: far over its limit, up to its ceiling. How near the ceiling a lone tenant of long kernels gets depends on
    # how fast the machine refills its queue; above it, the pacer lets a tenant run OVER_LIMIT times what is in force
    # before it corrects (83.1 % seen on a loaded CI machine), so that is the bound.
    alone = share(0, 3.0, 5.5)
    assert 70 <= alone <= 80 * OVER_LIMIT, alone
    # two periods after B came: A is back under its limit (the correction for B's slices takes a few more)
    assert share(0, b_start + 2.0, b_start + 4.0) < 30 + TOLERANCE
    assert share(0, b_start + 6.0, seconds - 0.5) == pytest.approx(30, abs=TOLERANCE)   # and at it
    assert share(1, b_start + 6.0, seconds - 0.5) == pytest.approx(50, abs=TOLERANCE)
