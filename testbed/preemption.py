"""TEST INFRASTRUCTURE: kube-scheduler's PostFilter plugin DefaultPreemption, for the kube-scheduler stand-in.

Written from upstream's source, kubernetes/kubernetes as the 1.34 line has it (read from stored copies, not from
the v1.34.0 tag itself): pkg/scheduler/framework/preemption/preemption.go at 00e6d95193934fed1b980e82fb6ec563e9dd1693
(`Evaluator` before the 1.35 Executor split: Preempt, findCandidates, DryRunPreemption, callExtenders,
SelectCandidate, pickOneNodeForPreemption, prepareCandidate(Async), PreemptPod in NewEvaluator,
getLowerPriorityNominatedPods, clearNominatedNodeName) and the matching
pkg/scheduler/framework/plugins/defaultpreemption/default_preemption.go (`NewEvaluator(Name, fh, &pl,
fts.EnableAsyncPreemption)`: PostFilter, PreEnqueue, PodEligibleToPreemptOthers, SelectVictimsOnNode,
calculateNumCandidates, podTerminatingByPreemption, filterPodsWithPDBViolation); pkg/scheduler/util/utils.go
(MoreImportantPod, GetEarliestPodStartTime, DeletePod); pkg/scheduler/framework/types.go (FitError.Error);
pkg/scheduler/extender.go at 02850301e61b0491a6efad7fb440dfa1b03cfc96 (ProcessPreemption, convertToVictims,
convertToMetaVictims, SupportsPreemption); staging/src/k8s.io/kube-scheduler/extender/v1/types.go at
2d58ef7868e6efda493e876aeaf72fb7dfea7c44 (ExtenderPreemptionArgs / Result, Victims, MetaVictims, MetaPod: no json
tags, so the Go field names); pkg/scheduler/schedule_one.go at 003b4460edb52bc9a9fe6cf54294e5b3e4681610
(schedulingCycle, evaluateNominatedNode, findNodesThatPassExtenders, handleSchedulingFailure, updatePod);
framework/runtime/framework.go (RunFilterPluginsWithNominatedPods, addGENominatedPods); pkg/features/kube_features.go
(SchedulerAsyncPreemption: beta, on by default since 1.33; SchedulerAsyncAPICalls: off in 1.34).
This module holds the parts that need no API access; testbed/scheduler_driver.py runs them at PostFilter, calls
the extenders' preemptVerb and makes the API calls. It imports nothing of the product.

What it models, step by step (Evaluator.Preempt):
  1. PodEligibleToPreemptOthers: `spec.preemptionPolicy: Never` -> "not eligible due to preemptionPolicy=Never.";
     a pod already nominated (`status.nominatedNodeName`) whose nominated node did not come out of this cycle's
     filters UnschedulableAndUnresolvable, while a lower-priority pod on that node is terminating because of a
     preemption (deletionTimestamp set and condition DisruptionTarget=True reason PreemptionByScheduler) ->
     "not eligible due to a terminating pod on the nominated node.";
  2. findCandidates: only the nodes whose filter status is Unschedulable (not UnschedulableAndUnresolvable, not
     absent) are dry-run, from a random offset, until calculateNumCandidates (max(n x minCandidateNodesPercentage
     / 100, minCandidateNodesAbsolute), at most n; defaults 10 and 100) candidates are found;
     SelectVictimsOnNode: every pod of strictly lower priority is removed, the incoming pod must then pass the
     in-tree filters with the nominated pods (RunFilterPluginsWithNominatedPods), then the removed pods are added
     back one by one in MoreImportantPod order (higher priority first, then the earlier status.startTime) and
     each one that still lets the pod fit is reprieved; the others are the victims, most important first;
     "No preemption victims found for incoming pod" (UnschedulableAndUnresolvable) when no pod has a lower
     priority; a node where nothing had to be evicted is not a candidate:
       DryRunPreemption:  if status.IsSuccess() && len(pods) == 0 {
                              status = fwk.AsStatus(fmt.Errorf("expected at least one victim pod on node %q", ...))
     so with no candidate at all the PostFilter answers that error (Preempt: `if err != nil && len(candidates) ==
     0 { return nil, fwk.AsStatus(err) }`), otherwise a FitError whose nodes that were not dry-run read
     "Preemption is not helpful for scheduling";
  3. callExtenders: only when there are candidates, each extender with a preemptVerb that is interested in the pod
     gets the candidates and its answer replaces them (see scheduler_driver._extender_preempt);
  4. SelectCandidate / pickOneNodeForPreemption: fewest PDB violations, lowest priority of the most important
     victim, lowest sum of (priority + MaxInt32 + 1), fewest victims, latest start time of the most important
     victims, then the first in Go's (random) map order;
  5. prepareCandidateAsync (SchedulerAsyncPreemption, beta and on by default since 1.33): the preemptor is
     nominated at once and kept out of the queue (DefaultPreemption's PreEnqueue, IsPodRunningPreemption) while
     the victims are preempted in the background: the lower-priority pods nominated to that node lose their
     `status.nominatedNodeName`, every victim but the last is preempted, then the last one; PreemptPod patches the
     victim's status with the DisruptionTarget condition (reason PreemptionByScheduler, message "<schedulerName>:
     preempting to accommodate a higher priority pod"), deletes it, and records the event `Preempted` "Preempted
     by pod <preemptor uid> on node <node>" (action Preempting) on the victim.

The important subtlety, reproduced and not "fixed": the dry run runs the in-tree filter plugins only, never the
extenders' filterVerb. A node that an extender rejected (FailedNodes: Unschedulable) while the in-tree filters
pass is dry-run, every lower-priority pod is removed and then reprieved again (the in-tree filters never needed
any room), so it yields no victims and is no candidate ("expected at least one victim pod on node ..." above, or
"No preemption victims found ..." on a node without lower-priority pods). An extender that manages a resource the
in-tree filters ignore (`managedResources` with `ignoredByScheduler: true`) therefore gets no preemption for
pods short of that resource, and it only gets a say through its preemptVerb, over candidates that already have
victims for the in-tree filters.

Not modelled: PodDisruptionBudgets (the API stand-in serves no policy/v1): every victim counts as not violating
a PDB, so NumPDBViolations is always 0, filterPodsWithPDBViolation's first reprieve pass is empty, the first
criterion of pickOneNodeForPreemption never decides and DryRunPreemption's violating-candidates list stays empty;
the synchronous path (SchedulerAsyncPreemption off); waiting pods (Permit) as victims; IsEligiblePod /
MoreImportantPod / OrderedScoreFuncs customisations (out-of-tree plugins); preemption metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "DEFAULT_MIN_CANDIDATE_NODES_ABSOLUTE",
    "DEFAULT_MIN_CANDIDATE_NODES_PERCENTAGE",
    "ERROR",
    "NOT_HELPFUL",
    "NO_CANDIDATE",
    "NO_VICTIMS",
    "UNRESOLVABLE",
    "UNSCHEDULABLE",
    "NodeStatus",
    "Victims",
    "aggregate_errors",
    "disruption_target_condition",
    "eligible_to_preempt",
    "fit_error",
    "nominated_node_name",
    "now_rfc3339",
    "num_candidates",
    "pick_one_node",
    "pod_priority",
    "preempted_message",
    "select_victims",
    "terminating_by_preemption",
]

Obj = dict[str, Any]

# fwk.Code names, as the stand-in records a node's filter status
UNSCHEDULABLE = "Unschedulable"
UNRESOLVABLE = "UnschedulableAndUnresolvable"
ERROR = "Error"

DEFAULT_MIN_CANDIDATE_NODES_PERCENTAGE = 10  # pkg/scheduler/apis/config/v1/defaults.go
DEFAULT_MIN_CANDIDATE_NODES_ABSOLUTE = 100
MAX_INT32 = 2**31 - 1

NO_VICTIMS = "No preemption victims found for incoming pod"
NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_CANDIDATE = "no candidate node for preemption"
NEVER = "not eligible due to preemptionPolicy=Never."
TERMINATING = "not eligible due to a terminating pod on the nominated node."
NO_NODE_AVAILABLE = "0/{} nodes are available"
DISRUPTION_TARGET = "DisruptionTarget"
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """A filter's answer for one node: its fwk.Code and reasons (absent from a map: it passed)."""

    code: str
    reasons: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        """fwk.Status.Message: the reasons joined with ", "."""
        return ", ".join(self.reasons)


