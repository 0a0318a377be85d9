"""TEST INFRASTRUCTURE: PodDisruptionBudgets, the disruption controller's status and the Eviction API, for the
API-server stand-in (testbed/apiserver.py), written from kube-apiserver's and kube-controller-manager's source. It
imports nothing of the product.

Upstream sources (kubernetes/kubernetes):
  * pkg/apis/policy/validation/validation.go `ValidatePodDisruptionBudgetSpec` (minAvailable and maxUnavailable not
    both, each a non-negative int or a percent not over 100%, the selector, unhealthyPodEvictionPolicy one of
    AlwaysAllow / IfHealthyBudget) and `ValidatePodDisruptionBudgetStatusUpdate` (non-negative counts, policy/v1);
    pkg/apis/apps/validation `ValidatePositiveIntOrPercent`, `IsNotMoreThan100Percent`; policy/v1 has no defaulting
    (a budget with neither field expects nothing and allows nothing);
  * pkg/controller/disruption/disruption.go: `trySync`, `getPodsForPdb`, `getExpectedPodCount`, `getExpectedScale`
    and its finders (`getPodReplicationController`, `getPodDeployment`, `getPodReplicaSet`, `getPodStatefulSet`,
    `getScaleController`), `countHealthyPods`, `buildDisruptedPodMap` (`DeletionTimeout` 2 min), `updatePdbStatus`,
    `failSafe`; staging/src/k8s.io/component-helpers/apps/poddisruptionbudget/helpers.go
    (`UpdateDisruptionAllowedCondition`, `ConditionsAreUpToDate`); apimachinery `meta.SetStatusCondition` and
    `intstr.GetScaledValueFromIntOrPercent` (percentages rounded up);
  * pkg/registry/core/pod/storage/eviction.go (the version with `unhealthyPodEvictionPolicy` and
    `addConditionAndDeletePod`): `EvictionREST.Create`, `propagateDryRun`, `canIgnorePDB`,
    `shouldEnforceResourceVersion`, `checkAndDecrement` (`MaxDisruptedPodSize` 2000), `createTooManyRequestsError`,
    `getPodDisruptionBudgets`; pkg/api/pod `IsPodReady`, `UpdatePodCondition` (the DisruptionTarget condition of
    PodDisruptionConditions, GA);
  * staging/src/k8s.io/apiserver/pkg/endpoints/handlers/finisher/finisher.go (a Status result that is not Success
    is answered as an error with its own code: the 500 of two budgets) and handlers/create.go (201 and the Status of
    a successful eviction); apimachinery errors `NewTooManyRequests`, `NewForbidden`.

What a pod is to a budget: selected by the budget's selector in its namespace (a null selector selects nothing, `{}`
everything); healthy when not being deleted, not in status.disruptedPods for less than DeletionTimeout, and Ready
(condition Ready True; upstream checks no phase here). Expected pods: with minAvailable an integer, the selected
pods; with a percentage or maxUnavailable, the sum of the scales of their controllers (ReplicaSet, the Deployment
of a ReplicaSet it controls, StatefulSet; ReplicationControllers are not served by the stand-in and so never found);
a pod without a controller is left out with a Warning event `UnmanagedPods` (so pods that all lack one give
expectedPods 0 and disruptionsAllowed 0); a controller reference that leads nowhere makes the sync fail: a Warning
event `CalculateExpectedPodCountFailed` and failSafe (disruptionsAllowed 0, condition DisruptionAllowed False
SyncFailed with the error, the rest of the status untouched).

Deviations (by the caller, testbed/apiserver.py): the controller's work is done synchronously, in the critical section
of the change that needs it, for every budget of the namespace that selects the changed pod before or after the
change (upstream: the first budget of the pod's current labels, through a queue) and for a created or updated
budget; an entry of disruptedPods past DeletionTimeout is dropped at the next recompute (upstream rechecks at that
moment); a pod matching several budgets gets no `MultiplePodDisruptionBudgets` event; the eviction's write of the
budget's status is stored without admission (upstream writes it through a loopback client).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from vgpu.testbed.admission import Denied

__all__ = [
    "DELETION_TIMEOUT",
    "MAX_DISRUPTED_POD_SIZE",
    "ControllerError",
    "SyncResult",
    "can_ignore_pdb",
    "check_and_decrement",
    "disruption_target",
    "eviction_success",
    "is_pod_ready",
    "matching_budgets",
    "selects",
    "several_budgets",
    "should_enforce_resource_version",
    "still_processing",
    "sync",
    "too_many_requests",
    "unready_may_go",
    "validate",
    "validate_status",
]

Obj = dict[str, Any]

DELETION_TIMEOUT = timedelta(minutes=2)  # disruption.go DeletionTimeout
MAX_DISRUPTED_POD_SIZE = 2000  # eviction.go MaxDisruptedPodSize
_POLICIES = ("AlwaysAllow", "IfHealthyBudget")  # validation.go supportedUnhealthyPodEvictionPolicies (sorted)
_PERCENT = re.compile(r"^[0-9]+%$")  # apimachinery validation IsValidPercent
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
# kinds kube-apiserver serves with a scale subresource, (group, kind) -> the stand-in's resource key (None: the
# stand-in does not serve it, so no object of it is ever found)
_SCALABLE = {("apps", "ReplicaSet"): "apps/v1/replicasets", ("apps", "Deployment"): "apps/v1/deployments",
             ("apps", "StatefulSet"): "apps/v1/statefulsets", ("", "ReplicationController"): None}
# kinds the stand-in serves without a scale subresource, (group, kind) -> plural as GroupResource.String() prints it
_UNSCALABLE = {("", "Pod"): "pods", ("", "Node"): "nodes", ("", "Event"): "events",
               ("coordination.k8s.io", "Lease"): "leases.coordination.k8s.io",
               ("policy", "PodDisruptionBudget"): "poddisruptionbudgets.policy"}


def _now_text(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


# ------------------------------------------------------------------------------------------------ label selectors

class _SelectorError(ValueError):
    pass


def _selector_problems(selector: Any, path: str) -> list[str]:
    """metav1 validation ValidateLabelSelector, the part a selector's meaning depends on."""
    if selector is None:
        return []
    if not isinstance(selector, dict):
        return [f"{path}: Invalid value: must be a label selector"]
    out = []
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        out.append(f"{path}.matchLabels: Invalid value: must be a map of strings")
    for i, req in enumerate(selector.get("matchExpressions") or []):
        where = f"{path}.matchExpressions[{i}]"
        if not isinstance(req, dict):
            out.append(f"{where}: Invalid value: must be an object")
            continue
        op, values = req.get("operator"), req.get("values") or []
        if op in ("In", "NotIn") and not values:
            out.append(f"{where}.values: Required value: must be specified when `operator` is 'In' or 'NotIn'")
        elif op in ("Exists", "DoesNotExist") and values:
            out.append(f"{where}.values: Forbidden: may not be specified when `operator` is 'Exists' or "
                       "'DoesNotExist'")
        elif op not in _OPERATORS:
            out.append(f'{where}.operator: Invalid value: "{op}": not a valid selector operator')
    return out


