"""Memory probes: every allocation path stops at the limit, the queries report it, it is shared and reclaimed.

A path is probed by allocating chunks (64 MiB) until the driver call is refused. The limit holds when the refusal
is CUDA_ERROR_OUT_OF_MEMORY and the bytes held are at most the limit and more than the limit less one step and
one 2 MiB page (the slack: what is left when the next step no longer fits). A path that keeps succeeding is
stopped one step past the limit: that is proof enough.
"""
from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vgpu.isolation.doctor import cuda, legs, nvml
from vgpu.isolation.doctor.channel import Action, Channel, Params
from vgpu.isolation.doctor.cuda import ERROR_OUT_OF_MEMORY, SUCCESS, Driver, error_name, open_device
from vgpu.isolation.doctor.outcome import Outcome, mib
from vgpu.units import bytes_of_mib

PAGE = bytes_of_mib(2)         # the library charges large allocations in 2 MiB pages
QUERY_CHUNKS = 4               # chunks held while the queries are read
RECLAIM_WAIT_S = 10.0          # how long a killed holder's memory may take to come back
SHARED_STEPS = 8               # mem-shared: steps per chunk, and...
SHARED_PAUSE_S = 0.001         # ...a pause after each, so that the two processes' allocations interleave


class Skip(Exception):
    """The path cannot be probed on this device or driver."""


def _need(drv: Driver, *names: str) -> None:
    missing = [n for n in names if not drv.has(n)]
    if missing:
        raise Skip(f"the driver does not export {', '.join(missing)}")


class Allocations:
    """One allocation path: `step` allocates one chunk (CUresult, bytes it holds), `release` frees them all.
    `feature` names the device attribute that says whether the device supports the path: when the path fails
    from its first call and the attribute says no, the probe is skipped (the attribute alone does not decide:
    a path that works is probed whatever the attribute says)."""

    label = ""
    feature: tuple[int, str] | None = None

    def __init__(self, drv: Driver, dev: int, chunk: int) -> None:
        self.drv, self.dev, self.chunk = drv, dev, chunk
        self.held: list[Any] = []

    def step(self) -> tuple[int, int]:
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError

    def unsupported(self) -> str | None:
        """Why the device cannot use this path, when its attribute says so."""
        if self.feature and not self.drv.attribute(self.feature[0], self.dev):
            return f"the device does not support {self.feature[1]}"
        return None

    def setup(self, call: str, *args: Any) -> None:
        """A call the path needs before its first step: Skip when it fails on a device without the feature."""
        code = self.drv.status(call, *args)
        if code != SUCCESS:
            why = self.unsupported()
            if why:
                raise Skip(f"{why} ({call}: {error_name(code)})")
            raise cuda.CudaError(call, code)

    def _free_each(self, call: str, *extra: Any) -> None:
        for h in self.held:
            self.drv.status(call, h, *extra)
        self.held.clear()


class AllocV2(Allocations):
    label = "cuMemAlloc_v2"

    def step(self) -> tuple[int, int]:
        p = ctypes.c_uint64()
        code = self.drv.status("cuMemAlloc_v2", ctypes.byref(p), self.chunk)
        if code == SUCCESS:
            self.held.append(p.value)
        return code, self.chunk

    def release(self) -> None:
        self._free_each("cuMemFree_v2")


class AllocV1(Allocations):
    """`cuMemAlloc` of the v1 ABI: 32-bit CUdeviceptr and size (PFN_cuMemAlloc_v2000)."""

    label = "cuMemAlloc (v1)"

    def __init__(self, drv: Driver, dev: int, chunk: int) -> None:
        super().__init__(drv, dev, chunk)
        _need(drv, "cuMemAlloc", "cuMemFree")

    def step(self) -> tuple[int, int]:
        p = ctypes.c_uint32()
        code = self.drv.status("cuMemAlloc", ctypes.byref(p), self.chunk)
        if code == SUCCESS:
            self.held.append(p.value)
        return code, self.chunk

    def release(self) -> None:
        self._free_each("cuMemFree")


class AllocPitch(Allocations):
    label = "cuMemAllocPitch_v2"
    WIDTH = 8192

    def step(self) -> tuple[int, int]:
        p, pitch = ctypes.c_uint64(), ctypes.c_size_t()
        rows = self.chunk // self.WIDTH
        code = self.drv.status("cuMemAllocPitch_v2", ctypes.byref(p), ctypes.byref(pitch), self.WIDTH, rows, 4)
        if code == SUCCESS:
            self.held.append(p.value)
        return code, pitch.value * rows

    def release(self) -> None:
        self._free_each("cuMemFree_v2")


