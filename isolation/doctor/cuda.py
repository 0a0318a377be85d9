"""A ctypes binding of the CUDA driver API: the calls, structures and constants the probes use.

`libcuda.so.1` is opened by its soname, so the dynamic loader finds it as it would for any CUDA program
(LD_LIBRARY_PATH first), and every entry point is looked up with dlsym on that handle. With libvgpu.so in
LD_PRELOAD those lookups reach the library's wrappers: the path the CUDA runtime and the frameworks take too.
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SONAME = "libcuda.so.1"

SUCCESS = 0
ERROR_OUT_OF_MEMORY = 2
ERROR_NAMES = {
    0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY", 3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED", 100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE",
    200: "CUDA_ERROR_INVALID_IMAGE", 201: "CUDA_ERROR_INVALID_CONTEXT", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
    218: "CUDA_ERROR_INVALID_PTX", 221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
    222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", 304: "CUDA_ERROR_OPERATING_SYSTEM", 400: "CUDA_ERROR_INVALID_HANDLE",
    500: "CUDA_ERROR_NOT_FOUND", 600: "CUDA_ERROR_NOT_READY", 700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    702: "CUDA_ERROR_LAUNCH_TIMEOUT", 719: "CUDA_ERROR_LAUNCH_FAILED", 800: "CUDA_ERROR_NOT_PERMITTED",
    801: "CUDA_ERROR_NOT_SUPPORTED", 803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", 900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
    901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", 902: "CUDA_ERROR_STREAM_CAPTURE_MERGE",
    903: "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", 904: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
    905: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", 906: "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
    908: "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", 999: "CUDA_ERROR_UNKNOWN",
}

# device attributes (CUdevice_attribute)
ATTR_MULTIPROCESSOR_COUNT = 16
ATTR_COMPUTE_CAPABILITY_MAJOR = 75
ATTR_COMPUTE_CAPABILITY_MINOR = 76
ATTR_MANAGED_MEMORY = 83
ATTR_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102
ATTR_MEMORY_POOLS_SUPPORTED = 115

MEM_ATTACH_GLOBAL = 0x1
MEM_ALLOCATION_TYPE_PINNED = 0x1
MEM_LOCATION_TYPE_DEVICE = 0x1
MEM_ALLOC_GRANULARITY_MINIMUM = 0x0
AD_FORMAT_FLOAT = 0x20
STREAM_NON_BLOCKING = 0x1
STREAM_CAPTURE_MODE_GLOBAL = 0


def error_name(code: int) -> str:
    """`CUDA_ERROR_OUT_OF_MEMORY (2)`: the enumerator's name (cuda.h) and its value."""
    return f"{ERROR_NAMES.get(code, 'CUDA error')} ({code})"


class CudaError(Exception):
    """A driver call returned something other than CUDA_SUCCESS."""

    def __init__(self, call: str, code: int) -> None:
        super().__init__(f"{call}: {error_name(code)}")
        self.call = call
        self.code = code


