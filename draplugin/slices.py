"""This node's ResourceSlice (`resource.k8s.io/v1`): its content, and the thread that keeps it published.

One slice per node, `<node>-gpu.vgpu-sharing.io`, pool = the node's name, one device per healthy GPU with the
attributes `uuid`, `model`, `index`, `memory` (MiB) and, where the backend knows them,
`resource.kubernetes.io/numaNode` and `nvlinkIsland` (the lowest NVML index of the GPUs NVLink joins it to);
beside them, under the names NVIDIA's DRA driver gives them (so a selector
written for it needs only the domain changed): `type` ("gpu"), `productName`, and where known `architecture`,
`cudaComputeCapability`, `driverVersion`, `cudaDriverVersion` (versions as semantic versions) and the standard
`resource.kubernetes.io/pciBusID` and `resource.kubernetes.io/pcieRoot`; and the consumable capacities `memory`
(the whole card by default, any whole number of MiB) and `cores` (0..100 percent, 0 by default: no compute
reservation, no SM limit). Devices allow multiple allocations. The slice is owned by the Node object, so it goes
when the node goes.

`SlicePublisher` writes the slice at start, after every `wake()` (a health change, a registration with kubelet)
and every minute, with pool.generation one above the slice it replaces; a slice that is current (quantities
compared by value, as the API server may rewrite them in canonical form) is not rewritten, nor is one that still
holds what the API server made of our last write of the same devices: an API server without the
DRAConsumableCapacity feature gate (off by default in Kubernetes 1.34 and 1.35) drops `allowMultipleAllocations` and
the capacities' `requestPolicy` from what it stores (kubernetes pkg/registry/resource/resourceslice/strategy.go,
dropDisabledFields), and the slice must not be rewritten at every resync for that. The publisher says so once, with
a WARNING log line and a Warning Event on the Node: without those fields every GPU is an exclusive device (one
claim each). API errors are logged and retried with backoff; the plugin keeps serving meanwhile. Slices of our
driver for this node under another name are deleted.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client as k8s

from vgpu.dra import (
    CAPACITY_CORES,
    CAPACITY_MEMORY,
    DRIVER,
    ISLAND_ATTRIBUTE,
    NUMA_ATTRIBUTE,
    device_name,
)
from vgpu.kube.client import read_json, read_object
from vgpu.kube.errors import ApiError, NotFoundError, translate
from vgpu.kube.events import EventRecorder
from vgpu.node.backends import GPUInfo
from vgpu.quantity import parse_quantity

__all__ = ["ISLAND_ATTRIBUTE", "NUMA_ATTRIBUTE", "PCIE_ROOT_ATTRIBUTE", "PCI_BUS_ATTRIBUTE", "SlicePublisher",
           "nvidia_attributes", "slice_devices_for", "slice_name", "slice_spec"]

log = logging.getLogger(__name__)

PCI_BUS_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"
_BACKOFF_FIRST, _BACKOFF_MAX = 0.5, 30.0
_RESYNC_SECONDS = 60.0  # a slice deleted or changed by someone else is restored within this time
_TIMEOUT = 10.0  # seconds per API request


def slice_name(node: str) -> str:
    """The name of the node's slice."""
    return f"{node}-{DRIVER}"


def _semver(version: str) -> str | None:
    """"580.159.04" as a semantic version ("580.159.4"), "13.0" as "13.0.0"; None when it is not numbers."""
    parts = version.split(".")
    if not version or len(parts) > 3 or not all(p.isdigit() for p in parts):
        return None
    return ".".join(str(int(p)) for p in [*parts, "0", "0"][:3])


def nvidia_attributes(gpu: GPUInfo) -> dict[str, Any]:
    """The attributes NVIDIA's DRA driver publishes for a whole GPU (NVIDIA/k8s-dra-driver-gpu, the GPU kubelet
    plugin's device attributes), with the values this GPU's backend knows."""
    found: dict[str, Any] = {"type": {"string": "gpu"}, "productName": {"string": gpu.name}}
    if gpu.architecture:
        found["architecture"] = {"string": gpu.architecture}
    for name, raw in (("cudaComputeCapability", gpu.compute_capability), ("driverVersion", gpu.driver_version),
                      ("cudaDriverVersion", gpu.cuda_driver_version)):
        version = _semver(raw)
        if version is not None:
            found[name] = {"version": version}
    if gpu.pci_bus_id:
        found[PCI_BUS_ATTRIBUTE] = {"string": gpu.pci_bus_id}
    if gpu.pcie_root:
        found[PCIE_ROOT_ATTRIBUTE] = {"string": gpu.pcie_root}
    return found


