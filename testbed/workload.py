"""TEST INFRASTRUCTURE: the sample GPU workload that `vgpu demo` and tests/e2e run inside their pods.

A small CUDA driver-API program written with ctypes against `libcuda.so.1` (the simulated driver under
testbed/build/simgpu when run by the pod runner, with libvgpu.so preloaded). On every visible device it creates a
context, reads `cuMemGetInfo`, allocates `--mib` MiB in `--chunk` MiB steps, launches `--kernels` kernels, holds
the memory for `--hold` seconds (or until `--release-file` exists) and frees it. It prints one JSON line (prefix
`VGPU-WORKLOAD `) with what it saw: the GPU env it was given, per device the total memory the driver reported, how
much it allocated and where CUDA_ERROR_OUT_OF_MEMORY stopped it, and the GPU UUIDs NVML reports.

Exit status: 0 when the behaviour matches the expectation (`--expect-oom`: an allocation past the limit must be
refused with CUDA_ERROR_OUT_OF_MEMORY and nothing past the limit allocated; otherwise every allocation must succeed),
3 when an over-limit allocation was NOT refused, 1 on any other CUDA error.

Run: `python -m vgpu.testbed.workload --mib 2000 --kernels 50 --hold 5 [--expect-oom]`.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from typing import Any

__all__ = ["MARKER", "main"]

MARKER = "VGPU-WORKLOAD "
CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
MIB = 1 << 20
_ENV_KEYS = ("NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_SHARED_CACHE",
             "GPU_CORE_UTILIZATION_POLICY", "LD_PRELOAD")


class CudaError(Exception):
    """A CUDA driver call returned an error code."""

    def __init__(self, call: str, code: int) -> None:
        super().__init__(f"{call} returned {code}")
        self.call = call
        self.code = code


def _load() -> ctypes.CDLL:
    cuda = ctypes.CDLL("libcuda.so.1")
    size_p = ctypes.POINTER(ctypes.c_size_t)
    cuda.cuMemGetInfo_v2.argtypes = [size_p, size_p]
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    cuda.cuCtxCreate_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_int]
    cuda.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
    cuda.cuDeviceGetUuid_v2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    cuda.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    cuda.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
    cuda.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [
        ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return cuda


def _nvml_uuids() -> list[str] | None:
    """GPU UUIDs as NVML reports them, in NVML index order (None when NVML cannot be loaded or fails)."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    count, handle, text = ctypes.c_uint(0), ctypes.c_void_p(), ctypes.create_string_buffer(96)
    if nvml.nvmlInit_v2() or nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)):
        return None
    uuids = []
    for i in range(count.value):
        if nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) or \
                nvml.nvmlDeviceGetUUID(handle, text, ctypes.c_uint(len(text))):
            return None
        uuids.append(text.value.decode())
    return uuids


def _check(call: str, code: int) -> None:
    if code != CUDA_SUCCESS:
        raise CudaError(call, code)


def _device_uuid(cuda: ctypes.CDLL, dev: int) -> str:
    raw = ctypes.create_string_buffer(16)
    _check("cuDeviceGetUuid_v2", cuda.cuDeviceGetUuid_v2(raw, dev))
    h = raw.raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


LIMITS_PATH = "/usr/local/vgpu/limits.env"  # the device plugin's read-only copy of the container's variables


def _variables() -> dict[str, str]:
    """The variables as libvgpu.so reads them: from the limits file where it exists (the mount, else the file
    VGPU_LIMITS_FILE names where the mount is absent), not from the environment; else the environment."""
    path = LIMITS_PATH if os.path.exists(LIMITS_PATH) else os.environ.get("VGPU_LIMITS_FILE")
    if not path:
        return dict(os.environ)
    with open(path) as f:
        return dict(line.split("=", 1) for line in f.read().splitlines() if "=" in line)


def _grant_position(uuid: str, ordinal: int) -> int:
    """Which CUDA_DEVICE_MEMORY_LIMIT_<i> is this device's: limits follow the device plugin's grant order, named by
    UUID in VGPU_DEVICE_UUIDS or NVIDIA_VISIBLE_DEVICES (the wire contract), not CUDA's device order (fastest first,
    then PCI bus: the CUDA_DEVICE_ORDER documentation).  Without UUIDs the ordinal is all there is."""
    variables = _variables()
    for key in ("VGPU_DEVICE_UUIDS", "NVIDIA_VISIBLE_DEVICES"):
        names = [n.strip().lower() for n in variables.get(key, "").split(",") if n.strip()]
        if names and all(n.startswith("gpu-") for n in names):
            return names.index(uuid.lower()) if uuid.lower() in names else ordinal
    return ordinal


def _limit_mib(position: int) -> int | None:
    variables = _variables()
    raw = variables.get(f"CUDA_DEVICE_MEMORY_LIMIT_{position}") or variables.get("CUDA_DEVICE_MEMORY_LIMIT")
    if not raw:
        return None
    text = raw.strip()
    units = {"k": 1 / 1024, "ki": 1 / 1024, "m": 1, "mi": 1, "g": 1024, "gi": 1024}
    for suffix in sorted(units, key=len, reverse=True):
        if text.lower().endswith(suffix):
            return int(float(text[: -len(suffix)]) * units[suffix])
    return int(text) // MIB