class Uuid(ctypes.Structure):
    """CUuuid."""

    _fields_ = [("bytes", ctypes.c_ubyte * 16)]

    def text(self) -> str:
        """The UUID as NVML and nvidia-smi print it: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
        h = bytes(self.bytes).hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class MemLocation(ctypes.Structure):
    """CUmemLocation."""

    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class MemAllocationProp(ctypes.Structure):
    """CUmemAllocationProp (allocFlags flattened)."""

    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", MemLocation),
                ("win32HandleMetaData", ctypes.c_void_p), ("compressionType", ctypes.c_ubyte),
                ("gpuDirectRDMACapable", ctypes.c_ubyte), ("usage", ctypes.c_ushort),
                ("reserved", ctypes.c_ubyte * 4)]


class MemPoolProps(ctypes.Structure):
    """CUmemPoolProps (88 bytes in every CUDA release that has it)."""

    _fields_ = [("allocType", ctypes.c_int), ("handleTypes", ctypes.c_int), ("location", MemLocation),
                ("win32SecurityAttributes", ctypes.c_void_p), ("maxSize", ctypes.c_size_t),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 54)]


class ArrayDescriptor(ctypes.Structure):
    """CUDA_ARRAY_DESCRIPTOR (v2)."""

    _fields_ = [("Width", ctypes.c_size_t), ("Height", ctypes.c_size_t), ("Format", ctypes.c_int),
                ("NumChannels", ctypes.c_uint)]


class ArrayMemoryRequirements(ctypes.Structure):
    """CUDA_ARRAY_MEMORY_REQUIREMENTS."""

    _fields_ = [("size", ctypes.c_size_t), ("alignment", ctypes.c_size_t), ("reserved", ctypes.c_uint * 4)]


_P = ctypes.POINTER
_u, _i, _sz, _vp = ctypes.c_uint, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p
_u32, _u64, _ull = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_ulonglong

# argument types of every entry point used (CUdevice is an int, handles are pointers, CUdeviceptr is 64-bit
# except in the v1 ABI of `cuMemAlloc` / `cuMemFree`: PFN_cuMemAlloc_v2000 in cudaTypedefs.h)
SIGNATURES: dict[str, tuple[Any, ...]] = {
    "cuInit": (_u,),
    "cuDriverGetVersion": (_P(_i),),
    "cuDeviceGetCount": (_P(_i),),
    "cuDeviceGet": (_P(_i), _i),
    "cuDeviceGetName": (ctypes.c_char_p, _i, _i),
    "cuDeviceGetUuid_v2": (_P(Uuid), _i),
    "cuDeviceGetUuid": (_P(Uuid), _i),
    "cuDeviceTotalMem_v2": (_P(_sz), _i),
    "cuDeviceGetAttribute": (_P(_i), _i, _i),
    "cuDevicePrimaryCtxRetain": (_P(_vp), _i),
    "cuCtxSetCurrent": (_vp,),
    "cuCtxSynchronize": (),
    "cuMemGetInfo_v2": (_P(_sz), _P(_sz)),
    "cuMemAlloc_v2": (_P(_u64), _sz),
    "cuMemFree_v2": (_u64,),
    "cuMemAlloc": (_P(_u32), _u32),
    "cuMemFree": (_u32,),
    "cuMemAllocPitch_v2": (_P(_u64), _P(_sz), _sz, _sz, _u),
    "cuMemAllocManaged": (_P(_u64), _sz, _u),
    "cuMemAllocAsync": (_P(_u64), _sz, _vp),
    "cuMemFreeAsync": (_u64, _vp),
    "cuMemPoolCreate": (_P(_vp), _P(MemPoolProps)),
    "cuMemPoolDestroy": (_vp,),
    "cuMemAllocFromPoolAsync": (_P(_u64), _sz, _vp, _vp),
    "cuMemGetAllocationGranularity": (_P(_sz), _P(MemAllocationProp), _i),
    "cuMemCreate": (_P(_u64), _sz, _P(MemAllocationProp), _ull),
    "cuMemRelease": (_u64,),
    "cuArrayCreate_v2": (_P(_vp), _P(ArrayDescriptor)),
    "cuArrayDestroy": (_vp,),
    "cuArrayGetMemoryRequirements": (_P(ArrayMemoryRequirements), _vp, _i),
    "cuStreamCreate": (_P(_vp), _u),
    "cuStreamDestroy_v2": (_vp,),
    "cuStreamSynchronize": (_vp,),
    "cuEventCreate": (_P(_vp), _u),
    "cuEventDestroy_v2": (_vp,),
    "cuEventRecord": (_vp, _vp),
    "cuEventSynchronize": (_vp,),
    "cuEventElapsedTime_v2": (_P(ctypes.c_float), _vp, _vp),
    "cuEventElapsedTime": (_P(ctypes.c_float), _vp, _vp),
    "cuModuleLoadData": (_P(_vp), ctypes.c_char_p),
    "cuModuleGetFunction": (_P(_vp), _vp, ctypes.c_char_p),
    "cuLaunchKernel": (_vp, _u, _u, _u, _u, _u, _u, _u, _vp, _P(_vp), _P(_vp)),
    "cuStreamBeginCapture_v2": (_vp, _i),
    "cuStreamEndCapture": (_vp, _P(_vp)),
    "cuGraphInstantiateWithFlags": (_P(_vp), _vp, _ull),
    "cuGraphLaunch": (_vp, _vp),
    "cuGraphExecDestroy": (_vp,),
    "cuGraphDestroy": (_vp,),
}


@dataclass(frozen=True, slots=True)
class Device:
    """What the driver says about one device."""

    index: int
    name: str
    uuid: str
    total_bytes: int
    sm_count: int
    compute_capability: tuple[int, int]


class Driver:
    """libcuda.so.1 through ctypes; raises OSError when it cannot be loaded."""

    def __init__(self, soname: str = SONAME) -> None:
        self.lib = ctypes.CDLL(soname)
        self._fns: dict[str, Callable[..., int]] = {}

    def has(self, name: str) -> bool:
        """Whether the driver exports `name`."""
        try:
            self.fn(name)
        except AttributeError:
            return False
        return True

    def fn(self, name: str) -> Callable[..., int]:
        """The entry point `name` with its argument types set; AttributeError when not exported."""
        found = self._fns.get(name)
        if found is None:
            raw = getattr(self.lib, name)
            raw.restype = ctypes.c_int
            raw.argtypes = list(SIGNATURES[name])
            self._fns[name] = found = raw
        return found

    def status(self, name: str, *args: Any) -> int:
        """Call `name`; its CUresult."""
        return int(self.fn(name)(*args))

    def call(self, name: str, *args: Any) -> None:
        """Call `name`; CudaError unless it succeeds."""
        code = self.status(name, *args)
        if code != SUCCESS:
            raise CudaError(name, code)

    # -------------------------------------------------------------------------------------------- conveniences
    def init(self) -> None:
        """cuInit(0)."""
        self.call("cuInit", 0)

    def version(self) -> int:
        """cuDriverGetVersion: 12040 for CUDA 12.4."""
        v = ctypes.c_int()
        self.call("cuDriverGetVersion", ctypes.byref(v))
        return v.value

    def device_count(self) -> int:
        """cuDeviceGetCount."""
        n = ctypes.c_int()
        self.call("cuDeviceGetCount", ctypes.byref(n))
        return n.value

    def attribute(self, attr: int, index: int) -> int:
        """cuDeviceGetAttribute."""
        v = ctypes.c_int()
        self.call("cuDeviceGetAttribute", ctypes.byref(v), attr, index)
        return v.value

    def uuid(self, index: int) -> str:
        """The device's UUID (cuDeviceGetUuid_v2, else cuDeviceGetUuid)."""
        u = Uuid()
        self.call("cuDeviceGetUuid_v2" if self.has("cuDeviceGetUuid_v2") else "cuDeviceGetUuid", ctypes.byref(u),
                  index)
        return u.text()

    def device(self, index: int) -> Device:
        """Name, UUID, total memory (as the driver, or a library in front of it, reports it), SMs, capability."""
        name = ctypes.create_string_buffer(256)
        self.call("cuDeviceGetName", name, len(name), index)
        total = ctypes.c_size_t()
        self.call("cuDeviceTotalMem_v2", ctypes.byref(total), index)
        return Device(index, name.value.decode(errors="replace"), self.uuid(index), total.value,
                      self.attribute(ATTR_MULTIPROCESSOR_COUNT, index), self.capability(index))

    def capability(self, index: int) -> tuple[int, int]:
        """The compute capability, (9, 0) for an H100."""
        return (self.attribute(ATTR_COMPUTE_CAPABILITY_MAJOR, index),
                self.attribute(ATTR_COMPUTE_CAPABILITY_MINOR, index))

    def use_device(self, index: int) -> None:
        """Make the device's primary context current (what the CUDA runtime does)."""
        ctx = ctypes.c_void_p()
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), index)
        self.call("cuCtxSetCurrent", ctx)

    def mem_info(self) -> tuple[int, int]:
        """cuMemGetInfo_v2: (free, total) of the current context's device."""
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def stream(self, flags: int = 0) -> ctypes.c_void_p:
        """cuStreamCreate."""
        s = ctypes.c_void_p()
        self.call("cuStreamCreate", ctypes.byref(s), flags)
        return s

    def event(self) -> ctypes.c_void_p:
        """cuEventCreate with timing."""
        e = ctypes.c_void_p()
        self.call("cuEventCreate", ctypes.byref(e), 0)
        return e

    def record(self, event: ctypes.c_void_p, stream: ctypes.c_void_p) -> None:
        """cuEventRecord."""
        self.call("cuEventRecord", event, stream)

    def elapsed_ns(self, start: ctypes.c_void_p, end: ctypes.c_void_p) -> float:
        """Waits for `end`; the device time between the two events in ns (cuEventElapsedTime)."""
        self.call("cuEventSynchronize", end)
        ms = ctypes.c_float()
        name = "cuEventElapsedTime_v2" if self.has("cuEventElapsedTime_v2") else "cuEventElapsedTime"
        self.call(name, ctypes.byref(ms), start, end)
        return float(ms.value) * 1e6

    def sync(self, stream: ctypes.c_void_p) -> None:
        """cuStreamSynchronize."""
        self.call("cuStreamSynchronize", stream)


def open_device(index: int = 0) -> Driver:
    """Load the driver, cuInit, and make device `index`'s primary context current; CudaError / OSError."""
    drv = Driver()
    drv.init()
    drv.use_device(index)
    return drv
