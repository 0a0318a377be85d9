"""Configuration of the device plugin: one pydantic model, filled from flags, environment and files.

Built once by `vgpu.deviceplugin.cli` (`resolve_config`); every other module receives a resolved `PluginConfig`.
Sources, highest first (docs/deviceplugin-options.md):

1. command-line flags;
2. environment variables (the NVIDIA device plugin's names: `FAIL_ON_INIT_ERROR`, `DEVICE_LIST_STRATEGY`, ...);
3. `--config-file` / `CONFIG_FILE`: a file in the NVIDIA plugin's layout (`version: v1`, options under `flags`,
   ours under `flags.vgpu`);
4. `--config`: the component file shipped in deploy/ (`device-plugin.yaml`): snake_case keys of `PluginConfig`,
   with the `sharing:` section (`vgpu.resources.SharingConfig`) that the scheduler's file carries too;
5. defaults.

Above them all, this node's entry of the cluster's per-node file (`--node-config`, vgpu.deviceplugin.nodeconfig):
its split count and excluded GPUs win, since they are the most specific.

Every value from a flag, the environment or a file goes through the same parser; a bad value raises ConfigError
whose message starts with the option as the user wrote it (`--device-id-strategy`, `DEVICE_ID_STRATEGY`,
`flags.plugin.deviceIDStrategy in FILE`), so the CLI prints one line and exits 2.

Memory is counted in units of `gpu_memory_factor` MiB. The factor is `sharing.gpu_memory_factor` (default 1,
the contract's), unless the plugin's own `gpu_memory_factor` overrides it with a number or `auto`. A factor that
makes the node's memory fake-device list overflow kubelet's message budget is refused at start with the smallest
factor that fits; `auto` picks that factor itself (see `resolve_memory_factor`).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vgpu.configfile import read_yaml_mapping, validated
from vgpu.deviceplugin.nodeconfig import node_entry
from vgpu.errors import ConfigError
from vgpu.node.backends import DEFAULT_IGNORED_XIDS, BackendSettings
from vgpu.resources import HAMI_NAMES, SharingConfig

__all__ = [
    "CORE_DEVICES_PER_GPU",
    "DEVICE_LIST_STRATEGIES",
    "MEMORY_ENTRY_BUDGET",
    "OPTIONS",
    "Option",
    "PluginConfig",
    "load_config",
    "parse_healthchecks",
    "resolve_config",
    "resolve_memory_factor",
]

# kubelet drops a ListAndWatch message over 4 MiB; at ~66 bytes per entry that is about 60000 device entries.
MEMORY_ENTRY_BUDGET = 60000
CORE_DEVICES_PER_GPU = 100
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations")
DEVICE_ID_STRATEGIES = ("uuid", "index")
MIG_STRATEGIES = ("none",)
WHOLE_GPU_RESOURCE = "nvidia.com/gpu"
_MAX_FACTOR = 1024
log = logging.getLogger(__name__)


DeviceListStrategy = Literal["envvar", "volume-mounts", "cdi-annotations"]


class PluginConfig(BaseModel):
    """Everything `vgpu device-plugin` needs; the `--config` YAML keys are the field names."""

    model_config = ConfigDict(extra="forbid")

    node_name: str = Field("", description="this node's name (required)")
    kubeconfig: str | None = Field(None, description="kubeconfig path; in-cluster config when absent")
    backend: Literal["nvml", "sim", "null"] = Field("nvml", description="where GPUs come from")
    sim_gpus: str = Field("", description="simulated GPUs, e.g. 4xA100-40GB,2xT4")
    sim_control: str | None = Field(None, description="control file for simulated faults (sim backend)")
    kubelet_dir: str = Field("/var/lib/kubelet/device-plugins", description="kubelet device-plugin directory")
    pod_resources_socket: str | None = Field(
        None, description="kubelet's pod-resources socket; unset = pod-resources/kubelet.sock beside kubelet_dir"
    )
    hook_path: str = Field("/usr/local", description="host root of vgpu/ (libvgpu.so, ld.so.preload, containers/)")
    lock_dir: str = Field(
        "/tmp/vgpulock", description="host root of the per-container directories mounted at /tmp/vgpulock"
    )
    container_storage: Literal["directory", "tmpfs"] = Field(
        "directory", description="tmpfs: each container's accounting and lock directories are tmpfs mounts of their "
        "own, sized up front (needs CAP_SYS_ADMIN and Bidirectional propagation); directory: plain directories on "
        "the node's filesystem"
    )
    metrics_listen: str = Field(":9394", description="HOST:PORT of /metrics; empty disables the monitor")
    legacy_metrics: bool = Field(False, description="also export volcano-vgpu-device-plugin's metric names")
    sharing: SharingConfig = Field(default_factory=SharingConfig, description="shared with the scheduler")
    gpu_memory_factor: int | Literal["auto"] | None = Field(
        None,
        description="this node's MiB per memory unit, overriding sharing.gpu_memory_factor: a number, or auto "
        "(the smallest factor that fits kubelet's budget); unset = sharing.gpu_memory_factor",
    )
    resource_mode: Literal["mib", "devices"] = Field(
        "mib", description="mib: only vgpu-number is advertised and vgpu-memory is MiB on every node (the scheduler "
        "places memory and cores); devices: Volcano's layout, memory and cores advertised as devices in units of "
        "gpu_memory_factor MiB"
    )
    memory_entry_budget: int = Field(MEMORY_ENTRY_BUDGET, ge=1, description="max memory fake devices per node")
    core_policy: Literal["default", "force", "disable"] | None = Field(
        None, description="GPU_CORE_UTILIZATION_POLICY given to containers; unset = not set"
    )
    ignored_xids: list[int] = Field(default_factory=lambda: list(DEFAULT_IGNORED_XIDS))
    handshake: bool = Field(False, description="write volcano.sh/node-vgpu-handshake (Volcano <= 1.15.0)")
    register_interval: float = Field(30.0, gt=0, description="seconds between inventory re-checks")
    mode: str = Field("hami-core", description="sharing mode published in the inventory and the node label")
    kube_qps: float = Field(50.0, gt=0)
    kube_burst: int = Field(100, ge=1)
    # options of NVIDIA's device plugin (same names and meanings)
    fail_on_init_error: bool = Field(True, description="exit when the GPU backend cannot start")
    nvidia_driver_root: str = Field("/", description="host path of the driver installation")
    pass_device_specs: bool = Field(False, description="return DeviceSpecs for /dev/nvidia* in Allocate")
    device_list_strategy: list[DeviceListStrategy] = Field(
        default_factory=lambda: list[DeviceListStrategy](["envvar"]), min_length=1,
        description="how GPUs are named to the runtime",
    )
    device_id_strategy: Literal["uuid", "index"] = Field("uuid", description="GPU IDs in the device list")
    mig_strategy: Literal["none"] = Field("none", description="MIG handling; only none")
    disable_healthchecks: str = Field("", description="all, xids, or a comma list of Xids to ignore")
    # options of ours
    node_labels: bool = Field(True, description="write nvidia.com/gpu.* and volcano.sh/vgpu.mode node labels")
    advertise_nvidia_gpu: bool = Field(False, description="also advertise plain nvidia.com/gpu (whole GPUs)")
    scheduler_names: list[str] = Field(
        default_factory=lambda: ["vgpu-scheduler"], min_length=1,
        description="schedulers whose pods may get GPUs on this node (the pod's spec.schedulerName)",
    )
    grant_key_file: str | None = Field(
        None, description="file with the scheduler's public grant key(s), PEM; unset = no signatures checked"
    )
    accept_unsigned_grants: bool = Field(
        False, description="with a key, also serve pods whose assignment is not signed (mixed schedulers)"
    )
    disable_control_namespaces: list[str] = Field(
        default_factory=list, description="namespaces whose containers may set CUDA_DISABLE_CONTROL=true"
    )
    isolation_fail_open: bool = Field(
        False, description="let the library run without limits when a container's accounting file is unusable"
    )
    driver_memory_limits: Literal["off", "auto"] = Field(
        "off", description="auto: also have the driver limit each container's cgroup to its grant, where it can"
    )
    cgroup_root: str = Field("/sys/fs/cgroup", description="mount point of the cgroup v2 hierarchy")
    xid_recovery_seconds: float = Field(
        60.0, gt=0, description="seconds without a critical Xid before a GPU that answers again is healthy (nvml)"
    )
    memory_guard_seconds: float = Field(
        5.0, ge=0, description="how often the memory guard compares what each pod holds on a GPU (NVML) with its "
        "grant, killing the processes of a pod over it; 0: off (node.guard)"
    )
    memory_guard_allowance_mib: int = Field(
        1024, ge=0, description="MiB per process the memory guard allows beyond a pod's grant (the driver's context)"
    )
    pace_seconds: float = Field(
        1.0, ge=0, description="how often the pacer compares what each pod ran on a GPU (NVML) with what the library "
        "charged it, and corrects the library's timings; 0: off (node.pacing)"
    )
    idle_share: bool = Field(
        False, description="let a pod naming vgpu-sharing.io/cores-ceiling run up to it while its GPUs' other "
        "tenants are idle (the pacer; node.pacing)"
    )
    node_config: str | None = Field(
        None, description="the cluster's per-node configuration file (deviceplugin.nodeconfig); the entry named "
        "after node_name applies over every other source"
    )
    exclude_devices: list[str] = Field(
        default_factory=list, description="GPUs this plugin leaves alone (not advertised, never granted), by UUID or "
        "by NVML index"
    )

    @field_validator("gpu_memory_factor")
    @classmethod
    def _factor_range(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and not isinstance(value, bool) and not 1 <= value <= _MAX_FACTOR:
            raise ValueError(f"must be 1..{_MAX_FACTOR} or 'auto', got {value}")
        return value

    @field_validator("disable_healthchecks")
    @classmethod
    def _healthchecks(cls, value: str) -> str:
        parse_healthchecks(value)
        return value

    @model_validator(mode="after")
    def _mib_has_no_factor(self) -> PluginConfig:
        if self.resource_mode == "mib" and (self.gpu_memory_factor not in (None, 1)
                                           or self.sharing.gpu_memory_factor != 1):
            raise ValueError("resource_mode mib counts vgpu-memory in MiB: gpu_memory_factor (and "
                             "sharing.gpu_memory_factor) apply to resource_mode devices only")
        return self

    def sharing_for(self, factor: int) -> SharingConfig:
        """The shared configuration with this node's resolved memory factor."""
        return self.sharing.model_copy(update={"gpu_memory_factor": factor})

    def healthchecks(self) -> tuple[bool, bool, frozenset[int]]:
        """(all checks off, Xid checks off, extra ignored Xids) from disable_healthchecks."""
        return parse_healthchecks(self.disable_healthchecks)

    def effective_ignored_xids(self) -> list[int]:
        """ignored_xids plus the Xids listed in disable_healthchecks."""
        return sorted(set(self.ignored_xids) | self.healthchecks()[2])

    def backend_settings(self) -> BackendSettings:
        """What the GPU backend reads (`make_backend`)."""
        return BackendSettings(backend=self.backend, node_name=self.node_name, sim_gpus=self.sim_gpus,
                               sim_control=self.sim_control, ignored_xids=tuple(self.effective_ignored_xids()),
                               driver_root=self.nvidia_driver_root, xid_recovery_seconds=self.xid_recovery_seconds)


