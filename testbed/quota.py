"""TEST INFRASTRUCTURE: ResourceQuota for the API-server stand-in, written from kube-apiserver's admission plugin and
kube-controller-manager's quota controller, with the quantities and pod arithmetic of testbed/kubemath.py. It
imports nothing of the product.

Upstream sources (kubernetes/kubernetes):
  * staging/src/k8s.io/apiserver/pkg/admission/plugin/resourcequota/admission.go (`Validate`: namespaced requests
    on the main resource only) and controller.go (`CheckRequest`, `checkQuotas`, `prettyPrint`,
    `prettyPrintResourceNames`, `hasUsageStats`, `getScopeSelectorsFromQuota`); the plugin runs among the validating
    ones, after the mutating webhooks and ValidatingAdmissionPolicy (pkg/kubeapiserver/options/plugins.go
    `AllOrderedPlugins`);
  * pkg/quota/v1/evaluator/core/pods.go (`podResources`, `MatchingResources`, `Constraints` with its
    `validationSet`, `podComputeUsageHelper`, `PodUsageFunc`, `QuotaV1Pod`, `podMatchesScopeFunc`) and registry.go
    (the `resourcequotas` alias); staging/src/k8s.io/apiserver/pkg/quota/v1/generic/evaluator.go (`Matches`,
    `CalculateUsageStats`, the object-count evaluator `count/<resource>[.<group>]`, CREATE only) and resources.go
    (`Add`, `Mask`, `LessThanOrEqual`, `RemoveZeros`, `CalculateUsage`);
  * pkg/controller/resourcequota/resource_quota_controller.go (`syncResourceQuota`: status.hard = spec.hard, used
    recomputed for the matched resources and masked to hard; `replenishQuota`) and resource_quota_monitor.go (a pod
    replenishes its quotas when deleted or when it stops counting: `QuotaV1Pod` true before, false after).

What a pod counts: `pods` and `count/pods` (count/pods whatever its state, the rest only while QuotaV1Pod: not
Succeeded or Failed, not past its deletion grace); `cpu`, `memory`, `ephemeral-storage` and their `requests.` names
from PodRequests, `limits.cpu`, `limits.memory`, `limits.ephemeral-storage` from PodLimits (component-helpers, init
containers and sidecars included: kubemath.pod_resource_lists); `hugepages-<size>` and `requests.hugepages-<size>`;
an extended resource only as `requests.<name>` ("only quota objects in format of requests.resourceName is allowed":
a quota naming `limits.<extended>` or the bare `<extended>` is accepted but matches nothing, so it limits nothing).
Scopes: Terminating, NotTerminating, BestEffort, NotBestEffort, PriorityClass (scopeSelector with In, NotIn, Exists,
DoesNotExist) and CrossNamespacePodAffinity; a quota with a scope matches no other resource's object count.

Deviations: the controller's work is done synchronously, in the same critical section as the change that needs it
(a quota's status is computed when it is created or its spec.hard changes, and its usage replenished when a pod is
deleted or becomes terminal, or any counted object is deleted), where upstream's controller catches up within its
resync; quotas are taken in order of name (upstream: the lister's order). Not done: the admission plugin's
configuration (limitedResources, matchScopes), the services and persistentvolumeclaims evaluators (the stand-in
serves neither), pods/resize (not served), the VolumeAttributesClass scope, ResourceQuota validation beyond readable
non-negative quantities in spec.hard.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any

from vgpu.testbed.admission import Attributes, Denied
from vgpu.testbed.kubemath import DECIMAL_SI, Quantity, QuantityError, ResourceList, pod_resource_lists

__all__ = ["Evaluator", "check_request", "evaluator_for", "quota_v1_pod", "sync", "validate"]

Obj = dict[str, Any]

_ONE = Quantity(Fraction(1), DECIMAL_SI)
_ZERO = Quantity(Fraction(0), DECIMAL_SI)
_POD_RESOURCES = frozenset({"count/pods", "cpu", "memory", "ephemeral-storage", "requests.cpu", "requests.memory",
                            "requests.ephemeral-storage", "limits.cpu", "limits.memory", "limits.ephemeral-storage",
                            "pods"})
_POD_PREFIXES = ("hugepages-", "requests.hugepages-")
# pods.go: "if a quota tracks cpu or memory related resources, the incoming pod is required to have those values set"
_VALIDATION_SET = frozenset({"cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory"})
# pkg/quota/v1/evaluator/core/registry.go legacyObjectCountAliases (the ones the stand-in serves)
_ALIASES = {("", "resourcequotas"): "resourcequotas"}
_DEVICE_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"  # resource/v1 ResourceDeviceClassPrefix
# pkg/quota/v1/install/registry.go ignoredResources (the ones the stand-in serves): never quota-ed
IGNORED = frozenset({("", "events"), ("events.k8s.io", "events")})
_QUALIFIED_NAME = re.compile(r"^(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
                             r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


# ------------------------------------------------------------------------------------- resource lists (resources.go)

def _parse_list(raw: Any) -> ResourceList:
    out: ResourceList = {}
    for name, value in (raw.items() if isinstance(raw, Mapping) else ()):
        try:
            out[str(name)] = Quantity.parse(value)
        except QuantityError:
            continue
    return out


def _add(a: Mapping[str, Quantity], b: Mapping[str, Quantity]) -> ResourceList:
    out = {k: v + b[k] if k in b else v for k, v in a.items()}
    out.update({k: v for k, v in b.items() if k not in out})
    return out


def _mask(items: Mapping[str, Quantity], names: Iterable[str]) -> ResourceList:
    keep = set(names)
    return {k: v for k, v in items.items() if k in keep}


def _pretty(items: Mapping[str, Quantity]) -> str:
    """controller.go prettyPrint: sorted names, `name=quantity` joined by commas."""
    return ",".join(f"{k}={items[k]}" for k in sorted(items))


def _text(items: Mapping[str, Quantity]) -> Obj:
    return {k: str(v) for k, v in items.items()}


# ------------------------------------------------------------------------------------------------------ the pods

def _native(name: str) -> bool:
    """helper.IsNativeResource: no domain, or a kubernetes.io one."""
    return "/" not in name or "kubernetes.io/" in name


def _extended(name: str) -> bool:
    """schedutil.IsDRAExtendedResourceName: helper.IsExtendedResourceName, or a DeviceClass's implicit name."""
    if name.startswith(_DEVICE_CLASS_PREFIX):
        return True
    return not _native(name) and not name.startswith("requests.") and bool(_QUALIFIED_NAME.match("requests." + name))


