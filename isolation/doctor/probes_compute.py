"""Compute probes: the share of the GPU a limited process gets, read from the device's own time.

The spin kernel (ptx.py) keeps the GPU busy for a known time per launch. `kernel-clock` measures, without the
library, the device time one launch takes when launches run back to back (a long kernel first, so that the
short ones queue behind it): that is what a launch costs the GPU, the spin plus the launch's own overhead. A
share probe launches in a loop under a limit; after a warm-up it records an event, keeps launching for the
window, records a second event and waits for it. Every launch between the two events ran between them, so

    share = launches x device time per launch / device time between the events

(the spin-time share, launches x spin / window, is reported too). No host clock is read across the window, and the
limiter is never made to wait for the GPU in the middle of it.
"""
from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Callable
from typing import Any

from vgpu.isolation.doctor import cuda, legs
from vgpu.isolation.doctor.catalog import SPINS, TINY_NS
from vgpu.isolation.doctor.channel import Action, Channel, Params
from vgpu.isolation.doctor.cuda import SUCCESS, CudaError, Driver, error_name, open_device
from vgpu.isolation.doctor.outcome import Outcome
from vgpu.isolation.doctor.ptx import SleepKernel

TOLERANCE = 5.0                # points of share either side of the limit
BLOCKER_NS = 50_000_000        # the kernel the calibration queues short ones behind
CALIBRATION_GPU_NS = 10_000_000  # device time each spin length is measured over (10 to 500 launches)
OVERHEAD_CORES = 90            # launch-overhead's compute limit: above what its loop keeps the GPU busy
OVERHEAD_ABSURD = 50.0         # % fewer launches/s with the library that fails launch-overhead
GRAPH_NODES = 4


def _kernel(drv: Driver, dev: int) -> SleepKernel:
    return SleepKernel(drv, drv.capability(dev))


def _launch(go: Callable[[], int], what: str) -> None:
    code = go()
    if code != SUCCESS:
        raise CudaError(what, code)


