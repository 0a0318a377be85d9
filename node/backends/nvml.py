"""Real GPUs through nvidia-ml-py (`pynvml`): inventory, Xid health events and usage.

Every NVML call is guarded: an error marks the GPU unhealthy (or leaves it out of usage) and is logged, it never
propagates. If NVML cannot be initialised the backend has no GPUs and `init_error` says why (the plugin then
exits or idles, per --fail-on-init-error). With a driver root other than `/` (the GPU Operator's
`/run/nvidia/driver`), `libnvidia-ml.so.1` is loaded from under that root. Unhealthy GPUs are re-probed; a GPU
that answers again and has had no critical Xid for `recovery_seconds` becomes healthy again. Where the driver has
them (`nvmlDeviceSetMemoryLimits_v1`), the backend also sets device-memory limits per cgroup
(`node.driverlimits`).

Topology: the NUMA node (NVML's, else the PCI device's in sysfs), the PCIe root complex (sysfs) and the NVLink
island: GPUs whose active NVLinks join them, directly or through an NVSwitch, form one island, numbered by its
lowest NVML index (`nvlink_islands`). NVML errors while reading links (NOT_SUPPORTED on a GPU without NVLink) only
mean fewer links.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from vgpu.node.backends import GPUInfo, GPUReading, HealthEvent
from vgpu.units import mib_floor

__all__ = ["ARCHITECTURES", "NVMLBackend", "find_nvml_library", "numa_node", "nvlink_islands", "pcie_root",
           "process_utilization"]

log = logging.getLogger(__name__)

NVML_LIBRARY = "libnvidia-ml.so.1"
_LIBRARY_DIRS = ("usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib", "lib64",
                 "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "lib")


# nvml.h NVML_DEVICE_ARCH_*, named as NVIDIA's DRA driver publishes its `architecture` attribute
ARCHITECTURES = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere", 8: "Ada Lovelace",
                 9: "Hopper", 10: "Blackwell"}


def pcie_root(bus_id: str, sysfs: str = "/sys") -> str:
    """The PCIe root complex of a PCI device ("pci0000:00"), from where its sysfs entry resolves; "" if unknown."""
    real = os.path.realpath(os.path.join(sysfs, "bus", "pci", "devices", bus_id))
    return next((part for part in real.split(os.sep) if part.startswith("pci")), "")


def numa_node(bus_id: str, sysfs: str = "/sys") -> int | None:
    """The NUMA node of a PCI device from sysfs (`numa_node`; -1 there: none); None if unknown."""
    try:
        with open(os.path.join(sysfs, "bus", "pci", "devices", bus_id, "numa_node")) as handle:
            node = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def nvlink_islands(ends: Mapping[int, tuple[str, Sequence[str]]]) -> dict[int, int]:
    """NVML index -> island, from each GPU's own PCI bus id and the bus ids at the far end of its active NVLinks
    (`ends`): GPUs linked directly, or through a common far end such as an NVSwitch, share an island, numbered by
    its lowest index. GPUs without an active link are left out."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for own, remote in ends.values():
        for far in remote:
            parent[root(far)] = root(own)
    lowest: dict[str, int] = {}
    for index in sorted(i for i, (_, remote) in ends.items() if remote):
        lowest.setdefault(root(ends[index][0]), index)
    return {i: lowest[root(own)] for i, (own, remote) in ends.items() if remote}


def _bus_id(pci: Any) -> str:
    return f"{int(pci.domain):04x}:{int(pci.bus):02x}:{int(pci.device):02x}.0"


def find_nvml_library(driver_root: str) -> str | None:
    """Path of libnvidia-ml.so.1 under `driver_root`, or None."""
    for directory in _LIBRARY_DIRS:
        path = os.path.join(driver_root, directory, NVML_LIBRARY)
        if os.path.exists(path):
            return path
    return None


def process_utilization(nv: Any, handle: Any, since_us: int) -> tuple[dict[int, float], int]:
    """NVML's per-process SM utilization samples of a GPU newer than `since_us` (NVML's timestamps, us), averaged
    per process (host PID -> %), and the newest sample's timestamp (0: none). NVMLError but for NOT_FOUND, which
    means no process ran."""
    try:
        samples = nv.nvmlDeviceGetProcessUtilization(handle, since_us)
    except nv.NVMLError as exc:
        if getattr(exc, "value", None) == nv.NVML_ERROR_NOT_FOUND:
            return {}, 0
        raise
    total: dict[int, list[float]] = {}
    newest = 0
    for sample in samples:
        total.setdefault(int(sample.pid), []).append(float(sample.smUtil))
        newest = max(newest, int(sample.timeStamp))
    return {pid: sum(v) / len(v) for pid, v in total.items()}, newest