def _extended_for_quota(name: str) -> bool:
    """pods.go isExtendedResourceNameForQuota: `requests.` and a non-native name (or a DeviceClass's)."""
    return name.startswith("requests.") and (not _native(name) or name.startswith("requests." + _DEVICE_CLASS_PREFIX))


def _pod_level_resources_set(pod: Obj) -> bool:
    """component-helpers IsPodLevelResourcesSet: spec.resources names CPU, memory or hugepages."""
    resources = (pod.get("spec") or {}).get("resources")
    if not isinstance(resources, dict):
        return False
    names = [n for kind in ("requests", "limits") for n in (resources.get(kind) or {})
             if isinstance(resources.get(kind), dict)]
    return any(n in ("cpu", "memory") or str(n).startswith("hugepages-") for n in names)


def _terminating(pod: Obj | None) -> bool:
    """pods.go IsTerminating: activeDeadlineSeconds set and not negative."""
    deadline = ((pod or {}).get("spec") or {}).get("activeDeadlineSeconds")
    return isinstance(deadline, int) and deadline >= 0


def _compute_usage(requests: Mapping[str, Quantity], limits: Mapping[str, Quantity]) -> ResourceList:
    """pods.go podComputeUsageHelper."""
    out: ResourceList = {"pods": _ONE}
    for name in ("cpu", "memory", "ephemeral-storage"):
        if name in requests:
            out[name] = out[f"requests.{name}"] = requests[name]
        if name in limits:
            out[f"limits.{name}"] = limits[name]
    for name, quantity in requests.items():
        if name.startswith("hugepages-"):
            out[name] = out[f"requests.{name}"] = quantity
        if _extended(name):
            out[f"requests.{name}"] = quantity
    return out


