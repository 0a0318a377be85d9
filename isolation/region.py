"""Reader/writer of the shared accounting file written by libvgpu.so (HAMi-core v1 layout + our extension).

Used by the device plugin's node monitor (usage and utilisation metrics, live limit changes) and by the tests.
The cffi declarations are read from `src/vgpu_region.h`, the header the C library is compiled with, so both
sides share one definition of the layout.

    with Region.open("/tmp/vgpu/x.cache") as r:
        snap = r.snapshot()
        r.set_memory_limit(0, 4 << 30)        # needs readonly=False
"""
from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from cffi import FFI

from vgpu.errors import VGPUError

HEADER = Path(__file__).resolve().parent / "src" / "vgpu_region.h"


class RegionError(VGPUError):
    """The shared accounting file is missing, too small, or not in the v1 layout."""


def _load_ffi() -> tuple[FFI, dict[str, int]]:
    text = HEADER.read_text()
    m = re.search(r"/\* CDEF-BEGIN \*/(.*?)/\* CDEF-END \*/", text, re.S)
    if not m:
        raise RegionError(f"{HEADER}: CDEF markers not found")
    ffi = FFI()
    ffi.cdef(m.group(1))
    consts: dict[str, int] = {}
    for name, val in re.findall(r"#define (VGPU_\w+) (0x[0-9A-Fa-f]+|\d+)(?:ULL)?", text):
        consts[name] = int(val, 0)
    return ffi, consts


ffi, CONST = _load_ffi()
MAGIC = CONST["VGPU_MAGIC"]
MAX_DEVICES = CONST["VGPU_MAX_DEVICES"]
MAX_PROCS = CONST["VGPU_MAX_PROCS"]
V1_SIZE = ffi.sizeof("vgpu_region_t")
EXT_OFFSET = CONST["VGPU_EXT_OFFSET"]
EXT_MAGIC = CONST["VGPU_EXT_MAGIC"]
FILE_SIZE = EXT_OFFSET + ffi.sizeof("vgpu_ext_t")

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kKmMgGtT](?:i|iB|B|b|ib)?)?\s*$")
_SHIFT = {"k": 10, "m": 20, "g": 30, "t": 40}


def parse_size(text: str) -> int:
    """Parse a memory size the way libvgpu.so does: bytes, or k/m/g/t, Ki/Mi/Gi/Ti, KB.., KiB.. (all binary)."""
    m = _SIZE_RE.match(text or "")
    if not m:
        raise ValueError(f"invalid memory size {text!r}: expected bytes with an optional suffix k, m, g, Ki, Mi, Gi")
    value = int(m.group(1))
    if m.group(2):
        value <<= _SHIFT[m.group(2)[0].lower()]
    if value >= 1 << 64:
        raise ValueError(f"invalid memory size {text!r}: too large")
    return value


@dataclass(slots=True, frozen=True)
class RegionDevice:
    """One device of the container as the region sees it."""

    index: int
    uuid: str
    limit: int          # bytes, 0 = unlimited
    sm_limit: int       # percent, 0 = unlimited
    used: int           # bytes charged by all live processes
    sm_util: int        # sum of the slots' sm_util (percent)
    charged_ns: int = 0  # GPU ns the compute limiter charged (extension block; 0 without one)
    read_ns: int = 0     # what it would have charged without the node's pace factors (0 from a library before them)


@dataclass(slots=True, frozen=True)
class ProcessUsage:
    """One process slot."""

    slot: int
    pid: int
    hostpid: int
    status: int
    used: tuple[int, ...]          # bytes per device
    context: tuple[int, ...]
    module: tuple[int, ...]
    data: tuple[int, ...]
    sm_util: tuple[int, ...]
    start_time: int                # /proc/<pid>/stat starttime (0 if unknown)


@dataclass(slots=True, frozen=True)
class RegionSnapshot:
    """Everything a monitor exports, read at one moment."""

    path: str
    major: int
    minor: int
    devices: tuple[RegionDevice, ...]
    processes: tuple[ProcessUsage, ...]
    utilization_switch: int
    recent_kernel: int
    priority: int
    last_kernel_time: int
    extended: bool


