"""A ctypes binding of the few NVML calls the doctor makes: driver version, a device by UUID, its memory."""
from __future__ import annotations

import ctypes
from typing import Any

SONAME = "libnvidia-ml.so.1"
SUCCESS = 0


class NvmlError(Exception):
    """An NVML call returned something other than NVML_SUCCESS."""

    def __init__(self, call: str, code: int) -> None:
        super().__init__(f"{call}: NVML error {code}")
        self.call = call
        self.code = code


class Memory(ctypes.Structure):
    """nvmlMemory_t."""

    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class MemoryV2(ctypes.Structure):
    """nvmlMemory_v2_t."""

    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


MEMORY_V2_VERSION = ctypes.sizeof(MemoryV2) | (2 << 24)   # NVML_STRUCT_VERSION(Memory, 2)

_P, _vp = ctypes.POINTER, ctypes.c_void_p
SIGNATURES: dict[str, tuple[Any, ...]] = {
    "nvmlInit_v2": (),
    "nvmlSystemGetDriverVersion": (ctypes.c_char_p, ctypes.c_uint),
    "nvmlDeviceGetHandleByUUID": (ctypes.c_char_p, _P(_vp)),
    "nvmlDeviceGetMemoryInfo": (_vp, _P(Memory)),
    "nvmlDeviceGetMemoryInfo_v2": (_vp, _P(MemoryV2)),
}


class Nvml:
    """libnvidia-ml.so.1 through ctypes, initialised; OSError when it cannot be loaded, NvmlError when it cannot
    start."""

    def __init__(self, soname: str = SONAME) -> None:
        self.lib = ctypes.CDLL(soname)
        self.call("nvmlInit_v2")

    def has(self, name: str) -> bool:
        """Whether NVML exports `name`."""
        return hasattr(self.lib, name)

    def call(self, name: str, *args: Any) -> None:
        """Call `name`; NvmlError unless it succeeds."""
        fn = getattr(self.lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = list(SIGNATURES[name])
        code = int(fn(*args))
        if code != SUCCESS:
            raise NvmlError(name, code)

    def driver_version(self) -> str:
        """nvmlSystemGetDriverVersion: "550.54.15"."""
        buf = ctypes.create_string_buffer(96)
        self.call("nvmlSystemGetDriverVersion", buf, len(buf))
        return buf.value.decode(errors="replace")

    def handle(self, uuid: str) -> ctypes.c_void_p:
        """nvmlDeviceGetHandleByUUID."""
        h = ctypes.c_void_p()
        self.call("nvmlDeviceGetHandleByUUID", uuid.encode(), ctypes.byref(h))
        return h

    def memory(self, handle: ctypes.c_void_p) -> tuple[int, int, int]:
        """nvmlDeviceGetMemoryInfo: (total, free, used)."""
        m = Memory()
        self.call("nvmlDeviceGetMemoryInfo", handle, ctypes.byref(m))
        return m.total, m.free, m.used

    def memory_v2(self, handle: ctypes.c_void_p) -> tuple[int, int, int]:
        """nvmlDeviceGetMemoryInfo_v2: (total, free, used)."""
        m = MemoryV2(version=MEMORY_V2_VERSION)
        self.call("nvmlDeviceGetMemoryInfo_v2", handle, ctypes.byref(m))
        return m.total, m.free, m.used
