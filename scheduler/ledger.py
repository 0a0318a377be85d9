"""The scheduler's view of the cluster: GPUs per node and what is charged on each of them.

Fed by the node and pod watch caches (`on_node`, `on_node_delete`, `on_pod`, `on_pod_delete`, each taking the
object as a plain API-JSON dict) and by the extender's own reservations (`reserve`, `mark_bound`, `release`).
Read by the extender on every /filter, /prioritize, /bind and /preempt, by the metrics collector and by
`vgpu inspect`.

Accounting is incremental: a pod event changes only the counters of the GPUs named in its `vgpu-ids-new`, so no
request ever walks the pods of the cluster. Every change to a node's devices or usage goes through
`NodeState.charge` / `set_devices`, which mark the node changed for the placement memo (scheduler.placement). The
CPU and memory that bound pods request are kept per node (kube-scheduler's arithmetic) for policies that read
node context.

A charge comes from one of two places:
- a pod of one of `scheduler_names` seen by the watch bound (`spec.nodeName`) with `vgpu-ids-new`, not yet
  Succeeded/Failed (OBSERVED; released on delete or a terminal phase). Its annotation is only a claim (pod authors
  can write it): it says on which GPUs, and each container is charged there what its own spec asks, so a pod
  can neither raise what others see as used nor lower its own charge; a claim that differs from the spec is
  reported to `grant_listeners` (vgpu.grants.violations). With a grant key, a claim without the scheduler's
  signature is reported too and leaves the ledger's own record of the pod in place. Pods of other schedulers and
  unbound pods are never charged from their annotations;
- the extender's own reservation, made at /filter (decide mode) or /bind (ASSUMED, short TTL) and kept after a
  successful bind until the watch shows the pod with its annotation (BOUND, long TTL);
- a nomination (NOMINATED): the room a pod is owed on GPUs whose lower-priority pods the extender is evicting for it
  (scheduler.preemption), counted as used while the victims are still charged too, until the pod is placed or the
  nomination's time runs out;
- a consolidation hold (NOMINATED too): a hold that `vgpu consolidate --execute` wrote into a node's
  `vgpu-sharing.io/consolidation-hold` (vgpu.holds), charged to the pending pod it names from the first node update
  that lists it until its `until` (wall clock; at most MAX_HOLD_SECONDS from then), so that the replacements of the
  pods evicted for it are not placed back into the room. A hold whose pod already has a charge of another kind
  (placed, bound, seen bound) is not charged; a hold the node stops listing, or the node's deletion, drops the pod's
  nomination on that node. A value that does not decode is logged once per node and problem and read as no holds.
Every charge carries its pod's priority (`spec.priority`, 0 when absent), for the choice of preemption victims.
A watch event without an assignment never removes one of our reservations: it may predate our own binding.
Reservations past their TTL are dropped by `expire`, which the extender calls on every request and the server's
housekeeping every second (vgpu.scheduler.server.create_app), so an idle extender's usage and metrics stay current.
All public methods are thread-safe (the watch caches call from their own threads).
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from vgpu import grants, keys
from vgpu.assignment import Assignment, salvage
from vgpu.errors import CodecError, RequestError
from vgpu.holds import MAX_HOLD_SECONDS, Hold, decode_holds
from vgpu.inventory import GPUDevice, decode_hami, decode_volcano
from vgpu.quantity import parse_integer_quantity, parse_quantity
from vgpu.requests import MAX_NODE_QUANTITY, pod_cpu_memory, pod_requests
from vgpu.resources import HAMI_NAMES, SCHEDULER_NAME, SharingConfig
from vgpu.scheduler.fit import GPUUsage
from vgpu.scheduler.nodestate import Grant, NodeState, flat_grants, with_topology
from vgpu.units import MIB

__all__ = [
    "NODE_UNKNOWN",
    "Charge",
    "ChargeState",
    "Ledger",
    "pod_key",
    "pod_priority",
]

log = logging.getLogger(__name__)

NODE_UNKNOWN = "node is not known to vgpu-scheduler (not in its node cache)"
EXPIRY_SLACK = 4096  # stale entries the expiry queue may hold beyond twice the live charges


class ChargeState:
    """Where a charge comes from (see the module docstring)."""

    ASSUMED = "assumed"
    BOUND = "bound"
    OBSERVED = "observed"
    NOMINATED = "nominated"


@dataclass(slots=True)
class Charge:
    """What one pod holds on one node: (uuid, memory units, cores) per granted device, containers flattened."""

    uid: str
    namespace: str
    name: str
    node: str
    grants: tuple[Grant, ...]
    assignment: Assignment
    state: str
    expires: float = 0.0
    priority: int = 0


def pod_priority(pod: Mapping[str, Any]) -> int:
    """A pod's `spec.priority` (set by the Priority admission plugin), 0 when absent or not an integer."""
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def pod_key(pod: Mapping[str, Any]) -> str:
    """The ledger's key of a pod: its UID, or namespace/name when the UID is missing."""
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    if uid:
        return str(uid)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def _signed(key: grants.GrantKey, pod: Mapping[str, Any], node: str, ids: str) -> bool:
    """Whether the pod's assignment carries the scheduler's signature for this pod and node."""
    meta = pod.get("metadata") or {}
    signature = (meta.get("annotations") or {}).get(grants.SIGNATURE)
    return key.verify(signature, str(meta.get("uid") or ""), node, ids)


