"""Allocate: find the container kubelet is admitting and build its environment, mounts and device specs.

Called by the gRPC services (server.py) for every Allocate kubelet sends, on every resource of ours: the GPU
resources (`vgpu-number`, and plain `nvidia.com/gpu` in whole-GPU mode) and the counting resources
(`vgpu-memory`, `vgpu-cores`). Kubelet passes fake device IDs only, never the pod, so the container is found in
the node-scoped pod cache. A candidate is a pod that is pending on this node with `bind-phase=allocating`,
`vgpu-node` = this node, and whose next unanswered GPU container (next segment of
`volcano.sh/devices-to-allocate`) is consistent with every Allocate call seen so far for the container being
admitted:

* a GPU-resource call matches when the GPUs behind kubelet's IDs are exactly the segment's GPUs;
* a memory / cores call matches when the number of IDs equals the container's limit of that resource (kubelet
  passes as many fake IDs as the quantity asked for).

Kubelet admits pods one at a time (in creationTimestamp order within a batch) and, per container, calls
Allocate once per extended resource, in no fixed order, before moving on to the next container. The calls of one
container therefore form a *sequence*; the plugin keeps the open sequence and narrows the candidates call by call.

The matching rule, applied at every call of a sequence (C = the candidates consistent with the sequence so far;
kubelet is asked about all of C, while the rules that go by the calls alone, 4 to 6, keep only the pods already
half-way through their admission if there are any):

1. no candidate: re-list the node's pods from the API server and retry; still none is an error;
2. while every candidate still expects a GPU-resource call, the plugin answers with an empty response and waits
   for it: the GPU set is the strongest evidence and the container's own call will bring it;
3. kubelet is asked: its pod-resources API (deviceplugin/podresources.py) lists the pod it is admitting, whose
   container holds no device of this resource yet. If that names one candidate (or *interchangeable* ones: the
   same remaining segments - GPU UUIDs, memory, cores - and the same per-container limits and
   `CUDA_DISABLE_CONTROL` setting for the rest of the pod), the oldest of them (creationTimestamp, then
   namespace/name) is chosen. Any choice among twins gives the container identical limits; only the
   per-container cache directory `<podUID>_<container>` carries the chosen twin's UID, and it stays distinct per
   container. If kubelet names none of C, the pod it admits is one the pod cache does not show yet (the watch
   lags the bind): the pods are read from the API server and the rule starts again;
4. kubelet cannot be asked (or names none even then): candidates that are interchangeable are chosen once the
   container's calls are over, or earlier on a list read from the API server just now (the cache could be
   missing the pod kubelet admits, with other limits on the same GPUs);
5. candidates whose limits differ and that all still expect another call: answer empty and wait for it (a
   memory or cores count separates them);
6. otherwise (the limits differ and no call is left to tell them apart) the call is refused with a message naming
   the pods; kubelet fails that pod.

GetPreferredAllocation steers kubelet to the GPUs of the fitting candidate kubelet's pod-resources API names (the
oldest fitting candidate when it cannot be asked), reading the pods from the API server once more when the cache
holds none (the cache may lag the bind).

The container's env, mounts and device specs are returned exactly once, on the call that fixes the match;
kubelet merges the responses of all resources of a container, so it does not matter which resource carries
them. The other calls of the sequence get empty responses. Each answered container consumes one segment of
`volcano.sh/devices-to-allocate`; after the last one the pod gets `bind-phase=success`.

The response is the contract's (../shared/compat/CONTRACT.md, "Device plugin"), byte-compatible with
volcano-vgpu-device-plugin under the default options; the NVIDIA device-plugin options (device list strategy,
device ID strategy, pass-device-specs) change how the GPUs are named to the container runtime
(docs/deviceplugin-options.md). Per-container cache directories are created, never deleted while their pod
exists; `collect_garbage` removes the ones of pods that are gone.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from vgpu import assignment, keys
from vgpu.errors import CodecError, RequestError, VGPUError
from vgpu.quantity import parse_integer_quantity
from vgpu.requests import ContainerRequest, gpu_containers, pod_requests
from vgpu.resources import SharingConfig

__all__ = [
    "CDI_ANNOTATION",
    "GPUS",
    "LIBVGPU_CONTAINER_PATH",
    "Allocation",
    "AllocationError",
    "Allocator",
    "ContainerGrant",
    "PodSource",
    "ResponseOptions",
]

log = logging.getLogger(__name__)

LIBVGPU_CONTAINER_PATH = "/usr/local/vgpu/libvgpu.so"
CACHE_CONTAINER_DIR = "/tmp/vgpu"
LOCK_CONTAINER_DIR = "/tmp/vgpulock"
PRELOAD_CONTAINER_PATH = "/etc/ld.so.preload"
DISABLE_CONTROL_ENV = "CUDA_DISABLE_CONTROL"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
CDI_ANNOTATION = "cdi.k8s.io/vgpu-sharing"
CDI_KIND = "nvidia.com/gpu"
# Kinds of resource: GPUS (kubelet's IDs name the GPUs), MEMORY and CORES (only the count matters).
GPUS, MEMORY, CORES = "gpus", "memory", "cores"
# A sequence whose last call is older than this is over whatever it expected (kubelet's calls for one container
# come back to back; this only guards against a kubelet that gave up half-way).
SEQUENCE_TIMEOUT = 30.0


class AllocationError(VGPUError):
    """Kubelet's request cannot be matched to exactly one waiting container."""


