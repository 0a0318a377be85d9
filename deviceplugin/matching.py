"""Which container is kubelet admitting? Matching kubelet's Allocate calls to the pods the scheduler placed.

Kubelet's Allocate passes fake device IDs, never the pod. A candidate is a pod pending on this node with
`bind-phase=allocating`, `vgpu-node` = this node, whose next unanswered GPU container (next segment of
`volcano.sh/devices-to-allocate`) is consistent with every Allocate call seen so far for the container being
admitted. The calls of one container form a sequence; the matcher narrows the candidates call by call, asks
kubelet's pod-resources API which pod it admits when the calls alone cannot tell, and re-reads the pods from the
API server when its cache lags. The rules, their order and why are in docs/deviceplugin-matching.md.

Used by deviceplugin.allocator; callers hold `Matcher.lock` around `match`, `consume` and `forget`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from vgpu import assignment, grants, keys
from vgpu.assignment import Assignment
from vgpu.errors import CodecError, RequestError, VGPUError
from vgpu.node.response import DISABLE_CONTROL_ENV, ContainerGrant, reserved_env
from vgpu.quantity import parse_integer_quantity
from vgpu.requests import ContainerRequest, gpu_containers, pod_requests
from vgpu.resources import SharingConfig

__all__ = ["CORES", "GPUS", "MEMORY", "AllocationError", "Call", "GrantRules", "KubeletView", "Matcher", "PodSource"]

log = logging.getLogger(__name__)

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
        """Pods on this node read from the API server now (the cache's view when that fails)."""
        ...

    def list_fresh(self) -> list[dict[str, Any]]:
        """Pods on this node read from the API server now; raises when it cannot answer."""
        ...

    def patch_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        """Merge-patch pod annotations (None deletes a key)."""
        ...


@dataclass(frozen=True, slots=True)
class Call:
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
    same_as: tuple[Any, ...]  # equal for interchangeable candidates

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

    calls: list[Call]
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


@dataclass(frozen=True, slots=True)
class GrantRules:
    """What makes a waiting pod's assignment acceptable on this node (docs/security.md).

    `scheduler_names`: the schedulers whose pods may be given GPUs here; `card_memory`: this node's GPUs, UUID ->
    memory units; `key`: the key the scheduler signs assignments with (None: no signatures), `accept_unsigned`: also
    take pods without a signature (clusters that mix in a scheduler that does not sign);
    `disable_control_namespaces`: where a container may run without the isolation library (CUDA_DISABLE_CONTROL)."""

    scheduler_names: frozenset[str]
    card_memory: Mapping[str, int]
    key: grants.GrantKey | None = None
    accept_unsigned: bool = False
    disable_control_namespaces: frozenset[str] = frozenset()

    def refusal(self, pod: Mapping[str, Any], node: str, segments: assignment.Assignment,
                requests: Sequence[ContainerRequest]) -> str:
        """Why this pod's assignment must not be served here ("" when it may)."""
        scheduler = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
        if scheduler not in self.scheduler_names:
            return f"the pod's schedulerName {scheduler!r} is not one of {sorted(self.scheduler_names)}"
        annotations = _meta(pod).get("annotations") or {}
        if self.key is not None:
            signature = annotations.get(grants.SIGNATURE)
            full = annotations.get(keys.VGPU_IDS, "")
            if signature is None and not self.accept_unsigned:
                return f"the assignment carries no scheduler signature ({grants.SIGNATURE})"
            if signature is not None:
                if not self.key.verify(signature, str(_meta(pod).get("uid") or ""), node, full):
                    return "the scheduler signature does not match the pod, node and assignment"
                try:
                    signed = assignment.decode(full)
                except CodecError as exc:
                    return f"the signed assignment does not parse: {exc}"
                for i, segment in enumerate(segments):
                    if segment and (i >= len(signed) or segment != signed[i]):
                        return f"devices-to-allocate segment {i} is not the signed assignment's"
        found = grants.violations(segments, requests, self.card_memory)
        asking = {r.container for r in requests}
        for container, _ in gpu_containers(pod):
            if container.get("name") not in asking:
                continue
            names = sorted({str(e.get("name")) for e in container.get("env") or ()
                            if isinstance(e, Mapping) and reserved_env(str(e.get("name")))})
            if names:
                found.append(f"container {container.get('name')!r} sets {', '.join(names)} in its env, which would "
                             "override the limits the device plugin hands out")
        return "; ".join(found)

    def disables_control(self, pod: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
        """Whether the container runs without the isolation library: it sets CUDA_DISABLE_CONTROL=true and its
        namespace is one where that is allowed (any other value, or another namespace, keeps the library)."""
        values = [e.get("value") for e in spec.get("env") or ()
                  if isinstance(e, Mapping) and e.get("name") == DISABLE_CONTROL_ENV]
        if not values or values[-1] != "true":
            return False
        return str(_meta(pod).get("namespace") or "") in self.disable_control_namespaces


class Matcher:
    """Matches the Allocate calls of the container kubelet admits to one waiting pod's next container."""

    def __init__(
        self,
        node_name: str,
        sharing: SharingConfig,
        pods: PodSource,
        *,
        resource_kinds: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        kubelet: KubeletView | None = None,
        rules: GrantRules,
        on_refused: Callable[[dict[str, Any], str], None] | None = None,
    ) -> None:
        self.node_name = node_name
        self.sharing = sharing
        self.source = pods
        self.kinds: dict[str, str] = dict(resource_kinds or {
            sharing.resources.number: GPUS, sharing.resources.memory: MEMORY, sharing.resources.cores: CORES,
        })
        self.clock = clock
        self.kubelet = kubelet
        self.rules = rules
        self.on_refused = on_refused
        self.lock = threading.Lock()
        # pod uid -> segment indexes answered by this process (covers a cache that has not seen our patch yet)
        self._consumed: dict[str, set[int]] = {}
        self.missing_candidates: list[_Candidate] = []  # after a failed match: the pods that were waiting
        self.ambiguous: list[_Candidate] = []  # after a failed match: the pods the calls could not tell apart
        self._parsed: dict[tuple[str, str, frozenset[int]], _Candidate | None] = {}
        self._refusals: dict[str, str] = {}  # pod uid -> "ns/name: why its assignment is refused"
        self._sequence: _Sequence | None = None
        self._pending: _Sequence | None = None  # the sequence a returned grant decides, once it is recorded

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
        refusal = self.rules.refusal(pod, self.node_name, segments, requests)
        if refusal:
            log.warning("event=grant_refused pod=%s/%s reason=%r", meta.get("namespace"), meta.get("name"), refusal)
            self._refusals[uid] = f"{meta.get('namespace')}/{meta.get('name')}: {refusal}"
            if self.on_refused is not None:
                self.on_refused(pod, refusal)
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
                         tuple(sorted(wants.items())), self.rules.disables_control(pod, spec)))
        return _Candidate(pod, uid, segments, requests, next_index, in_progress, expected, tuple(rest))

    def _candidates(self, pods: list[dict[str, Any]]) -> list[_Candidate]:
        found = [c for c in (self._candidate(p) for p in pods) if c is not None]
        # kubelet admits pods in creation order; keep that order for choices, hints and messages
        found.sort(key=lambda c: c.order)
        return found

    def _fits(self, candidate: _Candidate, call: Call) -> bool:
        """Is this call one that the candidate's next container makes?"""
        quantity = candidate.expected.get(call.resource)
        if quantity is None:
            return False
        if call.kind == GPUS:
            segment = candidate.segments[candidate.next_index]
            return len(call.gpus) == len(segment) and set(call.gpus) == {g.uuid for g in segment}
        return call.count == quantity

    def _consistent(self, candidates: list[_Candidate], calls: Sequence[Call] = ()) -> list[_Candidate]:
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

    def _admitted_elsewhere(self, candidates: list[_Candidate], resource: str) -> list[str]:
        """Pods of this node asking `resource` that kubelet's pod-resources API lists while they hold none of it,
        other than the candidates: whom kubelet admits instead (for the message)."""
        listed = self.kubelet.assigned() if self.kubelet is not None else None
        mine = {c.key for c in candidates}
        found = []
        for pod in self.source.pods():
            meta = _meta(pod)
            where = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
            key = f"{where[0]}/{where[1]}"
            containers = (listed or {}).get(where)
            if key in mine or containers is None:
                continue
            asks = [c for c in (pod.get("spec") or {}).get("containers") or ()
                    if isinstance(c, Mapping) and any(resource in ((c.get("resources") or {}).get(table) or {})
                                                      for table in ("limits", "requests"))]
            if any(not (containers.get(str(c.get("name") or "")) or {}).get(resource) for c in asks):
                found.append(f"{key} (schedulerName {(pod.get('spec') or {}).get('schedulerName')!r})")
        return found

    # GetPreferredAllocation -----------------------------------------------------------------------------------
    def preferred_gpus(self, resource: str, size: int, available_uuids: set[str]) -> list[str] | None:
        """GPU UUIDs of the container kubelet most likely admits next (a hint only), or None.

        Among the fitting pods, the one kubelet says it is admitting wins. When the pod cache holds none (it may lag
        the bind), the pods are read from the API server once more."""
        with self.lock:
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

    def _belongs(self, sequence: _Sequence, call: Call) -> bool:
        if any(c.resource == call.resource for c in sequence.calls):
            return False  # each container calls once per resource: this is the next container
        if sequence.decided is not None:
            return self._fits(sequence.decided, call)
        calls = [*sequence.calls, call]
        return bool(self._consistent(self._candidates(self.source.pods()), calls)
                    or self._consistent(self._candidates(self.source.refresh()), calls))

    # Allocate -------------------------------------------------------------------------------------------------
    def _choose(self, calls: list[Call]) -> _Candidate | None:
        """The candidate these calls identify, None to wait for the container's next call; raises AllocationError."""
        last_error = ""
        for attempt in range(2):
            fresh = attempt == 1
            pods = self.source.refresh() if fresh else self.source.pods()
            candidates = self._candidates(pods)
            fitting = [c for c in candidates if all(self._fits(c, call) for call in calls)]
            self.missing_candidates = []
            if not fitting:
                waiting = _listing([
                    f"{c.key}[{c.next_index}]={sorted(g.uuid for g in c.segments[c.next_index])}{dict(c.expected)}"
                    for c in candidates
                ], ", ") or "none"
                seen = ", ".join(
                    f"{c.resource}=GPUs {sorted(c.gpus)}" if c.kind == GPUS else f"{c.resource}={c.count}"
                    for c in calls
                )
                refused = _listing([self._refusals[u] for u in (str(_meta(p).get("uid") or "") for p in pods)
                                    if u in self._refusals], "; ", most=3)
                last_error = (
                    f"node {self.node_name}: no pod with bind-phase=allocating waits for a container with {seen} "
                    f"(waiting: {waiting})" + (f"; the device plugin refuses {refused}" if refused else "")
                )
                self.missing_candidates = candidates
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
            others = self._admitted_elsewhere(candidates, calls[-1].resource) if admitting == [] else []
            if others:
                # kubelet lists none of the pods these calls fit as being admitted, and does list another pod asking
                # this resource without devices yet: that one (no grant of ours: another scheduler's) is admitted,
                # and must not take the grant of a pod that waits
                raise AllocationError(
                    f"node {self.node_name}: kubelet's pod-resources API lists none of the pods waiting for these "
                    f"calls ({_listing([c.key for c in fitting], ', ')}) as being admitted; it admits "
                    f"{_listing(others, ', ')}, which holds no grant of "
                    f"{'/'.join(sorted(self.rules.scheduler_names))}: refused, so that no pod takes a grant made "
                    "for another")
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
            self.ambiguous = matches
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
        disable = self.rules.disables_control(candidate.pod, _container_spec(candidate.pod, name))
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


    # one Allocate call ----------------------------------------------------------------------------------------
    def make_call(self, resource: str, gpu_uuids: Sequence[str] = (), count: int = 0) -> Call:
        """A call of `resource` with the GPUs behind kubelet's IDs (GPU resources) or the number of IDs."""
        kind = self.kinds.get(resource)
        if kind is None:
            raise AllocationError(f"node {self.node_name}: resource {resource} is not one of ours")
        if kind != GPUS:
            return Call(resource, kind, (), count)
        gpus = tuple(gpu_uuids)
        if len(set(gpus)) != len(gpus):
            raise AllocationError(
                f"node {self.node_name}: kubelet chose several {resource} devices of one GPU {sorted(gpus)}; "
                "each GPU of a container must be distinct"
            )
        return Call(resource, kind, gpus, len(gpus))

    def match(self, call: Call) -> ContainerGrant | None:
        """The grant of the container this call fixes, or None (the container's answer went out on an earlier call,
        or its next call must tell); raises AllocationError, with `missing_candidates` / `ambiguous` set. After a
        grant, `consume` then `settle` once the grant is recorded."""
        self.missing_candidates = []
        self.ambiguous = []
        self._pending = None
        sequence = self._open_sequence()
        if sequence is not None and not self._belongs(sequence, call):
            self._close(sequence, f"next call {call.resource} belongs to another container")
            sequence = None
        if sequence is not None and sequence.decided is not None:
            sequence.calls.append(call)
            sequence.last_call = self.clock()
            self._maybe_finish(sequence)
            return None
        calls = [*(sequence.calls if sequence else ()), call]
        try:
            chosen = self._choose(calls)
        except AllocationError:
            self._sequence = None
            raise
        if chosen is None:
            self._sequence = _Sequence(calls, self.clock())
            log.debug("event=allocate_deferred calls=%d", len(calls))
            return None
        self._pending = _Sequence(calls, self.clock(), decided=chosen)
        return self._grant(chosen)

    def consume(self, grant: ContainerGrant) -> Assignment:
        """Count the grant's segment as answered; the segments still to answer after it."""
        done = self._consumed.setdefault(grant.pod_uid, set())
        done.add(grant.segment_index)
        return tuple(() if i in done else seg for i, seg in enumerate(grant.segments))

    def answered(self) -> frozenset[str]:
        """UIDs of the pods this process has answered a container of."""
        return frozenset(self._consumed)

    def settle(self) -> None:
        """The grant `match` returned is recorded: its container's other calls get empty answers."""
        if self._pending is not None:
            self._sequence, self._pending = self._pending, None
            self._maybe_finish(self._sequence)

    def _maybe_finish(self, sequence: _Sequence) -> None:
        if sequence.decided is not None and set(sequence.decided.expected) <= {c.resource for c in sequence.calls}:
            self._sequence = None

    def forget(self, live_uids: Collection[str]) -> None:
        """Drop what is remembered of pods no longer on the node."""
        for uid in [u for u in self._consumed if u not in live_uids]:
            del self._consumed[uid]
        for uid in [u for u in self._refusals if u not in live_uids]:
            del self._refusals[uid]