class AllocManaged(Allocations):
    label = "cuMemAllocManaged"
    feature = (cuda.ATTR_MANAGED_MEMORY, "managed memory")

    def __init__(self, drv: Driver, dev: int, chunk: int) -> None:
        super().__init__(drv, dev, chunk)
        _need(drv, "cuMemAllocManaged")

    def step(self) -> tuple[int, int]:
        p = ctypes.c_uint64()
        code = self.drv.status("cuMemAllocManaged", ctypes.byref(p), self.chunk, cuda.MEM_ATTACH_GLOBAL)
        if code == SUCCESS:
            self.held.append(p.value)
        return code, self.chunk

    def release(self) -> None:
        self._free_each("cuMemFree_v2")


class AllocAsync(Allocations):
    label = "cuMemAllocAsync"
    feature = (cuda.ATTR_MEMORY_POOLS_SUPPORTED, "memory pools")

    def __init__(self, drv: Driver, dev: int, chunk: int) -> None:
        super().__init__(drv, dev, chunk)
        _need(drv, "cuMemAllocAsync", "cuMemFreeAsync")
        self.stream = drv.stream()

    def step(self) -> tuple[int, int]:
        p = ctypes.c_uint64()
        code = self.drv.status("cuMemAllocAsync", ctypes.byref(p), self.chunk, self.stream)
        if code == SUCCESS:
            self.held.append(p.value)
        return code, self.chunk

    def release(self) -> None:
        self._free_each("cuMemFreeAsync", self.stream)
        self.drv.sync(self.stream)


class AllocPool(AllocAsync):
    label = "cuMemAllocFromPoolAsync"

    def __init__(self, drv: Driver, dev: int, chunk: int) -> None:
        super().__init__(drv, dev, chunk)
        _need(drv, "cuMemPoolCreate", "cuMemAllocFromPoolAsync", "cuMemPoolDestroy")
        props = cuda.MemPoolProps(allocType=cuda.MEM_ALLOCATION_TYPE_PINNED,
                                  location=cuda.MemLocation(cuda.MEM_LOCATION_TYPE_DEVICE, dev))
        self.pool = ctypes.c_void_p()
        self.setup("cuMemPoolCreate", ctypes.byref(self.pool), ctypes.byref(props))

    def step(self) -> tuple[int, int]:
        p = ctypes.c_uint64()
        code = self.drv.status("cuMemAllocFromPoolAsync", ctypes.byref(p), self.chunk, self.pool, self.stream)
        if code == SUCCESS:
            self.held.append(p.value)
        return code, self.chunk

    def release(self) -> None:
        super().release()
        self.drv.status("cuMemPoolDestroy", self.pool)