class NVMLBackend:
    """GPUs of this machine as NVML sees them."""

    def __init__(self, ignored_xids: Iterable[int] = (), recovery_seconds: float = 60.0,
                 driver_root: str = "/") -> None:
        self._ignored = set(ignored_xids)
        self._recovery = recovery_seconds
        self._lock = threading.Lock()
        self._gpus: list[GPUInfo] = []
        self._healthy: dict[str, bool] = {}
        self._last_xid: dict[str, float] = {}
        self._last_probe = 0.0
        self._event_set: Any = None
        self._nvml: Any = None  # the pynvml module once NVML is initialised
        self._util_seen: dict[str, int] = {}  # per GPU: the newest per-process utilization sample read (NVML's us)
        self.init_error: str | None = None
        try:
            import pynvml

            if os.path.normpath(driver_root) != "/":
                library = find_nvml_library(driver_root)
                if library is None:
                    raise RuntimeError(f"{NVML_LIBRARY} not found under driver root {driver_root}")
                if pynvml.nvmlLib is None:
                    pynvml.nvmlLib = ctypes.CDLL(library)
            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception as exc:
            self.init_error = f"NVML: {exc}"
            log.warning("event=nvml_init_failed error=%s", exc)
            return
        self._gpus = self._discover()
        self._healthy = {g.uuid: True for g in self._gpus}
        self._register_events()

    @staticmethod
    def _text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def _discover(self) -> list[GPUInfo]:
        nv = self._nvml
        gpus = []
        try:
            count = nv.nvmlDeviceGetCount()
        except Exception as exc:
            log.warning("event=nvml_count_failed error=%s", exc)
            return []
        drivers = self._driver_versions()
        ends: dict[int, tuple[str, list[str]]] = {}
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uid = self._text(nv.nvmlDeviceGetUUID(handle))
                name = self._text(nv.nvmlDeviceGetName(handle))
                memory = mib_floor(int(nv.nvmlDeviceGetMemoryInfo(handle).total))
                try:
                    minor = int(nv.nvmlDeviceGetMinorNumber(handle))
                except Exception:
                    minor = index
                facts = self._facts(handle)
                try:
                    numa: int | None = int(nv.nvmlDeviceGetNumaNodeId(handle))
                except Exception:
                    numa = numa_node(facts["pci_bus_id"]) if facts["pci_bus_id"] else None
                mig = False
                try:
                    current, _pending = nv.nvmlDeviceGetMigMode(handle)
                    mig = int(current) == int(getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1))
                except Exception:
                    mig = False
                gpus.append(GPUInfo(uuid=uid, name=name, memory_mib=memory, minor=minor, numa=numa, index=index,
                                    mig_enabled=mig, nvlink_island=None, **facts, **drivers))  # island: below
                ends[index] = (facts["pci_bus_id"] or f"index {index}", self._nvlink_ends(handle, index))
            except Exception as exc:
                log.warning("event=nvml_device_failed index=%d error=%s", index, exc)
        islands = nvlink_islands(ends)
        gpus = [replace(g, nvlink_island=islands.get(g.nvml_index)) for g in gpus]
        gpus.sort(key=lambda g: g.minor)
        return gpus

    def _nvlink_ends(self, handle: Any, index: int) -> list[str]:
        """PCI bus ids at the far end of the GPU's active NVLinks ([] without NVLink). The scan ends at the first
        link NVML refuses (INVALID_ARGUMENT past the GPU's links, NOT_SUPPORTED without NVLink)."""
        nv = self._nvml
        quiet = {getattr(nv, "NVML_ERROR_NOT_SUPPORTED", -1), getattr(nv, "NVML_ERROR_INVALID_ARGUMENT", -1)}
        enabled = int(getattr(nv, "NVML_FEATURE_ENABLED", 1))
        found: list[str] = []
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if int(nv.nvmlDeviceGetNvLinkState(handle, link)) != enabled:
                    continue
            except Exception as exc:
                if getattr(exc, "value", None) not in quiet:
                    log.debug("event=nvml_nvlink_unknown index=%d link=%d error=%s", index, link, exc)
                break
            try:
                found.append(_bus_id(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)))
            except Exception as exc:
                log.debug("event=nvml_nvlink_remote_unknown index=%d link=%d error=%s", index, link, exc)
        return found

    def _driver_versions(self) -> dict[str, str]:
        """The driver's and its CUDA's versions ("" where NVML does not say)."""
        nv = self._nvml
        found = {"driver_version": "", "cuda_driver_version": ""}
        try:
            found["driver_version"] = self._text(nv.nvmlSystemGetDriverVersion())
        except Exception as exc:
            log.debug("event=nvml_driver_version_unknown error=%s", exc)
        try:
            cuda = int(nv.nvmlSystemGetCudaDriverVersion())
            found["cuda_driver_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        except Exception as exc:
            log.debug("event=nvml_cuda_version_unknown error=%s", exc)
        return found

    def _facts(self, handle: Any) -> dict[str, str]:
        """Architecture, compute capability and PCI position of one GPU ("" for what NVML does not say)."""
        nv = self._nvml
        facts = {"architecture": "", "compute_capability": "", "pci_bus_id": "", "pcie_root": ""}
        try:
            facts["architecture"] = ARCHITECTURES.get(int(nv.nvmlDeviceGetArchitecture(handle)), "")
        except Exception as exc:
            log.debug("event=nvml_architecture_unknown error=%s", exc)
        try:
            major, minor = nv.nvmlDeviceGetCudaComputeCapability(handle)
            facts["compute_capability"] = f"{int(major)}.{int(minor)}"
        except Exception as exc:
            log.debug("event=nvml_capability_unknown error=%s", exc)
        try:
            pci = nv.nvmlDeviceGetPciInfo(handle)
            facts["pci_bus_id"] = _bus_id(pci)
            facts["pcie_root"] = pcie_root(facts["pci_bus_id"])
        except Exception as exc:
            log.debug("event=nvml_pci_unknown error=%s", exc)
        return facts

    def _register_events(self) -> None:
        nv = self._nvml
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except Exception as exc:
            log.warning("event=nvml_eventset_failed error=%s", exc)
            return
        for gpu in self._gpus:
            try:
                handle = nv.nvmlDeviceGetHandleByUUID(gpu.uuid)
                supported = nv.nvmlDeviceGetSupportedEventTypes(handle)
                mask = supported & nv.nvmlEventTypeXidCriticalError
                if mask:
                    nv.nvmlDeviceRegisterEvents(handle, mask, self._event_set)
            except Exception as exc:
                if not self._not_supported(exc):
                    log.warning("event=nvml_register_events_failed uuid=%s error=%s", gpu.uuid, exc)
                    self._healthy[gpu.uuid] = False

    def _not_supported(self, exc: Exception) -> bool:
        nv = self._nvml
        return getattr(exc, "value", None) == getattr(nv, "NVML_ERROR_NOT_SUPPORTED", -1)

    @property
    def watches_xids(self) -> bool:
        """Whether critical Xid events are waited for (NVML's event set was created)."""
        return self._event_set is not None

    def devices(self) -> list[GPUInfo]:
        """GPUs found at start, in minor order."""
        return list(self._gpus)

    def _change(self, uid: str, healthy: bool, reason: str, out: list[HealthEvent], xid: int | None = None) -> None:
        with self._lock:
            if self._healthy.get(uid) == healthy:
                return
            self._healthy[uid] = healthy
        out.append(HealthEvent(uid, healthy, reason, xid))

    def poll_health(self, timeout: float) -> list[HealthEvent]:
        """Wait for an Xid event up to `timeout`; also re-probes unhealthy GPUs every few seconds."""
        events: list[HealthEvent] = []
        if self._nvml is None or self._event_set is None:
            time.sleep(timeout)
            return events
        nv = self._nvml
        try:
            data = nv.nvmlEventSetWait(self._event_set, int(timeout * 1000))
            xid = int(data.eventData)
            uid = self._text(nv.nvmlDeviceGetUUID(data.device))
            if data.eventType == nv.nvmlEventTypeXidCriticalError and xid not in self._ignored:
                self._last_xid[uid] = time.monotonic()
                self._change(uid, False, f"xid {xid}", events, xid)
        except Exception as exc:
            if getattr(exc, "value", None) != getattr(nv, "NVML_ERROR_TIMEOUT", -2):
                log.warning("event=nvml_wait_failed error=%s", exc)
                for gpu in self._gpus:
                    self._change(gpu.uuid, False, f"nvml wait: {exc}", events)
                time.sleep(min(timeout, 1.0))
        now = time.monotonic()
        if now - self._last_probe >= 5.0:
            self._last_probe = now
            self._probe(now, events)
        return events

    def _probe(self, now: float, events: list[HealthEvent]) -> None:
        nv = self._nvml
        for gpu in self._gpus:
            try:
                handle = nv.nvmlDeviceGetHandleByUUID(gpu.uuid)
                nv.nvmlDeviceGetMemoryInfo(handle)
            except Exception as exc:
                self._change(gpu.uuid, False, f"lost: {exc}", events)
                continue
            if now - self._last_xid.get(gpu.uuid, -1e18) >= self._recovery:
                self._change(gpu.uuid, True, "recovered", events)

    def memory_limits_supported(self, uuid: str, cgroup_dir: str) -> bool:
        """Whether the driver can limit a cgroup's memory on this GPU (asks about `cgroup_dir`, an existing cgroup)."""
        nv = self._nvml
        if nv is None or not hasattr(nv, "nvmlDeviceGetMemoryLimits_v1"):
            return False
        query = nv.c_nvmlGetMemoryLimits_v1_t()
        query.nameSpace = cgroup_dir.encode()
        try:
            nv.nvmlDeviceGetMemoryLimits_v1(nv.nvmlDeviceGetHandleByUUID(uuid), query)
        except Exception as exc:
            # NOT_FOUND: supported, no limit on that cgroup yet; anything else (not supported, no such function)
            return getattr(exc, "value", None) == getattr(nv, "NVML_ERROR_NOT_FOUND", -1)
        return True

    def set_memory_limit(self, uuid: str, cgroup_dir: str, limit_bytes: int | None) -> None:
        """Let the processes of cgroup `cgroup_dir` hold at most `limit_bytes` of this GPU (None: no limit);
        raises RuntimeError with the driver's reason."""
        nv = self._nvml
        if nv is None or not hasattr(nv, "nvmlDeviceSetMemoryLimits_v1"):
            raise RuntimeError("NVML has no nvmlDeviceSetMemoryLimits_v1")
        limits = nv.c_nvmlSetMemoryLimits_v1_t()
        limits.nameSpace = cgroup_dir.encode()
        limits.softLimit = 0 if limit_bytes is None else limit_bytes
        limits.hardLimit = nv.NVML_DEVICE_MEMORY_LIMIT_MAX if limit_bytes is None else limit_bytes
        try:
            nv.nvmlDeviceSetMemoryLimits_v1(nv.nvmlDeviceGetHandleByUUID(uuid), limits)
        except Exception as exc:
            raise RuntimeError(f"nvmlDeviceSetMemoryLimits_v1 on {uuid} for {cgroup_dir}: {exc}") from exc

    def processes(self, uuid: str) -> list[tuple[int, int]] | None:
        """(host PID, bytes) of each process holding memory on the GPU, compute and graphics (NVML's running
        processes); None when NVML cannot say."""
        nv = self._nvml
        if nv is None:
            return None
        found: dict[int, int] = {}
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(uuid)
            infos = list(nv.nvmlDeviceGetComputeRunningProcesses(handle))
        except Exception as exc:
            log.debug("event=processes_unreadable uuid=%s error=%s", uuid, exc)
            return None
        try:
            infos += list(nv.nvmlDeviceGetGraphicsRunningProcesses(handle))
        except Exception:  # drivers without it, or without graphics: the compute list is what CUDA holds
            pass
        for info in infos:
            used = int(info.usedGpuMemory) if info.usedGpuMemory is not None else 0
            found[int(info.pid)] = max(found.get(int(info.pid), 0), used)
        return sorted(found.items())

    def process_utilization(self, uuid: str) -> dict[int, float] | None:
        """Each process's SM utilization (%) of the GPU since the last call for that GPU (host PID -> %); {} when
        none ran; None when NVML cannot say."""
        nv = self._nvml
        if nv is None:
            return None
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(uuid)
            found, newest = process_utilization(nv, handle, self._util_seen.get(uuid, 0))
        except Exception as exc:
            log.debug("event=process_utilization_unreadable uuid=%s error=%s", uuid, exc)
            return None
        if newest:
            self._util_seen[uuid] = newest
        return found

    def usage(self) -> dict[str, GPUReading]:
        """Memory used and utilisation per GPU; unreadable GPUs are left out."""
        result: dict[str, GPUReading] = {}
        if self._nvml is None:
            return result
        nv = self._nvml
        for gpu in self._gpus:
            try:
                handle = nv.nvmlDeviceGetHandleByUUID(gpu.uuid)
                memory = nv.nvmlDeviceGetMemoryInfo(handle)
                try:
                    util = int(nv.nvmlDeviceGetUtilizationRates(handle).gpu)
                except Exception:
                    util = 0
                result[gpu.uuid] = GPUReading(int(memory.used), util)
            except Exception as exc:
                log.debug("event=usage_unreadable uuid=%s error=%s", gpu.uuid, exc)
                continue
        return result

    def close(self) -> None:
        """Free the event set and shut NVML down."""
        if self._nvml is None:
            return
        try:
            if self._event_set is not None:
                self._nvml.nvmlEventSetFree(self._event_set)
            self._nvml.nvmlShutdown()
        except Exception as exc:
            log.debug("event=nvml_shutdown_failed error=%s", exc)