def quota_v1_pod(pod: Obj, now: datetime | None = None) -> bool:
    """pods.go QuotaV1Pod: whether a pod is charged (not terminal, not stuck past its deletion grace)."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    meta = pod.get("metadata") or {}
    stamp, grace = meta.get("deletionTimestamp"), meta.get("deletionGracePeriodSeconds")
    if stamp and grace is not None:
        try:
            deleted = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
        except ValueError:
            return True
        if (now or datetime.now(UTC)) > deleted + timedelta(seconds=int(grace)):
            return False
    return True


def _containers(pod: Obj) -> list[Obj]:
    spec = pod.get("spec") or {}
    return [c for field in ("containers", "initContainers") for c in (spec.get(field) or []) if isinstance(c, dict)]


def _best_effort(pod: Obj) -> bool:
    """qos.GetPodQOS == BestEffort: no CPU or memory request or limit anywhere (pod-level included)."""
    qos = (pod.get("status") or {}).get("qosClass")
    if qos:
        return bool(qos == "BestEffort")
    spec = pod.get("spec") or {}
    sources = [c.get("resources") for c in _containers(pod)] + [spec.get("resources")]
    for resources in sources:
        for kind in ("requests", "limits"):
            values = _parse_list((resources or {}).get(kind) if isinstance(resources, dict) else None)
            if any(values[n].value != 0 for n in ("cpu", "memory") if n in values):
                return False
    return True


def _cross_namespace_affinity(pod: Obj) -> bool:
    """pods.go usesCrossNamespacePodAffinity."""
    affinity = (pod.get("spec") or {}).get("affinity") or {}
    for kind in ("podAffinity", "podAntiAffinity"):
        terms = affinity.get(kind) or {}
        required = terms.get("requiredDuringSchedulingIgnoredDuringExecution") or []
        preferred = [t.get("podAffinityTerm") or {} for t in
                     terms.get("preferredDuringSchedulingIgnoredDuringExecution") or []]
        if any(t.get("namespaces") or t.get("namespaceSelector") is not None for t in required + preferred):
            return True
    return False


def _pod_matches_scope(selector: Obj, pod: Obj) -> bool:
    """pods.go podMatchesScopeFunc."""
    scope, op = selector.get("scopeName"), selector.get("operator")
    spec = pod.get("spec") or {}
    if scope in ("Terminating", "NotTerminating"):
        return _terminating(pod) if scope == "Terminating" else not _terminating(pod)
    if scope == "BestEffort":
        return _best_effort(pod)
    if scope == "NotBestEffort":
        return not _best_effort(pod)
    if scope == "PriorityClass":
        name = spec.get("priorityClassName") or ""
        values = selector.get("values") or []
        if op == "Exists":
            return bool(name)
        if op == "DoesNotExist":
            return not name
        if op == "In":
            return bool(name) and name in values
        if op == "NotIn":
            return not name or name not in values
        return False
    if scope == "CrossNamespacePodAffinity":
        return _cross_namespace_affinity(pod)
    return False


def _scope_selectors(quota: Obj) -> list[Obj]:
    """controller.go getScopeSelectorsFromQuota: spec.scopes as Exists, then spec.scopeSelector's expressions."""
    spec = quota.get("spec") or {}
    out = [{"scopeName": s, "operator": "Exists"} for s in spec.get("scopes") or []]
    return out + list((spec.get("scopeSelector") or {}).get("matchExpressions") or [])


# ------------------------------------------------------------------------------------------------- the evaluators

