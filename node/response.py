"""The container's part of an Allocate response: environment, mounts, device specs and annotations.

The response is byte-compatible with volcano-vgpu-device-plugin under the default options; the NVIDIA device-plugin
options (device list strategy, device ID strategy, pass-device-specs) change how the GPUs are named to the container
runtime (docs/deviceplugin-options.md). Pure: no I/O (host set-up is node.host).
"""

from __future__ import annotations

import os
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vgpu.assignment import Assignment, DeviceGrant
from vgpu.units import MemoryUnit, limit_text

__all__ = [
    "CACHE_CONTAINER_DIR",
    "CDI_ANNOTATION",
    "DEVICE_UUIDS_ENV",
    "DISABLE_CONTROL_ENV",
    "FAIL_OPEN_ENV",
    "LIBVGPU_CONTAINER_PATH",
    "LIMITS_CONTAINER_PATH",
    "LOCK_CONTAINER_DIR",
    "PACE_CONTAINER_DIR",
    "PRELOAD_CONTAINER_PATH",
    "RESERVED_ENV_NAMES",
    "SHARED_CACHE_ENV",
    "Allocation",
    "ContainerGrant",
    "ResponseOptions",
    "build_allocation",
    "limits_file_text",
    "reserved_env",
]

LIBVGPU_CONTAINER_PATH = "/usr/local/vgpu/libvgpu.so"
# the container's variables again, as a file mounted read-only: libvgpu.so reads them from it where it exists and
# ignores the environment, which the pod can change (envFrom, a shell prefix, setenv); isolation/src/env.c
LIMITS_CONTAINER_PATH = "/usr/local/vgpu/limits.env"
# the container's pace directory (node.pacing; isolation/src/pace.c reads its `factors`), read-only
PACE_CONTAINER_DIR = "/usr/local/vgpu/pace"
CACHE_CONTAINER_DIR = "/tmp/vgpu"
LOCK_CONTAINER_DIR = "/tmp/vgpulock"
PRELOAD_CONTAINER_PATH = "/etc/ld.so.preload"
DISABLE_CONTROL_ENV = "CUDA_DISABLE_CONTROL"
SHARED_CACHE_ENV = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
FAIL_OPEN_ENV = "VGPU_ISOLATION_FAIL_OPEN"
# the GPUs the limits' positions belong to, by UUID in grant order: libvgpu.so matches CUDA's devices by UUID, since
# CUDA numbers them its own way (fastest first, then by PCI bus) and NVIDIA_VISIBLE_DEVICES may hold indexes
DEVICE_UUIDS_ENV = "VGPU_DEVICE_UUIDS"
# env names the plugin sets or the library reads as limits: a container's own spec must not set them, since its
# `env` overrides what the plugin returns (kubelet puts the spec's variables after the device plugin's)
RESERVED_ENV_NAMES = frozenset({
    "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT", SHARED_CACHE_ENV,
    "GPU_CORE_UTILIZATION_POLICY", FAIL_OPEN_ENV, "VGPU_CONTEXT_OVERHEAD", "VGPU_COUNT_MANAGED", DEVICE_UUIDS_ENV,
})
RESERVED_ENV_PREFIXES = ("CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT_")


