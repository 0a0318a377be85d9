"""Run a command under libvgpu.so with limits, without Kubernetes (`vgpu run`, and a helper for tests).

Sets the environment of the wire contract (CUDA_DEVICE_MEMORY_LIMIT_<i>, CUDA_DEVICE_SM_LIMIT,
CUDA_DEVICE_MEMORY_SHARED_CACHE, GPU_CORE_UTILIZATION_POLICY), puts libvgpu.so first in LD_PRELOAD and, with a
driver directory (a simulated libcuda.so.1 / libnvidia-ml.so.1, say), that directory first on LD_LIBRARY_PATH.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vgpu.isolation.build import ensure_built
from vgpu.units import limit_text


@dataclass(slots=True)
class Limits:
    """What `vgpu run` enforces."""

    memory: int | None = None          # bytes per device
    cores: int | None = None           # percent 1..100
    devices: list[int] = field(default_factory=list)  # physical device indexes to expose (empty = all)
    policy: str | None = None          # default | force | disable
    cache: str | None = None           # shared accounting file; a fresh one when None


def limit_env(limits: Limits, driver_dir: str | os.PathLike[str] | None = None,
              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a command runs with under `limits`."""
    env = dict(os.environ if base is None else base)
    paths = ensure_built()
    count = max(1, len(limits.devices))
    if limits.memory is not None:
        for i in range(count):
            env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = limit_text(limits.memory)
    if limits.cores is not None:
        env["CUDA_DEVICE_SM_LIMIT"] = str(limits.cores)
    if limits.policy:
        env["GPU_CORE_UTILIZATION_POLICY"] = limits.policy
    if limits.devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in limits.devices)
    env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = limits.cache or os.path.join(
        tempfile.gettempdir(), f"vgpu-run-{uuid.uuid4()}.cache")
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = str(paths.libvgpu) + (":" + preload if preload else "")
    if driver_dir is not None:
        llp = env.get("LD_LIBRARY_PATH", "")
        env["LD_LIBRARY_PATH"] = os.fspath(driver_dir) + (":" + llp if llp else "")
    return env


def run(command: Sequence[str], limits: Limits, driver_dir: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None) -> int:
    """Run `command` under `limits`; returns its exit status as a shell reports it (128 + the signal number when a
    signal killed it).  A cache file we created is removed afterwards."""
    full = limit_env(limits, driver_dir, env)
    own_cache = limits.cache is None
    try:
        code = subprocess.run(list(command), env=full).returncode
        return 128 - code if code < 0 else code
    finally:
        if own_cache:
            try:
                os.unlink(full["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
            except FileNotFoundError:
                pass
