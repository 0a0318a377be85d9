"""Allocate: find the pod kubelet is admitting and build the container's environment and mounts.

Called by the `vgpu-number` gRPC service (server.py) for every container kubelet admits. Kubelet only passes
fake device IDs; the pod is found deterministically in the node-scoped pod cache: pending, `bind-phase=allocating`,
`vgpu-node` = this node, and the next unallocated GPU container's GPU set equals the GPUs behind kubelet's IDs.
No match or more than one match is an error (never a guess). Each answered container consumes one segment of
`volcano.sh/devices-to-allocate`; after the last one the pod gets `bind-phase=success`.

The response is the contract's (../shared/compat/CONTRACT.md, "Device plugin"), byte-compatible with
volcano-vgpu-device-plugin. Per-container cache directories are created, never deleted while their pod exists;
`collect_garbage` removes the ones of pods that are gone.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from vgpu import assignment, keys
from vgpu.errors import CodecError, RequestError, VGPUError
from vgpu.requests import ContainerRequest, gpu_containers, pod_requests
from vgpu.resources import SharingConfig

__all__ = ["LIBVGPU_CONTAINER_PATH", "AllocationError", "Allocator", "ContainerGrant", "PodSource"]

log = logging.getLogger(__name__)

LIBVGPU_CONTAINER_PATH = "/usr/local/vgpu/libvgpu.so"
CACHE_CONTAINER_DIR = "/tmp/vgpu"
LOCK_CONTAINER_DIR = "/tmp/vgpulock"
PRELOAD_CONTAINER_PATH = "/etc/ld.so.preload"
DISABLE_CONTROL_ENV = "CUDA_DISABLE_CONTROL"


class AllocationError(VGPUError):
    """Kubelet's request cannot be matched to exactly one waiting container."""


class PodSource(Protocol):
    """Pods bound to this node, as plain API dicts, and the one write the allocator needs."""

    def pods(self) -> list[dict[str, Any]]:
        """Pods on this node from the cache (may lag the API server slightly)."""
        ...

    def refresh(self) -> list[dict[str, Any]]:
        """Pods on this node read from the API server now."""
        ...

    def patch_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        """Merge-patch pod annotations (None deletes a key)."""
        ...


@dataclass(frozen=True, slots=True)
class ContainerGrant:
    """What one container gets: the container and its segment of the assignment."""

    namespace: str
    pod: str
    pod_uid: str
    container: str
    segment_index: int
    grants: tuple[assignment.DeviceGrant, ...]
    segments: assignment.Assignment
    last: bool
    disable_control: bool


@dataclass(frozen=True, slots=True)
class _Candidate:
    pod: dict[str, Any]
    uid: str
    segments: assignment.Assignment
    requests: tuple[ContainerRequest, ...]
    next_index: int
    in_progress: bool

    @property
    def key(self) -> str:
        meta = self.pod.get("metadata") or {}
        return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


