"""Configuration of the device plugin: a pydantic model loaded from YAML, with command-line overrides.

Built once by `deviceplugin.cli`; every other module receives a resolved `PluginConfig`. Memory is counted in
memory units of `gpu_memory_factor` MiB; "auto" picks the smallest factor that keeps the memory fake-device list
within kubelet's message budget, an explicit factor that breaks the budget is refused.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from vgpu.errors import ConfigError
from vgpu.resources import ResourceNames, SharingConfig

__all__ = [
    "CORE_DEVICES_PER_GPU",
    "DEFAULT_IGNORED_XIDS",
    "MEMORY_ENTRY_BUDGET",
    "PluginConfig",
    "load_config",
    "resolve_memory_factor",
]

# kubelet drops a ListAndWatch message over 4 MiB; at ~66 bytes per entry that is about 60000 device entries.
MEMORY_ENTRY_BUDGET = 60000
# Xids that say "the application did something wrong", not "the GPU is broken" (as NVIDIA's plugin).
DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68, 109)
CORE_DEVICES_PER_GPU = 100
_MAX_FACTOR = 1024
log = logging.getLogger(__name__)


class PluginConfig(BaseModel):
    """Everything `vgpu device-plugin` needs; YAML keys are the field names."""

    model_config = ConfigDict(extra="forbid")

    node_name: str = Field("", description="this node's name (required)")
    kubeconfig: str | None = Field(None, description="kubeconfig path; in-cluster config when absent")
    backend: Literal["nvml", "sim", "null"] = Field("nvml", description="where GPUs come from")
    sim_gpus: str = Field("", description="simulated GPUs, e.g. 4xA100-40GB,2xT4")
    sim_control: str | None = Field(None, description="control file for simulated faults (sim backend)")
    kubelet_dir: str = Field("/var/lib/kubelet/device-plugins", description="kubelet device-plugin directory")
    hook_path: str = Field("/usr/local", description="host root of vgpu/ (libvgpu.so, ld.so.preload, containers/)")
    lock_dir: str = Field("/tmp/vgpulock", description="host directory mounted at /tmp/vgpulock")
    metrics_listen: str = Field(":9394", description="HOST:PORT of /metrics; empty disables the monitor")
    resources: ResourceNames = Field(default_factory=ResourceNames, description="resource names")
    hami_aliases: bool = Field(False, description="also read HAMi resource names in pod specs")
    split_count: int = Field(10, ge=1, le=1000, description="vgpu-number fake devices per GPU")
    gpu_memory_factor: int | Literal["auto"] | None = Field(
        None,
        description="MiB per memory unit, or auto; unset = 1 when the node fits kubelet's budget, else derived "
        "(with a warning)",
    )
    memory_entry_budget: int = Field(MEMORY_ENTRY_BUDGET, ge=1, description="max memory fake devices per node")
    core_policy: Literal["default", "force", "disable"] | None = Field(
        None, description="GPU_CORE_UTILIZATION_POLICY given to containers; unset = not set"
    )
    ignored_xids: list[int] = Field(default_factory=lambda: list(DEFAULT_IGNORED_XIDS))
    handshake: bool = Field(False, description="write volcano.sh/node-vgpu-handshake (Volcano <= 1.15.0)")
    register_interval: float = Field(30.0, gt=0, description="seconds between inventory re-checks")
    mode: str = Field("hami-core", description="sharing mode published in the inventory")
    kube_qps: float = Field(50.0, gt=0)
    kube_burst: int = Field(100, ge=1)

    @field_validator("gpu_memory_factor")
    @classmethod
    def _factor_range(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not isinstance(value, bool) and not 1 <= value <= _MAX_FACTOR:
            raise ValueError(f"must be 1..{_MAX_FACTOR} or 'auto', got {value}")
        return value

    def sharing(self, factor: int) -> SharingConfig:
        """The shared-core view (resource names, factor, split) used to read pod requests."""
        return SharingConfig(
            resources=self.resources,
            hami_aliases=self.hami_aliases,
            gpu_memory_factor=factor,
            split_count=self.split_count,
        )


def resolve_memory_factor(config: PluginConfig, memory_mib: list[int]) -> int:
    """The memory factor to use for GPUs of these sizes (MiB); raises ConfigError if an explicit one is too small."""
    total = sum(memory_mib)
    budget = config.memory_entry_budget
    needed = max(1, math.ceil(total / budget)) if total else 1
    # floor(mib / f) summed can be below total / f, so confirm and step up if rounding left us over.
    while sum(m // needed for m in memory_mib) > budget:
        needed += 1
    if config.gpu_memory_factor is None:
        if needed > 1:
            log.warning(
                "event=gpu_memory_factor_derived factor=%d total_mib=%d budget=%d: 1 MiB units would overflow "
                "kubelet's ListAndWatch budget; volcano.sh/vgpu-memory is counted in units of %d MiB on this node "
                "(set gpu_memory_factor explicitly to silence this)", needed, total, budget, needed,
            )
        if needed > _MAX_FACTOR:
            raise ConfigError(f"gpu_memory_factor: would need {needed}, above the maximum {_MAX_FACTOR}")
        return needed
    if config.gpu_memory_factor == "auto":
        if needed > _MAX_FACTOR:
            raise ConfigError(f"gpu_memory_factor: auto would need {needed}, above the maximum {_MAX_FACTOR}")
        return needed
    factor = int(config.gpu_memory_factor)
    entries = sum(m // factor for m in memory_mib)
    if entries > budget:
        raise ConfigError(
            f"gpu_memory_factor: {factor} gives {entries} volcano.sh/vgpu-memory devices for {total} MiB, over "
            f"kubelet's budget of {budget}; set it to at least {needed} or to 'auto'"
        )
    return factor


def load_config(path: str | None, overrides: dict[str, Any] | None = None) -> PluginConfig:
    """Read the YAML file (if any), apply non-None overrides, validate; errors raise ConfigError."""
    data: dict[str, Any] = {}
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: not valid YAML: {exc}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: expected a mapping at the top level")
        data.update(loaded)
    for key, value in (overrides or {}).items():
        if value is not None:
            data[key] = value
    try:
        return PluginConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "config"
        raise ConfigError(f"{where}: {first['msg']} (from {path or 'flags'})") from None