class KubeletView(Protocol):
    """What kubelet itself says about its pods (vgpu.deviceplugin.podresources.KubeletPods)."""

    def assigned(self) -> Mapping[tuple[str, str], Mapping[str, Mapping[str, frozenset[str]]]] | None:
        """(namespace, name) -> container -> resource -> device IDs; None when kubelet cannot be asked."""
        ...


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
class ResponseOptions:
    """How granted GPUs are named to the container runtime (NVIDIA device-plugin options)."""

    device_list_strategy: tuple[str, ...] = ("envvar",)
    device_id_strategy: str = "uuid"
    pass_device_specs: bool = False
    driver_root: str = "/"
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
    grants: tuple[assignment.DeviceGrant, ...]
    segments: assignment.Assignment
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


@dataclass(frozen=True, slots=True)
class _Call:
    """One Allocate call of a container: the resource, and the GPUs (GPU kind) or the ID count."""

    resource: str
    kind: str
    gpus: tuple[str, ...]
    count: int


@dataclass(frozen=True, slots=True)
class _Candidate:
    pod: dict[str, Any]
    uid: str
    segments: assignment.Assignment
    requests: tuple[ContainerRequest, ...]
    next_index: int
    in_progress: bool
    expected: Mapping[str, int]  # resource name -> quantity, for our resources the next container asks for
    same_as: tuple  # equal for interchangeable candidates

    @property
    def key(self) -> str:
        meta = self.pod.get("metadata") or {}
        return f"{meta.get('namespace', '')}/{meta.get('name', '')}"

    @property
    def order(self) -> tuple[str, str]:
        meta = self.pod.get("metadata") or {}
        return (str(meta.get("creationTimestamp") or ""), self.key)


