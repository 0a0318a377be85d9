"""NodePrepareResources / NodeUnprepareResources of one claim: ResourceClaim -> limits -> CDI spec -> answer.

Preparing reads the claim from the API server, checks its UID, takes the allocation results of our driver in this
node's pool, maps each device to its GPU and gives each request the device plugin's container answer
(`build_allocation`: one grant per device, memory limit in MiB, SM limit, the library's mounts and the claim's own
accounting and lock directories) as one CDI device. What was made is checkpointed; preparing a prepared claim
answers from the checkpoint, unpreparing removes the spec and the directories. Every refusal is a PrepareError
whose message names the claim and says what is wrong; nothing is left behind by a refused claim.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from kubernetes import client as k8s

from vgpu.assignment import DeviceGrant
from vgpu.dra import ClaimShare, SliceDevice, claim_consumption, device_name
from vgpu.draplugin.cdi import CDIDevice, CDISpecs, cdi_device_name, qualified_id
from vgpu.draplugin.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from vgpu.errors import CodecError, VGPUError
from vgpu.kube.client import read_object
from vgpu.kube.errors import NotFoundError, translate
from vgpu.node.backends import GPUInfo
from vgpu.node.host import HostFiles
from vgpu.node.records import AllocationRecord
from vgpu.node.response import (
    DEVICE_UUIDS_ENV,
    FAIL_OPEN_ENV,
    SHARED_CACHE_ENV,
    ContainerGrant,
    ResponseOptions,
    build_allocation,
)
from vgpu.units import limit_bytes

__all__ = ["ClaimPreparer", "ClaimRef", "PrepareError", "pacing_records", "pin_limit_env"]

log = logging.getLogger(__name__)
_TIMEOUT = 10.0  # seconds per API request


class PrepareError(VGPUError):
    """One claim cannot be prepared or unprepared; the message is the claim's `error` in the response."""


ClaimRef = tuple[str, str, str]
"""(namespace, name, UID) of a claim as kubelet names it."""