class Region:
    """An open shared accounting file (mapped), or a copy of one's bytes (`from_bytes`)."""

    def __init__(self, path: str, data: mmap.mmap | bytes, readonly: bool):
        self.path = path
        self.readonly = readonly
        self._mm: mmap.mmap | None = data if isinstance(data, mmap.mmap) else None
        # cffi views of the data: the v1 region and, when present, our extension block
        self._buf: Any = cast(Any, ffi).from_buffer("char[]", data, require_writable=not readonly)
        self._r: Any = ffi.cast("vgpu_region_t *", self._buf)
        self._x: Any = None
        if len(data) >= FILE_SIZE:
            self._x = ffi.cast("vgpu_ext_t *", self._buf + EXT_OFFSET)
        if self._x is not None and self._x.magic != EXT_MAGIC:
            self._x = None

    @classmethod
    def from_bytes(cls, label: str, data: bytes) -> Region:
        """A read-only view of a copy of an accounting file's bytes (what a node agent reads with pread: no mapping
        of a file its writer can truncate); raises RegionError when they are not a v1 accounting file."""
        if len(data) < V1_SIZE:
            raise RegionError(f"region {label}: {len(data)} bytes < {V1_SIZE} (not a v1 accounting file)")
        reg = cls(label, data[:FILE_SIZE], readonly=True)
        if reg._r.initialized_flag != MAGIC or reg._r.major_version != 1:
            raise RegionError(f"region {label}: magic {reg._r.initialized_flag} / major {reg._r.major_version}, "
                              f"expected {MAGIC} / 1")
        return reg

    @classmethod
    def open(cls, path: str | os.PathLike[str], readonly: bool = True) -> Region:
        """Map an existing file; raises RegionError when it is not a v1 accounting file."""
        path = os.fspath(path)
        try:
            fd = os.open(path, os.O_RDONLY if readonly else os.O_RDWR)
        except OSError as exc:
            raise RegionError(f"region {path}: cannot open: {exc.strerror}") from exc
        try:
            size = os.fstat(fd).st_size
            if size < V1_SIZE:
                raise RegionError(f"region {path}: size {size} < {V1_SIZE} (not a v1 accounting file)")
            length = FILE_SIZE if size >= FILE_SIZE else V1_SIZE
            mm = mmap.mmap(fd, length, access=mmap.ACCESS_READ if readonly else mmap.ACCESS_WRITE)
        finally:
            os.close(fd)
        reg = cls(path, mm, readonly)
        if reg._r.initialized_flag != MAGIC or reg._r.major_version != 1:
            flag, major = reg._r.initialized_flag, reg._r.major_version
            reg.close()
            raise RegionError(f"region {path}: magic {flag} / major {major}, expected {MAGIC} / 1")
        return reg

    def close(self) -> None:
        """Unmap the file (nothing to do for a copy)."""
        self._r = self._x = self._buf = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ reading
    @property
    def device_count(self) -> int:
        """Devices registered in the region (by UUID), at least those with a limit."""
        n = int(self._r.device_num)
        lim = max((i + 1 for i in range(MAX_DEVICES) if self._r.limit[i] or self._r.sm_limit[i]), default=0)
        return min(MAX_DEVICES, n if n > 0 else lim)

    def limits(self) -> list[int]:
        """Memory limit in bytes per device (0 = unlimited)."""
        return [int(self._r.limit[i]) for i in range(self.device_count)]

    def _live_slots(self) -> range:
        top = int(self._r.proc_num)
        return range(min(max(top, 0), MAX_PROCS))

    def processes(self) -> list[ProcessUsage]:
        """Slots with a pid (status 0 slots are skipped, as HAMi's monitor does)."""
        out = []
        n = self.device_count
        for i in self._live_slots():
            s = self._r.procs[i]
            if not s.pid or not s.status:
                continue
            out.append(ProcessUsage(
                slot=i, pid=int(s.pid), hostpid=int(s.hostpid), status=int(s.status),
                used=tuple(int(s.used[d].total) for d in range(n)),
                context=tuple(int(s.used[d].context_size) for d in range(n)),
                module=tuple(int(s.used[d].module_size) for d in range(n)),
                data=tuple(int(s.used[d].data_size) for d in range(n)),
                sm_util=tuple(int(s.device_util[d].sm_util) for d in range(n)),
                start_time=int(self._x.slot_start[i]) if self._x is not None else 0,
            ))
        return out

    def used(self, dev: int) -> int:
        """Bytes charged on device `dev` by the container."""
        if self._x is not None:
            return int(self._x.used[dev])
        return sum(p.used[dev] for p in self.processes() if dev < len(p.used))

    def devices(self) -> list[RegionDevice]:
        """Per-device limits and usage."""
        procs = self.processes()
        out = []
        for d in range(self.device_count):
            out.append(RegionDevice(
                index=d, uuid=cast(bytes, ffi.string(self._r.uuids[d])).decode(errors="replace"),
                limit=int(self._r.limit[d]), sm_limit=int(self._r.sm_limit[d]),
                used=self.used(d), sm_util=sum(p.sm_util[d] for p in procs),
                charged_ns=int(self._x.sm[d].charged_ns) if self._x is not None else 0,
                read_ns=int(self._x.sm[d].read_ns) if self._x is not None else 0,
            ))
        return out

    def sm_state(self, dev: int) -> dict[str, int]:
        """The compute budget counters of device `dev` (extension block only)."""
        if self._x is None:
            return {}
        s = self._x.sm[dev]
        return {k: int(getattr(s, k)) for k in
                ("tokens", "last_refill", "charged_ns", "launches", "throttled_ns", "measured_ns",
                                 "read_ns")}

    def snapshot(self) -> RegionSnapshot:
        """Everything at once."""
        r = self._r
        return RegionSnapshot(
            path=self.path, major=int(r.major_version), minor=int(r.minor_version),
            devices=tuple(self.devices()), processes=tuple(self.processes()),
            utilization_switch=int(r.utilization_switch), recent_kernel=int(r.recent_kernel),
            priority=int(r.priority), last_kernel_time=int(r.last_kernel_time), extended=self._x is not None,
        )

    # ------------------------------------------------------------------ live changes
    def _writable(self, dev: int) -> None:
        if self.readonly:
            raise RegionError(f"region {self.path}: opened read-only")
        if not 0 <= dev < MAX_DEVICES:
            raise RegionError(f"region {self.path}: device index {dev} outside 0..{MAX_DEVICES - 1}")

    def set_memory_limit(self, dev: int, limit_bytes: int) -> None:
        """Change device `dev`'s memory limit (0 = unlimited); running processes see it on their next call."""
        self._writable(dev)
        if limit_bytes < 0:
            raise RegionError(f"region {self.path}: negative memory limit for device {dev}")
        self._r.limit[dev] = limit_bytes

    def set_utilization_switch(self, on: bool) -> None:
        """HAMi monitor's switch: with policy `default`, 0 turns compute limiting off."""
        self._writable(0)
        self._r.utilization_switch = 1 if on else 0


def offsets() -> dict[str, int]:
    """Byte offsets of the v1 fields, as cffi lays them out from the C header (used by the layout test)."""
    out = {f"region.{f}": ffi.offsetof("vgpu_region_t", f) for f, _ in ffi.typeof("vgpu_region_t").fields}
    out.update({f"slot.{f}": ffi.offsetof("vgpu_proc_slot_t", f) for f, _ in ffi.typeof("vgpu_proc_slot_t").fields})
    out.update({f"devmem.{f}": ffi.offsetof("vgpu_devmem_t", f) for f, _ in ffi.typeof("vgpu_devmem_t").fields})
    out.update({f"devutil.{f}": ffi.offsetof("vgpu_devutil_t", f) for f, _ in ffi.typeof("vgpu_devutil_t").fields})
    return out