@dataclass(slots=True)
class Victims:
    """extenderv1.Victims: the pods to preempt on a node (most important first) and the PDBs they violate."""

    pods: list[Obj] = field(default_factory=list)
    num_pdb_violations: int = 0


def _meta(pod: Obj) -> Obj:
    return pod.get("metadata") or {}


def pod_priority(pod: Obj) -> int:
    """corev1helpers.PodPriority: spec.priority (set by the Priority admission plugin), 0 when absent."""
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def nominated_node_name(pod: Obj | None) -> str:
    """status.nominatedNodeName, "" when unset."""
    return str(((pod or {}).get("status") or {}).get("nominatedNodeName") or "")


def _parse_time(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _start_time(pod: Obj, now: float) -> float:
    """util.GetPodStartTime: status.startTime, else now (assumed and bound pods that did not start)."""
    found = _parse_time((pod.get("status") or {}).get("startTime"))
    return now if found is None else found


def _importance(now: float) -> Callable[[Obj], tuple[int, float]]:
    """Sort key for util.MoreImportantPod: higher priority first, then the earlier start time. Python's sort is
    stable, so pods that tie keep the cache's order (Go's sort.Slice leaves ties in no particular order)."""
    return lambda pod: (-pod_priority(pod), _start_time(pod, now))


def terminating_by_preemption(pod: Obj) -> bool:
    """podTerminatingByPreemption: being deleted, with DisruptionTarget=True for reason PreemptionByScheduler."""
    if not _meta(pod).get("deletionTimestamp"):
        return False
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if isinstance(cond, dict) and cond.get("type") == DISRUPTION_TARGET:
            return cond.get("status") == "True" and cond.get("reason") == PREEMPTION_BY_SCHEDULER
    return False


def eligible_to_preempt(pod: Obj, nominated_status: NodeStatus | None,
                        pods_on_nominated: Iterable[Obj] | None) -> tuple[bool, str]:
    """DefaultPreemption.PodEligibleToPreemptOthers. `nominated_status`: this cycle's filter status of the pod's
    nominated node (None: it passed); `pods_on_nominated`: the pods on that node, None when it is not in the
    snapshot."""
    if (pod.get("spec") or {}).get("preemptionPolicy") == "Never":
        return False, NEVER
    if nominated_node_name(pod):
        if nominated_status is not None and nominated_status.code == UNRESOLVABLE:
            return True, ""
        priority = pod_priority(pod)
        for other in pods_on_nominated or ():
            if pod_priority(other) < priority and terminating_by_preemption(other):
                return False, TERMINATING
    return True, ""


def num_candidates(num_nodes: int, percentage: int, absolute: int) -> int:
    """DefaultPreemption.calculateNumCandidates."""
    n = num_nodes * percentage // 100
    n = max(n, absolute)
    return min(n, num_nodes)


def select_victims(pod: Obj, pods_on_node: Sequence[Obj],
                   fits: Callable[[Sequence[Obj]], NodeStatus | None],
                   now: float | None = None) -> tuple[list[Obj], NodeStatus | None]:
    """DefaultPreemption.SelectVictimsOnNode without PDBs: (victims, None) or ([], the failing status).

    `fits(removed)` runs the filters (with the nominated pods) on the node without the pods in `removed`, None
    when the pod passes. The victims come out most important first; an empty list with None means the pod fits
    without evicting anyone (DryRunPreemption turns that into "expected at least one victim pod")."""
    now = time.time() if now is None else now
    priority = pod_priority(pod)
    potential = [other for other in pods_on_node if pod_priority(other) < priority]
    if not potential:
        return [], NodeStatus(UNRESOLVABLE, (NO_VICTIMS,))
    removed = list(potential)
    status = fits(removed)
    if status is not None:
        return [], status
    victims: list[Obj] = []
    for candidate in sorted(potential, key=_importance(now)):
        # no PodDisruptionBudgets: every potential victim is in filterPodsWithPDBViolation's non-violating group
        removed = [other for other in removed if other is not candidate]
        if fits(removed) is not None:
            removed.append(candidate)
            victims.append(candidate)
    return victims, None


def _earliest_start_of_most_important(pods: Sequence[Obj], now: float) -> float:
    """util.GetEarliestPodStartTime: the earliest start time among the victims of the highest priority."""
    best_priority = pod_priority(pods[0])
    earliest = _start_time(pods[0], now)
    for pod in pods:
        priority = pod_priority(pod)
        if priority == best_priority:
            earliest = min(earliest, _start_time(pod, now))
        elif priority > best_priority:
            best_priority, earliest = priority, _start_time(pod, now)
    return earliest


def pick_one_node(victims: dict[str, Victims], order: Sequence[str], now: float | None = None) -> str:
    """pickOneNodeForPreemption with the default score functions; `order` stands for Go's map iteration order
    (the last tie-break: "the first such node is picked")."""
    if not victims:
        return ""
    now = time.time() if now is None else now

    def highest(node: str) -> int:
        return -pod_priority(victims[node].pods[0])

    def total(node: str) -> int:
        return -sum(pod_priority(p) + MAX_INT32 + 1 for p in victims[node].pods)

    def latest_start(node: str) -> float:
        return _earliest_start_of_most_important(victims[node].pods, now)

    score_funcs: list[Callable[[str], float]] = [
        lambda node: -victims[node].num_pdb_violations,   # fewest PDB violations
        highest,                                          # lowest priority of the most important victim
        total,                                            # lowest sum of priorities
        lambda node: -len(victims[node].pods),            # fewest victims
        latest_start,                                     # latest start time of the most important victims
    ]
    candidates = list(order)
    for func in score_funcs:
        scores = {node: func(node) for node in candidates}
        best = max(scores.values())
        selected = [node for node in candidates if scores[node] == best]
        if len(selected) == 1:
            return selected[0]
        candidates = selected
    return candidates[0]


def fit_error(num_all_nodes: int, statuses: dict[str, NodeStatus], absent: Sequence[str] = (NOT_HELPFUL,)) -> str:
    """framework.FitError.Error() for a diagnosis without a PreFilter message: "0/N nodes are available: <count
    reason, sorted>." where the nodes missing from `statuses` count with the `absent` reasons."""
    counts: dict[str, int] = {}
    for status in statuses.values():
        for reason in status.reasons:
            counts[reason] = counts.get(reason, 0) + 1
    if len(statuses) < num_all_nodes:
        for reason in absent:
            counts[reason] = counts.get(reason, 0) + num_all_nodes - len(statuses)
    message = NO_NODE_AVAILABLE.format(num_all_nodes) + ":"
    parts = sorted(f"{count} {reason}" for reason, count in counts.items())
    if parts:
        message += f" {', '.join(parts)}."
    return message


def aggregate_errors(messages: Sequence[str]) -> str:
    """utilerrors.NewAggregate(errs).Error(): one message as is, several distinct ones as "[a, b]"."""
    seen: list[str] = []
    for message in messages:
        if message not in seen:
            seen.append(message)
    if len(messages) == 1 or len(seen) == 1:
        return seen[0] if seen else ""
    return "[" + ", ".join(seen) + "]"


def disruption_target_condition(scheduler_name: str, existing: Obj | None, now: str) -> Obj | None:
    """The condition PreemptPod writes (apipod.UpdatePodCondition semantics): None when the victim already has
    it unchanged; the transition time moves only when the status changes."""
    wanted: Obj = {"type": DISRUPTION_TARGET, "status": "True", "reason": PREEMPTION_BY_SCHEDULER,
              "message": f"{scheduler_name}: preempting to accommodate a higher priority pod"}
    if existing is not None and all(existing.get(k) == v for k, v in wanted.items()):
        return None
    same_status = existing is not None and existing.get("status") == wanted["status"]
    wanted["lastTransitionTime"] = existing.get("lastTransitionTime") if same_status and existing else now
    return wanted


def preempted_message(preemptor: Obj, node: str) -> str:
    """The victim's `Preempted` event: "Preempted by pod %v on node %v" with the preemptor's uid."""
    return f"Preempted by pod {_meta(preemptor).get('uid')} on node {node}"


def now_rfc3339() -> str:
    """metav1.Now() as it serialises."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
