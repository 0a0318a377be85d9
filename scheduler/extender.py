"""The extender's decisions: filter, prioritize, bind and preempt on kube-scheduler's extender arguments.

No HTTP here: `vgpu.scheduler.server` decodes the JSON into dicts, calls these methods and encodes what they return;
the argument and result shapes are `scheduler.wire`.

Hot path: /filter resolves the candidate names in the ledger (remembered while the names and the ledger's nodes
stay the same) and hands them to `scheduler.placement.Placement`, the node-selection loop the trace replay uses
too: every node's fit and score for a request shape are kept per node and re-evaluated only when the node changes,
and evaluations are memoised per GPU state, context class and shape, so a call costs a few array operations over
the candidates plus the evaluation of the nodes that changed since that shape was last placed (stale scores of a
learning policy are refreshed within a budget; see placement). Nothing here walks the pods of the cluster.

The node policy's `observe` is called once per vGPU pod, when the pod watch first shows it or at its first
/filter, whichever comes first: a restarted extender learns the workload from the pods already running instead of
starting from nothing. `observe` only counts; what it learns is rebuilt (`NodePolicy.relearn`) off the request
path: inline while the extender is not ready yet (the initial pod list), then by the learner thread, which a
successful /bind wakes when a rebuild is due and which also rescores the results a new target made stale (`learn`).
Between a bind and the learner's run, requests use the previous target.

Bind sends one `pods/binding` carrying the contract's annotations (through the injected `binder`); there is no
node lock, because the device plugin identifies the pod from the assignment itself. A pod that asks none of our
resources is bound without annotations.

Nodes whose GPUs come through DRA, and pods that ask for GPUs through ResourceClaims, are the business of the claim
placement (`scheduler.claimpath`), which every verb consults the same way with or without DRA mode.

A pod that fits none of the nodes of its /filter may preempt pods of lower priority (`scheduler.preemption`, given
as `preemptor`): the room made is held for it as a nomination until it is placed. Room that `vgpu consolidate` holds
for a pod on a node (a consolidation hold, read by the ledger) is such a nomination too: only that pod may use it.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from vgpu import grants, keys
from vgpu.assignment import Assignment, encode, salvage
from vgpu.errors import ConfigError, VGPUError
from vgpu.quota import check_quota_totals
from vgpu.requests import ContainerRequest, Selectors, pod_cpu_memory, pod_requests, pod_selectors
from vgpu.resources import SCHEDULER_NAME
from vgpu.scheduler.claimpath import NO_CLAIMS, ClaimPlacement
from vgpu.scheduler.constraints import constraint_failure
from vgpu.scheduler.fit import GPU_ORDERS, FitResult, fit
from vgpu.scheduler.ledger import NODE_UNKNOWN, Charge, ChargeState, Ledger, pod_key, pod_priority
from vgpu.scheduler.nodestate import NodeState, gpu_types
from vgpu.scheduler.placement import Placement, PodShape
from vgpu.scheduler.policies import NodePolicy
from vgpu.scheduler.policies.base import PodContext
from vgpu.scheduler.preemption import PLANS_TRIED, WAITING, Preemptor, plan_on_node
from vgpu.scheduler.wire import (
    MAX_PRIORITY,
    InvalidArgs,
    candidate_nodes,
    failure_message,
    filter_result,
    lower_keys,
    pod_ref,
    priorities,
)

__all__ = [
    "MODES",
    "BindConflict",
    "Binder",
    "EventSink",
    "Extender",
    "PodLookup",
]

log = logging.getLogger(__name__)

MODES = ("decide", "score")
SPEC_CACHE = 4096  # distinct pod resources sections whose parse is kept
RESOLVE_CACHE_MIN = 64  # candidate lists at least this long are resolved once while the ledger's nodes stay
RESOLVED_KEPT = 4  # candidate lists remembered
MISSING_POD = "extender args missing Pod"
LEARN_SLICE = 4  # evaluations the learner thread makes per hold of the ledger's lock (about 0.5 ms)
WARM_SLICE = 2  # evaluations of changed nodes (`Placement.warm`) per hold of the lock, so a request waits little


class BindConflict(VGPUError):
    """The API server refused the binding with 409 (pod already bound, or its UID changed)."""


# binder(namespace, name, uid, node, annotations): POST pods/binding; raises BindConflict on 409, anything else
# on other failures.
Binder = Callable[[str, str, str, str, dict[str, str]], None]
# lookup(namespace, name) -> pod dict or None.
PodLookup = Callable[[str, str], "Mapping[str, Any] | None"]
# events(pod, type, reason, message); pod is {"namespace", "name", "uid"}. Must not block.
EventSink = Callable[[Mapping[str, str], str, str, str], None]


def _no_events(pod: Mapping[str, str], kind: str, reason: str, message: str) -> None:
    return None


@dataclass(slots=True)
class _PodInfo:
    """A pod as placement reads it, parsed once per resourceVersion."""

    namespace: str
    name: str
    uid: str
    version: str  # metadata.resourceVersion: the requests can change only with it
    requests: tuple[ContainerRequest, ...]
    selectors: Selectors
    context: PodContext  # CPU and memory requests, selectors
    priority: int = 0  # spec.priority
    may_preempt: bool = False  # it has a priority and its preemptionPolicy is not Never
    shape: PodShape | None = None  # set under the ledger's lock (`Extender._shape`)


class Extender:
    """kube-scheduler extender verbs over a Ledger; see the module docstring."""

    def __init__(
        self,
        ledger: Ledger,
        policy: NodePolicy,
        *,
        gpu_policy: str = "binpack",
        mode: str = "score",
        binder: Binder | None = None,
        lookup: PodLookup | None = None,
        fetch: PodLookup | None = None,
        events: EventSink | None = None,
        ready: Callable[[], str] | None = None,
        clock: Callable[[], float] = time.time,
        scheduler_names: frozenset[str] = frozenset({SCHEDULER_NAME}),
        grant_key: grants.GrantKey | None = None,
        claims: ClaimPlacement = NO_CLAIMS,
        preemptor: Preemptor | None = None,
        topology: bool = True,
        quota_limited: Callable[[str], bool] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"--mode: {mode!r} is not one of {', '.join(MODES)}")
        if gpu_policy not in GPU_ORDERS:
            raise ConfigError(f"--gpu-policy: {gpu_policy!r} is not one of {', '.join(sorted(GPU_ORDERS))}")
        self.ledger = ledger
        self.config = ledger.config
        self.policy = policy
        self.mode = mode
        self.placement = Placement(policy, gpu_policy=gpu_policy, decide=mode == "decide", topology=topology)
        self.binder = binder
        # without a pod source (tools, tests of the verbs alone) every pod posted is taken as existing
        self.pod_source = lookup is not None
        self.lookup = lookup or (lambda ns, name: None)
        self.fetch = fetch or self.lookup
        self.events = events or _no_events
        self.ready = ready or (lambda: "")
        self.clock = clock
        self.scheduler_names = scheduler_names
        self.grant_key = grant_key
        self.claims = claims  # nodes whose GPUs come through DRA (scheduler.claimpath)
        self.preemptor = preemptor  # None: no preemption
        # whether a namespace's ResourceQuota limits a quota total (require_quota_totals: where-limited)
        self.quota_limited = quota_limited or (lambda namespace: False)
        # pods learned from, by UID, with the parsed form of those not bound yet; a pod's entry goes with the pod
        self._seen: OrderedDict[str, _PodInfo | None] = OrderedDict()
        self._seen_max = 200_000
        self._seen_lock = threading.Lock()
        self._observe_lock = threading.Lock()
        # candidate names resolved lately (filter and prioritize send different lists), while the nodes stay
        self._resolved: list[tuple[list[Any], tuple[Any, ...]]] = []  # most recent first
        self._resolved_version: object = None
        self._learner = _Learner()
        self._specs: dict[Any, tuple[tuple[ContainerRequest, ...], int, int]] = {}  # see `_parse`
        self._gpu_types: dict[str, int] = {}
        self._capacity_version = -1
        self._current_epoch = 0  # the policy epoch whose stale results the learner has rescored
        ledger.pod_listeners.append(self.observe_pod)
        ledger.pod_gone_listeners.append(self.forget_pod)

    # ------------------------------------------------------------------ helpers

    def _pod_info(self, pod: Any) -> _PodInfo:
        """The pod's parsed form (kept per UID and resourceVersion); learned from the first time it is seen."""
        if not isinstance(pod, Mapping):
            raise InvalidArgs(MISSING_POD)
        ref = pod_ref(pod)
        key = ref["uid"] or f"{ref['namespace']}/{ref['name']}"
        version = str((pod.get("metadata") or {}).get("resourceVersion") or "")
        with self._seen_lock:
            known = self._seen.get(key)
        if known is not None and known.version == version and (known.namespace, known.name) == (
                ref["namespace"], ref["name"]):
            return known
        info = self._parse(pod, ref, version)
        if self._remember(key, info) and info.requests:
            self._observe(info.requests, info.context)
        return info

    def _parse(self, pod: Mapping[str, Any], ref: dict[str, str], version: str) -> _PodInfo:
        """Requests, selectors and CPU and memory of a pod; the arithmetic on quantities is kept per distinct
        resources section (the pods of one workload share it)."""
        spec = pod.get("spec") or {}
        required = self._totals_required(ref["namespace"])
        try:  # what the parsers read: each container's name and resources, and the pod overhead
            key: Any = (*(tuple((c.get("name"), _frozen(c.get("resources"))) for c in spec.get(field) or ())
                          for field in ("initContainers", "containers")), _frozen(spec.get("overhead")), required)
        except (TypeError, AttributeError):  # malformed: parse it afresh, and let the parser name what is wrong
            key = None
        known = self._specs.get(key) if key is not None else None
        if known is None:
            requests = pod_requests(pod, self.config)
            check_quota_totals(pod, requests, self.config, required)
            known = (requests, *pod_cpu_memory(pod))
            if key is not None:
                if len(self._specs) >= SPEC_CACHE:
                    self._specs.clear()
                self._specs[key] = known
        requests, cpu, memory = known
        selectors = pod_selectors(pod)
        may_preempt = "priority" in spec and spec.get("preemptionPolicy") != "Never"
        return _PodInfo(ref["namespace"], ref["name"], ref["uid"], version, requests, selectors,
                        PodContext(cpu=cpu, memory=memory, selectors=selectors), pod_priority(pod), may_preempt)

    def _totals_required(self, namespace: str) -> bool:
        """Whether a vGPU pod of the namespace must carry the quota totals (SharingConfig.require_quota_totals)."""
        mode = self.config.require_quota_totals
        return mode is True or (mode == "where-limited" and self.quota_limited(namespace))

    def _shape(self, info: _PodInfo) -> PodShape:
        """The placement shape of a parsed pod; callers hold the ledger's lock."""
        if info.shape is None:
            info.shape = self.placement.shape(info.requests, info.selectors, info.context)
        return info.shape

    def _remember(self, key: str, info: _PodInfo | None) -> bool:
        """Record a pod as seen (bounded, least recently seen dropped first); True when it is new."""
        with self._seen_lock:
            new = key not in self._seen
            if info is not None or new:
                self._seen[key] = info
            self._seen.move_to_end(key)
            while len(self._seen) > self._seen_max:
                self._seen.popitem(last=False)
        return new

    def _observe(self, requests: tuple[ContainerRequest, ...], pod: PodContext) -> None:
        try:
            with self._observe_lock:  # the pod watch and the request handlers both feed the policy
                self.policy.observe(requests, pod)  # policies learn from every vGPU pod they see
        except Exception:
            log.exception("policy observe failed policy=%s", self.policy.name)

    def learn(self, slice_size: int | None = None) -> None:
        """Rebuild what the policy learned, if due, then rescore the results a new target made stale; with
        `slice_size`, the ledger's lock is released every `slice_size` evaluations so that requests get through.
        Then evaluate the nodes changed since the recent pod shapes' last requests (`Placement.warm`, in both
        placements), WARM_SLICE per hold of the lock, so that the next requests find them done. Never called by a
        request."""
        with self.ledger.lock, self._observe_lock:
            try:
                self.policy.relearn(self._capacity())
            except Exception:
                log.exception("policy relearn failed policy=%s", self.policy.name)
            epoch = self.policy.epoch
        budget = slice_size or 1 << 62
        while self._current_epoch != epoch:
            with self.ledger.lock:
                done = self.placement.refresh(budget)
            if done < budget:
                self._current_epoch = epoch
            else:
                time.sleep(0)  # let a waiting request take the lock
        for warm in (self.placement.warm, self.claims.warm):
            while True:
                with self.ledger.lock:
                    done = warm(WARM_SLICE)
                if done < WARM_SLICE:
                    break
                time.sleep(0)

    def _capacity(self) -> dict[str, int]:
        """GPUs per device type of the ledger's nodes (recounted when they change); callers hold the lock."""
        if self._capacity_version != self.ledger.devices_version:
            self._gpu_types = gpu_types(self.ledger.nodes.values())
            self._capacity_version = self.ledger.devices_version
        return self._gpu_types

    def _wake_learner(self) -> None:
        """Have the learner thread run `learn` when there is something to learn, rescore or warm (the thread is
        started on first use; it ends when the extender is dropped)."""
        if not (self.policy.due or self._capacity_version != self.ledger.devices_version
                or self._current_epoch != self.policy.epoch):
            with self.ledger.lock:  # requests change the placements' boards under it
                if not (self.placement.unwarmed() or self.claims.unwarmed()):
                    return
        self._learner.wake(self)

    def changed(self) -> None:
        """Something placement reads changed outside the verbs (a claim or a slice of a DRA node): have the learner
        thread evaluate the changed nodes for the next pods (not before the extender is ready: the initial lists
        are read first, and the first requests rebuild what they need once)."""
        if not self.ready():
            self._wake_learner()

    def wait_learned(self, timeout: float = 10.0) -> bool:
        """Block until the learner thread has served every wake (tests and benchmarks); False on timeout."""
        return self._learner.wait_idle(timeout)

    def observe_pod(self, pod: Mapping[str, Any]) -> None:
        """Let the node policy learn from a pod of the watch (once per pod; invalid or non-vGPU pods are skipped)."""
        meta = pod.get("metadata") or {}
        key = pod_key(pod)
        with self._seen_lock:
            if key in self._seen:
                return
        try:
            info = self._parse(pod, pod_ref(pod), str(meta.get("resourceVersion") or ""))
        except VGPUError:
            return
        bound = bool((pod.get("spec") or {}).get("nodeName"))
        if info.requests and self._remember(key, None if bound else info):
            self._observe(info.requests, info.context)
            if self.ready():  # not serving yet (the initial list): no request waits for the rebuild
                with self.ledger.lock, self._observe_lock:
                    self.policy.relearn(self._capacity())

    def forget_pod(self, pod: Mapping[str, Any]) -> None:
        """A pod of the watch was deleted: what was kept of it goes (its UID never comes back)."""
        key = pod_key(pod)
        with self._seen_lock:
            self._seen.pop(key, None)
        if self.preemptor is not None:
            self.preemptor.forget(key)

    def _resolve(self, names: list[Any], objects: dict[str, Mapping[str, Any]] | None,
                 unresolvable: dict[str, str]) -> tuple[list[NodeState], list[int], np.ndarray]:
        """The ledger's states of the candidate nodes that can take vGPU pods, their positions in `names` and their
        placement slots (-1: not registered); the others are added to `unresolvable`. Nodes the ledger does not
        know, given whole in `objects`, are ranked after the known ones, in name order. Callers hold the ledger's
        lock. The answer for the same names is kept while the ledger's nodes do not change."""
        ledger = self.ledger
        if ledger.rank_nodes():
            self.placement.rerank()
        if self._resolved_version is not ledger.version:
            self._resolved.clear()
            self._resolved_version = ledger.version
        cached = objects is None and len(names) >= RESOLVE_CACHE_MIN
        if cached:
            for k, (known_names, known) in enumerate(self._resolved):
                if known_names == names:  # a list comparison: no hashing of the names
                    self._resolved.insert(0, self._resolved.pop(k))
                    unresolvable.update(known[0])
                    return known[1], known[2], known[3]
        nodes_get = ledger.nodes.get
        register = self.placement.register
        states: list[NodeState] = []
        positions: list[int] = []
        detached: list[NodeState] = []
        missing: dict[str, str] = {}
        for position, name in enumerate(names):
            try:
                state = nodes_get(name)
            except TypeError:
                raise InvalidArgs("NodeNames must be a list of strings") from None
            if state is None:
                if objects is None:
                    missing[str(name)] = NODE_UNKNOWN
                    continue
                state = ledger.detached(objects[name])
                detached.append(state)
            elif not state.error:
                register(state)
            if state.error:
                missing[name] = state.error
                continue
            states.append(state)
            positions.append(position)
        for rank, state in enumerate(sorted(detached, key=lambda s: s.name), start=len(ledger.nodes)):
            state.rank = rank
        slots = np.fromiter((-1 if s in detached else s.slot for s in states), np.int64, len(states))
        if cached:
            self._resolved.insert(0, (list(names), (missing, states, positions, slots)))
            del self._resolved[RESOLVED_KEPT:]
        unresolvable.update(missing)
        return states, positions, slots

    def _exists(self, info: _PodInfo) -> bool:
        """Whether the API server holds this pod under this UID (the cache, else a read): /filter reserves nothing
        for a pod that does not exist (a made-up pod posted to /filter); /bind re-checks and reserves."""
        if not self.pod_source:
            return True
        try:
            pod = self.lookup(info.namespace, info.name) or self.fetch(info.namespace, info.name)
        except VGPUError:
            return False
        return pod is not None and str((pod.get("metadata") or {}).get("uid") or "") == info.uid

    def _bind_refusal(self, namespace: str, name: str, uid: str, node: str) -> tuple[str, str]:
        """Why this pod must not be bound to `node` by us ("" when it may): it does not exist (or under another
        UID), another scheduler owns it, or the node breaks its own nodeSelector or required node affinity; and
        the pod's UID. Without a pod source nothing can be checked."""
        if not self.pod_source:
            return "", uid
        pod = self.lookup(namespace, name) or self.fetch(namespace, name)
        if pod is None:
            return f"pod {namespace}/{name} not found", uid
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        found = str(meta.get("uid") or "")
        if uid and found != uid:
            return f"pod {namespace}/{name} has another UID than {uid}", uid
        scheduler = spec.get("schedulerName") or "default-scheduler"
        if scheduler not in self.scheduler_names:
            return (f"pod {namespace}/{name} belongs to scheduler {scheduler!r}, not to "
                    f"{sorted(self.scheduler_names)}"), found
        state = self.ledger.nodes.get(node)
        if state is not None and state.obj is not None:
            return constraint_failure(pod, state.obj), found
        return "", found

    def _describe(self, assignment: Assignment) -> str:
        """The grants as a person reads them: `GPU-a (2000 MiB, 10% cores); GPU-b (...)`, containers by `|`."""
        mib = self.config.memory_unit.mib
        return " | ".join("; ".join(f"{g.uuid} ({mib(g.memory)} MiB, {g.cores}% cores)" for g in segment)
                          for segment in assignment if segment)

    def evaluate(self, pod: Mapping[str, Any], node: str) -> tuple[FitResult, float]:
        """Fit and node-policy score of `pod` on one known node, without reserving (for tools and tests)."""
        info = self._pod_info(pod)
        with self.ledger.lock:
            state = self.ledger.nodes.get(node)
            if state is None or state.error:
                return FitResult(ok=False, reason=state.error if state else NODE_UNKNOWN, unresolvable=True), 0.0
            return self.placement.evaluate(state, self._shape(info))

    # ------------------------------------------------------------------ verbs

    def filter(self, raw_args: Any) -> dict[str, Any]:
        """ExtenderArgs -> ExtenderFilterResult."""
        args = lower_keys(raw_args)
        names, objects = candidate_nodes(args)
        not_ready = self.ready()
        if not_ready:
            return filter_result(names, objects, [], {}, {}, error=f"vgpu-scheduler not ready: {not_ready}")
        pod = args.get("pod")
        if not isinstance(pod, Mapping):
            return filter_result(names, objects, [], {}, {}, error=MISSING_POD)
        try:
            info = self._pod_info(pod)
        except VGPUError as exc:
            self.events(pod_ref(pod), "Warning", "FilteringFailed", str(exc))
            return filter_result(names, objects, [], {}, {}, error=str(exc))
        if not info.requests:
            return self.claims.filter(self, names, objects, pod)
        exists = self._exists(info)  # before the lock: it may read the API server
        ledger = self.ledger
        ledger.expire()
        unresolvable: dict[str, str] = {}
        waiting: Charge | None = None  # the pod's nomination (or consolidation hold), while its victims end
        uid = info.uid or f"{info.namespace}/{info.name}"
        with ledger.lock:
            mine = ledger.charges.get(uid)
            if mine is not None and mine.state == ChargeState.ASSUMED:
                ledger.release(uid)  # a retry: the earlier decision no longer holds
            held = ledger.take(uid) if mine is not None and mine.state == ChargeState.NOMINATED else None
            states, _, slots = self._resolve(names, objects, unresolvable)
            choice = self.placement.choose(states, self._shape(info), slots=slots)
            unresolvable.update(choice.unresolvable)
            if choice.best is not None and choice.result is not None and choice.best.name in ledger.nodes and exists:
                ledger.reserve(uid, info.namespace, info.name, choice.best.name, choice.result.assignment,
                               info.priority)
                if held is not None and self.preemptor is not None:
                    self.preemptor.forget(uid)
            elif held is not None:
                ledger.put_back(held)
                waiting = held
        failed = dict(choice.failed)
        feasible = [state.name for state in choice.feasible]
        feasible += self.claims.whole_gpu_nodes(self, pod, info.requests, failed, unresolvable)
        if not feasible and waiting is None and exists and info.may_preempt and self.preemptor is not None:
            waiting = self._preempt(info, states, names, objects)
        if waiting is not None and waiting.node not in feasible:  # in score mode the pod may fit its room already
            unresolvable.pop(waiting.node, None)
            failed[waiting.node] = self.preemptor.waiting_message(uid) if self.preemptor else WAITING
        if not feasible:
            self.events(
                {"namespace": info.namespace, "name": info.name, "uid": info.uid},
                "Warning",
                "FilteringFailed",
                failure_message(len(names), failed, unresolvable),
            )
        return filter_result(names, objects, feasible, failed, unresolvable)

    def _preempt(self, info: _PodInfo, states: list[NodeState], names: list[Any],
                 objects: dict[str, Mapping[str, Any]] | None) -> Charge | None:
        """Nominate the pod on the cheapest node of `states` (those of kube-scheduler's candidates `names`) whose
        lower-priority pods the API server lets go, and start their eviction (scheduler.preemption); the nomination,
        or None. When budgets refuse every plan, the pod is planned for again later on the same candidates."""
        preemptor = self.preemptor
        assert preemptor is not None
        uid = info.uid or f"{info.namespace}/{info.name}"
        if not preemptor.due(uid):
            return None
        ledger = self.ledger
        order = self.policy.gpu_order(None, info.context) or self.placement.default_order
        plans = preemptor.plans(states, info.requests, info.selectors, info.priority, order)
        refusals = []
        for plan in plans[:PLANS_TRIED]:
            refusal = preemptor.admissible(plan)  # dry runs of the evictions, outside the lock
            if refusal:
                log.info("preemption plan refused pod=%s/%s node=%s reason=%r", info.namespace, info.name,
                         plan.node, refusal)
                refusals.append(f"on {plan.node}: {refusal}")
                continue
            with ledger.lock:
                state = ledger.nodes.get(plan.node)
                fresh = plan_on_node(state, ledger.on_node_charges(plan.node), info.requests, info.selectors,
                                     info.priority, order) if state is not None and not state.error else None
                if fresh is None or not {v.uid for v in fresh.victims} <= {v.uid for v in plan.victims}:
                    continue  # the node changed since the dry run
                charge = ledger.nominate(uid, info.namespace, info.name, plan.node, fresh.assignment, info.priority,
                                         preemptor.nomination_ttl(fresh))
            preemptor.started(uid, fresh)
            log.info("event=preempting pod=%s/%s node=%s victims=%s", info.namespace, info.name, plan.node,
                     ",".join(f"{v.namespace}/{v.name}" for v in fresh.victims))
            self.events({"namespace": info.namespace, "name": info.name, "uid": info.uid}, "Normal", "Preempting",
                        f"evicting {fresh.describe()} on {plan.node} to make room for this pod")
            preemptor.carry_out(fresh, {"namespace": info.namespace, "name": info.name, "uid": info.uid})
            return charge
        preemptor.started(uid, None)
        if refusals and len(refusals) == len(plans[:PLANS_TRIED]):
            # every plan was refused by the API server (a budget): say so on the pod, once per change of reason
            message = f"preemption would free room, but the evictions are refused: {'; '.join(refusals)}"
            if preemptor.blocked(uid, message, lambda: self._replan(info, names, objects)):
                preemptor.events({"namespace": info.namespace, "name": info.name, "uid": info.uid}, "Warning",
                                 "PreemptionBlocked", message)
        return None

    def _replan(self, info: _PodInfo, names: list[Any], objects: dict[str, Mapping[str, Any]] | None) -> None:
        """Plan the preemption for a pod that budgets blocked, on the candidates of its last /filter, while it still
        waits: it still exists under its UID, is not bound and holds nothing in the ledger."""
        uid = info.uid or f"{info.namespace}/{info.name}"
        try:
            pod = (self.lookup(info.namespace, info.name) or self.fetch(info.namespace, info.name)) \
                if self.pod_source else None
        except VGPUError:
            return  # the API server did not answer: the next round asks again
        if self.pod_source and (pod is None or str((pod.get("metadata") or {}).get("uid") or "") != info.uid
                                or (pod.get("spec") or {}).get("nodeName")):
            if self.preemptor is not None:
                self.preemptor.forget(uid)
            return
        with self.ledger.lock:
            if uid in self.ledger.charges:
                return
            states, _, _ = self._resolve(names, objects, {})
        self._preempt(info, states, names, objects)

    def prioritize(self, raw_args: Any) -> list[dict[str, Any]]:
        """ExtenderArgs -> HostPriorityList (scores 0..10, best = 10)."""
        args = lower_keys(raw_args)
        names, objects = candidate_nodes(args)
        pod = args.get("pod")
        if not isinstance(pod, Mapping):
            raise InvalidArgs(MISSING_POD)
        info = self._pod_info(pod)
        if not info.requests:
            return self.claims.prioritize(self, names, pod)
        if len(names) == 1:  # scores only rank candidates against each other: one candidate needs none
            return [{"Host": names[0], "Score": MAX_PRIORITY}]
        scores: list[float | None] = [None] * len(names)
        with self.ledger.lock:
            states, positions, _ = self._resolve(names, objects, {})
            for position, score in zip(positions, self.placement.scores(states, self._shape(info))):
                scores[position] = score
        return priorities(names, scores)

    def bind(self, raw_args: Any) -> dict[str, str]:
        """ExtenderBindingArgs -> ExtenderBindingResult. Blocks on one API call; run it off the event loop."""
        args = lower_keys(raw_args)
        fields = {}
        for field in ("PodName", "PodNamespace", "Node"):
            value = args.get(field.lower())
            if not isinstance(value, str) or not value:
                return {"Error": f"ExtenderBindingArgs.{field} missing"}
            fields[field] = value
        name, namespace, node = fields["PodName"], fields["PodNamespace"], fields["Node"]
        raw_uid = args.get("poduid")
        if raw_uid is not None and not isinstance(raw_uid, str):
            return {"Error": "ExtenderBindingArgs.PodUID must be a string"}
        uid = raw_uid or ""
        ref = {"namespace": namespace, "name": name, "uid": uid}
        key = uid or f"{namespace}/{name}"
        if self.binder is None:
            return {"Error": "vgpu-scheduler has no API client to bind with"}
        not_ready = self.ready()
        if not_ready:
            return {"Error": f"vgpu-scheduler not ready: {not_ready}"}
        try:
            refusal, pod_uid = self._bind_refusal(namespace, name, uid, node)
        except VGPUError as exc:
            refusal, pod_uid = f"cannot read pod {namespace}/{name}: {exc}", uid
        if refusal:
            return self.bind_failed(ref, node, refusal)
        answer = self.claims.bind(self, ref, key, node)
        if answer is not None:
            return answer
        held = self._hold(ref, key, node)
        if held is None:
            return self.bind_plain(ref, node, "no vGPU resources asked")
        if isinstance(held, dict):
            return held
        return self._bind_assignment(ref, key, node, pod_uid, held)

    def _hold(self, ref: dict[str, str], key: str, node: str) -> Assignment | dict[str, str] | None:
        """The assignment to bind the pod to `node` with, held in the ledger (its reservation from /filter, else one
        made now); the answer itself when there is nothing more to do (a retry of a bind that succeeded) or the pod
        no longer fits; None for a pod that asks none of our resources (bound without an assignment)."""
        ledger = self.ledger
        ledger.expire()
        with ledger.lock:
            charge = ledger.charges.get(key)
            if charge is not None and charge.state == ChargeState.NOMINATED:
                held = ledger.take(key)  # its victims may still be there: the pod is placed only if it fits now
                try:
                    return self._hold_fresh(ref, key, node)
                finally:
                    ledger.put_back(held)  # a no-op once the pod is charged again
            if charge is not None and charge.node == node:
                if charge.state == ChargeState.BOUND:
                    return {"Error": ""}  # a retry of a bind that already succeeded
                if charge.state == ChargeState.OBSERVED:
                    pod = self.lookup(ref["namespace"], ref["name"])
                    if pod is not None and (pod.get("spec") or {}).get("nodeName") == node:
                        return {"Error": ""}
                ledger.extend(key, max(ledger.assume_ttl, 60.0))
                return charge.assignment
            if charge is not None and charge.state != ChargeState.OBSERVED:
                ledger.release(key)
            return self._hold_fresh(ref, key, node)

    def _hold_fresh(self, ref: dict[str, str], key: str, node: str) -> Assignment | dict[str, str] | None:
        """`_hold` for a pod that holds nothing on `node`: fit it there now and reserve (ledger's lock held)."""
        ledger = self.ledger
        try:
            info = self._bind_info(key, ref["namespace"], ref["name"])
        except VGPUError as exc:
            return self.bind_failed(ref, node, str(exc))
        if not info.requests:
            return None
        state = ledger.nodes.get(node)
        if state is None:
            return self.bind_failed(ref, node, NODE_UNKNOWN)
        if state.error:
            return self.bind_failed(ref, node, state.error)
        result, _ = self.placement.evaluate(state, self._shape(info), want_score=False)
        if not result.ok:
            return self.bind_failed(ref, node, f"pod no longer fits on {node}: {result.reason}")
        ledger.reserve(key, ref["namespace"], ref["name"], node, result.assignment, info.priority)
        ledger.extend(key, max(ledger.assume_ttl, 60.0))
        return result.assignment

    def _bind_assignment(self, ref: dict[str, str], key: str, node: str, pod_uid: str,
                         assignment: Assignment) -> dict[str, str]:
        """POST the binding with the contract's annotations for `assignment`, held in the ledger; the charge is
        marked bound, or released when the binding fails."""
        assert self.binder is not None
        ledger = self.ledger
        namespace, name = ref["namespace"], ref["name"]
        now = str(int(self.clock()))
        value = encode(assignment)
        annotations = {
            keys.VGPU_NODE: node,
            keys.VGPU_IDS: value,
            keys.DEVICES_TO_ALLOCATE: value,
            keys.VGPU_TIME: now,
            keys.BIND_TIME: now,
            keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING,
        }
        if self.grant_key is not None:
            annotations[grants.SIGNATURE] = self.grant_key.sign(pod_uid, node, value)
        try:
            self.binder(namespace, name, ref["uid"], node, annotations)
        except BindConflict as exc:
            pod = self._fetch_quietly(namespace, name)
            if pod is not None and (pod.get("spec") or {}).get("nodeName") == node and (
                (pod.get("metadata") or {}).get("annotations") or {}
            ).get(keys.VGPU_NODE) == node:
                if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    ledger.release(key)  # a retry from a lagging view of a pod that has finished: nothing to hold
                else:
                    ids = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.VGPU_IDS, "")
                    ledger.mark_bound(key, salvage(ids))
                return {"Error": ""}
            ledger.release(key)
            return self.bind_failed(ref, node, f"binding conflict: {exc}")
        except Exception as exc:
            ledger.release(key)
            return self.bind_failed(ref, node, f"binding failed: {exc}")
        ledger.mark_bound(key)
        with self._seen_lock:
            if key in self._seen:
                self._seen[key] = None  # keep the key (the pod was learned from), drop the parsed request
        self._wake_learner()
        self.events(ref, "Normal", "BindingSucceeded", f"bound to {node}: {self._describe(assignment)}")
        return {"Error": ""}

    def bind_plain(self, ref: dict[str, str], node: str, what: str) -> dict[str, str]:
        """Bind a pod without an assignment (nothing is charged in the ledger); `what` says what the pod got."""
        assert self.binder is not None
        try:
            self.binder(ref["namespace"], ref["name"], ref["uid"], node, {})
        except BindConflict as exc:
            pod = self._fetch_quietly(ref["namespace"], ref["name"])
            if pod is not None and (pod.get("spec") or {}).get("nodeName") == node:
                return {"Error": ""}  # a retry of a bind that already succeeded
            return self.bind_failed(ref, node, f"binding conflict: {exc}")
        except Exception as exc:
            return self.bind_failed(ref, node, f"binding failed: {exc}")
        self._wake_learner()  # a DRA node: its claims changed it
        self.events(ref, "Normal", "BindingSucceeded", f"bound to {node}: {what}")
        return {"Error": ""}

    def _fetch_quietly(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod as the API server has it now, or None when it cannot be read."""
        try:
            return self.fetch(namespace, name)
        except Exception:
            return None

    def show_policy(self, requests: tuple[ContainerRequest, ...], context: PodContext) -> None:
        """Let the node policy learn from a pod the pod watch does not show it (a pod asking through claims)."""
        self._observe(requests, context)
        self._wake_learner()

    def bound_requests(self, key: str, namespace: str, name: str) -> tuple[ContainerRequest, ...]:
        """The extended-resource requests of a pod being bound; raises VGPUError when it cannot be read."""
        return self._bind_info(key, namespace, name).requests

    def _bind_info(self, key: str, namespace: str, name: str) -> _PodInfo:
        with self._seen_lock:
            info = self._seen.get(key)
        if info is not None:
            return info
        pod = self.lookup(namespace, name)
        if pod is None:
            raise InvalidArgs(f"pod {namespace}/{name} not found in the pod cache")
        return self._pod_info(pod)

    def bind_failed(self, ref: dict[str, str], node: str, message: str) -> dict[str, str]:
        """Refuse a bind with `message`, logged and recorded as an event of the pod."""
        log.info("bind failed pod=%s/%s node=%s reason=%r", ref["namespace"], ref["name"], node, message)
        self.events(ref, "Warning", "BindingFailed", message)
        return {"Error": message}

    def preempt(self, raw_args: Any) -> dict[str, Any]:
        """ExtenderPreemptionArgs -> ExtenderPreemptionResult: keep the nodes where evicting the proposed victims
        frees enough GPU room for the pod (victims unchanged)."""
        args = lower_keys(raw_args)
        info = self._pod_info(args.get("pod"))
        meta = args.get("nodenametometavictims")
        full = args.get("nodenametovictims")
        source = meta if isinstance(meta, Mapping) else full if isinstance(full, Mapping) else {}
        out: dict[str, Any] = {}
        for node, victims in source.items():
            v = lower_keys(victims) if isinstance(victims, Mapping) else {}
            pods = v.get("pods") or []
            uids = []
            for p in pods:
                if not isinstance(p, Mapping):
                    continue
                lp = lower_keys(p)
                uid = lp.get("uid") or ((p.get("metadata") or {}).get("uid") if "metadata" in p else None)
                if uid:
                    uids.append(str(uid))
            if info.requests:
                usage = self.ledger.usage_without(node, uids)
                if usage is None:
                    continue
                with self.ledger.lock:
                    state = self.ledger.nodes.get(node)
                    if state is None:
                        continue
                    order = self.policy.gpu_order(None, info.context) or self.placement.default_order
                    result = fit(state.devices, usage, info.requests, info.selectors, order)
                if not result.ok:
                    continue
            out[node] = {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": int(v.get("numpdbviolations") or 0)}
        return {"NodeNameToMetaVictims": out}


def _frozen(value: Any) -> Any:
    """A hashable copy of a JSON value (mappings as sorted item tuples); raises TypeError on anything else."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    hash(value)
    return value


class _Learner:
    """The learner thread of an extender: woken after binds (`wake`), it runs `Extender.learn` in slices; it holds
    the extender only weakly, and ends within `IDLE_EXIT` seconds of it being dropped."""

    IDLE_EXIT = 5.0

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.wanted = 0  # wakes asked for
        self.served = 0  # wakes served
        self.thread: threading.Thread | None = None

    def wake(self, extender: Extender) -> None:
        with self.cv:
            self.wanted += 1
            self.cv.notify()
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, args=(weakref.ref(extender),), name="vgpu-learner",
                                               daemon=True)
                self.thread.start()

    def wait_idle(self, timeout: float) -> bool:
        with self.cv:
            return self.cv.wait_for(lambda: self.served == self.wanted, timeout)

    def _run(self, extender: weakref.ref[Extender]) -> None:
        while True:
            with self.cv:
                if self.served == self.wanted:
                    self.cv.wait(self.IDLE_EXIT)
                target = self.wanted
            ext = extender()
            if ext is None:
                return
            if target != self.served:
                try:
                    ext.learn(LEARN_SLICE)
                except Exception:
                    log.exception("learner failed")
                with self.cv:
                    self.served = target
                    self.cv.notify_all()
            del ext