def selects(selector: Any, labels: Mapping[str, str] | None) -> bool:
    """metav1.LabelSelectorAsSelector(selector).Matches(labels): a null selector selects nothing, `{}` everything;
    a selector that cannot be read raises ValueError."""
    if selector is None:
        return False
    if not isinstance(selector, dict):
        raise _SelectorError("a label selector must be an object")
    labels = labels or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for req in selector.get("matchExpressions") or []:
        key, op, values = req.get("key"), req.get("operator"), req.get("values") or []
        if op not in _OPERATORS:
            raise _SelectorError(f'"{op}" is not a valid label selector operator')
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and key in labels
                                                              and labels[key] in values):
            return False
        if (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
            return False
    return True


def _selects_pod(pdb: Obj, pod: Obj) -> bool:
    try:
        return selects((pdb.get("spec") or {}).get("selector"), (pod.get("metadata") or {}).get("labels"))
    except ValueError:
        return False  # getPodDisruptionBudgets: "an invalid selector, it does not match the pod"


def matching_budgets(pdbs: Iterable[Obj], pod: Obj) -> list[Obj]:
    """eviction.go getPodDisruptionBudgets: the budgets of the pod's namespace whose selector selects it."""
    ns = (pod.get("metadata") or {}).get("namespace", "")
    return [p for p in pdbs if (p.get("metadata") or {}).get("namespace", "") == ns and _selects_pod(p, pod)]


# -------------------------------------------------------------------------------------- the registry's strategy

def _int_or_percent_problems(value: Any, path: str) -> list[str]:
    """ValidatePositiveIntOrPercent and IsNotMoreThan100Percent."""
    shown = f'"{value}"' if isinstance(value, str) else str(value)
    if isinstance(value, bool) or not isinstance(value, int | str):
        return [f"{path}: Invalid value: {shown}: must be an integer or percentage (e.g '5%')"]
    if isinstance(value, int):
        return [f"{path}: Invalid value: {value}: must be greater than or equal to 0"] if value < 0 else []
    if not _PERCENT.match(value):
        return [f"{path}: Invalid value: {shown}: a valid percent string must be a numeric string followed by an "
                "ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')"]
    if int(value[:-1]) > 100:
        return [f"{path}: Invalid value: {shown}: must not be greater than 100%"]
    return []


def validate(pdb: Obj) -> list[str]:
    """ValidatePodDisruptionBudgetSpec: the field errors of a budget's spec, as `field: what` (empty when valid)."""
    spec = pdb.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        return ["spec: Invalid value: must be an object"]
    out = []
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        out.append(f"spec: Invalid value: {json.dumps(spec, sort_keys=True)}: minAvailable and maxUnavailable "
                   "cannot be both set")
    for name in ("minAvailable", "maxUnavailable"):
        if spec.get(name) is not None:
            out += _int_or_percent_problems(spec[name], f"spec.{name}")
    out += _selector_problems(spec.get("selector"), "spec.selector")
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy is not None and policy not in _POLICIES:
        out.append(f'spec.unhealthyPodEvictionPolicy: Unsupported value: "{policy}": supported values: '
                   + ", ".join(f'"{p}"' for p in _POLICIES))
    return out


def validate_status(pdb: Obj) -> list[str]:
    """ValidatePodDisruptionBudgetStatusUpdate for policy/v1: the counts are not negative."""
    status = pdb.get("status") or {}
    if not isinstance(status, dict):
        return ["status: Invalid value: must be an object"]
    out = []
    for name in ("disruptionsAllowed", "currentHealthy", "desiredHealthy", "expectedPods"):
        value = status.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int):
            out.append(f"status.{name}: Invalid value: must be an integer")
        elif value < 0:
            out.append(f"status.{name}: Invalid value: {value}: must be greater than or equal to 0")
    return out


