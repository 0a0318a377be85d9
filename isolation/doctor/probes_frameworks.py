"""Framework probes: PyTorch, CuPy and JAX under the library, each where it can be imported.

Each runs in its own worker (and the throughput runs each in their own), imports its framework there and skips
with the import error when it cannot. Frameworks hold a few buffers of their own, so a memory probe passes when
the framework refuses with its out-of-memory error, holds at most the limit, and holds more than the limit less
two allocation steps.
"""
from __future__ import annotations

import collections
import importlib
import time
from types import ModuleType
from typing import Any

from vgpu.isolation.doctor import legs
from vgpu.isolation.doctor.channel import Action, Channel, Params
from vgpu.isolation.doctor.outcome import Outcome, mib

TOLERANCE = 5.0                 # points between the limit and the throughput ratio
MATMUL_N = 4096                 # float32 matmuls: a few ms each on a data-centre GPU
IN_FLIGHT = 8                   # matmuls queued ahead of the host at most


class _Missing(Exception):
    """The framework cannot be imported or sees no GPU."""


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except Exception as exc:  # ImportError, or a framework that fails while importing
        raise _Missing(f"{name} not importable: {type(exc).__name__}: {exc}") from exc


def _torch() -> Any:
    torch: Any = _import("torch")
    if not torch.cuda.is_available():
        raise _Missing("torch sees no CUDA device")
    return torch


def _fill_outcome(name: str, refused: bool, held: int, pool: int, total: int, limit: int, chunk: int) -> Outcome:
    figures = {"held_bytes": held, "pool_bytes": pool, "reported_total": total, "limit_bytes": limit}
    problems = []
    if not refused:
        problems.append(f"{name} allocated {mib(held)}, past the {mib(limit)} limit, without an out-of-memory error")
    elif held <= limit - 2 * chunk:
        problems.append(f"{name} refused early: {mib(held)} held of the {mib(limit)} limit")
    if pool > limit:
        problems.append(f"{name}'s pool holds {mib(pool)}, past the {mib(limit)} limit")
    if total != limit:
        problems.append(f"{name} reports {mib(total)} of device memory, not the {mib(limit)} limit")
    if problems:
        return Outcome.failed("; ".join(problems), **figures)
    return Outcome.passed(f"out of memory at {mib(held)} of {mib(limit)}; reported total {mib(total)}", **figures)


def probe_torch_memory(params: Params, channel: Channel) -> Outcome:
    """torch.empty in chunks until torch.cuda.OutOfMemoryError; torch.cuda.mem_get_info's total is the limit."""
    try:
        torch = _torch()
    except _Missing as exc:
        return Outcome.skip(str(exc))
    limit, chunk = params["limit"], params["chunk"]
    oom = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
    _, total = torch.cuda.mem_get_info(0)
    held: list[Any] = []
    refused = False
    try:
        while len(held) * chunk <= limit:
            held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
    except oom:
        refused = True
    return _fill_outcome("torch", refused, len(held) * chunk, int(torch.cuda.memory_reserved()), int(total), limit,
                         chunk)


def probe_cupy_memory(params: Params, channel: Channel) -> Outcome:
    """cupy.empty in chunks until cupy.cuda.memory.OutOfMemoryError; memGetInfo's total is the limit."""
    try:
        cupy: Any = _import("cupy")
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise _Missing("cupy sees no CUDA device")
    except _Missing as exc:
        return Outcome.skip(str(exc))
    except Exception as exc:  # CUDARuntimeError when no driver answers
        return Outcome.skip(f"cupy sees no CUDA device: {exc}")
    limit, chunk = params["limit"], params["chunk"]
    _, total = cupy.cuda.runtime.memGetInfo()
    held: list[Any] = []
    refused = False
    try:
        while len(held) * chunk <= limit:
            held.append(cupy.empty(chunk, dtype=cupy.uint8))
    except cupy.cuda.memory.OutOfMemoryError:
        refused = True
    pool = int(cupy.get_default_memory_pool().total_bytes())
    return _fill_outcome("cupy", refused, len(held) * chunk, pool, int(total), limit, chunk)


def probe_jax_memory(params: Params, channel: Channel) -> Outcome:
    """JAX's GPU backend preallocates a fraction of what the driver reports: bytes_limit is at most the limit."""
    try:
        jax: Any = _import("jax")
        try:
            devices = jax.devices("gpu")
        except RuntimeError as exc:
            raise _Missing(f"jax has no GPU backend: {exc}") from exc
    except _Missing as exc:
        return Outcome.skip(str(exc))
    limit = params["limit"]
    stats = devices[0].memory_stats() or {}
    bytes_limit = int(stats.get("bytes_limit", 0))
    figures = {"bytes_limit": bytes_limit, "limit_bytes": limit, "device": str(devices[0])}
    if not 0 < bytes_limit <= limit:
        return Outcome.failed(f"jax's bytes_limit is {mib(bytes_limit)}, not within the {mib(limit)} limit",
                              **figures)
    return Outcome.passed(f"bytes_limit {mib(bytes_limit)} of {mib(limit)}", **figures)