class AllocVmm(Allocations):
    label = "cuMemCreate"
    feature = (cuda.ATTR_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, "virtual memory management")

    def __init__(self, drv: Driver, dev: int, chunk: int) -> None:
        super().__init__(drv, dev, chunk)
        _need(drv, "cuMemCreate", "cuMemRelease", "cuMemGetAllocationGranularity")
        self.prop = cuda.MemAllocationProp(type=cuda.MEM_ALLOCATION_TYPE_PINNED,
                                           location=cuda.MemLocation(cuda.MEM_LOCATION_TYPE_DEVICE, dev))
        gran = ctypes.c_size_t()
        self.setup("cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(self.prop),
                   cuda.MEM_ALLOC_GRANULARITY_MINIMUM)
        g = max(1, gran.value)
        self.size = -(-chunk // g) * g

    def step(self) -> tuple[int, int]:
        h = ctypes.c_uint64()
        code = self.drv.status("cuMemCreate", ctypes.byref(h), self.size, ctypes.byref(self.prop), 0)
        if code == SUCCESS:
            self.held.append(h.value)
        return code, self.size

    def release(self) -> None:
        self._free_each("cuMemRelease")


class AllocArray(Allocations):
    """2D float arrays of one chunk's nominal size; each counts what cuArrayGetMemoryRequirements says it takes."""

    label = "cuArrayCreate_v2"
    WIDTH = 4096

    def __init__(self, drv: Driver, dev: int, chunk: int) -> None:
        super().__init__(drv, dev, chunk)
        _need(drv, "cuArrayCreate_v2", "cuArrayDestroy")
        self.desc = cuda.ArrayDescriptor(Width=self.WIDTH, Height=chunk // (self.WIDTH * 4),
                                         Format=cuda.AD_FORMAT_FLOAT, NumChannels=1)
        self.sized = drv.has("cuArrayGetMemoryRequirements")

    def step(self) -> tuple[int, int]:
        a = ctypes.c_void_p()
        code = self.drv.status("cuArrayCreate_v2", ctypes.byref(a), ctypes.byref(self.desc))
        size = self.chunk
        if code == SUCCESS:
            self.held.append(a)
            req = cuda.ArrayMemoryRequirements()
            if self.sized and self.drv.status("cuArrayGetMemoryRequirements", ctypes.byref(req), a,
                                              self.dev) == SUCCESS and req.size:
                size = req.size
        return code, size

    def release(self) -> None:
        self._free_each("cuArrayDestroy")


PATHS: dict[str, type[Allocations]] = {
    "alloc": AllocV2, "pitch": AllocPitch, "managed": AllocManaged, "async": AllocAsync, "pool": AllocPool,
    "vmm": AllocVmm, "array": AllocArray,
}


@dataclass(slots=True)
class Fill:
    """Where allocating chunks stopped."""

    total: int = 0             # bytes held
    count: int = 0             # successful steps
    code: int = SUCCESS        # the refusal, SUCCESS when stopped past the limit
    largest: int = 0           # the largest step


def fill(step: Callable[[], tuple[int, int]], limit: int) -> Fill:
    """Step until refused, or until past `limit`."""
    f = Fill()
    while f.total <= limit:
        code, size = step()
        f.largest = max(f.largest, size)
        if code != SUCCESS:
            f.code = code
            return f
        f.total += size
        f.count += 1
    return f


def judge(label: str, f: Fill, limit: int) -> Outcome:
    """Whether `f` shows the limit holding on `label`."""
    figures = {"allocated_bytes": f.total, "allocations": f.count, "limit_bytes": limit,
               "refused_with": error_name(f.code) if f.code != SUCCESS else None, "step_bytes": f.largest}
    if f.total > limit:
        return Outcome.failed(f"{label}: {mib(f.total)} allocated, past the {mib(limit)} limit, and nothing was "
                              "refused", **figures)
    if f.code != ERROR_OUT_OF_MEMORY:
        return Outcome.failed(f"{label} refused at {mib(f.total)} with {error_name(f.code)}, not "
                              "CUDA_ERROR_OUT_OF_MEMORY", **figures)
    if f.total <= limit - f.largest - PAGE:
        return Outcome.failed(f"{label} refused early: {mib(f.total)} held of the {mib(limit)} limit", **figures)
    return Outcome.passed(f"refused at {mib(f.total)} of {mib(limit)} ({f.count} x {mib(f.largest)})", **figures)


def _probe_path(params: Params, kind: type[Allocations]) -> Outcome:
    dev, limit = params["device"], params["limit"]
    drv = open_device(dev)
    try:
        path = kind(drv, dev, params["chunk"])
    except Skip as exc:
        return Outcome.skip(str(exc))
    try:
        f = fill(path.step, limit)
    finally:
        path.release()
    why = path.unsupported() if f.count == 0 and f.code not in (SUCCESS, ERROR_OUT_OF_MEMORY) else None
    if why:
        return Outcome.skip(f"{why} ({path.label}: {error_name(f.code)})")
    return judge(path.label, f, limit)


def probe_fill(params: Params, channel: Channel) -> Outcome:
    """One allocation path (params["path"]) until refused."""
    return _probe_path(params, PATHS[params["path"]])


def probe_alloc_v1(params: Params, channel: Channel) -> Outcome:
    """The v1 cuMemAlloc, where the driver exports it and it works without the library."""
    drv = open_device(params["device"])
    if not (drv.has("cuMemAlloc") and drv.has("cuMemFree")):
        return Outcome.skip("the driver does not export cuMemAlloc / cuMemFree (v1 ABI)")
    alone = legs.run("v1-works", params, legs.reference(params))
    if not alone.ok:
        return Outcome.skip(f"the v1 cuMemAlloc fails here even without the library: {alone.reason}")
    return _probe_path(params, AllocV1)


def leg_v1_works(params: Params, channel: Channel) -> Outcome:
    """Without the library: one v1 cuMemAlloc of a chunk succeeds."""
    drv = open_device(params["device"])
    v1 = AllocV1(drv, params["device"], params["chunk"])
    code, _ = v1.step()
    v1.release()
    return Outcome.passed("works") if code == SUCCESS else Outcome.failed(f"cuMemAlloc: {error_name(code)}")


def _hold(drv: Driver, dev: int, chunk: int, count: int) -> AllocV2:
    held = AllocV2(drv, dev, chunk)
    for _ in range(count):
        code, _ = held.step()
        if code != SUCCESS:
            raise cuda.CudaError("cuMemAlloc_v2", code)
    return held


def probe_meminfo_cuda(params: Params, channel: Channel) -> Outcome:
    """With 4 chunks held: cuMemGetInfo_v2's total is the limit and its free the limit less what is held;
    cuDeviceTotalMem_v2 is the limit."""
    dev, limit, chunk = params["device"], params["limit"], params["chunk"]
    drv = open_device(dev)
    _hold(drv, dev, chunk, QUERY_CHUNKS)
    held = QUERY_CHUNKS * chunk
    free, total = drv.mem_info()
    dev_total = ctypes.c_size_t()
    drv.call("cuDeviceTotalMem_v2", ctypes.byref(dev_total), dev)
    figures = {"limit_bytes": limit, "held_bytes": held, "meminfo_total": total, "meminfo_free": free,
               "device_total_mem": dev_total.value}
    problems = []
    if total != limit:
        problems.append(f"cuMemGetInfo_v2 total is {mib(total)}, not the {mib(limit)} limit")
    if abs(free - (limit - held)) > PAGE:
        problems.append(f"cuMemGetInfo_v2 free is {mib(free)} with {mib(held)} held, not {mib(limit - held)}")
    if dev_total.value != limit:
        problems.append(f"cuDeviceTotalMem_v2 is {mib(dev_total.value)}, not the {mib(limit)} limit")
    if problems:
        return Outcome.failed("; ".join(problems), **figures)
    return Outcome.passed(f"total {mib(total)}, free {mib(free)} with {mib(held)} held", **figures)


def probe_meminfo_nvml(params: Params, channel: Channel) -> Outcome:
    """With 4 chunks held: NVML's memory info of the device with CUDA device 0's UUID shows the limit as total,
    what is held as used."""
    if params.get("nvml_error"):
        return Outcome.skip(f"NVML is not available: {params['nvml_error']}")
    dev, limit, chunk = params["device"], params["limit"], params["chunk"]
    drv = open_device(dev)
    uuid = drv.uuid(dev)
    _hold(drv, dev, chunk, QUERY_CHUNKS)
    held = QUERY_CHUNKS * chunk
    try:
        ml = nvml.Nvml()
    except OSError as exc:
        return Outcome.skip(f"NVML is not available: {exc}")
    try:
        handle = ml.handle(uuid)
    except nvml.NvmlError as exc:
        return Outcome.skip(f"NVML has no device with CUDA device {dev}'s UUID {uuid}: {exc}")
    readings = {"nvmlDeviceGetMemoryInfo": ml.memory(handle)}
    figures: dict[str, Any] = {"uuid": uuid, "limit_bytes": limit, "held_bytes": held}
    if ml.has("nvmlDeviceGetMemoryInfo_v2"):
        try:
            readings["nvmlDeviceGetMemoryInfo_v2"] = ml.memory_v2(handle)
        except nvml.NvmlError as exc:
            figures["v2_error"] = str(exc)
    problems = []
    for call, (total, free, used) in readings.items():
        figures[call] = {"total": total, "free": free, "used": used}
        if total != limit:
            problems.append(f"{call} total is {mib(total)}, not the {mib(limit)} limit")
        if abs(used - held) > PAGE:
            problems.append(f"{call} used is {mib(used)}, not the {mib(held)} held")
        if free > limit - held:
            problems.append(f"{call} free is {mib(free)}, more than the {mib(limit - held)} left")
    if problems:
        return Outcome.failed("; ".join(problems), **figures)
    return Outcome.passed(f"total {mib(limit)}, used {mib(held)} ({', '.join(readings)})", **figures)


def probe_reclaim(params: Params, channel: Channel) -> Outcome:
    """A second process of the container holds 3/4 of the limit: half the limit is refused here; after the holder
    is killed with SIGKILL, its 3/4 can be allocated here again (within 10 s)."""
    dev, limit, chunk = params["device"], params["limit"], params["chunk"]
    hold = max(chunk, limit * 3 // 4 // chunk * chunk)
    drv = open_device(dev)
    p = ctypes.c_uint64()
    with legs.start("hold", {**params, "bytes": hold}, legs.same_container()) as holder:
        msg = holder.message(legs.LEG_TIMEOUT_S)
        if not msg or msg.get("event") != "holding":
            return Outcome.failed("the holding process did not start holding memory" + holder.stderr_tail())
        code = drv.status("cuMemAlloc_v2", ctypes.byref(p), limit // 2)
        if code == SUCCESS:
            return Outcome.failed(f"{mib(limit // 2)} allocated while another process of the container held "
                                  f"{mib(hold)} of the {mib(limit)} limit: the two were not counted together",
                                  held_bytes=hold)
        if code != ERROR_OUT_OF_MEMORY:
            return Outcome.failed(f"cuMemAlloc_v2 refused with {error_name(code)}, not CUDA_ERROR_OUT_OF_MEMORY")
        holder.kill()
    killed = time.monotonic()
    while (code := drv.status("cuMemAlloc_v2", ctypes.byref(p), hold)) != SUCCESS:
        if time.monotonic() - killed > RECLAIM_WAIT_S:
            return Outcome.failed(f"{mib(hold)} could still not be allocated {RECLAIM_WAIT_S:.0f} s after the holder "
                                  f"was killed: {error_name(code)}", held_bytes=hold)
        time.sleep(0.05)
    ms = (time.monotonic() - killed) * 1000
    return Outcome.passed(f"{mib(hold)} allocated again {ms:.0f} ms after SIGKILL", held_bytes=hold,
                          reclaim_ms=round(ms, 1))


def leg_hold(params: Params, channel: Channel) -> Outcome:
    """Hold params["bytes"] until told (or until killed)."""
    drv = open_device(params["device"])
    held = _hold(drv, params["device"], params["chunk"], params["bytes"] // params["chunk"])
    channel.emit({"event": "holding", "bytes": params["bytes"]})
    channel.expect()
    held.release()
    return Outcome.passed("released")


def probe_shared(params: Params, channel: Channel) -> Outcome:
    """Two processes of one container (one accounting file) allocate at the same moment, in steps of an eighth of a
    chunk with a millisecond's pause after each, until refused: together they hold at most the limit and within
    one step of it."""
    limit = params["limit"]
    with legs.start("grab", params, legs.same_container()) as a, legs.start("grab", params,
                                                                            legs.same_container()) as b:
        for w in (a, b):
            msg = w.message(legs.LEG_TIMEOUT_S)
            if not msg or msg.get("event") != "ready":
                return Outcome.failed("an allocating process did not start" + w.stderr_tail())
        for w in (a, b):
            w.send("go")
        done = [w.message(legs.LEG_TIMEOUT_S) for w in (a, b)]
        for w in (a, b):
            w.send("exit")
        if any(d is None or d.get("event") != "done" for d in done):
            return Outcome.failed("an allocating process did not report" + a.stderr_tail() + b.stderr_tail())
    each = [int(d["bytes"]) for d in done if d]
    codes = [int(d["code"]) for d in done if d]
    f = Fill(sum(each), sum(int(d["count"]) for d in done if d),
             next((c for c in codes if c != ERROR_OUT_OF_MEMORY), ERROR_OUT_OF_MEMORY),
             params["chunk"] // SHARED_STEPS)
    out = judge("two processes", f, limit)
    out.figures["per_process_bytes"] = each
    if out.ok:
        out.summary = f"together {mib(f.total)} of {mib(limit)} ({' + '.join(mib(e) for e in each)})"
    return out


def leg_grab(params: Params, channel: Channel) -> Outcome:
    """Say ready, wait for "go", allocate paced steps until refused, report, hold until told."""
    drv = open_device(params["device"])
    path = AllocV2(drv, params["device"], params["chunk"] // SHARED_STEPS)

    def paced() -> tuple[int, int]:
        got = path.step()
        time.sleep(SHARED_PAUSE_S)
        return got

    channel.emit({"event": "ready"})
    if channel.expect() != "go":
        return Outcome.failed("not told to go")
    f = fill(paced, params["limit"])
    channel.emit({"event": "done", "bytes": f.total, "count": f.count, "code": f.code})
    channel.expect()
    path.release()
    return Outcome.passed(f"held {mib(f.total)}")


ACTIONS: dict[str, Action] = {
    "fill": probe_fill, "mem-alloc-v1": probe_alloc_v1, "v1-works": leg_v1_works,
    "meminfo-cuda": probe_meminfo_cuda, "meminfo-nvml": probe_meminfo_nvml,
    "mem-reclaim": probe_reclaim, "hold": leg_hold, "mem-shared": probe_shared, "grab": leg_grab,
}
