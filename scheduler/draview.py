"""DRA mode: the cluster's GPUs as our driver's ResourceSlices publish them, their use from allocated ResourceClaims,
and the extender's answers for pods that ask our DeviceClass through claims.

In DRA mode kube-scheduler's structured-parameters allocator picks the device inside a node (first fit in slice
order, `lowest_index_order`) and writes the allocation in PreBind; the extender can still filter nodes and score them
(docs/dra.md). `DRAView` keeps one `NodeState` per node that has slices of our driver (`vgpu.dra.slice_devices`),
charged with the shares of the allocated claims on its devices (`vgpu.dra.claim_consumption`), and places through
its own `scheduler.placement.Placement`, so the node policy is the extender's. A node whose slice or one of whose
claims does not parse is skipped with the reason (FailedNodes) and does not affect the others.

Feeds: `on_slice` / `on_slice_delete` and `on_claim` / `on_claim_delete` (watch handlers, any thread); nodes are
rebuilt at the next request after a change. Thread-safe (one lock).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from vgpu.dra import (
    CAPACITY_CORES,
    CAPACITY_MEMORY,
    DEVICE_CLASS,
    DRIVER,
    ClaimShare,
    SliceDevice,
    claim_consumption,
    cores_of,
    mib_of,
    slice_devices,
)
from vgpu.errors import CodecError
from vgpu.inventory import GPUDevice
from vgpu.keys import DEVICE_TYPE
from vgpu.requests import ContainerRequest, Selectors, pod_cpu_memory
from vgpu.scheduler.fit import GPUOrder
from vgpu.scheduler.ledger import pod_key
from vgpu.scheduler.nodestate import NodeState
from vgpu.scheduler.placement import Choice, Placement
from vgpu.scheduler.policies.base import NodePolicy, PodContext
from vgpu.scheduler.policies.shares import lowest_index_order

__all__ = ["NO_SLICES", "ClaimRequests", "DRAView", "pod_claim_keys"]

log = logging.getLogger(__name__)

NO_SLICES = f"no ResourceSlice of driver {DRIVER} on this node"
NEEDS_CLAIM = ("node serves GPUs through DRA: only volcano.sh/vgpu-number (whole GPUs) can be asked in "
               "resources.limits there; shares of memory or cores need a ResourceClaim (docs/dra.md)")
# allocations a device with allowMultipleAllocations takes (DRA sets no count limit)
SHARED_SPLIT = 1 << 20  # not a memory size
SEEN_MAX = 100_000  # pods remembered as already shown to the node policy


@dataclass(frozen=True, slots=True)
class ClaimRequests:
    """What a pod asks of our driver through its claims: the requests still to allocate, and why the extender
    cannot place it (`problem`: a claim not created yet, a form we do not read); `ours` when any claim names our
    DeviceClass; `unknown`, the claims the view has not seen (yet)."""

    requests: tuple[ContainerRequest, ...] = ()
    problem: str = ""
    ours: bool = False
    unknown: tuple[str, ...] = ()


def pod_claim_keys(pod: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The "namespace/name" of each ResourceClaim a pod uses, and the pod claim names whose claim (from a template)
    is not created yet (not in status.resourceClaimStatuses)."""
    claims, missing = _pod_claims(pod)
    return [key for _, key in claims], missing


def _pod_claims(pod: Mapping[str, Any]) -> tuple[list[tuple[str, str]], list[str]]:
    """`pod_claim_keys` with the pod's name for each claim (spec.resourceClaims[].name)."""
    namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
    generated = {str(s.get("name")): s.get("resourceClaimName")
                 for s in (pod.get("status") or {}).get("resourceClaimStatuses") or () if isinstance(s, Mapping)}
    claims: list[tuple[str, str]] = []
    missing: list[str] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        if not isinstance(entry, Mapping):
            continue
        name = str(entry.get("name") or "")
        claim = entry.get("resourceClaimName") or (generated.get(name) if entry.get("resourceClaimTemplateName")
                                                   else None)
        if claim:
            claims.append((name, f"{namespace}/{claim}"))
        elif entry.get("resourceClaimTemplateName"):
            missing.append(name)
    return claims, missing