@dataclass(slots=True)
class _Sequence:
    """The Allocate calls of the container kubelet is admitting now."""

    calls: list[_Call]
    last_call: float
    decided: _Candidate | None = None


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def _container_spec(pod: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    return next((c for c, _ in gpu_containers(pod) if c.get("name") == name), {})


def _listing(items: list[str], separator: str, most: int = 8) -> str:
    """At most `most` items joined, then how many more there are (error messages stay readable and small)."""
    shown = separator.join(items[:most])
    return shown if len(items) <= most else f"{shown}{separator}and {len(items) - most} more"


def _interchangeable(candidates: list[_Candidate]) -> bool:
    """Would any of these candidates give the container kubelet admits the same limits?"""
    return len({c.same_as for c in candidates}) == 1


def _disables_control(spec: Mapping[str, Any]) -> bool:
    return any(isinstance(e, Mapping) and e.get("name") == DISABLE_CONTROL_ENV for e in spec.get("env") or ())


class Allocator:
    """Matches kubelet's Allocate calls to containers and answers them; thread-safe."""

    def __init__(
        self,
        node_name: str,
        sharing: SharingConfig,
        pods: PodSource,
        hook_path: str,
        lock_dir: str = LOCK_CONTAINER_DIR,
        core_policy: str | None = None,
        resource_kinds: Mapping[str, str] | None = None,
        options: ResponseOptions | None = None,
        recorder: Any = None,
        clock: Callable[[], float] = time.monotonic,
        kubelet: KubeletView | None = None,
    ) -> None:
        self.node_name = node_name
        self.sharing = sharing
        self.factor = sharing.gpu_memory_factor
        self.source = pods
        self.hook_path = Path(hook_path)
        self.lock_dir = lock_dir
        self.core_policy = core_policy
        self.kinds: dict[str, str] = dict(resource_kinds or {
            sharing.resources.number: GPUS, sharing.resources.memory: MEMORY, sharing.resources.cores: CORES,
        })
        self.options = options or ResponseOptions()
        self.recorder = recorder
        self.clock = clock
        self.kubelet = kubelet
        self._lock = threading.Lock()
        # pod uid -> segment indexes answered by this process (covers a cache that has not seen our patch yet)
        self._consumed: dict[str, set[int]] = {}
        self._missing_candidates: list[_Candidate] = []
        self._ambiguous: list[_Candidate] = []
        self._parsed: dict[tuple[str, str, frozenset[int]], _Candidate | None] = {}
        self._sequence: _Sequence | None = None

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

    def _expected(self, spec: Mapping[str, Any]) -> dict[str, int]:
        resources = spec.get("resources") or {}
        merged = dict(resources.get("requests") or {})
        merged.update(resources.get("limits") or {})
        expected = {}
        for name in self.kinds:
            if name in merged:
                try:
                    quantity = parse_integer_quantity(merged[name])
                except (VGPUError, ValueError):
                    continue
                if quantity > 0:
                    expected[name] = quantity
        return expected

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
        rest = []
        expected: dict[str, int] = {}
        for i in range(next_index, len(segments)):
            if not segments[i] or i in done:
                continue
            spec = _container_spec(pod, requests[i].container) if i < len(requests) else {}
            wants = self._expected(spec)
            if i == next_index:
                expected = wants
            rest.append((i - next_index, tuple((g.uuid, g.memory, g.cores) for g in segments[i]),
                         tuple(sorted(wants.items())), _disables_control(spec)))
        return _Candidate(pod, uid, segments, requests, next_index, in_progress, expected, tuple(rest))

    def _candidates(self, pods: list[dict[str, Any]]) -> list[_Candidate]:
        found = [c for c in (self._candidate(p) for p in pods) if c is not None]
        # kubelet admits pods in creation order; keep that order for choices, hints and messages
        found.sort(key=lambda c: c.order)
        return found

    def _fits(self, candidate: _Candidate, call: _Call) -> bool:
        """Is this call one that the candidate's next container makes?"""
        quantity = candidate.expected.get(call.resource)
        if quantity is None:
            return False
        if call.kind == GPUS:
            segment = candidate.segments[candidate.next_index]
            return len(call.gpus) == len(segment) and set(call.gpus) == {g.uuid for g in segment}
        return call.count == quantity

    def _consistent(self, candidates: list[_Candidate], calls: Sequence[_Call] = ()) -> list[_Candidate]:
        """The candidates these calls fit; only those half-way through their admission if there are any."""
        matching = [c for c in candidates if all(self._fits(c, call) for call in calls)]
        busy = [c for c in matching if c.in_progress]
        return busy or matching

    def _admitting(self, candidates: list[_Candidate], resource: str) -> list[_Candidate] | None:
        """The candidates kubelet is admitting now (pod listed by its pod-resources API, next container holding no
        `resource` devices yet); None when kubelet cannot be asked."""
        listed = self.kubelet.assigned() if self.kubelet is not None else None
        if listed is None:
            return None
        found = []
        for c in candidates:
            containers = listed.get((str(_meta(c.pod).get("namespace") or ""), str(_meta(c.pod).get("name") or "")))
            if containers is None:
                continue
            name = c.requests[c.next_index].container if c.next_index < len(c.requests) else ""
            if not (containers.get(name) or {}).get(resource):
                found.append(c)
        return found

    # GetPreferredAllocation -----------------------------------------------------------------------------------
    def preferred_gpus(self, resource: str, size: int, available_uuids: set[str]) -> list[str] | None:
        """GPU UUIDs of the container kubelet most likely admits next (a hint only), or None.

        Among the fitting pods, the one kubelet says it is admitting wins. When the pod cache holds none (it may lag
        the bind), the pods are read from the API server once more."""
        with self._lock:
            fitting: list[_Candidate] = []
            for attempt in range(2):
                candidates = self._candidates(self.source.pods() if attempt == 0 else self.source.refresh())
                sequence = self._open_sequence()
                if sequence is not None and sequence.decided is None:
                    candidates = self._consistent(candidates, sequence.calls) or candidates
                fitting = [
                    c for c in candidates
                    if len(c.segments[c.next_index]) == size
                    and all(g.uuid in available_uuids for g in c.segments[c.next_index])
                ]
                admitting = self._admitting(fitting, resource) if fitting else []
                if admitting:
                    fitting = admitting
                    break
                if fitting and admitting is None:
                    break  # kubelet cannot be asked: the cache's oldest fitting pod
        fitting.sort(key=lambda c: not c.in_progress)  # a pod in the middle of admission comes first
        if not fitting:
            return None
        return [g.uuid for g in fitting[0].segments[fitting[0].next_index]]

    # sequences ---------------------------------------------------------------------------------------------------
    def _open_sequence(self) -> _Sequence | None:
        sequence = self._sequence
        if sequence is not None and self.clock() - sequence.last_call > SEQUENCE_TIMEOUT:
            self._close(sequence, "timed out")
            return None
        return sequence

    def _close(self, sequence: _Sequence, why: str) -> None:
        if sequence.decided is None:
            log.error(
                "event=sequence_abandoned calls=%s reason=%s: kubelet's calls for a container ended before it "
                "could be matched; that container got no vGPU limits",
                ",".join(f"{c.resource}:{c.count}" for c in sequence.calls), why,
            )
        if self._sequence is sequence:
            self._sequence = None

    def _belongs(self, sequence: _Sequence, call: _Call) -> bool:
        if any(c.resource == call.resource for c in sequence.calls):
            return False  # each container calls once per resource: this is the next container
        if sequence.decided is not None:
            return self._fits(sequence.decided, call)
        calls = [*sequence.calls, call]
        return bool(self._consistent(self._candidates(self.source.pods()), calls)
                    or self._consistent(self._candidates(self.source.refresh()), calls))

    # Allocate -------------------------------------------------------------------------------------------------
    def _choose(self, calls: list[_Call]) -> _Candidate | None:
        """The candidate these calls identify, None to wait for the container's next call; raises AllocationError."""
        last_error = ""
        for attempt in range(2):
            fresh = attempt == 1
            candidates = self._candidates(self.source.refresh() if fresh else self.source.pods())
            fitting = [c for c in candidates if all(self._fits(c, call) for call in calls)]
            self._missing_candidates = []
            if not fitting:
                waiting = _listing([
                    f"{c.key}[{c.next_index}]={sorted(g.uuid for g in c.segments[c.next_index])}{dict(c.expected)}"
                    for c in candidates
                ], ", ") or "none"
                seen = ", ".join(
                    f"{c.resource}=GPUs {sorted(c.gpus)}" if c.kind == GPUS else f"{c.resource}={c.count}"
                    for c in calls
                )
                last_error = (
                    f"node {self.node_name}: no pod with bind-phase=allocating waits for a container with {seen} "
                    f"(waiting: {waiting})"
                )
                self._missing_candidates = candidates
                continue
            seen_resources = {c.resource for c in calls}

            def pending(c: _Candidate, seen: set[str] = seen_resources) -> set[str]:
                return set(c.expected) - seen

            if all(any(self.kinds.get(r) == GPUS for r in pending(c)) for c in fitting):
                return None  # every candidate still makes its GPU call: wait for the GPU set
            admitting = self._admitting(fitting, calls[-1].resource)
            if admitting and _interchangeable(admitting):
                if len(fitting) > 1:
                    log.info("event=matched_by_kubelet chosen=%s others=%s", admitting[0].key,
                             ",".join(c.key for c in fitting if c is not admitting[0]))
                return admitting[0]  # the oldest of what kubelet names: it admits pods in creation order
            if admitting == [] and not fresh:
                continue  # kubelet admits a pod the cache does not show yet: read the pods from the API server
            matches = self._consistent(fitting)
            if _interchangeable(matches):
                if fresh or not pending(matches[0]):
                    if len(matches) > 1:
                        log.info("event=interchangeable_candidates chosen=%s others=%s", matches[0].key,
                                 ",".join(c.key for c in matches[1:]))
                    return matches[0]
                if admitting is None:
                    continue  # decide before the container's last call only on a fresh list
            if all(pending(c) for c in matches):
                return None  # every candidate expects another call: it brings more evidence
            names = _listing([
                f"{c.key} (segment {c.next_index}: "
                f"{','.join(f'{g.uuid}/{g.memory}/{g.cores}' for g in c.segments[c.next_index])}, "
                f"limits {dict(c.expected)})" for c in matches
            ], "; ")
            self._ambiguous = matches
            raise AllocationError(
                f"node {self.node_name}: the Allocate calls of this container ("
                f"{', '.join(c.resource for c in calls)}) match the next container of several pods whose limits "
                f"differ, and no call is left to tell them apart: {names}; "
                + ("kubelet's pod-resources API could not be read" if admitting is None else
                   f"kubelet's pod-resources API lists {len(admitting)} of them as being admitted")
            )
        raise AllocationError(last_error)

    def _grant(self, candidate: _Candidate) -> ContainerGrant:
        index = candidate.next_index
        if index >= len(candidate.requests):
            raise AllocationError(
                f"pod {candidate.key}: devices-to-allocate has segment {index} but the pod has only "
                f"{len(candidate.requests)} GPU containers"
            )
        name = candidate.requests[index].container
        disable = _disables_control(_container_spec(candidate.pod, name))
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

    def _device_id(self, uuid: str) -> str:
        if self.options.device_id_strategy == "index":
            numbers = self.options.gpu_numbers.get(uuid)
            if numbers is not None:
                return str(numbers[0])
        return uuid

    def response_parts(self, grant: ContainerGrant) -> Allocation:
        """Env, mounts, device specs and annotations for one container, per the contract and the options."""
        envs: dict[str, str] = {}
        uuids: list[str] = []
        for g in grant.grants:
            if g.uuid not in uuids:
                uuids.append(g.uuid)
        ids = [self._device_id(u) for u in uuids]
        strategies = self.options.device_list_strategy
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
        mounts.extend(extra_mounts)
        devices: list[tuple[str, str, str]] = []
        if self.options.pass_device_specs:
            root = self.options.driver_root

            def host(path: str) -> str:
                return os.path.normpath(os.path.join(root, path.lstrip("/")))

            for path in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
                devices.append((path, host(path), "rw"))
            for u in uuids:
                minor = self.options.gpu_numbers.get(u, (0, 0))[1]
                devices.append((f"/dev/nvidia{minor}", host(f"/dev/nvidia{minor}"), "rw"))
        return Allocation(grant, envs, mounts, devices, annotations)

    def install_library(self, source: Path) -> bool:
        """Copy libvgpu.so to $HOOK_PATH/vgpu/libvgpu.so when the content differs; True if it was written.

        Written to a temporary file and renamed over the old one: containers that bind-mounted the old file keep
        its inode, so a library in use is never changed under a running process."""
        data = source.read_bytes()
        target = self.vgpu_root / "libvgpu.so"
        try:
            if target.read_bytes() == data:
                return False
        except FileNotFoundError:
            pass
        self.vgpu_root.mkdir(parents=True, exist_ok=True)
        tmp = self.vgpu_root / f".libvgpu.so.{os.getpid()}.tmp"
        try:
            tmp.write_bytes(data)
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return True

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

    def allocate_call(self, resource: str, gpu_uuids: list[str] | None = None, count: int = 0) -> Allocation | None:
        """One Allocate call of one container: its Allocation if this call fixes the match, else None (empty
        response). Raises AllocationError when the call cannot belong to any waiting container."""
        kind = self.kinds.get(resource)
        if kind is None:
            raise AllocationError(f"node {self.node_name}: resource {resource} is not one of ours")
        if kind == GPUS:
            gpus = tuple(gpu_uuids or ())
            if len(set(gpus)) != len(gpus):
                raise AllocationError(
                    f"node {self.node_name}: kubelet chose several {resource} devices of one GPU {sorted(gpus)}; "
                    "each GPU of a container must be distinct"
                )
            call = _Call(resource, kind, gpus, len(gpus))
        else:
            call = _Call(resource, kind, (), count)
        with self._lock:
            self._missing_candidates = []
            self._ambiguous = []
            sequence = self._open_sequence()
            if sequence is not None and not self._belongs(sequence, call):
                self._close(sequence, f"next call {resource} belongs to another container")
                sequence = None
            if sequence is not None and sequence.decided is not None:
                sequence.calls.append(call)
                sequence.last_call = self.clock()
                self._maybe_finish(sequence)
                return None  # the container's env went out on an earlier call
            calls = [*(sequence.calls if sequence else ()), call]
            try:
                chosen = self._choose(calls)
            except AllocationError as exc:
                self._sequence = None
                lone = self._missing_candidates
                if len(lone) == 1:
                    self._mark_failed(lone[0].pod, str(exc))
                elif self.recorder is not None:
                    for candidate in self._ambiguous:
                        self.recorder.warning(candidate.pod, "VGPUAllocationAmbiguous", str(exc)[:1000])
                raise
            if chosen is None:
                self._sequence = _Sequence(calls, self.clock())
                log.debug("event=allocate_deferred calls=%d", len(calls))
                return None
            grant = self._grant(chosen)
            allocation = self.response_parts(grant)
            self.prepare_host(grant)
            self._consumed.setdefault(grant.pod_uid, set()).add(grant.segment_index)
            self._record(grant)
            self._sequence = _Sequence(calls, self.clock(), decided=chosen)
            self._maybe_finish(self._sequence)
            return allocation

    def _maybe_finish(self, sequence: _Sequence) -> None:
        if sequence.decided is not None and set(sequence.decided.expected) <= {c.resource for c in sequence.calls}:
            self._sequence = None

    def allocate(self, gpu_uuids: list[str]) -> Allocation:
        """A GPU-resource call that must fix the match on its own (kept for tools and tests)."""
        allocation = self.allocate_call(self.sharing.resources.number, gpu_uuids)
        if allocation is None:
            raise AllocationError(f"node {self.node_name}: GPUs {sorted(gpu_uuids)} need the container's other calls")
        return allocation

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

    def _mark_failed(self, pod: dict[str, Any], message: str) -> None:
        meta = _meta(pod)
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