def _allocatable_cpu_memory(allocatable: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """A node's allocatable CPU (milli) and memory (MiB, rounded down; each at most MAX_NODE_QUANTITY), None where
    absent or malformed."""
    out: list[int | None] = []
    for name, scale in (("cpu", 1000), ("memory", Fraction(1, MIB))):
        try:
            out.append(min(math.floor(parse_quantity(allocatable[name]) * scale), MAX_NODE_QUANTITY))
        except (KeyError, ValueError):
            out.append(None)
    return out[0], out[1]


def _allocatable_count(node: Mapping[str, Any], names: Iterable[str]) -> int:
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    best = 0
    for name in names:
        raw = allocatable.get(name)
        if raw is None:
            continue
        try:
            best = max(best, parse_integer_quantity(raw))
        except ValueError:
            continue
    return best


class Ledger:
    """Per-node devices and per-GPU usage, incrementally maintained; see the module docstring."""

    def __init__(
        self,
        config: SharingConfig | None = None,
        *,
        scheduler_names: frozenset[str] = frozenset({SCHEDULER_NAME}),
        assume_ttl: float = 30.0,
        bound_ttl: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        grant_key: grants.GrantKey | None = None,
    ) -> None:
        self.config = config or SharingConfig()
        self.grant_key = grant_key  # with a key, a claim whose signature fails keeps the ledger's own record
        self.assume_ttl = assume_ttl
        self.bound_ttl = bound_ttl
        self.clock = clock
        self.wall_clock = wall_clock  # what consolidation holds' `until` is compared with
        self.lock = threading.RLock()
        self.nodes: dict[str, NodeState] = {}
        self.charges: dict[str, Charge] = {}
        self._by_node: dict[str, set[str]] = {}
        self._holds: dict[str, dict[str, Hold]] = {}  # node -> the consolidation holds it lists, by pod uid
        self._hold_problems: dict[str, str] = {}  # node -> its hold annotation's problem, as last logged
        self._expiry: list[tuple[float, str]] = []
        # the GPU-count names a node's device plugin may advertise: HAMi's nvidia.com/gpu only where every
        # nvidia.com/gpu is ours (hami_names: all); otherwise it is NVIDIA's device plugin's whole GPUs
        self._number_names = tuple(n.number for n in self.config.name_sets()
                                   if n == self.config.resources or self.config.hami_mode() == "all")
        self.scheduler_names = scheduler_names
        self.pod_listeners: list[Callable[[Mapping[str, Any]], None]] = []  # called with every watched pod
        self.pod_gone_listeners: list[Callable[[Mapping[str, Any]], None]] = []  # called with every deleted pod
        # called with a pod and how its assignment differs from its spec, when its charge is made
        self.grant_listeners: list[Callable[[Mapping[str, Any], list[str]], None]] = []
        self._reported: dict[str, str] = {}  # pod uid -> the claim last reported as inconsistent
        self._compute: dict[str, tuple[str, int, int]] = {}  # pod -> (node, CPU milli, memory MiB) it takes
        self._requested: dict[str, list[int]] = {}  # node -> [CPU milli, memory MiB] its pods take
        self._ranked = True  # whether NodeState.rank is every node's position in name order
        self.version = object()  # replaced whenever a node comes, goes or changes whether it can take vGPU pods
        self.devices_version = 0  # bumped whenever a node comes, goes or publishes other GPUs

    # ------------------------------------------------------------------ nodes

    def on_node(self, node: Mapping[str, Any]) -> None:
        """Add or update a node from its API object (cheap no-op when nothing we read changed)."""
        meta = node.get("metadata") or {}
        name = meta.get("name")
        if not name:
            return
        annotations = meta.get("annotations") or {}
        volcano = annotations.get(keys.NODE_REGISTER)
        hami = annotations.get(keys.HAMI_NODE_REGISTER) if volcano is None else None
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        names = (*self._number_names, HAMI_NAMES.number, "cpu", "memory")
        alloc_raw = "|".join(str(allocatable.get(n)) for n in names)
        held = annotations.get(keys.CONSOLIDATION_HOLD)
        raw = (volcano, hami, alloc_raw, annotations.get(keys.NODE_TOPOLOGY), held)
        with self.lock:
            state = self.nodes.get(name)
            if state is not None and state.raw == raw:
                state.obj = node
                return
            devices, error = self._decode_node(node, volcano, hami)
            if state is None:
                state = NodeState(name=name)
                state.set_requested(*self._requested.get(name, (0, 0)))
                self.nodes[name] = state
                self._ranked = False
                self.version = object()
            state.raw = raw
            state.obj = node
            state.set_allocatable(*_allocatable_cpu_memory(allocatable))
            if devices != state.devices or error != state.error:
                if error:
                    log.info("node unschedulable node=%s reason=%r", name, error)
                self._rebuild(state, devices, error)
            self._set_holds(name, self._read_holds(name, held))

    def _decode_node(
        self, node: Mapping[str, Any], volcano: Any, hami: Any
    ) -> tuple[tuple[GPUDevice, ...], str]:
        if volcano is None and hami is None:
            return (), f"node has no vGPU inventory (annotation {keys.NODE_REGISTER} absent)"
        try:
            devices = decode_volcano(volcano) if volcano is not None else decode_hami(hami)
        except CodecError as exc:
            return (), f"node inventory annotation is malformed: {exc}"
        names = self._number_names if volcano is not None else (*self._number_names, HAMI_NAMES.number)
        if _allocatable_count(node, names) <= 0:
            return (), f"node allocatable {names[0]} is 0 or absent (device plugin not registered)"
        if not devices:
            return (), "node inventory annotation lists no GPUs"
        meta = node.get("metadata") or {}
        topology = (meta.get("annotations") or {}).get(keys.NODE_TOPOLOGY)
        return with_topology(str(meta.get("name") or ""), devices, topology), ""

    def _read_holds(self, node: str, value: Any) -> dict[str, Hold]:
        """The consolidation holds of a node's annotation (`value`; None: absent) by pod uid; none when it does not
        decode, which is logged once per node and problem (callers hold `lock`)."""
        if value is None:
            self._hold_problems.pop(node, None)
            return {}
        try:
            holds = decode_holds(value)
        except CodecError as exc:
            if self._hold_problems.get(node) != str(exc):
                self._hold_problems[node] = str(exc)
                log.warning("event=consolidation_hold_ignored node=%s error=%s", node, exc)
            return {}
        self._hold_problems.pop(node, None)
        return {hold.uid: hold for hold in holds}

    def _set_holds(self, node: str, holds: dict[str, Hold]) -> None:
        """Make the node's consolidation holds `holds`: a hold it no longer lists (or lists changed) gives up its
        pod's nomination on the node; a hold it lists for the first time (or changed) and whose time is not up is
        charged, replacing a nomination of its pod, unless the pod holds a charge of another kind. A hold listed as
        before is left as it is: its charge may since have been used or run out (callers hold `lock`)."""
        before = self._holds.pop(node, {})
        if holds:
            self._holds[node] = holds
        for uid, hold in before.items():
            charge = self.charges.get(uid)
            if (holds.get(uid) != hold and charge is not None and charge.state == ChargeState.NOMINATED
                    and charge.node == node):
                self._remove(uid)
        now = self.wall_clock()
        for uid, hold in holds.items():
            ttl = min(hold.until - now, MAX_HOLD_SECONDS)
            if before.get(uid) == hold or ttl <= 0:
                continue
            current = self.charges.get(uid)
            if current is not None and current.state != ChargeState.NOMINATED:
                continue
            log.info("event=consolidation_hold pod=%s/%s node=%s seconds=%.0f", hold.namespace, hold.name, node, ttl)
            self._reserve(uid, hold.namespace, hold.name, node, hold.assignment, 0, ChargeState.NOMINATED, ttl)

    def detached(self, node: Mapping[str, Any]) -> NodeState:
        """A NodeState built from a node object without storing it (for full-`Nodes` filter requests of nodes
        the cache does not know, e.g. Cluster Autoscaler templates); usage comes from charges on that name."""
        meta = node.get("metadata") or {}
        name = meta.get("name") or ""
        annotations = meta.get("annotations") or {}
        volcano = annotations.get(keys.NODE_REGISTER)
        hami = annotations.get(keys.HAMI_NODE_REGISTER) if volcano is None else None
        state = NodeState(name=name, obj=node)
        with self.lock:
            self._rebuild(state, *self._decode_node(node, volcano, hami))
        return state

    def on_node_delete(self, node: Mapping[str, Any]) -> None:
        """Forget a node; charges of pods on it are kept (they come back if the node does), except the nominations
        of its consolidation holds."""
        name = str((node.get("metadata") or {}).get("name") or "")
        with self.lock:
            self._set_holds(name, {})
            self._hold_problems.pop(name, None)
            if self.nodes.pop(name, None) is not None:
                self._ranked = False
                self.version = object()
                self.devices_version += 1

    def rank_nodes(self) -> bool:
        """Number the nodes in name order (`NodeState.rank`: placement gives equal scores to the lower name), if a
        node came or went since the last call; True when it did. Callers hold `lock`."""
        if self._ranked:
            return False
        for rank, name in enumerate(sorted(self.nodes)):
            self.nodes[name].rank = rank
        self._ranked = True
        return True

    def _rebuild(self, state: NodeState, devices: tuple[GPUDevice, ...], error: str) -> None:
        """New devices for a node: its usage is recounted from the charges on it."""
        if error != state.error:
            self.version = object()
        self.devices_version += 1
        state.set_devices(devices, error)
        for uid in self._by_node.get(state.name, ()):
            state.charge(self.charges[uid].grants)

    # ------------------------------------------------------------------ charges

    def _add(self, charge: Charge) -> None:
        self.charges[charge.uid] = charge
        self._by_node.setdefault(charge.node, set()).add(charge.uid)
        state = self.nodes.get(charge.node)
        if state is not None:
            state.charge(charge.grants)
        if charge.expires:
            self._expire_at(charge.expires, charge.uid)

    def _expire_at(self, when: float, uid: str) -> None:
        """Queue a look at `uid`'s charge at `when`.  Entries of charges since removed or re-timed are dropped when
        their time comes; when they outnumber the live ones, the queue is rebuilt from the charges, so that its size
        follows the charges that exist rather than the pods that came and went (caller holds the lock)."""
        heapq.heappush(self._expiry, (when, uid))
        if len(self._expiry) > 2 * len(self.charges) + EXPIRY_SLACK:
            self._expiry = [(c.expires, u) for u, c in self.charges.items() if c.expires]
            heapq.heapify(self._expiry)

    def _remove(self, uid: str) -> Charge | None:
        charge = self.charges.pop(uid, None)
        if charge is None:
            return None
        members = self._by_node.get(charge.node)
        if members is not None:
            members.discard(uid)
            if not members:
                del self._by_node[charge.node]
        state = self.nodes.get(charge.node)
        if state is not None:
            state.charge(charge.grants, -1)
        return charge

    def on_pod(self, pod: Mapping[str, Any]) -> None:
        """Account a pod from a watch add/update event."""
        for listener in self.pod_listeners:
            listener(pod)
        uid = pod_key(pod)
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        phase = (pod.get("status") or {}).get("phase")
        annotations = meta.get("annotations") or {}
        with self.lock:
            if phase in ("Succeeded", "Failed"):
                self._set_compute(uid, None)
                self._remove(uid)
                self._reported.pop(uid, None)
                return
            bound_to = spec.get("nodeName")
            self._set_compute(uid, (bound_to, *pod_cpu_memory(pod)) if bound_to else None)
            ids = annotations.get(keys.VGPU_IDS)
            node = bound_to
            current = self.charges.get(uid)
            ours = (spec.get("schedulerName") or "default-scheduler") in self.scheduler_names
            if not ids or not node or not ours:
                if current is not None and current.state == ChargeState.OBSERVED:
                    self._remove(uid)
                return
            assignment = salvage(ids)
            grants, problems = self._charged(pod, node, assignment)
            if self.grant_key is not None and not _signed(self.grant_key, pod, node, ids):
                problems.append("the assignment does not carry the scheduler's signature for this pod and node")
                if current is not None and current.node == node:
                    grants = current.grants  # what this extender decided (or a signed claim it saw) stands
            if problems and self._reported.get(uid) != ids:  # once per claim, whatever else the pod changes
                self._reported[uid] = ids
                log.warning("event=grant_inconsistent pod=%s/%s node=%s problems=%r", meta.get("namespace"),
                            meta.get("name"), node, problems)
                for report in self.grant_listeners:
                    report(pod, problems)
            priority = pod_priority(pod)
            if (
                current is not None
                and current.node == node
                and current.grants == grants
            ):
                current.priority = priority
                if current.state != ChargeState.OBSERVED:
                    current.state = ChargeState.OBSERVED
                    current.expires = 0.0
                return
            if current is not None:
                self._remove(uid)
            self._add(
                Charge(
                    uid=uid,
                    namespace=meta.get("namespace") or "default",
                    name=meta.get("name") or "",
                    node=node,
                    grants=grants,
                    assignment=assignment,
                    state=ChargeState.OBSERVED,
                    priority=priority,
                )
            )

    def _charged(self, pod: Mapping[str, Any], node: str,
                 assignment: Assignment) -> tuple[tuple[Grant, ...], list[str]]:
        """What a bound pod is charged: what each container's spec asks on the GPUs its claim names for it (at most
        as many GPUs as it asks; nothing for a claim no GPU container of the spec stands behind), whatever amounts
        the claim writes; and how the claim departs from the spec, either way (callers hold `lock`)."""
        try:
            requests = pod_requests(pod, self.config)
        except RequestError:
            requests = ()
        state = self.nodes.get(node)
        card = {d.uuid: d.memory for d in state.devices} if state is not None else {}
        problems = grants.violations(assignment, requests, card) if card else []
        charged = grants.spec_charges(assignment, requests, card)
        problems += grants.shortfalls(assignment, requests, card)
        return tuple(charged), problems

    def on_pod_delete(self, pod: Mapping[str, Any]) -> None:
        """Release whatever a deleted pod held (by UID, whatever its annotations say)."""
        for listener in self.pod_gone_listeners:
            listener(pod)
        with self.lock:
            uid = pod_key(pod)
            self._set_compute(uid, None)
            self._remove(uid)
            self._reported.pop(uid, None)

    def _set_compute(self, uid: str, taken: tuple[str, int, int] | None) -> None:
        """Record the CPU and memory a bound pod takes from its node (None: nothing), updating node totals."""
        old = self._compute.get(uid)
        if old == taken:
            return
        for entry, sign in ((old, -1), (taken, +1)):
            if entry is None:
                continue
            node, cpu, memory = entry
            totals = self._requested.setdefault(node, [0, 0])
            totals[0] += sign * cpu
            totals[1] += sign * memory
            state = self.nodes.get(node)
            if state is not None:
                state.set_requested(*totals)
            if totals == [0, 0]:
                del self._requested[node]
        if taken is None:
            self._compute.pop(uid, None)
        else:
            self._compute[uid] = taken

    def reserve(self, uid: str, namespace: str, name: str, node: str, assignment: Assignment,
                priority: int = 0) -> Charge:
        """Charge an assumed placement (replacing any previous charge of this pod) with the assume TTL."""
        return self._reserve(uid, namespace, name, node, assignment, priority, ChargeState.ASSUMED, self.assume_ttl)

    def nominate(self, uid: str, namespace: str, name: str, node: str, assignment: Assignment, priority: int,
                 ttl: float) -> Charge:
        """Hold room for a pod whose victims are being evicted (replacing any previous charge of it) for `ttl` s."""
        return self._reserve(uid, namespace, name, node, assignment, priority, ChargeState.NOMINATED, ttl)

    def _reserve(self, uid: str, namespace: str, name: str, node: str, assignment: Assignment, priority: int,
                 state: str, ttl: float) -> Charge:
        with self.lock:
            self._remove(uid)
            charge = Charge(
                uid=uid,
                namespace=namespace,
                name=name,
                node=node,
                grants=flat_grants(assignment),
                assignment=assignment,
                state=state,
                expires=self.clock() + ttl,
                priority=priority,
            )
            self._add(charge)
            return charge

    def take(self, uid: str) -> Charge | None:
        """Remove a pod's charge and return it (to be `put_back` when the pod is not placed elsewhere)."""
        with self.lock:
            return self._remove(uid)

    def put_back(self, charge: Charge | None) -> None:
        """Restore a charge `take` returned, unless the pod has been charged again meanwhile or its time is up."""
        with self.lock:
            if charge is None or charge.uid in self.charges:
                return
            if not charge.expires or charge.expires > self.clock():
                self._add(charge)

    def extend(self, uid: str, ttl: float) -> None:
        """Push the expiry of an assumed reservation `ttl` seconds from now (a bind is in flight)."""
        with self.lock:
            charge = self.charges.get(uid)
            if charge is not None and charge.state != ChargeState.OBSERVED:
                charge.expires = self.clock() + ttl
                self._expire_at(charge.expires, uid)

    def mark_bound(self, uid: str, assignment: Assignment | None = None) -> None:
        """Our binding succeeded: keep the charge until the watch shows the pod (with the bound TTL)."""
        with self.lock:
            charge = self.charges.get(uid)
            if charge is None or charge.state == ChargeState.OBSERVED:
                return
            if assignment is not None and flat_grants(assignment) != charge.grants:
                self._remove(uid)
                charge = Charge(
                    charge.uid, charge.namespace, charge.name, charge.node, flat_grants(assignment), assignment,
                    ChargeState.BOUND, priority=charge.priority,
                )
                charge.expires = self.clock() + self.bound_ttl
                self._add(charge)
                return
            charge.state = ChargeState.BOUND
            charge.expires = self.clock() + self.bound_ttl
            self._expire_at(charge.expires, uid)

    def release(self, uid: str, only_unobserved: bool = True) -> bool:
        """Drop a pod's charge (by default only one of our own reservations); True if something was dropped."""
        with self.lock:
            charge = self.charges.get(uid)
            if charge is None or (only_unobserved and charge.state == ChargeState.OBSERVED):
                return False
            self._remove(uid)
            return True

    def expire(self, now: float | None = None) -> int:
        """Drop reservations whose TTL has passed; returns how many. Cost is O(expired), amortised."""
        now = self.clock() if now is None else now
        dropped = 0
        with self.lock:
            heap = self._expiry
            while heap and heap[0][0] <= now:
                _expires, uid = heapq.heappop(heap)
                charge = self.charges.get(uid)
                if charge is None or charge.state == ChargeState.OBSERVED or charge.expires > now:
                    continue
                log.info("reservation expired pod=%s/%s node=%s", charge.namespace, charge.name, charge.node)
                self._remove(uid)
                dropped += 1
        return dropped

    # ------------------------------------------------------------------ reads

    def usage_without(self, node: str, uids: Iterable[str]) -> list[GPUUsage] | None:
        """A copy of a node's usage with the given pods' charges taken off (for preemption), or None."""
        with self.lock:
            state = self.nodes.get(node)
            if state is None or state.error:
                return None
            usage = [GPUUsage(u.shares, u.memory, u.cores) for u in state.usage]
            for uid in set(uids):
                charge = self.charges.get(uid)
                if charge is None or charge.node != node:
                    continue
                for uuid, memory, cores in charge.grants:
                    i = state.index.get(uuid)
                    if i is not None:
                        usage[i].sub(memory, cores)
            return usage

    def on_node_charges(self, node: str) -> list[Charge]:
        """The charges on one node (callers hold `lock`)."""
        return [self.charges[uid] for uid in self._by_node.get(node, ())]

    def snapshot(self) -> list[tuple[NodeState, list[GPUUsage], list[Charge]]]:
        """Per node (sorted by name): its state, a copy of its usage and its charges; for metrics and inspect."""
        with self.lock:
            out = []
            for name in sorted(self.nodes):
                state = self.nodes[name]
                usage = [GPUUsage(u.shares, u.memory, u.cores) for u in state.usage]
                charges = [self.charges[uid] for uid in self._by_node.get(name, ())]
                out.append((state, usage, sorted(charges, key=lambda c: (c.namespace, c.name))))
            return out