class ClaimPreparer:
    """Prepares and unprepares claims on this node's GPUs; thread-safe (kubelet may call concurrently)."""

    def __init__(self, api: k8s.ApiClient, node: str, gpus: list[GPUInfo], healthy: Callable[[str], bool],
                 host: HostFiles, cdi: CDISpecs, checkpoint: Checkpoint, isolation_fail_open: bool) -> None:
        self.resource = k8s.ResourceV1Api(api)
        self.node = node
        self.gpus = {device_name(g.nvml_index): g for g in gpus}
        self.healthy = healthy
        self.host = host
        self.cdi = cdi
        self.checkpoint = checkpoint
        self.options = ResponseOptions(isolation_fail_open=isolation_fail_open,
                                       gpu_numbers={g.uuid: (g.nvml_index, g.minor) for g in gpus})
        self.whole = {(node, name): SliceDevice(node, name, g.uuid, g.name, g.nvml_index, g.memory_mib, 100, True)
                      for name, g in self.gpus.items()}
        self.prepared = checkpoint.load()
        self._lock = threading.Lock()

    def prepare(self, ref: ClaimRef) -> PreparedClaim:
        """Prepare one claim (or answer as before when it is prepared); raises PrepareError."""
        namespace, name, uid = ref
        with self._lock:
            done = self.prepared.get(uid)
            if done is not None:
                self._restore(done)
        if done is not None:   # another pod of a shared claim: the pacer must know it is the claim's
            return self._refresh_consumers(done)
        claim = self._read(namespace, name, uid)
        where = f"claim {namespace}/{name} ({uid})"
        by_request = self._shares(claim, where)
        with self._lock:
            done = self.prepared.get(uid)
            if done is not None:  # a concurrent call prepared it meanwhile
                return done
            prepared = replace(self._build(namespace, name, uid, by_request), consumers=_consumers(claim))
            try:
                for request, device in zip(prepared.requests, prepared.cdi_devices, strict=True):
                    self.host.prepare(uid, _key(request))
                    self.host.write_limits(uid, _key(request), dict(device.env))
                self.cdi.write(uid, prepared.cdi_devices)
                self.prepared[uid] = prepared
                self.checkpoint.save(self.prepared)
            except OSError as exc:
                self.prepared.pop(uid, None)
                self._remove_files(prepared)
                raise PrepareError(f"{where}: cannot write its files: {exc}") from None
        log.info("event=claim_prepared claim=%s/%s uid=%s devices=%s", namespace, name, uid,
                 ",".join(d.device for d in prepared.devices))
        return prepared

    def unprepare(self, ref: ClaimRef) -> None:
        """Remove what preparing the claim made; a claim never prepared (or already unprepared) is fine."""
        namespace, name, uid = ref
        with self._lock:
            prepared = self.prepared.get(uid)
            if prepared is None:
                removed = self.cdi.remove(uid)
                log.info("event=claim_unprepare_unknown claim=%s/%s uid=%s spec_removed=%s", namespace, name, uid,
                         removed)
                return
            try:
                self._remove_files(prepared)
                del self.prepared[uid]
                self.checkpoint.save(self.prepared)
            except OSError as exc:
                raise PrepareError(f"claim {namespace}/{name} ({uid}): cannot remove its files: {exc}") from None
        log.info("event=claim_unprepared claim=%s/%s uid=%s", namespace, name, uid)

    def _refresh_consumers(self, done: PreparedClaim) -> PreparedClaim:
        """A prepared claim asked for again (a further pod shares it), with its pods read afresh; when they cannot be
        read the claim's pods are unknown, and the pacer leaves it alone until they are."""
        try:
            consumers = _consumers(self._read(done.namespace, done.name, done.uid))
        except PrepareError as exc:
            log.warning("event=claim_consumers_unknown claim=%s/%s uid=%s error=%s", done.namespace, done.name,
                        done.uid, exc)
            consumers = ()
        with self._lock:
            current = self.prepared.get(done.uid)
            if current is None or current.consumers == consumers:
                return current or done
            self.prepared[done.uid] = current = replace(current, consumers=consumers)
            try:
                self.checkpoint.save(self.prepared)
            except OSError as exc:
                log.warning("event=checkpoint_unwritable error=%s", exc)
            return current

    def _read(self, namespace: str, name: str, uid: str) -> dict[str, Any]:
        where = f"claim {namespace}/{name} ({uid})"
        try:
            claim = read_object(self.resource.read_namespaced_resource_claim(
                name, namespace, _preload_content=False, _request_timeout=_TIMEOUT))
        except Exception as exc:
            error = translate(exc, f"read ResourceClaim {namespace}/{name}")
            if isinstance(error, NotFoundError):
                raise PrepareError(f"{where}: not found") from None
            raise PrepareError(f"{where}: {error}") from None
        actual = str((claim.get("metadata") or {}).get("uid") or "")
        if actual != uid:
            raise PrepareError(f"{where}: the API server has UID {actual or '(none)'} for this name: the claim was "
                               "replaced")
        return claim

    def _shares(self, claim: Mapping[str, Any], where: str) -> dict[str, list[tuple[ClaimShare, GPUInfo]]]:
        """This node's shares of the claim by request (in result order) with their GPUs; PrepareError otherwise."""
        if not ((claim.get("status") or {}).get("allocation")):
            raise PrepareError(f"{where}: not allocated")
        try:
            shares = claim_consumption(claim, self.whole)
        except CodecError as exc:
            raise PrepareError(f"{where}: {exc}") from None
        mine = [s for s in shares if s.pool == self.node]
        if not mine:
            raise PrepareError(f"{where}: no allocation result of driver gpu.vgpu-sharing.io in pool {self.node!r}")
        by_request: dict[str, list[tuple[ClaimShare, GPUInfo]]] = {}
        for share in mine:
            gpu = self.gpus.get(share.device)
            what = f"{where}: request {share.request!r} device {share.device!r}"
            if gpu is None:
                raise PrepareError(f"{what}: no such device on this node (devices: {', '.join(sorted(self.gpus))})")
            if not self.healthy(gpu.uuid):
                raise PrepareError(f"{what}: GPU {gpu.uuid} is unhealthy")
            if share.memory_mib < 1:
                raise PrepareError(f"{what}: consumes no memory (at least 1Mi)")
            if share.memory_mib > gpu.memory_mib:
                raise PrepareError(f"{what}: consumes {share.memory_mib}Mi of memory, more than the device's "
                                   f"{gpu.memory_mib}Mi")
            by_request.setdefault(share.request, []).append((share, gpu))
        return by_request

    def _build(self, namespace: str, name: str, uid: str,
               by_request: Mapping[str, list[tuple[ClaimShare, GPUInfo]]]) -> PreparedClaim:
        devices: list[PreparedDevice] = []
        cdi_devices: list[CDIDevice] = []
        for request, shares in by_request.items():
            grants = tuple(DeviceGrant(gpu.uuid, share.memory_mib, share.cores) for share, gpu in shares)
            grant = ContainerGrant(namespace=namespace, pod=name, pod_uid=uid, container=request, segment_index=0,
                                   grants=grants, segments=(grants,), last=True, disable_control=False)
            allocation = build_allocation(grant, options=self.options, memory_factor=1,
                                          vgpu_root=self.host.vgpu_root,
                                          cache_dir=self.host.cache_dir(uid, _key(request)),
                                          lock_dir=self.host.lock_dir(uid, _key(request)),
                                          limits_file=self.host.limits_file(uid, _key(request)),
                                          pace_dir=self.host.pace_dir(uid, _key(request)))
            cdi_name = cdi_device_name(uid, request)
            cdi_devices.append(CDIDevice(cdi_name, pin_limit_env(allocation.envs, grants), tuple(allocation.mounts)))
            for share, _ in shares:
                devices.append(PreparedDevice((base_request(request),), share.pool, share.device,
                                              (qualified_id(cdi_name),), share.share_id or None))
        return PreparedClaim(uid, namespace, name, tuple(devices), tuple(cdi_devices), tuple(by_request))

    def _restore(self, prepared: PreparedClaim) -> None:
        """Re-create what a prepared claim needs if it went missing (a CDI directory on tmpfs after a reboot)."""
        try:
            for request, device in zip(prepared.requests, prepared.cdi_devices, strict=True):
                self.host.prepare(prepared.uid, _key(request))
                if not self.host.limits_file(prepared.uid, _key(request)).exists():
                    self.host.write_limits(prepared.uid, _key(request), dict(device.env))
            if not self.cdi.exists(prepared.uid):
                self.cdi.write(prepared.uid, prepared.cdi_devices)
                log.warning("event=cdi_spec_rewritten uid=%s", prepared.uid)
        except OSError as exc:
            raise PrepareError(f"claim {prepared.namespace}/{prepared.name} ({prepared.uid}): cannot restore its "
                               f"files: {exc}") from None

    def _remove_files(self, prepared: PreparedClaim) -> None:
        self.cdi.remove(prepared.uid)
        for request in prepared.requests:
            key = _key(request)
            for directory in (self.host.cache_dir(prepared.uid, key), self.host.lock_dir(prepared.uid, key),
                              self.host.pace_dir(prepared.uid, key)):
                _remove_tree(directory)
            self.host.limits_file(prepared.uid, key).unlink(missing_ok=True)


