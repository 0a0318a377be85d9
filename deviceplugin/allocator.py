"""Allocate: answer each of kubelet's Allocate calls for the container it admits.

Called by the gRPC services (server.py) for every Allocate kubelet sends, on every resource of ours. The matcher
(deviceplugin.matching) finds the container the calls belong to; on the call that fixes the match the container's
environment, mounts and device specs (node.response) go out, its host directory is made
(node.host) and the pod's annotations record the answered segment (`bind-phase=success` after the last
one; when the API server cannot take that patch, deviceplugin.deferred writes it later and the container is
admitted). Kubelet merges the responses of all resources of a container, so it does not matter which call carries
them; the container's other calls get empty responses. A call nothing matches fails the pod's admission with a
message naming what was waiting, and the pod gets `bind-phase=failed` and an event.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Any

from vgpu import assignment, keys
from vgpu.deviceplugin.capacity import overcommit
from vgpu.deviceplugin.deferred import DeferredPatches
from vgpu.deviceplugin.matching import AllocationError, GrantRules, KubeletView, Matcher, PodSource
from vgpu.errors import VGPUError
from vgpu.node.host import HostFiles
from vgpu.node.records import AllocationRecord
from vgpu.node.response import SHARED_CACHE_ENV, Allocation, ContainerGrant, ResponseOptions, build_allocation
from vgpu.resources import SharingConfig
from vgpu.units import MemoryUnit

__all__ = ["Allocator", "UnsafeName"]

log = logging.getLogger(__name__)

# what kube-apiserver lets a container name and a pod UID be (a DNS label; a UUID): anything else would make the
# paths of the container's host files (`<uid>_<container>`) leave their directories
_CONTAINER_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_POD_UID = re.compile(r"[0-9A-Za-z][-0-9A-Za-z]{0,63}")


class UnsafeName(AllocationError):
    """The matched container's name or its pod's UID cannot name host files (the gRPC answer: INVALID_ARGUMENT)."""


class Allocator:
    """Matches kubelet's Allocate calls to containers and answers them; thread-safe."""

    def __init__(
        self,
        node_name: str,
        sharing: SharingConfig,
        pods: PodSource,
        host: HostFiles,
        *,
        rules: GrantRules,
        core_policy: str | None = None,
        resource_kinds: Mapping[str, str] | None = None,
        options: ResponseOptions | None = None,
        recorder: Any = None,
        clock: Callable[[], float] = time.monotonic,
        kubelet: KubeletView | None = None,
    ) -> None:
        self.node_name = node_name
        self.factor = sharing.gpu_memory_factor
        self.sharing = sharing
        self.source = pods
        self.host = host
        self.core_policy = core_policy
        self.options = options or ResponseOptions()
        self.recorder = recorder
        self.matcher = Matcher(node_name, sharing, pods, resource_kinds=resource_kinds, clock=clock, kubelet=kubelet,
                               rules=rules, on_refused=self._refused)
        self.deferred = DeferredPatches(pods.patch_annotations)

    def _refused(self, pod: dict[str, Any], reason: str) -> None:
        if self.recorder is not None:
            message = f"the device plugin refuses this pod's GPUs: {reason}"
            self.recorder.warning(pod, "VGPUGrantRefused", message[:1000])

    def preferred_gpus(self, resource: str, size: int, available_uuids: set[str]) -> list[str] | None:
        """GPU UUIDs of the container kubelet most likely admits next (GetPreferredAllocation's hint), or None."""
        return self.matcher.preferred_gpus(resource, size, available_uuids)

    def allocate_call(self, resource: str, gpu_uuids: list[str] | None = None, count: int = 0) -> Allocation | None:
        """One Allocate call of one container: its Allocation if this call fixes the match, else None (empty
        response). Raises AllocationError when the call cannot belong to any waiting container."""
        matcher = self.matcher
        call = matcher.make_call(resource, gpu_uuids or (), count)
        with matcher.lock:
            try:
                grant = matcher.match(call)
            except AllocationError as exc:
                if len(matcher.missing_candidates) == 1:
                    self._mark_failed(matcher.missing_candidates[0].pod, str(exc))
                elif self.recorder is not None:
                    for candidate in matcher.ambiguous:
                        self.recorder.warning(candidate.pod, "VGPUAllocationAmbiguous", str(exc)[:1000])
                raise
            if grant is None:
                return None
            if not _CONTAINER_NAME.fullmatch(grant.container) or not _POD_UID.fullmatch(grant.pod_uid):
                raise UnsafeName(f"node {self.node_name}: refusing pod {grant.namespace}/{grant.pod}: container "
                                 f"name {grant.container!r} or pod UID {grant.pod_uid!r} is not what kube-apiserver "
                                 "allows (a DNS label, a UID), and cannot name the container's files")
            over = overcommit(grant, self.source.pods(), matcher.answered(), matcher.rules.card_memory, self.sharing,
                              matcher.rules.scheduler_names)
            if over:
                raise AllocationError(f"node {self.node_name}: refusing pod {grant.namespace}/{grant.pod}: {over} "
                                      "(placed by two schedulers at once?)")
            allocation = build_allocation(
                grant, options=self.options, memory_factor=self.factor, vgpu_root=self.host.vgpu_root,
                cache_dir=self.host.cache_dir(grant.pod_uid, grant.container),
                lock_dir=self.host.lock_dir(grant.pod_uid, grant.container),
                core_policy=self.core_policy,
                limits_file=self.host.limits_file(grant.pod_uid, grant.container),
                pace_dir=self.host.pace_dir(grant.pod_uid, grant.container),
            )
            try:
                self.host.prepare(grant.pod_uid, grant.container)
                self.host.write_limits(grant.pod_uid, grant.container, allocation.envs)
                self.host.records.write(AllocationRecord(
                    pod_uid=grant.pod_uid, namespace=grant.namespace, pod=grant.pod, container=grant.container,
                    gpus=tuple(g.uuid for g in grant.grants),
                    memory_bytes=tuple(MemoryUnit(self.factor).bytes(g.memory) for g in grant.grants),
                    cores=grant.grants[0].cores if grant.grants else 0,
                    cache_file=PurePosixPath(allocation.envs[SHARED_CACHE_ENV]).name,
                ))
            except OSError as exc:
                self.host.discard(grant.pod_uid, grant.container)
                raise AllocationError(f"node {self.node_name}: cannot make the files of container "
                                      f"{grant.container!r} of pod {grant.namespace}/{grant.pod}: "
                                      f"{exc.strerror or exc}") from None
            self._record(grant, matcher.consume(grant))
            matcher.settle()
            return allocation

    def _record(self, grant: ContainerGrant, left: assignment.Assignment) -> None:
        patch: dict[str, str | None] = {}
        if grant.last or not any(left):
            patch[keys.DEVICES_TO_ALLOCATE] = ""
            patch[keys.BIND_PHASE] = keys.BIND_PHASE_SUCCESS
            patch[keys.VGPU_TIME] = keys.VGPU_TIME_DONE
        else:
            patch[keys.DEVICES_TO_ALLOCATE] = assignment.encode(left)
        try:
            self.source.patch_annotations(grant.namespace, grant.pod, patch)
        except VGPUError as exc:  # the grant stands (the matcher remembers it): write the record later
            log.warning("event=annotation_deferred pod=%s/%s error=%s", grant.namespace, grant.pod, exc)
            self.deferred.add(grant.namespace, grant.pod, patch)
        log.info(
            "event=allocated pod=%s/%s container=%s gpus=%s last=%s",
            grant.namespace, grant.pod, grant.container, ",".join(g.uuid for g in grant.grants), grant.last,
        )

    def _mark_failed(self, pod: dict[str, Any], message: str) -> None:
        meta = pod.get("metadata") or {}
        try:
            self.source.patch_annotations(
                str(meta.get("namespace") or ""),
                str(meta.get("name") or ""),
                {keys.BIND_PHASE: keys.BIND_PHASE_FAILED, keys.VGPU_TIME: keys.VGPU_TIME_DONE},
            )
        except Exception as exc:
            log.warning("event=mark_failed_error pod=%s/%s error=%s", meta.get("namespace"), meta.get("name"), exc)
        if self.recorder is not None:
            self.recorder.warning(pod, "VGPUAllocationFailed", message[:1000])

    def collect_garbage(self, min_age: float = 300.0, now: Callable[[], float] = time.time) -> list[str]:
        """Remove the records and host directories of pods no longer on this node (directories older than
        `min_age` s); returns the accounting directories removed.

        Only on a fresh pod list from the API server, and only for pods kubelet does not list either (when its
        pod-resources API is configured): during an API outage, or when kubelet cannot be asked, nothing is
        removed, so a running container never loses its directory."""
        try:
            listed = self.source.list_fresh()
        except VGPUError as exc:
            log.warning("event=gc_skipped reason=%s", exc)
            return []
        live = {str((p.get("metadata") or {}).get("uid") or "") for p in listed}
        if self.matcher.kubelet is not None:
            admitted = self.matcher.kubelet.assigned()
            if admitted is None:
                log.warning("event=gc_skipped reason=kubelet's pod-resources API cannot be asked")
                return []
            live |= {r.pod_uid for r in self.host.records.all() if (r.namespace, r.pod) in admitted}
        removed = self.host.remove_stale(live, min_age, now)
        with self.matcher.lock:
            self.matcher.forget(live)
        return removed