def _matmuls(torch: Any, seconds: float) -> tuple[int, float]:
    """Launch float32 matmuls for `seconds` with at most IN_FLIGHT queued; (matmuls, device ms they spanned)."""
    a = torch.randn(MATMUL_N, MATMUL_N, device="cuda")
    b = torch.randn(MATMUL_N, MATMUL_N, device="cuda")
    c = torch.empty_like(a)
    marks: collections.deque[Any] = collections.deque()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    n = 0
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        torch.matmul(a, b, out=c)
        n += 1
        mark = torch.cuda.Event()
        mark.record()
        marks.append(mark)
        if len(marks) > IN_FLIGHT:
            marks.popleft().synchronize()
    end.record()
    end.synchronize()
    return n, float(start.elapsed_time(end))


def leg_torch_rate(params: Params, channel: Channel) -> Outcome:
    """Matmuls per second after a warm-up (TF32 off: the same kernels in every run)."""
    try:
        torch = _torch()
    except _Missing as exc:
        return Outcome.skip(str(exc))
    torch.backends.cuda.matmul.allow_tf32 = False
    _matmuls(torch, params["warmup"])
    n, ms = _matmuls(torch, params["window"])
    return Outcome.passed(f"{n / ms * 1000:.1f} matmuls/s", rate=n / ms * 1000, matmuls=n)


def probe_torch_share(params: Params, channel: Channel) -> Outcome:
    """Matmul throughput at 30 % and 60 % against a run with the memory limit only: each ratio within 5 points of
    its limit."""
    rates: dict[str, float] = {}
    for cores in (None, 30, 60):
        tag = "unlimited" if cores is None else str(cores)
        got = legs.run("torch-rate", params, legs.limited(params, f"torch-{tag}", cores),
                       timeout=legs.LEG_TIMEOUT_S + params["warmup"] + params["window"])
        if got.skipped:
            return got
        if not got.ok:
            return Outcome.failed(f"the {tag} run failed: {got.reason}")
        rates[tag] = float(got.figures["rate"])
    ratios = {c: rates[c] / rates["unlimited"] * 100 for c in ("30", "60")}
    figures = {"matmuls_per_s": {k: round(v, 2) for k, v in rates.items()},
               "ratio_pct": {k: round(v, 2) for k, v in ratios.items()}, "matmul_n": MATMUL_N}
    text = ", ".join(f"{v:.1f} % at {c} %" for c, v in ratios.items()) + f" of {rates['unlimited']:.0f} matmuls/s"
    off = [c for c, v in ratios.items() if abs(v - int(c)) > TOLERANCE]
    if off:
        return Outcome.failed(f"throughput {text}: off by more than {TOLERANCE:.0f} points at {off[0]} %", **figures)
    return Outcome.passed(text, **figures)


def probe_torch_graph(params: Params, channel: Channel) -> Outcome:
    """torch.cuda.graph captures a matmul under the compute limit, replays it for the window, and the result equals
    the eager one."""
    try:
        torch = _torch()
    except _Missing as exc:
        return Outcome.skip(str(exc))
    torch.backends.cuda.matmul.allow_tf32 = False
    n = MATMUL_N // 4
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            torch.matmul(a, b)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            c = torch.matmul(a, b)
    except RuntimeError as exc:
        return Outcome.failed(f"capture under the limit failed: {exc}")
    replays = 0
    stop = time.monotonic() + params["window"]
    while time.monotonic() < stop:
        graph.replay()
        replays += 1
        if replays % IN_FLIGHT == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    same = bool(torch.allclose(c, torch.matmul(a, b)))
    figures = {"replays": replays, "replays_per_s": round(replays / params["window"], 1), "result_matches": same}
    if not same:
        return Outcome.failed("the replayed graph's result differs from the eager matmul", **figures)
    return Outcome.passed(f"captured, {replays} replays, result matches", **figures)


ACTIONS: dict[str, Action] = {
    "torch-memory": probe_torch_memory, "torch-share": probe_torch_share, "torch-rate": leg_torch_rate,
    "torch-graph": probe_torch_graph, "cupy-memory": probe_cupy_memory, "jax-memory": probe_jax_memory,
}
