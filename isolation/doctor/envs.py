"""The environments the probes run in: the reference (no library, no limits) and the limited one.

Both start from the caller's environment less everything that configures libvgpu.so (the wire contract's
variables, VGPU_*, LD_PRELOAD), so limits inherited from a pod cannot mix with the doctor's own. The driver
directory, when given, goes first on LD_LIBRARY_PATH. The limited environment sets what `vgpu run` and the device
plugin set: CUDA_DEVICE_MEMORY_LIMIT_<i> per device, CUDA_DEVICE_SM_LIMIT, GPU_CORE_UTILIZATION_POLICY=force, a
private CUDA_DEVICE_MEMORY_SHARED_CACHE, and the library first in LD_PRELOAD.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from vgpu.units import limit_text

_DROP_PREFIXES = ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT", "VGPU_")
_DROP = ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "GPU_CORE_UTILIZATION_POLICY", "CUDA_TASK_PRIORITY", "LD_PRELOAD")


def reference_env(base: Mapping[str, str], driver_dir: str | None) -> dict[str, str]:
    """`base` without any library configuration, the driver directory first on LD_LIBRARY_PATH."""
    env = {k: v for k, v in base.items() if not k.startswith(_DROP_PREFIXES) and k not in _DROP}
    if driver_dir:
        old = env.get("LD_LIBRARY_PATH", "")
        env["LD_LIBRARY_PATH"] = driver_dir + (":" + old if old else "")
    return env


def limited_env(base: Mapping[str, str], driver_dir: str | None, lib: str, cache: Path, memory: int,
                devices: int, cores: int | None = None) -> dict[str, str]:
    """The reference environment plus libvgpu.so with a memory limit on each of `devices` devices and, with
    `cores`, a compute limit (forced)."""
    env = reference_env(base, driver_dir)
    for i in range(max(1, devices)):
        env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = limit_text(memory)
    if cores is not None:
        env["CUDA_DEVICE_SM_LIMIT"] = str(cores)
    env["GPU_CORE_UTILIZATION_POLICY"] = "force"
    env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = os.fspath(cache)
    env["LD_PRELOAD"] = lib
    return env