# ------------------------------------------------------------------------------------------ the disruption controller

class ControllerError(Exception):
    """The controller of a pod cannot be found (getExpectedScale's error)."""


def _controller_of(obj: Obj) -> Obj | None:
    """metav1.GetControllerOf: the owner reference with controller: true."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, dict) and ref.get("controller") is True:
            return ref
    return None


def _group_of(api_version: Any) -> str:
    text = str(api_version or "")
    if text.count("/") > 1:
        raise ControllerError(f"unexpected GroupVersion string: {text}")
    return text.rpartition("/")[0]


Lookup = Callable[[str, str, str], Obj | None]  # (resource key, namespace, name) -> the stored object or None


def _replicas(obj: Obj) -> int:
    value = (obj.get("spec") or {}).get("replicas")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 1  # apps/v1 defaults to 1


def _find_scale(ref: Obj, ns: str, lookup: Lookup) -> tuple[str, int] | None:
    """The finders of disruption.go, in their order: (the controller's uid, its scale), None when none finds it."""
    group, kind, name, uid = _group_of(ref.get("apiVersion")), ref.get("kind"), ref.get("name", ""), ref.get("uid")

    def get(key: str, obj_name: str, obj_uid: Any) -> Obj | None:
        obj = lookup(key, ns, obj_name)
        return obj if obj is not None and obj["metadata"].get("uid") == obj_uid else None

    # getPodReplicationController: the stand-in serves no ReplicationControllers
    if kind == "ReplicaSet" and group in ("apps", "extensions"):
        rs = get("apps/v1/replicasets", name, uid)
        owner = _controller_of(rs) if rs is not None else None
        if rs is not None and owner is not None and owner.get("kind") == "Deployment":  # getPodDeployment
            dep = (get("apps/v1/deployments", owner.get("name", ""), owner.get("uid"))
                   if _group_of(owner.get("apiVersion")) in ("apps", "extensions") else None)
            if dep is not None:
                return str(dep["metadata"]["uid"]), _replicas(dep)
        elif rs is not None:  # getPodReplicaSet: a ReplicaSet no Deployment controls
            return str(rs["metadata"]["uid"]), _replicas(rs)
    if kind == "StatefulSet" and group == "apps":  # getPodStatefulSet
        ss = get("apps/v1/statefulsets", name, uid)
        if ss is not None:
            return str(ss["metadata"]["uid"]), _replicas(ss)
    # getScaleController: the kind's RESTMapping, then its scale subresource (NotFound: no controller found)
    if (group, kind) in _SCALABLE:
        key = _SCALABLE[(group, str(kind))]
        obj = get(key, name, uid) if key is not None else None
        return (str(obj["metadata"]["uid"]), _replicas(obj)) if obj is not None else None
    plural = _UNSCALABLE.get((group, str(kind)))
    if plural is not None:
        raise ControllerError(f"{plural} does not implement the scale subresource")
    raise ControllerError(f'no matches for kind "{kind}" in version "{ref.get("apiVersion", "")}"')


def _scaled(value: Any, total: int) -> int:
    """intstr.GetScaledValueFromIntOrPercent(value, total, roundUp=true)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value)
    if not text.endswith("%"):
        raise ControllerError("invalid type: string is not a percentage")
    try:
        percent = int(text[:-1])
    except ValueError:
        raise ControllerError(f"invalid value for IntOrString: invalid value {text!r}") from None
    return -(-percent * total // 100)


def _expected_scale(pods: list[Obj], lookup: Lookup) -> tuple[int, list[str]]:
    """getExpectedScale: the sum of the scales of the pods' controllers and the pods without a controller."""
    scales: dict[str, int] = {}
    unmanaged: list[str] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        ref = _controller_of(pod)
        if ref is None:
            unmanaged.append(meta.get("name", ""))
            continue
        if ref.get("uid") in scales:
            continue
        found = _find_scale(ref, meta.get("namespace", ""), lookup)
        if found is None:
            raise ControllerError(f'found no controllers for pod "{meta.get("name", "")}"')
        scales[found[0]] = found[1]
    return sum(scales.values()), unmanaged


def _expected_pod_count(pdb: Obj, pods: list[Obj], lookup: Lookup) -> tuple[int, int, list[str]]:
    """getExpectedPodCount: (expectedCount, desiredHealthy, unmanagedPods)."""
    spec = pdb.get("spec") or {}
    expected, desired, unmanaged = 0, 0, list[str]()
    if spec.get("maxUnavailable") is not None:
        expected, unmanaged = _expected_scale(pods, lookup)
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
    elif spec.get("minAvailable") is not None:
        if isinstance(spec["minAvailable"], int) and not isinstance(spec["minAvailable"], bool):
            desired, expected = spec["minAvailable"], len(pods)
        else:
            expected, unmanaged = _expected_scale(pods, lookup)
            desired = _scaled(spec["minAvailable"], expected)
    return expected, desired, unmanaged


def is_pod_ready(pod: Obj) -> bool:
    """podutil.IsPodReady: the Ready condition is True."""
    return any(isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or ())


def _disrupted_pod_map(pods: list[Obj], pdb: Obj, now: datetime) -> dict[str, str]:
    """buildDisruptedPodMap: the entries of pods that still exist, are not being deleted and are within
    DeletionTimeout of their disruption."""
    disrupted = (pdb.get("status") or {}).get("disruptedPods") or {}
    out = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp") or meta.get("name") not in disrupted:
            continue
        when = _parse_time(disrupted[meta["name"]])
        if when is not None and when + DELETION_TIMEOUT >= now:
            out[meta["name"]] = disrupted[meta["name"]]
    return out


def _count_healthy(pods: list[Obj], disrupted: Mapping[str, str], now: datetime) -> int:
    """countHealthyPods."""
    healthy = 0
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        when = _parse_time(disrupted.get(meta.get("name", "")))
        if when is not None and when + DELETION_TIMEOUT > now:
            continue
        if is_pod_ready(pod):
            healthy += 1
    return healthy


def _set_condition(conditions: list[Obj], new: Obj, now: datetime) -> None:
    """apimachinery meta.SetStatusCondition."""
    for cond in conditions:
        if cond.get("type") == new["type"]:
            if cond.get("status") != new["status"]:
                cond["status"] = new["status"]
                cond["lastTransitionTime"] = _now_text(now)
            for key in ("reason", "message"):
                cond[key] = new.get(key, "")
            if new.get("observedGeneration"):
                cond["observedGeneration"] = new["observedGeneration"]
            else:
                cond.pop("observedGeneration", None)
            return
    cond = {"type": new["type"], "status": new["status"], "lastTransitionTime": _now_text(now),
            "reason": new.get("reason", ""), "message": new.get("message", "")}
    if new.get("observedGeneration"):
        cond["observedGeneration"] = new["observedGeneration"]
    conditions.append(cond)


def _update_allowed_condition(status: Obj, now: datetime) -> None:
    """poddisruptionbudget helpers UpdateDisruptionAllowedCondition."""
    conditions = status.setdefault("conditions", [])
    allowed = int(status.get("disruptionsAllowed") or 0) > 0
    _set_condition(conditions, {"type": "DisruptionAllowed", "status": "True" if allowed else "False",
                                "reason": "SufficientPods" if allowed else "InsufficientPods", "message": "",
                                "observedGeneration": status.get("observedGeneration", 0)}, now)


def _conditions_up_to_date(pdb: Obj) -> bool:
    """poddisruptionbudget helpers ConditionsAreUpToDate."""
    status = pdb.get("status") or {}
    cond = next((c for c in status.get("conditions") or () if c.get("type") == "DisruptionAllowed"), None)
    if cond is None or status.get("observedGeneration", 0) != (pdb.get("metadata") or {}).get("generation", 0):
        return False
    if int(status.get("disruptionsAllowed") or 0) > 0:
        return cond.get("status") == "True" and cond.get("reason") == "SufficientPods"
    return cond.get("status") == "False" and cond.get("reason") == "InsufficientPods"


@dataclass(slots=True)
class SyncResult:
    """What one sync of a budget does: the status to write (None: already up to date) and the events to record
    (type, reason, message) about the budget."""

    status: Obj | None
    events: list[tuple[str, str, str]] = field(default_factory=list)


def _status(current: int, desired: int, expected: int, allowed: int, disrupted: Mapping[str, str],
            generation: int, conditions: list[Obj]) -> Obj:
    """A PodDisruptionBudgetStatus as policy/v1 serializes it (disruptedPods and observedGeneration omitted when
    empty)."""
    out: Obj = {}
    if generation:
        out["observedGeneration"] = generation
    if disrupted:
        out["disruptedPods"] = dict(disrupted)
    out.update({"disruptionsAllowed": allowed, "currentHealthy": current, "desiredHealthy": desired,
                "expectedPods": expected})
    if conditions:
        out["conditions"] = conditions
    return out


def _fail_safe(pdb: Obj, error: str, now: datetime) -> Obj | None:
    """failSafe: disruptionsAllowed 0 and DisruptionAllowed False SyncFailed with the error, the rest of the status
    kept (observedGeneration included); None when the stored status already says so."""
    old = pdb.get("status") or {}
    conditions = [dict(c) for c in old.get("conditions") or ()]
    generation = int(old.get("observedGeneration") or 0)
    _set_condition(conditions, {"type": "DisruptionAllowed", "status": "False", "reason": "SyncFailed",
                                "message": error, "observedGeneration": generation}, now)
    new = _status(int(old.get("currentHealthy") or 0), int(old.get("desiredHealthy") or 0),
                  int(old.get("expectedPods") or 0), 0, old.get("disruptedPods") or {}, generation, conditions)
    return None if new == old else new


def sync(pdb: Obj, pods: Iterable[Obj], lookup: Lookup, now: datetime | None = None) -> SyncResult:
    """The disruption controller's sync of one budget (trySync, failSafe on an error): `pods` are the pods of the
    budget's namespace, `lookup` finds the workload objects that may control them."""
    now = now or datetime.now(UTC)
    ns = (pdb.get("metadata") or {}).get("namespace", "")
    spec = pdb.get("spec") or {}
    events: list[tuple[str, str, str]] = []
    try:
        try:
            selected = [p for p in pods if (p.get("metadata") or {}).get("namespace", "") == ns
                        and selects(spec.get("selector"), (p.get("metadata") or {}).get("labels"))]
        except ValueError as exc:
            events.append(("Warning", "NoPods", f"Failed to get pods: {exc}"))
            raise ControllerError(str(exc)) from None
        if not selected:
            events.append(("Normal", "NoPods", "No matching pods found"))
        try:
            expected, desired, unmanaged = _expected_pod_count(pdb, selected, lookup)
        except ControllerError as exc:
            events.append(("Warning", "CalculateExpectedPodCountFailed",
                           f"Failed to calculate the number of expected pods: {exc}"))
            raise
        if unmanaged:
            events.append(("Warning", "UnmanagedPods",
                           f"Pods selected by this PodDisruptionBudget (selector: {_format_selector(spec)}) were "
                           "found to be unmanaged. As a result, the status of the PDB cannot be calculated "
                           "correctly, which may result in undefined behavior. To account for these pods please "
                           'set ".spec.minAvailable" field of the PDB to an integer value.'))
    except ControllerError as exc:
        return SyncResult(_fail_safe(pdb, str(exc), now), events)
    disrupted = _disrupted_pod_map(selected, pdb, now)
    current = _count_healthy(selected, disrupted, now)
    return SyncResult(_update_status(pdb, current, desired, expected, disrupted, now), events)


def _update_status(pdb: Obj, current: int, desired: int, expected: int, disrupted: Mapping[str, str],
                   now: datetime) -> Obj | None:
    """updatePdbStatus: the new status, or None when the stored one is up to date."""
    allowed = current - desired
    if expected <= 0 or allowed <= 0:
        allowed = 0
    old = pdb.get("status") or {}
    generation = int((pdb.get("metadata") or {}).get("generation") or 0)
    if (old.get("currentHealthy", 0) == current and old.get("desiredHealthy", 0) == desired
            and old.get("expectedPods", 0) == expected and old.get("disruptionsAllowed", 0) == allowed
            and (old.get("disruptedPods") or {}) == dict(disrupted)
            and old.get("observedGeneration", 0) == generation and _conditions_up_to_date(pdb)):
        return None
    status = _status(current, desired, expected, allowed, disrupted, generation,
                     [dict(c) for c in old.get("conditions") or ()])
    _update_allowed_condition(status, now)
    return status


def _format_selector(spec: Obj) -> str:
    """How Go's %v prints a *metav1.LabelSelector, approximately: `&LabelSelector{MatchLabels:map[k:v],...}`."""
    selector = spec.get("selector")
    if not isinstance(selector, dict):
        return "nil"
    labels = " ".join(f"{k}:{v}" for k, v in sorted((selector.get("matchLabels") or {}).items()))
    exprs = ",".join(f"{e.get('key')} {e.get('operator')} {e.get('values') or []}"
                     for e in selector.get("matchExpressions") or () if isinstance(e, dict))
    return f"&LabelSelector{{MatchLabels:map[string]string{{{labels}}},MatchExpressions:[{exprs}],}}"


# ----------------------------------------------------------------------------------------------- the Eviction API

def can_ignore_pdb(pod: Obj) -> bool:
    """eviction.go canIgnorePDB: Succeeded, Failed or Pending, or already being deleted."""
    return ((pod.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Pending")
            or bool((pod.get("metadata") or {}).get("deletionTimestamp")))


def should_enforce_resource_version(pod: Obj) -> bool:
    """eviction.go shouldEnforceResourceVersion: not for terminal pods or pods being deleted."""
    return not ((pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
                or bool((pod.get("metadata") or {}).get("deletionTimestamp")))


def too_many_requests(cause: str, retry_after: int) -> Denied:
    """errors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", retry_after)
    with a DisruptionBudget cause."""
    details: Obj = {"causes": [{"reason": "DisruptionBudget", "message": cause}]}
    if retry_after:
        details["retryAfterSeconds"] = retry_after
    return Denied(429, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
                        "reason": "TooManyRequests", "details": details, "code": 429})


def still_processing(name: str) -> Denied:
    """eviction.go createTooManyRequestsError: the budget's status is behind its generation (Retry-After 10)."""
    return too_many_requests(f"The disruption budget {name} is still being processed by the server.", 10)


def _forbidden(name: str, why: str) -> Denied:
    """errors.NewForbidden(policy.Resource("poddisruptionbudget"), name, why)."""
    return Denied(403, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": f'poddisruptionbudget.policy "{name}" is forbidden: {why}', "reason": "Forbidden",
                        "details": {"name": name, "group": "policy", "kind": "poddisruptionbudget"}, "code": 403})


def check_and_decrement(pdb: Obj, pod_name: str, dry_run: bool, now: datetime | None = None) -> Obj | None:
    """eviction.go checkAndDecrement: the budget with one disruption fewer and the pod in disruptedPods (None on a
    dry run, where nothing is written); raises Denied (429 or 403) when the budget does not allow it."""
    now = now or datetime.now(UTC)
    meta, status = pdb.get("metadata") or {}, dict(pdb.get("status") or {})
    name = meta.get("name", "")
    if int(status.get("observedGeneration") or 0) < int(meta.get("generation") or 0):
        raise still_processing(name)
    allowed = int(status.get("disruptionsAllowed") or 0)
    if allowed < 0:
        raise _forbidden(name, "pdb disruptions allowed is negative")
    if len(status.get("disruptedPods") or {}) > MAX_DISRUPTED_POD_SIZE:
        raise _forbidden(name, "DisruptedPods map too big - too many evictions not confirmed by PDB controller")
    if allowed == 0:
        raise too_many_requests(f"The disruption budget {name} needs {int(status.get('desiredHealthy') or 0)} "
                                f"healthy pods and has {int(status.get('currentHealthy') or 0)} currently", 0)
    status["disruptionsAllowed"] = allowed - 1
    if allowed - 1 == 0:
        status["conditions"] = [dict(c) for c in status.get("conditions") or ()]
        _update_allowed_condition(status, now)
    if dry_run:
        return None
    status["disruptedPods"] = {**(status.get("disruptedPods") or {}), pod_name: _now_text(now)}
    return {**pdb, "status": status}


def unready_may_go(pdb: Obj, pod: Obj) -> bool:
    """EvictionREST.Create: an unready pod is deleted without touching the budget under AlwaysAllow, or under
    IfHealthyBudget (the default) while currentHealthy >= desiredHealthy > 0."""
    if is_pod_ready(pod):
        return False
    if (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
        return True
    status = pdb.get("status") or {}
    desired = int(status.get("desiredHealthy") or 0)
    return int(status.get("currentHealthy") or 0) >= desired > 0


def disruption_target(pod: Obj, now: datetime | None = None) -> Obj:
    """addConditionAndDeletePod's conditionAppender (podutil.UpdatePodCondition): the pod with the condition
    DisruptionTarget True, EvictionByEvictionAPI."""
    now_text = _now_text(now or datetime.now(UTC))
    status = dict(pod.get("status") or {})
    conditions = [dict(c) for c in status.get("conditions") or ()]
    new = {"type": "DisruptionTarget", "status": "True", "lastProbeTime": None, "lastTransitionTime": now_text,
           "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"}
    for i, cond in enumerate(conditions):
        if cond.get("type") == "DisruptionTarget":
            if cond.get("status") == "True":
                new["lastTransitionTime"] = cond.get("lastTransitionTime")
            conditions[i] = new
            break
    else:
        conditions.append(new)
    status["conditions"] = conditions
    return {**pod, "status": status}


def eviction_success() -> Obj:
    """The answer to an eviction that deleted the pod: a Success Status, code 201 (handlers/create.go)."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def several_budgets() -> Denied:
    """The Failure Status EvictionREST.Create returns for a pod with more than one budget; the finisher answers it
    as an error with its code, 500 (no reason)."""
    return Denied(500, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": "This pod has more than one PodDisruptionBudget, which the eviction subresource "
                                   "does not support.", "code": 500})