def probe_kernel_clock(params: Params, channel: Channel) -> Outcome:
    """Device ns per launch of each spin length, launched back to back without the library. Fails when a spin
    kernel does not run at least (95 % of) its spin: the compute probes would measure nothing then."""
    dev = params["device"]
    drv = open_device(dev)
    kernel = _kernel(drv, dev)
    stream = drv.stream()
    start, end = drv.event(), drv.event()
    blocker = kernel.launcher(BLOCKER_NS, stream)
    device_ns: dict[str, float] = {}
    for spin in SPINS:
        go = kernel.launcher(spin, stream)
        n = max(10, min(500, CALIBRATION_GPU_NS // max(spin, 1)))
        _launch(blocker, "cuLaunchKernel")
        drv.record(start, stream)
        for _ in range(n):
            _launch(go, "cuLaunchKernel")
        drv.record(end, stream)
        device_ns[str(spin)] = drv.elapsed_ns(start, end) / n
    figures: dict[str, Any] = {"device_ns": device_ns, "ptx": kernel.variant}
    slow = [s for s in SPINS if s and device_ns[str(s)] < 0.95 * s]
    if slow:
        return Outcome.failed(f"the spin kernel ran shorter than its spin ({slow[0]} ns took "
                              f"{device_ns[str(slow[0])]:.0f} ns): the GPU timer does not advance as expected",
                              **figures)
    text = ", ".join(f"{int(s) // 1000} us: {v / 1000:.1f} us" for s, v in device_ns.items() if int(s))
    return Outcome.passed(f"{text}; tiny: {device_ns[str(TINY_NS)] / 1000:.1f} us (PTX {kernel.variant})",
                          **figures)


def _timed_window(drv: Driver, stream: ctypes.c_void_p, step: Callable[[], int], warmup: float, window: float,
                  what: str) -> tuple[int, float]:
    """Launch `step` for `warmup` s, then count launches for `window` s between two events; (launches, device ns
    between the events)."""
    start, end = drv.event(), drv.event()
    stop = time.monotonic() + warmup
    while time.monotonic() < stop:
        _launch(step, what)
    drv.record(start, stream)
    n = 0
    stop = time.monotonic() + window
    while time.monotonic() < stop:
        _launch(step, what)
        n += 1
    drv.record(end, stream)
    return n, drv.elapsed_ns(start, end)


def _share_outcome(share: float, spin_share: float, cores: int, launches: int, elapsed_ns: float) -> Outcome:
    figures = {"share_pct": round(share, 2), "spin_share_pct": round(spin_share, 2), "limit_pct": cores,
               "launches": launches, "window_s": round(elapsed_ns / 1e9, 3)}
    text = f"{share:.1f} % at a {cores} % limit (spin time: {spin_share:.1f} %, {launches} launches)"
    if abs(share - cores) > TOLERANCE:
        return Outcome.failed(f"achieved {text}: off by more than {TOLERANCE:.0f} points", **figures)
    return Outcome.passed(text, **figures)


def probe_share(params: Params, channel: Channel) -> Outcome:
    """Saturating launches of one spin length under CUDA_DEVICE_SM_LIMIT: the share is within 5 points of it."""
    dev, spin, cores = params["device"], params["spin"], params["cores"]
    per_launch = params["device_ns"][str(spin)]
    drv = open_device(dev)
    kernel = _kernel(drv, dev)
    stream = drv.stream()
    n, elapsed = _timed_window(drv, stream, kernel.launcher(spin, stream), params["warmup"], params["window"],
                               "cuLaunchKernel")
    return _share_outcome(n * per_launch / elapsed * 100, n * spin / elapsed * 100, cores, n, elapsed)


def probe_graph(params: Params, channel: Channel) -> Outcome:
    """Capture 4 spin kernels on a non-blocking stream in global mode, instantiate, replay under the limit: the
    capture must end valid, the replays complete, their share be within 5 points of the limit."""
    dev, spin, cores = params["device"], params["spin"], params["cores"]
    drv = open_device(dev)
    calls = ("cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphInstantiateWithFlags", "cuGraphLaunch",
             "cuGraphExecDestroy", "cuGraphDestroy")
    missing = [c for c in calls if not drv.has(c)]
    if missing:
        return Outcome.skip(f"the driver does not export {', '.join(missing)} (no stream capture)")
    kernel = _kernel(drv, dev)
    stream = drv.stream(cuda.STREAM_NON_BLOCKING)
    node = kernel.launcher(spin, stream)
    drv.call("cuStreamBeginCapture_v2", stream, cuda.STREAM_CAPTURE_MODE_GLOBAL)
    launched = [node() for _ in range(GRAPH_NODES)]
    graph = ctypes.c_void_p()
    code = drv.status("cuStreamEndCapture", stream, ctypes.byref(graph))
    bad = next((c for c in launched if c != SUCCESS), SUCCESS)
    if bad != SUCCESS:
        return Outcome.failed(f"a launch into the capturing stream failed: {error_name(bad)}")
    if code != SUCCESS:
        return Outcome.failed(f"cuStreamEndCapture: {error_name(code)} (the capture was invalidated)")
    graph_exec = ctypes.c_void_p()
    drv.call("cuGraphInstantiateWithFlags", ctypes.byref(graph_exec), graph, 0)
    replay = functools.partial(drv.fn("cuGraphLaunch"), graph_exec, stream)
    n, elapsed = _timed_window(drv, stream, replay, params["warmup"], params["window"], "cuGraphLaunch")
    drv.sync(stream)
    drv.status("cuGraphExecDestroy", graph_exec)
    drv.status("cuGraphDestroy", graph)
    per_replay = GRAPH_NODES * params["device_ns"][str(spin)]
    out = _share_outcome(n * per_replay / elapsed * 100, n * GRAPH_NODES * spin / elapsed * 100, cores, n, elapsed)
    out.figures["replays"] = out.figures.pop("launches")
    if out.ok:
        out.summary = f"capture valid, {n} replays: " + out.summary.split(" (", 1)[0]
    return out


def leg_launch_rate(params: Params, channel: Channel) -> Outcome:
    """Launches/s of a loop of tiny kernels for params["seconds"] (until the GPU has run them all)."""
    dev = params["device"]
    drv = open_device(dev)
    kernel = _kernel(drv, dev)
    stream = drv.stream()
    go = kernel.launcher(TINY_NS, stream)
    stop = time.monotonic() + 0.1
    while time.monotonic() < stop:
        _launch(go, "cuLaunchKernel")
    drv.sync(stream)
    n = 0
    t0 = time.monotonic()
    stop = t0 + params["seconds"]
    while time.monotonic() < stop:
        _launch(go, "cuLaunchKernel")
        n += 1
    drv.sync(stream)
    rate = n / (time.monotonic() - t0)
    return Outcome.passed(f"{rate:.0f} launches/s", rate=rate)


def probe_launch_overhead(params: Params, channel: Channel) -> Outcome:
    """Runs of the launch loop without the library and with it (memory limit and a 90 % compute limit),
    alternating; the overhead is how many fewer launches per second the best run with the library makes than the
    best run without it (noise only ever slows a run down), in %. A figure: it fails only when absurd (50 % or
    more)."""
    leg = {**params, "seconds": params["window"] / 3}
    rates: dict[str, list[float]] = {"without": [], "with": []}
    for rep in range(params["reps"]):
        for side in ("without", "with"):
            env = legs.reference(params) if side == "without" else legs.limited(params, f"rate-{rep}",
                                                                                 OVERHEAD_CORES)
            got = legs.run("launch-rate", leg, env)
            if not got.ok:
                return Outcome.failed(f"the launch loop {side} the library failed: {got.reason}")
            rates[side].append(float(got.figures["rate"]))
    without, with_lib = max(rates["without"]), max(rates["with"])
    overhead = (1 - with_lib / without) * 100
    figures: dict[str, Any] = {"launches_per_s_without": round(without), "launches_per_s_with": round(with_lib),
                               "overhead_pct": round(overhead, 2), "goal_pct": 3, "sm_limit_pct": OVERHEAD_CORES,
                               "runs": {k: [round(r) for r in v] for k, v in rates.items()}}
    tiny = (params.get("device_ns") or {}).get(str(TINY_NS))
    if tiny:
        figures["gpu_busy_pct_with"] = round(with_lib * tiny / 1e9 * 100, 1)
    text = (f"{with_lib:,.0f} launches/s with the library, {without:,.0f} without: {overhead:+.1f} % "
            "(goal <= 3 %)")
    if overhead >= OVERHEAD_ABSURD:
        return Outcome.failed(f"the library leaves {text}", **figures)
    return Outcome.passed(text, **figures)


ACTIONS: dict[str, Action] = {
    "kernel-clock": probe_kernel_clock, "share": probe_share, "graph-30": probe_graph,
    "launch-rate": leg_launch_rate, "launch-overhead": probe_launch_overhead,
}
