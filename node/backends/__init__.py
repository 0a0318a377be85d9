"""GPU backends of the node's plugins: where GPUs, their health and their usage come from.

`make_backend` picks one from `BackendSettings`: `nvml` (real GPUs through nvidia-ml-py), `sim` (GPUs described
on the command line, with fault injection for tests and the demo) or `null` (no GPUs). The plugin server polls
`poll_health` from one thread; the monitor calls `usage` at scrape time. Backends never raise on GPU errors:
they report devices as unhealthy instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from vgpu.errors import VGPUError

__all__ = ["DEFAULT_IGNORED_XIDS", "BackendSettings", "BackendUnavailable", "GPUBackend", "GPUInfo", "GPUReading",
           "HealthEvent", "MemoryLimitBackend", "make_backend"]

# Xids that say "the application did something wrong", not "the GPU is broken" (as NVIDIA's plugin).
DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68, 109)


@dataclass(frozen=True, slots=True)
class GPUInfo:
    """Static facts of one physical GPU."""

    uuid: str
    name: str  # NVML name, e.g. "NVIDIA A100-PCIE-40GB"
    memory_mib: int
    minor: int
    numa: int | None = None
    index: int | None = None  # NVML enumeration index (None: same as minor)
    mig_enabled: bool = False
    architecture: str = ""  # "Hopper"; "" where unknown (so for every field below)
    compute_capability: str = ""  # "9.0"
    driver_version: str = ""  # "580.159.04", as NVML reports it
    cuda_driver_version: str = ""  # "13.0"
    pci_bus_id: str = ""  # "0000:00:06.0"
    pcie_root: str = ""  # "pci0000:00", the PCIe root complex the GPU hangs off
    nvlink_island: int | None = None  # lowest NVML index of the GPUs joined to it by NVLink; None: no NVLink

    @property
    def nvml_index(self) -> int:
        """The index `nvidia-smi -i` and the index device-ID strategy use."""
        return self.minor if self.index is None else self.index


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """A GPU became healthy or unhealthy."""

    uuid: str
    healthy: bool
    reason: str
    xid: int | None = None  # set when an Xid caused the change


@dataclass(frozen=True, slots=True)
class GPUReading:
    """Current usage of one GPU."""

    memory_used_bytes: int
    utilization_percent: int


@runtime_checkable
class GPUBackend(Protocol):
    """What the plugin needs from a source of GPUs."""

    init_error: str | None
    """Why the backend could not start (None when it did); the plugin exits or idles on it."""

    def devices(self) -> list[GPUInfo]:
        """All GPUs, sorted by minor number (stable for the life of the process)."""
        ...

    def poll_health(self, timeout: float) -> list[HealthEvent]:
        """Block up to `timeout` seconds; return health changes since the last call (may be empty)."""
        ...

    def usage(self) -> dict[str, GPUReading]:
        """Usage per GPU UUID; GPUs that cannot be read are left out."""
        ...

    def close(self) -> None:
        """Release resources."""
        ...


@runtime_checkable
class MemoryLimitBackend(Protocol):
    """A backend whose driver enforces device-memory limits per cgroup (NVML's nvmlDeviceSetMemoryLimits_v1)."""

    def memory_limits_supported(self, uuid: str, cgroup_dir: str) -> bool:
        """Whether the driver can limit a cgroup on this GPU."""
        ...

    def set_memory_limit(self, uuid: str, cgroup_dir: str, limit_bytes: int | None) -> None:
        """Set (None: clear) the limit of a cgroup on this GPU; raises RuntimeError."""
        ...


class BackendUnavailable(VGPUError):
    """The GPU backend could not start and the plugin may not run without it (the process exits with status 1)."""


@dataclass(frozen=True, slots=True)
class BackendSettings:
    """What `make_backend` reads from a plugin's configuration."""

    backend: str = "nvml"                 # nvml, sim or null
    node_name: str = ""
    sim_gpus: str = ""                    # sim: the GPUs, e.g. 4xA100-40GB,2xT4
    sim_control: str | None = None        # sim: the fault-injection control file
    ignored_xids: tuple[int, ...] = DEFAULT_IGNORED_XIDS
    driver_root: str = "/"                # nvml: host path of the driver installation
    xid_recovery_seconds: float = 60.0    # nvml: quiet time before a GPU that answers again is healthy


def make_backend(settings: BackendSettings) -> GPUBackend:
    """The backend the settings name."""
    if settings.backend == "sim":
        from vgpu.node.backends.sim import SimBackend

        return SimBackend.from_spec(
            settings.sim_gpus, node_name=settings.node_name, control_file=settings.sim_control,
            ignored_xids=settings.ignored_xids,
        )
    if settings.backend == "nvml":
        from vgpu.node.backends.nvml import NVMLBackend

        return NVMLBackend(ignored_xids=settings.ignored_xids, driver_root=settings.driver_root,
                           recovery_seconds=settings.xid_recovery_seconds)
    from vgpu.node.backends.null import NullBackend

    return NullBackend()