def _claim_requests(claim: Mapping[str, Any], key: str, label: str) -> list[ContainerRequest]:
    """Our DeviceClass's requests of an unallocated claim, in our request form (CodecError for a form we do not
    read). A capacity the request leaves out takes the request-policy default our plugin publishes
    (draplugin/slices.py): the whole card's memory, and no cores. Each request is named `label`/its name: the pod's
    name for the claim rather than the claim's own, so that the pods of one workload have the same requests and
    share the placement's evaluations (a claim's name differs from pod to pod)."""
    out: list[ContainerRequest] = []
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
        if not isinstance(request, Mapping):
            raise CodecError(f"claim {key}: a request is not an object")
        name = str(request.get("name") or "")
        exactly = request.get("exactly")
        if not isinstance(exactly, Mapping):
            if any(isinstance(a, Mapping) and a.get("deviceClassName") == DEVICE_CLASS
                   for a in request.get("firstAvailable") or ()):
                raise CodecError(f"claim {key} request {name!r}: firstAvailable is not read by the extender")
            continue
        if exactly.get("deviceClassName") != DEVICE_CLASS:
            continue
        if exactly.get("allocationMode", "ExactCount") != "ExactCount":
            raise CodecError(f"claim {key} request {name!r}: allocationMode {exactly.get('allocationMode')!r} is "
                             "not read by the extender")
        count = exactly.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise CodecError(f"claim {key} request {name!r}: count {count!r} is not a positive integer")
        wanted = (exactly.get("capacity") or {}).get("requests") or {}
        if not isinstance(wanted, Mapping):
            raise CodecError(f"claim {key} request {name!r}: capacity.requests is not an object")
        where = f"claim {key} request {name!r}"
        has_memory = CAPACITY_MEMORY in wanted
        memory = mib_of(wanted[CAPACITY_MEMORY], f"{where} memory") if has_memory else 0
        cores = cores_of(wanted[CAPACITY_CORES], f"{where} cores") if CAPACITY_CORES in wanted else 0
        out.append(ContainerRequest(container=f"{label}/{name}", init=False, count=count, memory=memory,
                                    memory_percent=0 if has_memory else 100, cores=cores))
    return out


def _device(device: SliceDevice) -> GPUDevice:
    model = device.model or "GPU"
    kind = model if DEVICE_TYPE.lower() in model.lower() else f"{DEVICE_TYPE}-{model}"
    return GPUDevice(uuid=f"{device.pool}/{device.name}", split=SHARED_SPLIT if device.shared else 1,
                     memory=device.memory_mib, type=kind, index=max(device.index, 0), cores=device.cores,
                     numa=max(device.numa, 0), island=device.island)