def parse_healthchecks(value: str) -> tuple[bool, bool, frozenset[int]]:
    """`all`, `xids`, or a comma list of Xids (mixable) -> (all off, Xids off, Xids to ignore); raises ValueError."""
    off_all = off_xids = False
    xids: set[int] = set()
    for raw in str(value).split(","):
        token = raw.strip().lower()
        if not token:
            continue
        if token == "all":
            off_all = True
        elif token == "xids":
            off_xids = True
        elif token.isdigit():
            xids.add(int(token))
        else:
            raise ValueError(f"unknown value {raw.strip()!r} (expected all, xids or Xid numbers such as 48,79)")
    return off_all, off_xids, frozenset(xids)


# ---------------------------------------------------------------------------------------------------------------
# options: one table for flags, environment, the NVIDIA-layout file and --help


@dataclass(frozen=True, slots=True)
class Option:
    """One option: where it can be given and how its text is parsed."""

    field: str  # PluginConfig field; "sharing.x" for a field of the sharing section
    flag: str
    env: str | None
    file_key: str | None  # key in the --config-file (NVIDIA layout)
    kind: str  # bool | str | int | float | choice | list | names | factor | xids | path
    help: str
    choices: tuple[str, ...] = ()
    default: str = ""  # as shown in --help


OPTIONS: tuple[Option, ...] = (
    # NVIDIA device plugin
    Option("fail_on_init_error", "--fail-on-init-error", "FAIL_ON_INIT_ERROR", "flags.failOnInitError", "bool",
           "exit when the GPU backend cannot start; false: stay up, advertise nothing", default="true"),
    Option("nvidia_driver_root", "--nvidia-driver-root", "NVIDIA_DRIVER_ROOT", "flags.nvidiaDriverRoot", "path",
           "host path of the driver installation (/run/nvidia/driver under the GPU Operator)", default="/"),
    Option("pass_device_specs", "--pass-device-specs", "PASS_DEVICE_SPECS", "flags.plugin.passDeviceSpecs", "bool",
           "return DeviceSpecs for /dev/nvidiactl, /dev/nvidia-uvm*, /dev/nvidiaN", default="false"),
    Option("device_list_strategy", "--device-list-strategy", "DEVICE_LIST_STRATEGY",
           "flags.plugin.deviceListStrategy", "list", "how GPUs are passed to the container runtime (comma list)",
           DEVICE_LIST_STRATEGIES, "envvar"),
    Option("device_id_strategy", "--device-id-strategy", "DEVICE_ID_STRATEGY", "flags.plugin.deviceIDStrategy",
           "choice", "GPU IDs in the device list", DEVICE_ID_STRATEGIES, "uuid"),
    Option("mig_strategy", "--mig-strategy", "MIG_STRATEGY", "flags.migStrategy", "choice",
           "MIG handling; only none (MIG-enabled cards are refused)", MIG_STRATEGIES, "none"),
    Option("disable_healthchecks", "--disable-healthchecks", "DP_DISABLE_HEALTHCHECKS",
           "flags.plugin.disableHealthchecks", "xids", "all, xids, or a comma list of Xids to ignore",
           default="empty: all checks on"),
    # ours
    Option("node_name", "--node-name", "NODE_NAME", None, "str", "this node's name (required)", default="none"),
    Option("kubeconfig", "--kubeconfig", None, None, "str", "kubeconfig file", default="in-cluster"),
    Option("backend", "--backend", None, "flags.vgpu.backend", "choice", "GPU source", ("nvml", "sim", "null"),
           "nvml"),
    Option("sim_gpus", "--sim-gpus", None, "flags.vgpu.simGpus", "str",
           "simulated GPUs, e.g. 4xA100-40GB,2xT4 (backend sim; +mig marks MIG-enabled cards)", default="none"),
    Option("sim_control", "--sim-control", None, None, "str", "fault-injection control file (backend sim)",
           default="none"),
    Option("kubelet_dir", "--kubelet-dir", None, "flags.vgpu.kubeletDir", "path", "kubelet device-plugin directory",
           default="/var/lib/kubelet/device-plugins"),
    Option("pod_resources_socket", "--pod-resources-socket", None, "flags.vgpu.podResourcesSocket", "path",
           "kubelet's pod-resources socket, asked which pod kubelet admits when Allocate calls cannot tell",
           default="/var/lib/kubelet/pod-resources/kubelet.sock (beside --kubelet-dir)"),
    Option("hook_path", "--hook-path", "HOOK_PATH", "flags.vgpu.hookPath", "path",
           "host directory holding vgpu/ (libvgpu.so, ld.so.preload, containers/)", default="/usr/local"),
    Option("lock_dir", "--lock-dir", None, None, "path",
           "host root of the per-container directories mounted at each container's /tmp/vgpulock",
           default="/tmp/vgpulock"),
    Option("container_storage", "--container-storage", "CONTAINER_STORAGE", "flags.vgpu.containerStorage", "choice",
           "tmpfs: each container's accounting and lock directories are tmpfs mounts of their own, sized up front, "
           "so a tenant filling them fills only its own (needs CAP_SYS_ADMIN and Bidirectional mount propagation); "
           "directory: plain directories on the node's filesystem", choices=("directory", "tmpfs"),
           default="directory"),
    Option("metrics_listen", "--metrics-listen", None, "flags.vgpu.metricsListen", "str",
           "HOST:PORT of /metrics (empty disables)", default=":9394"),
    Option("legacy_metrics", "--legacy-metrics", "LEGACY_METRICS", "flags.vgpu.legacyMetrics", "bool",
           "also export volcano-vgpu-device-plugin's names (HostGPUMemoryUsage, HostCoreUtilization, "
           "vGPU_device_memory_usage_in_bytes, vGPU_device_memory_limit_in_bytes, "
           "Device_utilization_desc_of_container) for dashboards built on them", default="false"),
    Option("node_labels", "--node-labels", "NODE_LABELS", "flags.vgpu.nodeLabels", "bool",
           "write nvidia.com/gpu.product/.memory/.count and volcano.sh/vgpu.mode on the node", default="true"),
    Option("advertise_nvidia_gpu", "--advertise-nvidia-gpu", "ADVERTISE_NVIDIA_GPU", "flags.vgpu.advertiseNvidiaGpu",
           "bool", "also advertise plain nvidia.com/gpu, one per GPU, for whole-GPU pods (needs "
           "sharing.hami_names: all)", default="false"),
    Option("resource_mode", "--resource-mode", "RESOURCE_MODE", "flags.vgpu.resourceMode", "choice",
           "mib: advertise only vgpu-number, vgpu-memory is MiB on every node; devices: Volcano's layout, memory "
           "and cores as devices in units of the memory factor", choices=("mib", "devices"), default="mib"),
    Option("gpu_memory_factor", "--gpu-memory-factor", "GPU_MEMORY_FACTOR", "flags.vgpu.gpuMemoryFactor", "factor",
           "MiB per memory unit on this node, or auto (--resource-mode devices); overrides sharing.gpu_memory_factor",
           default="sharing.gpu_memory_factor (1)"),
    Option("sharing.split_count", "--split-count", None, None, "int",
           "vgpu-number devices per GPU; overrides sharing.split_count", default="sharing.split_count (10)"),
    Option("register_interval", "--register-interval", None, None, "float",
           "seconds between inventory re-checks", default="30"),
    Option("scheduler_names", "--scheduler-names", "SCHEDULER_NAMES", "flags.vgpu.schedulerNames", "names",
           "schedulers whose pods may get GPUs here (comma list of spec.schedulerName values)",
           default="vgpu-scheduler"),
    Option("grant_key_file", "--grant-key-file", "GRANT_KEY_FILE", "flags.vgpu.grantKeyFile", "path",
           "file with the public key(s) of the key the scheduler signs assignments with (PEM; no private key)",
           default="none: assignments are not signed"),
    Option("accept_unsigned_grants", "--accept-unsigned-grants", "ACCEPT_UNSIGNED_GRANTS",
           "flags.vgpu.acceptUnsignedGrants", "bool",
           "with --grant-key-file, also serve unsigned assignments (a scheduler that does not sign)", default="false"),
    Option("disable_control_namespaces", "--disable-control-namespaces", "DISABLE_CONTROL_NAMESPACES",
           "flags.vgpu.disableControlNamespaces", "names",
           "namespaces whose containers may run without the isolation library (CUDA_DISABLE_CONTROL=true)",
           default="none"),
    Option("isolation_fail_open", "--isolation-fail-open", "ISOLATION_FAIL_OPEN", "flags.vgpu.isolationFailOpen",
           "bool", "let libvgpu.so run a container without limits when its accounting file is unusable (default: "
           "CUDA initialisation is refused)", default="false"),
    Option("driver_memory_limits", "--driver-memory-limits", "DRIVER_MEMORY_LIMITS", "flags.vgpu.driverMemoryLimits",
           "choice", "auto: where the driver can (nvmlDeviceSetMemoryLimits_v1), also limit each container's cgroup to "
           "its granted memory; off: libvgpu.so only", ("off", "auto"), "off"),
    Option("cgroup_root", "--cgroup-root", None, "flags.vgpu.cgroupRoot", "path",
           "mount point of the cgroup v2 hierarchy, where --driver-memory-limits finds containers",
           default="/sys/fs/cgroup"),
    Option("xid_recovery_seconds", "--xid-recovery-seconds", None, "flags.vgpu.xidRecoverySeconds", "float",
           "seconds without a critical Xid after which a GPU that answers NVML again is healthy (backend nvml)",
           default="60"),
    Option("memory_guard_seconds", "--memory-guard-seconds", "MEMORY_GUARD_SECONDS", "flags.vgpu.memoryGuardSeconds",
           "float", "how often the memory guard compares what each pod's processes hold on each GPU (NVML) with its "
           "grant, and kills the processes of a pod over it (backend nvml; needs hostPID); 0: off", default="5"),
    Option("memory_guard_allowance_mib", "--memory-guard-allowance-mib", None, "flags.vgpu.memoryGuardAllowanceMib",
           "int", "MiB per process the memory guard allows beyond a pod's grant, for the driver's own per-context "
           "memory", default="1024"),
    Option("pace_seconds", "--pace-seconds", "PACE_SECONDS", "flags.vgpu.paceSeconds", "float",
           "how often the pacer compares what each pod's processes ran on each GPU (NVML's per-process utilization) "
           "with what libvgpu.so charged them, and corrects the library's timings where the GPU's time slicing makes "
           "it over-charge (backend nvml; needs hostPID); 0: off", default="1"),
    Option("idle_share", "--idle-share", "IDLE_SHARE", "flags.vgpu.idleShare", "bool",
           "let a pod that names vgpu-sharing.io/cores-ceiling run above its vgpu-cores, up to that ceiling, while "
           "everything else on its GPU is idle, and back to its limit within about two pacer periods when that ends "
           "(needs the pacer: --pace-seconds above 0)", default="false"),
    Option("handshake", "--handshake", None, "flags.vgpu.handshake", "bool",
           "write volcano.sh/node-vgpu-handshake (Volcano <= 1.15.0)", default="false"),
    Option("node_config", "--node-config", "NODE_CONFIG_FILE", "flags.vgpu.nodeConfigFile", "path",
           "the cluster's per-node configuration (nodeConfig: [{name, splitCount, filterDevices: {uuid, index}}]); "
           "the entry named after this node wins over every other source", default="none"),
)
CONFIG_FILE_FLAG, CONFIG_FILE_ENV = "--config-file", "CONFIG_FILE"
_BY_FILE_KEY = {o.file_key: o for o in OPTIONS if o.file_key}
# keys of NVIDIA's config file that mean nothing here: accepted and ignored (with a log line)
_IGNORED_FILE_KEYS = {
    "flags.gdsEnabled", "flags.mofedEnabled", "flags.useNodeFeatureAPI", "flags.deviceDiscoveryStrategy",
    "flags.plugin.cdiAnnotationPrefix", "flags.plugin.nvidiaCTKPath", "flags.plugin.containerDriverRoot",
    "flags.plugin.nvidiaDevRoot", "flags.plugin.deviceListStrategyEnvvar", "flags.gfd",
}
_REFUSED_FILE_SECTIONS = {
    "sharing": "time-slicing and MPS sharing are not used here: GPUs are shared through the volcano.sh/vgpu-* "
               "resources; remove the section",
    "resources": "resource renaming is not supported (the resource names are sharing.resources in --config); "
                 "remove the section",
}


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r} (expected true or false)")