def _device(gpu: GPUInfo) -> dict[str, Any]:
    memory = f"{gpu.memory_mib}Mi"
    attributes: dict[str, Any] = {
        "uuid": {"string": gpu.uuid},
        "model": {"string": gpu.name},
        "index": {"int": gpu.nvml_index},
        "memory": {"int": gpu.memory_mib},
    }
    if gpu.numa is not None and gpu.numa >= 0:
        attributes[NUMA_ATTRIBUTE] = {"int": gpu.numa}
    if gpu.nvlink_island is not None and gpu.nvlink_island >= 0:
        attributes[ISLAND_ATTRIBUTE] = {"int": gpu.nvlink_island}
    attributes.update(nvidia_attributes(gpu))
    return {
        "name": device_name(gpu.nvml_index),
        "attributes": attributes,
        "capacity": {
            CAPACITY_MEMORY: {"value": memory, "requestPolicy": {
                "default": memory, "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"}}},
            CAPACITY_CORES: {"value": "100", "requestPolicy": {
                "default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}},
        },
        "allowMultipleAllocations": True,
    }


def slice_devices_for(gpus: Sequence[GPUInfo]) -> list[dict[str, Any]]:
    """The slice's devices for these (healthy) GPUs, in index order."""
    return [_device(g) for g in sorted(gpus, key=lambda g: g.nvml_index)]


def slice_spec(node: str, gpus: Sequence[GPUInfo], generation: int) -> dict[str, Any]:
    """The slice's spec."""
    return {
        "driver": DRIVER,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
        "nodeName": node,
        "devices": slice_devices_for(gpus),
    }


def _comparable(devices: Any) -> Any:
    """Devices with every capacity quantity as its value ("40960Mi" and "40Gi" compare equal)."""
    if not isinstance(devices, list):
        return devices
    out = []
    for device in devices:
        if not isinstance(device, dict) or not isinstance(device.get("capacity"), dict):
            out.append(device)
            continue
        capacity = {name: _quantities(entry) for name, entry in device["capacity"].items()}
        out.append({**device, "capacity": capacity})
    return out


def _quantities(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _quantities(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_quantities(item) for item in value]
    try:
        return parse_quantity(value)
    except ValueError:
        return value


class SlicePublisher:
    """Keeps this node's slice equal to the healthy GPUs; one thread, woken by `wake()`."""

    def __init__(self, api: k8s.ApiClient, node: str, healthy_gpus: Callable[[], list[GPUInfo]],
                 events: EventRecorder | None = None) -> None:
        self.resource = k8s.ResourceV1Api(api)
        self.core = k8s.CoreV1Api(api)
        self.node = node
        self.name = slice_name(node)
        self.healthy_gpus = healthy_gpus
        self.generation = 0  # of the slice last written or found current
        self.events = events
        self.sharing_dropped = False  # the API server dropped allowMultipleAllocations (DRAConsumableCapacity off)
        self._last_write: tuple[Any, Any] | None = None  # (devices we wrote, devices the server kept), comparable
        self._changed = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> SlicePublisher:
        """Publish now and on every change, from a thread of its own."""
        self._changed.set()
        self._thread = threading.Thread(target=self._run, name="dra-slices", daemon=True)
        self._thread.start()
        return self

    def wake(self) -> None:
        """The healthy GPUs changed: publish again."""
        self._changed.set()

    def stop(self) -> None:
        """Stop the thread; the slice stays (a restarting plugin must not make its devices vanish)."""
        self._stopping.set()
        self._changed.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        delay = _BACKOFF_FIRST
        while not self._stopping.is_set():
            self._changed.wait(_RESYNC_SECONDS)
            if self._stopping.is_set():
                return
            self._changed.clear()
            try:
                self.publish()
                delay = _BACKOFF_FIRST
            except ApiError as exc:
                log.warning("event=slice_publish_failed slice=%s error=%s retry_in=%.1fs", self.name, exc, delay)
                self._changed.set()
                if self._stopping.wait(delay):
                    return
                delay = min(delay * 2, _BACKOFF_MAX)

    def publish(self) -> None:
        """Write the slice if it differs from what the API server has; raises ApiError."""
        gpus = self.healthy_gpus()
        devices = slice_devices_for(gpus)
        current = self._read_slice()
        owner = self._owner()
        if current is not None:
            spec = current.get("spec") or {}
            found = int((spec.get("pool") or {}).get("generation") or 0)
            kept = _comparable(spec.get("devices") or [])
            wanted = _comparable(devices)
            as_written = self._last_write is not None and self._last_write == (wanted, kept)
            same = ((kept == wanted or as_written)
                    and spec.get("nodeName") == self.node
                    and (current.get("metadata") or {}).get("ownerReferences") == owner)
            if same:
                self.generation = found
                log.info("event=slice_current slice=%s generation=%d", self.name, found)
                self._delete_others()
                return
            generation = max(found, self.generation) + 1
        else:
            generation = self.generation + 1
        body: Any = {  # the client's typed signature wants its models; a dict is serialised as is
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": self.name},
            "spec": slice_spec(self.node, gpus, generation),
        }
        if owner is not None:
            body["metadata"]["ownerReferences"] = owner
        try:
            if current is None:
                stored = read_json(self.resource.create_resource_slice(body, _preload_content=False,
                                                                       _request_timeout=_TIMEOUT))
            else:
                body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                stored = read_json(self.resource.replace_resource_slice(self.name, body, _preload_content=False,
                                                                        _request_timeout=_TIMEOUT))
        except Exception as exc:
            raise translate(exc, f"write ResourceSlice {self.name}") from None
        kept_devices = ((stored.get("spec") or {}).get("devices") or []) if isinstance(stored, dict) else []
        self._last_write = (_comparable(devices), _comparable(kept_devices))
        self._notice_dropped_sharing(devices, kept_devices if isinstance(kept_devices, list) else [],
                                     str(owner[0]["uid"]) if owner else "")
        self.generation = generation
        log.info("event=slice_published slice=%s generation=%d devices=%s", self.name, generation,
                 ",".join(d["name"] for d in devices) or "none")
        self._delete_others()

    def _notice_dropped_sharing(self, wrote: list[dict[str, Any]], kept: list[Any], node_uid: str) -> None:
        """Say once that the API server dropped allowMultipleAllocations from the devices we wrote."""
        shared = {d["name"] for d in wrote if d.get("allowMultipleAllocations")}
        still = {d.get("name") for d in kept if isinstance(d, dict) and d.get("allowMultipleAllocations")}
        if self.sharing_dropped or not shared or shared <= still:
            return
        self.sharing_dropped = True
        message = ("the API server dropped allowMultipleAllocations from this node's ResourceSlice: the "
                   "DRAConsumableCapacity feature gate is off, so each GPU goes to one claim at a time (no sharing); "
                   "enable the gate on kube-apiserver, kube-scheduler and kubelet to share GPUs")
        log.warning("event=consumable_capacity_off slice=%s: %s", self.name, message)
        if self.events is not None:
            self.events.warning({"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node, "uid": node_uid}},
                                "DRAConsumableCapacityOff", message, kind="Node")

    def _read_slice(self) -> dict[str, Any] | None:
        try:
            return read_object(self.resource.read_resource_slice(self.name, _preload_content=False,
                                                                 _request_timeout=_TIMEOUT))
        except Exception as exc:
            error = translate(exc, f"read ResourceSlice {self.name}")
            if isinstance(error, NotFoundError):
                return None
            raise error from None

    def _owner(self) -> list[dict[str, Any]] | None:
        """The owner reference to this node's Node object (None while there is no such object)."""
        try:
            node = read_object(self.core.read_node(self.node, _preload_content=False, _request_timeout=_TIMEOUT))
        except Exception as exc:
            error = translate(exc, f"read Node {self.node}")
            if isinstance(error, NotFoundError):
                return None
            raise error from None
        uid = (node.get("metadata") or {}).get("uid")
        if not uid:
            return None
        return [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid, "controller": True}]

    def _delete_others(self) -> None:
        """Delete our driver's slices for this node that are not ours by name (left by an older naming)."""
        try:
            listed = read_object(self.resource.list_resource_slice(field_selector=f"spec.nodeName={self.node}",
                                                                   _preload_content=False, _request_timeout=_TIMEOUT))
        except Exception as exc:
            raise translate(exc, "list ResourceSlices") from None
        for item in listed.get("items") or ():
            name = str((item.get("metadata") or {}).get("name") or "")
            if (item.get("spec") or {}).get("driver") != DRIVER or name in ("", self.name):
                continue
            try:
                read_json(self.resource.delete_resource_slice(name, _preload_content=False, _request_timeout=_TIMEOUT))
                log.info("event=stale_slice_deleted slice=%s", name)
            except Exception as exc:
                error = translate(exc, f"delete ResourceSlice {name}")
                if not isinstance(error, NotFoundError):
                    raise error from None