class DRAView:
    """Slices and claims of our driver, one `NodeState` per node that publishes slices; see the module docstring."""

    def __init__(self, policy: NodePolicy, *, decide: bool = True, device_order: GPUOrder = lowest_index_order) -> None:
        # nodes are fitted and scored on the devices the allocator will take (first fit), not the policy's own
        self.placement = Placement(policy, decide=decide, device_order=device_order)
        self._lock = threading.Lock()
        self._claim_arrived = threading.Condition(self._lock)  # notified when a claim is added or changed
        self._slices: dict[str, tuple[str, Mapping[str, Any]]] = {}  # slice name -> (node, slice)
        self._node_slices: dict[str, set[str]] = {}  # node -> names of its slices
        # what was read of each slice and claim, kept until it changes (a rebuild reads only what changed)
        self._devices: dict[str, list[SliceDevice]] = {}  # slice name -> its devices
        self._shares: dict[str, list[ClaimShare]] = {}  # claim key -> its shares of our devices
        self._claims: dict[str, Mapping[str, Any]] = {}  # "ns/name" -> claim
        self._claim_pools: dict[str, set[str]] = {}  # claim key -> pools its allocation results name
        self._pool_claims: dict[str, set[str]] = {}  # pool -> claim keys
        self._pool_nodes: dict[str, set[str]] = {}  # pool -> nodes whose slices carry it
        self._states: dict[str, NodeState] = {}
        self._dirty: set[str] = set()
        self._ranked = True
        self._layout = 0  # changes whenever a node comes or goes or its reason not to be usable changes
        self._resolved: tuple[int, list[str], tuple[list[NodeState], list[int], dict[str, str], np.ndarray]] | None \
            = None
        self._seen: OrderedDict[str, None] = OrderedDict()

    # ------------------------------------------------------------------ feeds

    def on_slice(self, resource_slice: Mapping[str, Any]) -> None:
        """A ResourceSlice was added or changed (other drivers' slices and slices not bound to a node are ignored)."""
        spec = resource_slice.get("spec") or {}
        name = str((resource_slice.get("metadata") or {}).get("name") or "")
        node = spec.get("nodeName") if isinstance(spec, Mapping) else None
        with self._lock:
            self._drop_slice(name)
            if not isinstance(spec, Mapping) or spec.get("driver") != DRIVER or not isinstance(node, str) or not node:
                return
            self._slices[name] = (node, resource_slice)
            self._node_slices.setdefault(node, set()).add(name)
            self._pool_nodes.setdefault(_pool_of(resource_slice), set()).add(node)
            self._forget_shares(_pool_of(resource_slice))
            self._dirty.add(node)
            if node not in self._states:
                self._ranked = False

    def on_slice_delete(self, resource_slice: Mapping[str, Any]) -> None:
        """A ResourceSlice was deleted."""
        with self._lock:
            self._drop_slice(str((resource_slice.get("metadata") or {}).get("name") or ""))

    def _drop_slice(self, name: str) -> None:
        known = self._slices.pop(name, None)
        if known is None:
            return
        node, old = known
        pool = _pool_of(old)
        self._devices.pop(name, None)
        mine = self._node_slices.get(node, set())
        mine.discard(name)
        if not mine:
            self._node_slices.pop(node, None)
        if not any(_pool_of(self._slices[other][1]) == pool for other in mine):
            self._pool_nodes.get(pool, set()).discard(node)
        self._forget_shares(pool)
        self._dirty.add(node)

    def _forget_shares(self, pool: str) -> None:
        """Drop what was read of the claims on a pool whose slices changed (a whole-device share takes the
        device's capacity from the slice)."""
        for key in self._pool_claims.get(pool, ()):
            self._shares.pop(key, None)

    def on_claim(self, claim: Mapping[str, Any]) -> None:
        """A ResourceClaim was added or changed: the nodes of the pools its allocation names are recounted."""
        key = _claim_key(claim)
        try:
            results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
            pools = {str(r.get("pool") or "") for r in results or () if isinstance(r, Mapping)
                     and r.get("driver") == DRIVER}
        except (AttributeError, TypeError):
            log.warning("event=dra_claim_ignored claim=%s reason=status.allocation is not an allocation", key)
            pools = set()
        with self._lock:
            self._forget_claim(key)
            self._claims[key] = claim
            self._claim_arrived.notify_all()
            if pools:
                self._claim_pools[key] = pools
                for pool in pools:
                    self._pool_claims.setdefault(pool, set()).add(key)
                    self._dirty.update(self._pool_nodes.get(pool, ()))

    def on_claim_delete(self, claim: Mapping[str, Any]) -> None:
        """A ResourceClaim was deleted."""
        with self._lock:
            self._forget_claim(_claim_key(claim))

    def _forget_claim(self, key: str) -> None:
        self._claims.pop(key, None)
        self._shares.pop(key, None)
        for pool in self._claim_pools.pop(key, ()):
            self._pool_claims.get(pool, set()).discard(key)
            self._dirty.update(self._pool_nodes.get(pool, ()))

    # ------------------------------------------------------------------ nodes

    def _rebuild(self, node: str) -> None:
        """Read a node's devices from its slices (slice name order, then device order) and charge its claims."""
        mine = sorted((name, self._slices[name][1]) for name in self._node_slices.get(node, ()))
        state = self._states.get(node)
        if not mine:
            if state is not None:
                state.set_devices((), NO_SLICES)
            return
        if state is None:
            state = self._states[node] = NodeState(name=node)
        try:
            found = [d for name, s in mine for d in self._slice_devices(name, s)]
            whole = {(d.pool, d.name): d for d in found}
            grants: list[tuple[str, int, int]] = []
            for key in sorted({k for pool in {d.pool for d in found} for k in self._pool_claims.get(pool, ())}):
                for share in self._claim_shares(key, whole):
                    if (share.pool, share.device) in whole:
                        grants.append((f"{share.pool}/{share.device}", share.memory_mib, share.cores))
        except (CodecError, AttributeError, TypeError, ValueError) as exc:  # a shape the readers do not expect
            why = str(exc) if isinstance(exc, CodecError) else f"{exc.__class__.__name__}: {exc}"
            log.warning("event=dra_node_skipped node=%s reason=%s", node, why)
            state.set_devices((), f"malformed DRA object: {why}")
            return
        state.set_devices(tuple(_device(d) for d in found))
        state.charge(tuple(grants))

    def _slice_devices(self, name: str, resource_slice: Mapping[str, Any]) -> list[SliceDevice]:
        """`slice_devices` of one slice, read once per version of it."""
        found = self._devices.get(name)
        if found is None:
            found = self._devices[name] = slice_devices(resource_slice)
        return found

    def _claim_shares(self, key: str, whole: Mapping[tuple[str, str], SliceDevice]) -> list[ClaimShare]:
        """`claim_consumption` of one claim, read once per version of it and of its pools' slices."""
        found = self._shares.get(key)
        if found is None:
            found = self._shares[key] = claim_consumption(self._claims[key], whole)
        return found

    def _refresh(self) -> None:
        """Rebuild the nodes changed since the last request and number them in name order (lock held)."""
        for node in sorted(self._dirty):
            before = self._unusable(node)
            self._rebuild(node)
            if self._unusable(node) != before:
                self._layout += 1
        self._dirty.clear()
        if not self._ranked:
            self._layout += 1
            for rank, name in enumerate(sorted(self._states)):
                self._states[name].rank = rank
                self.placement.register(self._states[name])
            self.placement.rerank()
            self._ranked = True

    def _unusable(self, node: str) -> str:
        """Why a node cannot take DRA pods of our driver ("" when it can)."""
        state = self._states.get(node)
        return NO_SLICES if state is None else state.error

    def serves(self, name: str) -> bool:
        """Whether node `name` publishes a usable ResourceSlice of our driver (a node in DRA mode)."""
        with self._lock:
            self._refresh()
            state = self._states.get(name)
            return state is not None and not state.error

    def states(self) -> dict[str, NodeState]:
        """The nodes with slices of our driver, rebuilt where they changed (for tools and tests)."""
        with self._lock:
            self._refresh()
            return dict(self._states)

    # ------------------------------------------------------------------ pods

    def first_sight(self, pod: Mapping[str, Any]) -> bool:
        """True the first time a pod (by UID, else namespace/name) is asked about: the node policy learns from it
        once."""
        key = pod_key(pod)
        with self._lock:
            if key in self._seen:
                return False
            self._seen[key] = None
            if len(self._seen) > SEEN_MAX:
                self._seen.popitem(last=False)
            return True

    def forget_pod(self, pod: Mapping[str, Any]) -> None:
        """A pod of the watch was deleted: its first-sight mark goes with it (its UID never comes back)."""
        key = pod_key(pod)
        with self._lock:
            self._seen.pop(key, None)

    def pod_requests(self, pod: Mapping[str, Any]) -> ClaimRequests:
        """What `pod` asks of our driver through the claims it names; claims already allocated ask nothing more.
        A pod or claim of an unexpected shape asks nothing, with the reason in `problem`."""
        try:
            return self._pod_requests(pod)
        except (AttributeError, TypeError) as exc:
            return ClaimRequests(problem=f"unreadable pod or claim: {exc.__class__.__name__}: {exc}")

    def _pod_requests(self, pod: Mapping[str, Any]) -> ClaimRequests:
        named, missing = _pod_claims(pod)
        if not named and not missing:
            return ClaimRequests()
        requests: list[ContainerRequest] = []
        problems: list[str] = [f"pod claim {name!r} is not created yet" for name in missing]
        ours = False
        with self._lock:
            claims = [(name, key, self._claims.get(key)) for name, key in named]
        unknown = tuple(key for _, key, claim in claims if claim is None)
        for name, key, claim in claims:
            if claim is None:
                problems.append(f"claim {key} is not known yet")
                continue
            try:
                found = _claim_requests(claim, key, name)
            except CodecError as exc:
                return ClaimRequests(problem=str(exc), ours=True)
            ours = ours or bool(found) or _names_our_class(claim)
            if not (claim.get("status") or {}).get("allocation"):
                requests.extend(found)
        return ClaimRequests(tuple(requests), "; ".join(problems) if problems and not requests else "", ours,
                             unknown)

    def wait_claims(self, keys: Iterable[str], timeout: float) -> None:
        """Wait up to `timeout` seconds for these claims to reach the view (a claim created a moment before its
        pod may still be on its way in the watch)."""
        with self._claim_arrived:
            self._claim_arrived.wait_for(lambda: all(key in self._claims for key in keys), timeout)

    def choose(self, names: Iterable[str], pod: Mapping[str, Any], requests: tuple[ContainerRequest, ...],
               context: PodContext | None = None) -> tuple[Choice, dict[str, str]]:
        """Place the pod's claim requests over the candidate nodes: the placement's choice, and the candidates that
        cannot take DRA pods of our driver with the reason (`context`: the pod's CPU and memory, when already
        read)."""
        if context is None:
            context = PodContext(*pod_cpu_memory(pod))
        with self._lock:
            self._refresh()
            states, _, skipped, slots = self._candidates(list(names))
            shape = self.placement.shape(requests, Selectors(), context)
            return self.placement.choose(states, shape, slots=slots), dict(skipped)

    def scores(self, names: list[str], pod: Mapping[str, Any],
               requests: tuple[ContainerRequest, ...]) -> list[float | None]:
        """The node policy's score of each candidate (None where the pod does not fit or the node is skipped)."""
        cpu, memory = pod_cpu_memory(pod)
        with self._lock:
            self._refresh()
            states, positions, _, _ = self._candidates(names)
            shape = self.placement.shape(requests, Selectors(), PodContext(cpu=cpu, memory=memory))
            values = self.placement.scores(states, shape)
        out: list[float | None] = [None] * len(names)
        for i, value in zip(positions, values):
            out[i] = value
        return out

    def unwarmed(self) -> bool:
        """Whether nodes changed since the recent pod shapes last saw them (`warm` has work)."""
        with self._lock:
            return bool(self._dirty) or self.placement.unwarmed()

    def warm(self, budget: int) -> int:
        """Off the request path (the caller holds the extender ledger's lock, under which the node policy changes):
        rescore results a new learned target made stale (`Placement.refresh`), then rebuild the changed nodes and
        `Placement.warm` them; evaluations made, at most `budget`."""
        with self._lock:
            done = self.placement.refresh(budget)
            if done < budget:
                self._refresh()
                done += self.placement.warm(budget - done)
            return done

    def _candidates(self, names: list[str]) -> tuple[list[NodeState], list[int], dict[str, str], np.ndarray]:
        """The candidates that can take DRA pods of our driver, their positions in `names` and their placement
        slots, and the others with the reason; kept for the last list of names while `_layout` stays (lock held,
        after `_refresh`)."""
        known = self._resolved
        if known is not None and known[0] == self._layout and known[1] == names:
            return known[2]
        states: list[NodeState] = []
        positions: list[int] = []
        skipped: dict[str, str] = {}
        for i, name in enumerate(names):
            why = self._unusable(str(name))
            if why:
                skipped[str(name)] = why
            else:
                states.append(self._states[str(name)])
                positions.append(i)
        registered = self.placement.registered
        slots = np.fromiter((s.slot if registered(s) else -1 for s in states), np.int64, len(states))
        found = (states, positions, skipped, slots)
        self._resolved = (self._layout, list(names), found)
        return found


def _names_our_class(claim: Mapping[str, Any]) -> bool:
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
        if isinstance(request, Mapping) and isinstance(request.get("exactly"), Mapping) \
                and request["exactly"].get("deviceClassName") == DEVICE_CLASS:
            return True
    return False


def _pool_of(resource_slice: Mapping[str, Any]) -> str:
    """The pool name of one of our slices ("" when it has none: `slice_devices` then names the problem)."""
    pool = (resource_slice.get("spec") or {}).get("pool")
    return str(pool.get("name") or "") if isinstance(pool, Mapping) else ""


def _claim_key(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"