def parse_value(option: Option, raw: Any, where: str) -> Any:
    """Parse one option's value from a flag, the environment or a file; raises ConfigError naming `where`."""
    try:
        if option.kind == "bool":
            if isinstance(raw, bool):
                return raw
            return _bool(str(raw))
        if option.kind == "int":
            if isinstance(raw, bool):
                raise ValueError(f"not an integer: {raw!r}")
            return int(str(raw).strip())
        if option.kind == "float":
            return float(str(raw).strip())
        if option.kind == "factor":
            text = str(raw).strip().lower()
            if text == "auto":
                return "auto"
            try:
                value = int(text)
            except ValueError:
                raise ValueError(f"not a number or auto: {raw!r}") from None
            if not 1 <= value <= _MAX_FACTOR:
                raise ValueError(f"must be 1..{_MAX_FACTOR} or auto, got {value}")
            return value
        if option.kind == "choice":
            text = str(raw).strip()
            if option.field == "mig_strategy" and text in ("single", "mixed"):
                raise ValueError(f"{text!r} is not supported yet: MIG is not supported, use none and disable MIG "
                                 "on the cards (nvidia-smi -i <index> -mig 0)")
            if text not in option.choices:
                raise ValueError(f"unknown value {text!r} (expected {' or '.join(option.choices)})")
            return text
        if option.kind == "list":
            items = raw if isinstance(raw, list) else str(raw).split(",")
            values = [str(i).strip() for i in items if str(i).strip()]
            if not values:
                raise ValueError(f"empty (expected one or more of {', '.join(option.choices)})")
            for item in values:
                if item not in option.choices:
                    raise ValueError(f"unknown value {item!r} (expected {', '.join(option.choices)})")
            return list(dict.fromkeys(values))
        if option.kind == "names":
            items = raw if isinstance(raw, list) else str(raw).split(",")
            names = [str(i).strip() for i in items if str(i).strip()]
            for name in names:
                if any(c.isspace() or c in ",;" for c in name):
                    raise ValueError(f"{name!r} is not a name")
            return list(dict.fromkeys(names))
        if option.kind == "xids":
            text = ",".join(str(i) for i in raw) if isinstance(raw, list) else str(raw)
            parse_healthchecks(text)
            return text
        if option.kind == "path":
            text = str(raw).strip()
            if not text:
                raise ValueError("empty path")
            if option.field == "nvidia_driver_root" and not text.startswith("/"):
                raise ValueError(f"must be an absolute path, got {text!r}")
            return text
        return str(raw)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and path not in _BY_FILE_KEY and path not in _IGNORED_FILE_KEYS:
            flat.update(_flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def read_options_file(path: str) -> dict[str, Any]:
    """A config file in the NVIDIA plugin's layout -> {PluginConfig field: value}; raises ConfigError."""
    label = "--config-file"
    data = read_yaml_mapping(path, label)
    version = data.get("version", "v1")
    if version != "v1":
        raise ConfigError(f"{label} {path}: version: unknown value {version!r} (expected v1)")
    for section, why in _REFUSED_FILE_SECTIONS.items():
        if section in data:
            raise ConfigError(f"{label} {path}: {section}: {why}")
    for key in data:
        if key not in ("version", "flags") and key not in _IGNORED_FILE_KEYS:
            raise ConfigError(f"{label} {path}: {key}: unknown key (expected version, flags)")
    values: dict[str, Any] = {}
    for key, value in _flatten(data.get("flags") or {}, "flags.").items():
        if key in _IGNORED_FILE_KEYS:
            log.info("event=config_key_ignored file=%s key=%s", path, key)
            continue
        option = _BY_FILE_KEY.get(key)
        if option is None:
            raise ConfigError(f"{key} in {path}: unknown key")
        if value is None:
            continue
        values[option.field] = parse_value(option, value, f"{key} in {path}")
    return values


def _set(data: dict[str, Any], field_path: str, value: Any) -> None:
    parts = field_path.split(".")
    target = data
    for part in parts[:-1]:
        nested = target.get(part)
        if not isinstance(nested, dict):
            nested = {}
            target[part] = nested
        target = nested
    target[parts[-1]] = value


def _read_component_file(path: str) -> dict[str, Any]:
    """The `--config` file; values of options in the table go through the same parser as flags."""
    data = read_yaml_mapping(path, "--config")
    by_field = {o.field: o for o in OPTIONS}
    for key, value in list(data.items()):
        option = by_field.get(key)
        if option is not None and value is not None and option.kind in ("bool", "choice", "list", "xids", "factor"):
            data[key] = parse_value(option, value, f"{key} in {path}")
    return data


def load_config(path: str | None, overrides: dict[str, Any] | None = None) -> PluginConfig:
    """Read the `--config` YAML file (if any), apply non-None overrides (field paths), validate."""
    data: dict[str, Any] = _read_component_file(path) if path else {}
    for key, value in (overrides or {}).items():
        if value is not None:
            _set(data, key, value)
    return validated(PluginConfig, data, path or "flags")


def resolve_config(
    config_path: str | None,
    flags: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    config_file_flag: str | None = None,
) -> PluginConfig:
    """The configuration from every source, flag > env > --config-file > --config > default; raises ConfigError.

    `flags` maps option fields to the raw flag text (None = not given)."""
    environ = os.environ if environ is None else environ
    data: dict[str, Any] = _read_component_file(config_path) if config_path else {}
    config_file = config_file_flag or environ.get(CONFIG_FILE_ENV) or None
    if config_file:
        for key, value in read_options_file(config_file).items():
            _set(data, key, value)
    by_field = {o.field: o for o in OPTIONS}
    for option in OPTIONS:
        if option.env and environ.get(option.env, "") != "":
            _set(data, option.field, parse_value(option, environ[option.env], option.env))
    for field_name, raw in flags.items():
        if raw is None:
            continue
        option = by_field[field_name]
        _set(data, field_name, parse_value(option, raw, option.flag))
    _apply_node_entry(data)
    config = validated(PluginConfig, data, config_path or "flags and environment")
    check_consistency(config)
    return config


def _apply_node_entry(data: dict[str, Any]) -> None:
    """Lay this node's entry of the node-configuration file (if any) over `data`: its split count replaces
    sharing.split_count, its excluded GPUs join exclude_devices."""
    path, node = data.get("node_config"), data.get("node_name")
    if not path or not node:
        return
    entry = node_entry(str(path), str(node))
    if entry is None:
        log.info("event=node_config_none file=%s node=%s: no entry for this node, the defaults apply", path, node)
        return
    if entry.split_count is not None:
        _set(data, "sharing.split_count", entry.split_count)
    exclude = entry.exclude_devices()
    if exclude:
        current = data.get("exclude_devices") or []
        if not isinstance(current, list):
            raise ConfigError(f"exclude_devices: expected a list of GPU UUIDs or indices, got {current!r}")
        data["exclude_devices"] = list(dict.fromkeys([*map(str, current), *exclude]))
    log.info("event=node_config_applied file=%s node=%s keys=%s split_count=%s exclude_devices=%s", path, node,
             ",".join(entry.keys) or "-", entry.split_count if entry.split_count is not None else "-",
             ",".join(exclude) or "-")


def check_consistency(config: PluginConfig) -> None:
    """Refuse contradictory combinations; raises ConfigError naming the option."""
    if not config.node_name:
        raise ConfigError("--node-name: required (or $NODE_NAME)")
    if config.backend == "sim" and not config.sim_gpus:
        raise ConfigError("--sim-gpus: required with --backend sim (e.g. 4xA100-40GB)")
    if config.backend != "sim" and config.sim_gpus:
        raise ConfigError(f"--sim-gpus: only meaningful with --backend sim (backend is {config.backend})")
    if config.advertise_nvidia_gpu:
        if WHOLE_GPU_RESOURCE in config.sharing.resources.all():
            raise ConfigError(f"--advertise-nvidia-gpu: {WHOLE_GPU_RESOURCE} is already one of sharing.resources")
        if config.sharing.hami_mode() != "all":
            raise ConfigError(
                f"--advertise-nvidia-gpu: needs sharing.hami_names: all (in the sharing section of both "
                f"components), or the scheduler does not read {HAMI_NAMES.number} alone in pod specs"
            )


def resolve_memory_factor(config: PluginConfig, memory_mib: list[int]) -> int:
    """The memory factor for GPUs of these sizes (MiB); raises ConfigError if the configured one is too small."""
    total = sum(memory_mib)
    budget = config.memory_entry_budget
    needed = max(1, math.ceil(total / budget)) if total else 1
    # floor(mib / f) summed can be below total / f, so confirm and step up if rounding left us over.
    while sum(m // needed for m in memory_mib) > budget:
        needed += 1
    if config.gpu_memory_factor == "auto":
        if needed > _MAX_FACTOR:
            raise ConfigError(f"gpu_memory_factor: auto would need {needed}, above the maximum {_MAX_FACTOR}")
        if needed != config.sharing.gpu_memory_factor:
            log.warning(
                "event=gpu_memory_factor_auto factor=%d sharing_factor=%d total_mib=%d: volcano.sh/vgpu-memory is "
                "counted in units of %d MiB on this node", needed, config.sharing.gpu_memory_factor, total, needed,
            )
        return needed
    if config.gpu_memory_factor is None:
        factor, name = config.sharing.gpu_memory_factor, "sharing.gpu_memory_factor"
    else:
        factor, name = int(config.gpu_memory_factor), "gpu_memory_factor"
    entries = sum(m // factor for m in memory_mib)
    if entries > budget:
        raise ConfigError(
            f"{name}: {factor} gives {entries} {config.sharing.resources.memory} devices for {total} MiB of GPU "
            f"memory, over kubelet's budget of {budget}; set it to at least {needed} (sharing.gpu_memory_factor, or "
            f"this node's --gpu-memory-factor) or let the plugin pick it with --gpu-memory-factor=auto"
        )
    return factor