def pin_limit_env(envs: Mapping[str, str], grants: Sequence[DeviceGrant]) -> dict[str, str]:
    """A CDI device's env: the limits `build_allocation` gives (CUDA_DEVICE_MEMORY_LIMIT_<i> and
    CUDA_DEVICE_SM_LIMIT_<i> per device among them), plus a value of ours for every other variable the isolation
    library reads as a limit or a switch (node.response.RESERVED_ENV_NAMES). The container runtime applies
    CDI env over the container's own, so a value a pod author writes for any of them is replaced, never read.
    (Device-plugin mode refuses such pods instead: there kubelet puts the pod's env after the plugin's.)"""
    pinned = dict(envs)
    pinned.setdefault("CUDA_DEVICE_MEMORY_LIMIT", min((pinned[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"]
                                                       for i in range(len(grants))), key=limit_bytes))
    pinned.setdefault("GPU_CORE_UTILIZATION_POLICY", "default")
    pinned.setdefault(FAIL_OPEN_ENV, "0")
    pinned.setdefault("VGPU_CONTEXT_OVERHEAD", "0")
    pinned.setdefault("VGPU_COUNT_MANAGED", "1")
    return pinned


def _consumers(claim: Mapping[str, Any]) -> tuple[str, ...]:
    """UIDs of the pods a claim is reserved for (status.reservedFor)."""
    reserved = (claim.get("status") or {}).get("reservedFor") or ()
    return tuple(str(r.get("uid")) for r in reserved
                 if isinstance(r, dict) and r.get("resource") == "pods" and r.get("uid"))


def pacing_records(prepared: Mapping[str, PreparedClaim]) -> list[AllocationRecord]:
    """The prepared claims as the pacer's tenants (node.pacing.NodePacer): one record per claim and request, keyed
    by the claim's UID as a device plugin's are by the pod's, with its GPUs, cores and accounting file from the CDI
    device's limits. Claims whose pods are not known are left out: the pacer could not tell their processes."""
    records = []
    for claim in list(prepared.values()):   # the pacer's thread reads while calls prepare
        if not claim.consumers:
            continue
        for request, device in zip(claim.requests, claim.cdi_devices, strict=True):
            env = device.env
            gpus = tuple(u for u in env.get(DEVICE_UUIDS_ENV, "").split(",") if u)
            if not gpus or SHARED_CACHE_ENV not in env:
                continue
            records.append(AllocationRecord(
                pod_uid=claim.uid, namespace=claim.namespace, pod=claim.name, container=_key(request), gpus=gpus,
                memory_bytes=tuple(limit_bytes(env.get(f"CUDA_DEVICE_MEMORY_LIMIT_{i}", "0"))
                                   for i in range(len(gpus))),
                cores=int(env.get("CUDA_DEVICE_SM_LIMIT", "0") or 0),
                cache_file=PurePosixPath(env[SHARED_CACHE_ENV]).name,
            ))
    return records


def base_request(request: str) -> str:
    """The request a container names for an allocation result: a firstAvailable result `gpu/a100` is request `gpu`.
    Kubelet gives a container the CDI devices whose request names contain its `resources.claims[].request` exactly
    (kubernetes pkg/kubelet/cm/dra/claiminfo.go `cdiDevicesAsList`), and upstream's kubelet-plugin helper answers
    with the parent request (kubernetes/dynamic-resource-allocation kubeletplugin/draplugin.go
    `stripSubrequestNames`, resourceclaim.BaseRequestRef)."""
    return request.split("/", 1)[0]


def _key(request: str) -> str:
    """A request's part of its directories' names (a subrequest `main/sub` as `main_sub`)."""
    return request.replace("/", "_")


def _remove_tree(directory: Path) -> None:
    try:
        shutil.rmtree(directory)
    except FileNotFoundError:
        pass