def run(args: argparse.Namespace) -> dict:
    """Do the work on every visible device and return the report."""
    report: dict = {"pid": os.getpid(), "env": {k: os.environ[k] for k in _ENV_KEYS if k in os.environ},
                    "limits": {}, "devices": [], "result": "ok"}
    for key, value in os.environ.items():
        if key.startswith("CUDA_DEVICE_MEMORY_LIMIT"):
            report["limits"][key] = value
    cuda = _load()
    _check("cuInit", cuda.cuInit(0))
    report["nvml_uuids"] = _nvml_uuids()
    count = ctypes.c_int(0)
    _check("cuDeviceGetCount", cuda.cuDeviceGetCount(ctypes.byref(count)))
    held: list[tuple[ctypes.c_void_p, int]] = []
    for ordinal in range(count.value):
        dev = ctypes.c_int(0)
        _check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), ordinal))
        ctx = ctypes.c_void_p()
        _check("cuCtxCreate_v2", cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev.value))
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        _check("cuMemGetInfo_v2", cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)))
        uuid = _device_uuid(cuda, dev.value)
        entry: dict[str, Any] = {"ordinal": ordinal, "uuid": uuid, "total_mib": total.value // MIB,
                                 "free_mib": free.value // MIB, "limit_mib": _limit_mib(_grant_position(uuid, ordinal)),
                                 "allocated_mib": 0, "oom_at_mib": None, "kernels": 0}
        report["devices"].append(entry)
        target = args.mib
        while entry["allocated_mib"] < target:
            step = min(args.chunk, target - entry["allocated_mib"])
            ptr = ctypes.c_uint64(0)
            code = cuda.cuMemAlloc_v2(ctypes.byref(ptr), step * MIB)
            if code == CUDA_ERROR_OUT_OF_MEMORY:
                entry["oom_at_mib"] = entry["allocated_mib"] + step
                break
            _check("cuMemAlloc_v2", code)
            held.append((ctx, ptr.value))
            entry["allocated_mib"] += step
        if args.kernels:
            module, func = ctypes.c_void_p(), ctypes.c_void_p()
            _check("cuModuleLoadData", cuda.cuModuleLoadData(ctypes.byref(module), None))
            _check("cuModuleGetFunction", cuda.cuModuleGetFunction(ctypes.byref(func), module,
                                                                   f"work_{args.kernel_ns}".encode()))
            for _ in range(args.kernels):
                _check("cuLaunchKernel", cuda.cuLaunchKernel(func, args.grid, 1, 1, 32, 1, 1, 0, None, None, None))
                entry["kernels"] += 1
            _check("cuCtxSynchronize", cuda.cuCtxSynchronize())
        limit = entry["limit_mib"]
        past_limit = limit is None or target > limit  # this device's allocation is meant to cross its limit
        if args.expect_oom and past_limit:
            if entry["oom_at_mib"] is None or (limit is not None and entry["allocated_mib"] > limit):
                report["result"] = "limit-not-enforced"
            elif report["result"] == "ok":
                report["result"] = "oom-refused"
        elif entry["oom_at_mib"] is not None:
            report["result"] = "unexpected-oom"
    if args.hold:
        deadline = time.monotonic() + args.hold
        while time.monotonic() < deadline and not (args.release_file and os.path.exists(args.release_file)):
            time.sleep(max(0.0, min(0.2, deadline - time.monotonic())))
    for ctx, address in held:
        cuda.cuCtxSetCurrent(ctx)
        cuda.cuMemFree_v2(address)
    return report


def main(argv: list[str] | None = None) -> int:
    """Command line entry; see the module docstring for the exit status."""
    ap = argparse.ArgumentParser(prog="python -m vgpu.testbed.workload", description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024, help="MiB to allocate on each visible device")
    ap.add_argument("--chunk", type=int, default=256, help="MiB per cuMemAlloc call")
    ap.add_argument("--kernels", type=int, default=20, help="kernel launches per device")
    ap.add_argument("--kernel-ns", type=int, default=2000, help="simulated ns per block of each kernel")
    ap.add_argument("--grid", type=int, default=500, help="blocks per launch")
    ap.add_argument("--hold", type=float, default=0.0, help="seconds to keep the memory before freeing it")
    ap.add_argument("--release-file", default=None, help="stop holding early once this file exists")
    ap.add_argument("--expect-oom", action="store_true", help="the allocation must be refused past the limit")
    args = ap.parse_args(argv)
    try:
        report = run(args)
    except (CudaError, OSError, AttributeError) as exc:
        report = {"pid": os.getpid(), "result": "error", "error": str(exc)}
        print(MARKER + json.dumps(report), flush=True)
        return 1
    print(MARKER + json.dumps(report), flush=True)
    if report["result"] == "limit-not-enforced":
        return 3
    if report["result"] in ("ok", "oom-refused"):
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