@dataclass(frozen=True, slots=True)
class Evaluator:
    """quota.Evaluator for one resource: the pod evaluator, or an object-count one."""

    group: str
    resource: str

    @property
    def pods(self) -> bool:
        return self.group == "" and self.resource == "pods"

    @property
    def count_names(self) -> tuple[str, ...]:
        """generic.ObjectCountQuotaResourceNameFor (and the legacy alias)."""
        name = f"count/{self.resource}.{self.group}" if self.group else f"count/{self.resource}"
        alias = _ALIASES.get((self.group, self.resource))
        return (name, alias) if alias else (name,)

    def handles(self, a: Attributes) -> bool:
        """CREATE; for pods also an UPDATE that moves the pod in or out of the Terminating scope (and pods/resize,
        which the stand-in does not serve)."""
        if a.subresource:
            return False
        if self.pods and a.operation == "UPDATE":
            return _terminating(a.object) != _terminating(a.old_object)
        return a.operation == "CREATE"

    def matching_resources(self, names: Iterable[str]) -> list[str]:
        if not self.pods:
            return [n for n in names if n in self.count_names]
        return [n for n in names if n in _POD_RESOURCES or n.startswith(_POD_PREFIXES) or _extended_for_quota(n)]

    def matches_scope(self, selector: Obj, obj: Obj) -> bool:
        return _pod_matches_scope(selector, obj) if self.pods else False  # generic.MatchesNoScopeFunc

    def matches(self, quota: Obj, obj: Obj) -> bool:
        """generic.Matches: one of the quota's status.hard resources is this evaluator's, and every scope matches."""
        hard = list(((quota.get("status") or {}).get("hard") or {}).keys())
        return bool(self.matching_resources(hard)) and all(self.matches_scope(s, obj)
                                                           for s in _scope_selectors(quota))

    def usage(self, obj: Obj, now: datetime | None = None) -> ResourceList:
        if not self.pods:
            return dict.fromkeys(self.count_names, _ONE)
        out: ResourceList = {"count/pods": _ONE}
        if not quota_v1_pod(obj, now):
            return out
        requests, limits = pod_resource_lists(obj)
        return _add(out, _compute_usage(requests, limits))

    def constraints(self, required: Iterable[str], obj: Obj) -> str | None:
        """pods.go Constraints: every container must request what a cpu or memory quota tracks (not asked of a pod
        with pod-level resources: PodLevelResources is on by default)."""
        if not self.pods or _pod_level_resources_set(obj):
            return None
        wanted = set(required) & _VALIDATION_SET
        missing: dict[str, set[str]] = {}
        for container in _containers(obj):
            resources = container.get("resources")
            if not isinstance(resources, dict):
                resources = {}
            have = set(_compute_usage(_parse_list(resources.get("requests")), _parse_list(resources.get("limits"))))
            for name in wanted - have:
                missing.setdefault(name, set()).add(str(container.get("name", "")))
        if not missing:
            return None
        return "must specify " + "; ".join(f"{n} for: {','.join(sorted(missing[n]))}" for n in sorted(missing))


def evaluator_for(group: str, resource: str) -> Evaluator | None:
    """The evaluator kube-apiserver's registry has (or creates) for a group resource; None for an ignored one."""
    return None if (group, resource) in IGNORED else Evaluator(group, resource)


# -------------------------------------------------------------------------------------------------- admission

def _forbidden(a: Attributes, message: str) -> Denied:
    """admission.NewForbidden: the object's name (or generateName, or "Unknown") and the group resource."""
    meta = (a.object or {}).get("metadata") or {}
    name = meta.get("name") or meta.get("generateName") or ("Unknown" if a.object is not None else a.name)
    qualified = f"{a.resource}.{a.group}" if a.group else a.resource
    return Denied(403, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": f'{qualified} "{name}" is forbidden: {message}', "reason": "Forbidden",
                        "details": {"name": name, "group": a.group, "kind": a.resource}, "code": 403})


def _subtract_non_negative(a: Mapping[str, Quantity], b: Mapping[str, Quantity]) -> ResourceList:
    """resources.go SubtractWithNonNegativeResult."""
    out = {k: (v - b[k] if k in b else v) for k, v in a.items()}
    out = {k: v if v.value > 0 else _ZERO for k, v in out.items()}
    out.update({k: _ZERO for k in b if k not in out})
    return out