def reserved_env(name: str) -> bool:
    """Whether `name` is one of the variables that carry a container's limits (RESERVED_ENV_NAMES)."""
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
CDI_ANNOTATION = "cdi.k8s.io/vgpu-sharing"
CDI_KIND = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class ResponseOptions:
    """How granted GPUs are named to the container runtime (NVIDIA device-plugin options)."""

    device_list_strategy: tuple[str, ...] = ("envvar",)
    device_id_strategy: str = "uuid"
    pass_device_specs: bool = False
    driver_root: str = "/"
    isolation_fail_open: bool = False  # the library runs without limits when its accounting file is unusable
    # GPU UUID -> (NVML index, minor number); needed by the index strategy and the device specs
    gpu_numbers: Mapping[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ContainerGrant:
    """What one container gets: the container and its segment of the assignment."""

    namespace: str
    pod: str
    pod_uid: str
    container: str
    segment_index: int
    grants: tuple[DeviceGrant, ...]
    segments: Assignment
    last: bool
    disable_control: bool


@dataclass(frozen=True, slots=True)
class Allocation:
    """The container's share of an Allocate response."""

    grant: ContainerGrant
    envs: dict[str, str]
    mounts: list[tuple[str, str, bool]]  # (container path, host path, read-only)
    devices: list[tuple[str, str, str]] = field(default_factory=list)  # (container path, host path, permissions)
    annotations: dict[str, str] = field(default_factory=dict)


def _device_id(uuid: str, options: ResponseOptions) -> str:
    if options.device_id_strategy == "index":
        numbers = options.gpu_numbers.get(uuid)
        if numbers is not None:
            return str(numbers[0])
    return uuid


def limits_file_text(envs: dict[str, str]) -> str:
    """The limits file of a container (LIMITS_CONTAINER_PATH): its variables, one NAME=VALUE per line."""
    for name, value in envs.items():
        if "\n" in name or "=" in name or "\n" in value:
            raise ValueError(f"variable {name!r} cannot be written as one NAME=VALUE line")
    return "".join(f"{name}={value}\n" for name, value in sorted(envs.items()))


def build_allocation(grant: ContainerGrant, *, options: ResponseOptions, memory_factor: int, vgpu_root: Path,
                     cache_dir: Path, lock_dir: Path, core_policy: str | None = None,
                     limits_file: Path | None = None, pace_dir: Path | None = None) -> Allocation:
    """Env, mounts, device specs and annotations for one container, per the contract and the options.

    `vgpu_root` is $HOOK_PATH/vgpu on the host, `cache_dir` and `lock_dir` the container's own directories,
    `limits_file` the host file mounted read-only at LIMITS_CONTAINER_PATH (the caller writes `limits_file_text`
    of the envs there), `pace_dir` the host directory mounted read-only at PACE_CONTAINER_DIR."""
    envs: dict[str, str] = {}
    uuids: list[str] = []
    for g in grant.grants:
        if g.uuid not in uuids:
            uuids.append(g.uuid)
    ids = [_device_id(u, options) for u in uuids]
    strategies = options.device_list_strategy
    annotations: dict[str, str] = {}
    extra_mounts: list[tuple[str, str, bool]] = []
    if "envvar" in strategies:
        envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
    if "volume-mounts" in strategies:
        envs["NVIDIA_VISIBLE_DEVICES"] = VOLUME_MOUNTS_ROOT
        extra_mounts = [(f"{VOLUME_MOUNTS_ROOT}/{i}", "/dev/null", True) for i in ids]
    if "cdi-annotations" in strategies:
        annotations[CDI_ANNOTATION] = ",".join(f"{CDI_KIND}={i}" for i in ids)
    for i, g in enumerate(grant.grants):
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = limit_text(MemoryUnit(memory_factor).bytes(g.memory))
        envs[f"CUDA_DEVICE_SM_LIMIT_{i}"] = str(g.cores)
    # the first GPU's cores, as Volcano's plugin gives them; the per-GPU values above are what libvgpu.so applies
    envs["CUDA_DEVICE_SM_LIMIT"] = str(grant.grants[0].cores if grant.grants else 0)
    envs[DEVICE_UUIDS_ENV] = ",".join(g.uuid for g in grant.grants)
    envs[SHARED_CACHE_ENV] = f"{CACHE_CONTAINER_DIR}/{uuidlib.uuid4()}.cache"
    if core_policy:
        envs["GPU_CORE_UTILIZATION_POLICY"] = core_policy
    if options.isolation_fail_open:
        envs[FAIL_OPEN_ENV] = "1"
    mounts = [
        (LIBVGPU_CONTAINER_PATH, str(vgpu_root / "libvgpu.so"), True),
        (CACHE_CONTAINER_DIR, str(cache_dir), False),
        (LOCK_CONTAINER_DIR, str(lock_dir), False),
    ]
    if limits_file is not None:
        mounts.append((LIMITS_CONTAINER_PATH, str(limits_file), True))
    if pace_dir is not None:
        mounts.append((PACE_CONTAINER_DIR, str(pace_dir), True))
    if not grant.disable_control:
        mounts.append((PRELOAD_CONTAINER_PATH, str(vgpu_root / "ld.so.preload"), True))
    mounts.extend(extra_mounts)
    devices: list[tuple[str, str, str]] = []
    if options.pass_device_specs:
        root = options.driver_root

        def host(path: str) -> str:
            return os.path.normpath(os.path.join(root, path.lstrip("/")))

        for path in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
            devices.append((path, host(path), "rw"))
        for u in uuids:
            minor = options.gpu_numbers.get(u, (0, 0))[1]
            devices.append((f"/dev/nvidia{minor}", host(f"/dev/nvidia{minor}"), "rw"))
    return Allocation(grant, envs, mounts, devices, annotations)