class Allocator:
    """Matches kubelet's Allocate calls to pods and answers them; thread-safe."""

    def __init__(
        self,
        node_name: str,
        sharing: SharingConfig,
        pods: PodSource,
        hook_path: str,
        lock_dir: str = LOCK_CONTAINER_DIR,
        core_policy: str | None = None,
    ) -> None:
        self.node_name = node_name
        self.sharing = sharing
        self.factor = sharing.gpu_memory_factor
        self.source = pods
        self.hook_path = Path(hook_path)
        self.lock_dir = lock_dir
        self.core_policy = core_policy
        self._lock = threading.Lock()
        # pod uid -> segment indexes answered by this process (covers a cache that has not seen our patch yet)
        self._consumed: dict[str, set[int]] = {}
        # (uid, resourceVersion, consumed) -> parsed candidate; pods are immutable per resourceVersion
        self._missing_candidates: list[_Candidate] = []
        self._parsed: dict[tuple[str, str, frozenset[int]], _Candidate | None] = {}

    # paths -------------------------------------------------------------------------------------------------
    @property
    def vgpu_root(self) -> Path:
        """$HOOK_PATH/vgpu on the host."""
        return self.hook_path / "vgpu"

    @property
    def containers_root(self) -> Path:
        """Host directory holding one cache directory per container."""
        return self.vgpu_root / "containers"

    def cache_dir(self, pod_uid: str, container: str) -> Path:
        """Host cache directory of one container."""
        return self.containers_root / f"{pod_uid}_{container}"

    # candidates ----------------------------------------------------------------------------------------------
    def _candidate(self, pod: dict[str, Any]) -> _Candidate | None:
        meta = _meta(pod)
        uid = str(meta.get("uid") or "")
        key = (uid, str(meta.get("resourceVersion") or ""), frozenset(self._consumed.get(uid, ())))
        if key[1] and key in self._parsed:
            return self._parsed[key]
        found = self._parse_candidate(pod)
        if key[1]:
            if len(self._parsed) > 4096:
                self._parsed.clear()
            self._parsed[key] = found
        return found

    def _parse_candidate(self, pod: dict[str, Any]) -> _Candidate | None:
        meta = _meta(pod)
        annotations = meta.get("annotations") or {}
        if annotations.get(keys.BIND_PHASE) != keys.BIND_PHASE_ALLOCATING:
            return None
        if annotations.get(keys.VGPU_NODE) != self.node_name:
            return None
        if (pod.get("status") or {}).get("phase", "Pending") != "Pending":
            return None
        if meta.get("deletionTimestamp"):
            return None
        uid = str(meta.get("uid") or "")
        try:
            segments = assignment.decode(annotations.get(keys.DEVICES_TO_ALLOCATE, ""))
            requests = pod_requests(pod, self.sharing)
        except (CodecError, RequestError) as exc:
            log.warning("event=pod_unreadable pod=%s/%s error=%s", meta.get("namespace"), meta.get("name"), exc)
            return None
        done = self._consumed.get(uid, set())
        next_index = next((i for i, seg in enumerate(segments) if seg and i not in done), None)
        if next_index is None:
            return None
        in_progress = next_index > 0 or bool(done)
        return _Candidate(pod, uid, segments, requests, next_index, in_progress)

    def _candidates(self, pods: list[dict[str, Any]]) -> list[_Candidate]:
        found = [c for c in (self._candidate(p) for p in pods) if c is not None]
        # kubelet admits pods in creation order; keep that order for hints and messages
        found.sort(key=lambda c: (_meta(c.pod).get("creationTimestamp") or "", c.key))
        return found

    # GetPreferredAllocation -----------------------------------------------------------------------------------
    def preferred_gpus(self, size: int, available_uuids: set[str]) -> list[str] | None:
        """GPU UUIDs of the container kubelet most likely admits next (a hint only), or None."""
        with self._lock:
            candidates = self._candidates(self.source.pods())
        fitting = [
            c for c in candidates
            if len(c.segments[c.next_index]) == size
            and all(g.uuid in available_uuids for g in c.segments[c.next_index])
        ]
        fitting.sort(key=lambda c: not c.in_progress)  # a pod in the middle of admission comes first
        if not fitting:
            return None
        return [g.uuid for g in fitting[0].segments[fitting[0].next_index]]

    # Allocate -------------------------------------------------------------------------------------------------
    def match(self, gpu_uuids: list[str]) -> ContainerGrant:
        """The one waiting container whose next segment is exactly these GPUs; raises AllocationError."""
        if len(set(gpu_uuids)) != len(gpu_uuids):
            raise AllocationError(
                f"node {self.node_name}: kubelet chose several vgpu-number devices of one GPU {sorted(gpu_uuids)}; "
                "each GPU of a container must be distinct"
            )
        wanted = set(gpu_uuids)
        last_error = ""
        for attempt in range(2):
            pods = self.source.pods() if attempt == 0 else self.source.refresh()
            candidates = self._candidates(pods)
            matches = [c for c in candidates if {g.uuid for g in c.segments[c.next_index]} == wanted
                       and len(c.segments[c.next_index]) == len(gpu_uuids)]
            if len(matches) > 1:
                busy = [c for c in matches if c.in_progress]
                if len(busy) == 1:
                    matches = busy
            if len(matches) == 1:
                return self._grant(matches[0])
            if len(matches) > 1:
                names = ", ".join(c.key for c in matches)
                last_error = (
                    f"node {self.node_name}: GPUs {sorted(wanted)} match the next container of several pods "
                    f"({names}); refusing to guess"
                )
                self._missing_candidates = []
                continue
            waiting = ", ".join(
                f"{c.key}[{c.next_index}]={sorted(g.uuid for g in c.segments[c.next_index])}" for c in candidates
            ) or "none"
            last_error = (
                f"node {self.node_name}: no pod with bind-phase=allocating waits for GPUs {sorted(wanted)} "
                f"(waiting: {waiting})"
            )
            self._missing_candidates = candidates
        raise AllocationError(last_error)

    def _grant(self, candidate: _Candidate) -> ContainerGrant:
        index = candidate.next_index
        if index >= len(candidate.requests):
            raise AllocationError(
                f"pod {candidate.key}: devices-to-allocate has segment {index} but the pod has only "
                f"{len(candidate.requests)} GPU containers"
            )
        name = candidate.requests[index].container
        spec = next((c for c, _ in gpu_containers(candidate.pod) if c.get("name") == name), {})
        disable = any(isinstance(e, Mapping) and e.get("name") == DISABLE_CONTROL_ENV for e in spec.get("env") or ())
        remaining = [
            i for i, seg in enumerate(candidate.segments)
            if seg and i != index and i not in self._consumed.get(candidate.uid, set()) and i > index
        ]
        meta = _meta(candidate.pod)
        return ContainerGrant(
            namespace=str(meta.get("namespace") or ""),
            pod=str(meta.get("name") or ""),
            pod_uid=candidate.uid,
            container=name,
            segment_index=index,
            grants=candidate.segments[index],
            segments=candidate.segments,
            last=not remaining,
            disable_control=disable,
        )

    def response_parts(self, grant: ContainerGrant) -> tuple[dict[str, str], list[tuple[str, str, bool]]]:
        """Env and mounts (container path, host path, read-only) for one container, per the contract."""
        envs: dict[str, str] = {}
        uuids: list[str] = []
        for g in grant.grants:
            if g.uuid not in uuids:
                uuids.append(g.uuid)
        envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
        for i, g in enumerate(grant.grants):
            envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{g.memory * self.factor}m"
        envs["CUDA_DEVICE_SM_LIMIT"] = str(grant.grants[0].cores if grant.grants else 0)
        envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{CACHE_CONTAINER_DIR}/{uuidlib.uuid4()}.cache"
        if self.core_policy:
            envs["GPU_CORE_UTILIZATION_POLICY"] = self.core_policy
        mounts = [
            (LIBVGPU_CONTAINER_PATH, str(self.vgpu_root / "libvgpu.so"), True),
            (CACHE_CONTAINER_DIR, str(self.cache_dir(grant.pod_uid, grant.container)), False),
            (LOCK_CONTAINER_DIR, self.lock_dir, False),
        ]
        if not grant.disable_control:
            mounts.append((PRELOAD_CONTAINER_PATH, str(self.vgpu_root / "ld.so.preload"), True))
        return envs, mounts

    def prepare_host(self, grant: ContainerGrant) -> None:
        """Create the container's cache directory, the lock directory and ld.so.preload (never deletes)."""
        directory = self.cache_dir(grant.pod_uid, grant.container)
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o777)
        Path(self.lock_dir).mkdir(parents=True, exist_ok=True)
        try:
            os.chmod(self.lock_dir, 0o777)
        except PermissionError:
            pass
        preload = self.vgpu_root / "ld.so.preload"
        if not preload.exists():
            preload.write_text(LIBVGPU_CONTAINER_PATH + "\n")

    def allocate(self, gpu_uuids: list[str]) -> tuple[ContainerGrant, dict[str, str], list[tuple[str, str, bool]]]:
        """Match, prepare the host, record progress on the pod; returns the grant, env and mounts."""
        with self._lock:
            self._missing_candidates = []
            try:
                grant = self.match(gpu_uuids)
            except AllocationError:
                lone = self._missing_candidates
                if len(lone) == 1:
                    self._mark_failed(lone[0].pod)
                raise
            envs, mounts = self.response_parts(grant)
            self.prepare_host(grant)
            self._consumed.setdefault(grant.pod_uid, set()).add(grant.segment_index)
            self._record(grant)
            return grant, envs, mounts

    def _record(self, grant: ContainerGrant) -> None:
        done = self._consumed.get(grant.pod_uid, set())
        left = tuple(() if i in done or i == grant.segment_index else seg for i, seg in enumerate(grant.segments))
        patch: dict[str, str | None] = {}
        if grant.last or not any(left):
            patch[keys.DEVICES_TO_ALLOCATE] = ""
            patch[keys.BIND_PHASE] = keys.BIND_PHASE_SUCCESS
            patch[keys.VGPU_TIME] = keys.VGPU_TIME_DONE
        else:
            patch[keys.DEVICES_TO_ALLOCATE] = assignment.encode(left)
        self.source.patch_annotations(grant.namespace, grant.pod, patch)
        log.info(
            "event=allocated pod=%s/%s container=%s gpus=%s last=%s",
            grant.namespace, grant.pod, grant.container, ",".join(g.uuid for g in grant.grants), grant.last,
        )

    def _mark_failed(self, pod: dict[str, Any]) -> None:
        meta = _meta(pod)
        try:
            self.source.patch_annotations(
                str(meta.get("namespace") or ""),
                str(meta.get("name") or ""),
                {keys.BIND_PHASE: keys.BIND_PHASE_FAILED, keys.VGPU_TIME: keys.VGPU_TIME_DONE},
            )
        except Exception as exc:  # noqa: BLE001 - the allocation error is what kubelet must see
            log.warning("event=mark_failed_error pod=%s/%s error=%s", meta.get("namespace"), meta.get("name"), exc)

    # garbage collection -------------------------------------------------------------------------------------
    def collect_garbage(self, min_age: float = 300.0, now: Callable[[], float] = time.time) -> list[str]:
        """Remove cache directories of pods no longer on this node (older than `min_age` s); returns removed names."""
        root = self.containers_root
        if not root.is_dir():
            return []
        live = {str(_meta(p).get("uid") or "") for p in self.source.refresh()}
        removed = []
        for entry in root.iterdir():
            uid = entry.name.split("_", 1)[0]
            if uid in live or not entry.is_dir():
                continue
            try:
                if now() - entry.stat().st_mtime < min_age:
                    continue
                shutil.rmtree(entry)
                removed.append(entry.name)
            except OSError as exc:
                log.warning("event=gc_failed dir=%s error=%s", entry, exc)
        with self._lock:
            for uid in [u for u in self._consumed if u not in live]:
                del self._consumed[uid]
        return removed