def check_request(quotas: list[Obj], a: Attributes) -> list[Obj]:
    """controller.go CheckRequest: the quotas with the request charged (an unchanged quota is the same object);
    raises Denied as kube-apiserver refuses. An UPDATE is charged the growth of its usage, and all of it for a
    quota the old object did not match."""
    evaluator = evaluator_for(a.group, a.resource)
    if evaluator is None or a.subresource or not a.namespace or a.object is None or not evaluator.handles(a):
        return quotas
    obj = a.object
    interesting: list[int] = []
    for i, quota in enumerate(quotas):
        if not evaluator.matches(quota, obj):
            continue
        status = quota.get("status") or {}
        restricted = evaluator.matching_resources((status.get("hard") or {}).keys())
        error = evaluator.constraints(restricted, obj)
        if error:
            raise _forbidden(a, f"failed quota: {quota['metadata']['name']}: {error}")
        used = status.get("used") or {}
        if any(n not in used for n in restricted):
            raise _forbidden(a, f"status unknown for quota: {quota['metadata']['name']}, resources: "
                                f"{','.join(sorted(restricted))}")
        interesting.append(i)
    usage = evaluator.usage(obj)
    negative = sorted(n for n, q in usage.items() if q.value < 0)
    if negative:
        raise _forbidden(a, f"quota usage is negative for resource(s): {','.join(negative)}")
    deltas: dict[int, ResourceList] = dict.fromkeys(interesting, usage)
    if a.operation == "UPDATE":
        if a.old_object is None:
            raise _forbidden(a, "unable to get previous usage since prior version of object was not found")
        if (a.old_object.get("metadata") or {}).get("resourceVersion"):
            growth = _subtract_non_negative(usage, evaluator.usage(a.old_object))
            for i in interesting:
                if evaluator.matches(quotas[i], a.old_object):
                    deltas[i] = growth
    deltas = {i: {k: v for k, v in d.items() if v.value != 0} for i, d in deltas.items()}
    deltas = {i: d for i, d in deltas.items() if d}
    if not interesting or not deltas:
        return quotas
    out = list(quotas)
    for i in interesting:
        if i not in deltas:
            continue
        quota = quotas[i]
        status = quota.get("status") or {}
        hard, used = _parse_list(status.get("hard")), _parse_list(status.get("used"))
        requested = _mask(deltas[i], hard)
        new_used = _add(used, requested)
        exceeded = sorted(n for n, limit in hard.items() if n in requested and new_used[n].value > limit.value)
        if exceeded:
            raise _forbidden(a, f"exceeded quota: {quota['metadata']['name']}, requested: "
                                f"{_pretty(_mask(requested, exceeded))}, used: {_pretty(_mask(used, exceeded))}, "
                                f"limited: {_pretty(_mask(hard, exceeded))}")
        if {k: v.value for k, v in new_used.items()} != {k: v.value for k, v in used.items()}:
            out[i] = {**quota, "status": {**status, "used": {**(status.get("used") or {}), **_text(new_used)}}}
    return out


# -------------------------------------------------------------------------------------------------- the controller

def sync(quota: Obj, evaluators: Iterable[Evaluator], items: Callable[[Evaluator], Iterable[Obj]],
         now: datetime | None = None) -> Obj | None:
    """resource_quota_controller.go syncResourceQuota: the quota with status.hard and status.used recomputed, or
    None when its status would not change. `items(evaluator)` lists the namespace's objects of its resource."""
    spec_hard = (quota.get("spec") or {}).get("hard") or {}
    hard = _parse_list(spec_hard)
    status = quota.get("status") or {}
    used = _parse_list(status.get("used"))
    selectors = _scope_selectors(quota)
    evaluators = list(evaluators)
    matched = {n for e in evaluators for n in e.matching_resources(hard)}
    new_usage: ResourceList = {}
    for evaluator in evaluators:
        names = evaluator.matching_resources(matched)
        if not names:
            continue
        stats: ResourceList = dict.fromkeys(names, _ZERO)  # CalculateUsageStats: each tracked resource from zero
        for obj in items(evaluator):
            if all(evaluator.matches_scope(s, obj) for s in selectors):
                stats = _add(stats, evaluator.usage(obj, now))
        new_usage = _add(new_usage, stats)
    used.update(_mask(new_usage, matched))
    used = _mask(used, hard)
    new_status = {"hard": _text(hard), "used": _text(used)}
    if new_status == status:
        return None
    return {**quota, "status": new_status}


def validate(quota: Obj) -> str | None:
    """What the stand-in checks of a ResourceQuota: spec.hard's values are non-negative quantities (the field path
    and message of kube-apiserver's ValidateResourceQuota), None when it passes."""
    hard = (quota.get("spec") or {}).get("hard") or {}
    if not isinstance(hard, dict):
        return "spec.hard: Invalid value: must be a map of quantities"
    for name, raw in hard.items():
        try:
            value = Quantity.parse(raw)
        except QuantityError:
            return (f'spec.hard[{name}]: Invalid value: "{raw}": quantities must match the regular expression '
                    "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
        if value.value < 0:
            return f'spec.hard[{name}]: Invalid value: "{raw}": must be greater than or equal to 0'
    return None
