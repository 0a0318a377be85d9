"""TEST INFRASTRUCTURE: a local stand-in for kube-apiserver, serving the subset of the REST API vgpu-sharing uses.

It is not part of any shipped component. Tests and `vgpu demo` run it so that our code talks to a real HTTP
peer through the official `kubernetes` client (never through patched functions).

Why not `kmock`: its KubernetesEmulator keeps objects but has no real resourceVersions (lists answer "..."),
no field or label selectors, no 409 on a stale resourceVersion, no 410 for an expired watch, no `pods/binding`
and no persistence, which are exactly the behaviours our caches, patches and binds depend on. So this module
implements them directly on `http.server.ThreadingHTTPServer` (one thread per connection; a watch is a blocked
thread waiting on a condition variable, which comfortably handles hundreds of concurrent watches).

Served:
  core/v1                 nodes (cluster-scoped), nodes/status, pods, pods/status, pods/binding, events,
                          pods/log (from the node's kubelet endpoint: testbed/podlogs.py)
  events.k8s.io/v1        events
  coordination.k8s.io/v1  leases
  resource.k8s.io/v1      deviceclasses, resourceslices (cluster-scoped), resourceclaims, resourceclaims/status,
                          resourceclaimtemplates (structural checks of testbed.resourceapi)
  core/v1                 resourcequotas, resourcequotas/status
  policy/v1               poddisruptionbudgets, poddisruptionbudgets/status; core/v1 pods/eviction (testbed.disruption)
  apps/v1                 deployments, replicasets, statefulsets (+ status): stored only, for the scale the
                          disruption controller reads (no workload controller acts on them)
  admissionregistration.k8s.io/v1  validatingadmissionpolicies, validatingadmissionpolicybindings,
                          mutatingwebhookconfigurations (cluster-scoped)
  scheduling.k8s.io/v1    priorityclasses (cluster-scoped, testbed.priority; system-node-critical and
                          system-cluster-critical created at start unless stored)
Verbs: get, list (fieldSelector with = == !=, labelSelector with = == != in notin, exists, !exists),
watch (`?watch=true&resourceVersion=N`, chunked JSON lines, ADDED/MODIFIED/DELETED/BOOKMARK; an ERROR event with
a 410 Status when N is older than the retained history), create, update (PUT; 409 on a stale resourceVersion),
patch (merge, strategic-merge with `conditions` merged by `type`, JSON patch; 409 when the patch carries a stale
metadata.resourceVersion), delete (immediate, as with gracePeriodSeconds=0; honours preconditions; pods gracefully
with `graceful_deletion=True`, below).

Semantics copied from kube-apiserver where our code depends on them:
  * with the DRAConsumableCapacity feature gate off (`consumable_capacity=False`, `--feature-gates
    DRAConsumableCapacity=false`; off by default in Kubernetes 1.34 and 1.35), a ResourceSlice is stored without its
    devices' `allowMultipleAllocations` and its capacities' `requestPolicy`, silently (kubernetes
    pkg/registry/resource/resourceslice/strategy.go, dropDisabledFields);
  * a watch that allowed bookmarks gets a BOOKMARK (with the current resourceVersion, whatever its selector) once
    it has had nothing for `bookmark_interval`, by default a minute as kube-apiserver's watch cache
    (staging/src/k8s.io/apiserver/pkg/storage/cacher/cacher.go, `defaultBookmarkFrequency = time.Minute`);
  * one global, monotonically increasing resourceVersion, shared by every kind, as etcd's revision is, and a
    list's resourceVersion is that revision at the time of the list (staging/src/k8s.io/apiserver/pkg/storage/
    etcd3/store.go `GetList`);
  * pods are created with uid, creationTimestamp and status.phase=Pending (a client-supplied status is dropped),
    and a container's limits without requests are copied to its requests; a spec without containers, or whose
    containers or resources are not objects, is refused with 422 Invalid;
  * the main pod/node endpoint ignores status changes, the status subresource ignores everything but status;
  * a patch or update that changes nothing does not bump the resourceVersion;
  * `POST pods/{name}/binding` sets spec.nodeName, merges the Binding's metadata.annotations into the pod, adds
    the PodScheduled condition, answers 409 when the pod is already bound or when the Binding's metadata.uid
    does not match the pod's uid;
  * a watch whose selector stops (starts) matching an object receives DELETED (ADDED) for it;
  * a MutatingWebhookConfiguration is stored with admissionregistration/v1's defaults (failurePolicy Fail,
    matchPolicy Equivalent, empty selectors, timeoutSeconds 10, reinvocationPolicy Never, rule scope `*`, service
    port 443); a ResourceQuota's spec.hard must hold non-negative quantities, its status is the controller's;
  * a PodDisruptionBudget, ReplicaSet, Deployment or StatefulSet is created with generation 1 and no status, and its
    generation goes up by one when an update changes its spec (pkg/registry/policy/poddisruptionbudget/strategy.go
    PrepareForCreate / PrepareForUpdate, rest.BeforeUpdate; the apps strategies alike); a budget's spec and status
    are validated as pkg/apis/policy/validation does (testbed.disruption.validate, validate_status);
  * the disruption controller's work (pkg/controller/disruption/disruption.go, testbed.disruption.sync) is done at
    once, like the quota controller's: a budget's status is recomputed when it is created or updated and when a pod
    it selects (before or after the change) is created, changed or deleted; `disruption_controller=False` leaves
    budgets' status to clients (kube-controller-manager without that controller);
  * with `graceful_deletion=True` (`--graceful-deletion`) pods are deleted as kube-apiserver deletes them
    (testbed/graceful.py): a DELETE (or an eviction) of a pod bound to a node and not finished sets
    metadata.deletionTimestamp and deletionGracePeriodSeconds (an update: watches see MODIFIED) and answers the pod;
    the kubelet's final DELETE (gracePeriodSeconds 0, UID precondition) removes it (DELETED); a later DELETE may
    shorten the period, never lengthen it; a period of 0 removes the pod in the same request (MODIFIED, then
    DELETED); a pod's finalizers keep it until an update empties them; an update cannot change or remove the
    deletion fields. Off by default: most tests bind pods to nodes where no kubelet runs, and their pods would
    never go; off, every object is removed at once whatever its finalizers, as before;
  * `POST pods/{name}/eviction` (a policy/v1 or v1beta1 Eviction) is pkg/registry/core/pod/storage/eviction.go
    EvictionREST.Create: admission as a CREATE of pods/eviction whose object is the Eviction, then the pod (404),
    the PDB check (testbed.disruption), the budget's status written, the pod given the DisruptionTarget condition
    and deleted with the Eviction's deleteOptions (preconditions honoured, no delete admission: the registry's
    delete); 201 with a Success Status, or the Status upstream answers (429 with Retry-After when it says so).
Authentication (`users`, or `.authenticate(users)`): a table of bearer tokens, each the UserInfo kube-apiserver's
authenticators would give (extra included, as a pod-bound ServiceAccount token carries
`authentication.kubernetes.io/node-name`); any other token gets 401.  Without a table every token is a cluster admin.

Admission, in kube-apiserver's order (pkg/kubeapiserver/options/plugins.go: Priority, the mutating webhooks, then the
validating plugins, Priority's, ValidatingAdmissionPolicy, ResourceQuota), on every create, update, patch, delete and
pods/binding, with the authenticated user as the request's userInfo; a refusal answers kube-apiserver's Status:
  * Priority (testbed/priority.py): a created pod's priorityClassName resolved into spec.priority and
    spec.preemptionPolicy (an unknown class, or a priority or policy set otherwise, refused), an updated pod's kept;
    a second globalDefault PriorityClass refused;
  * mutating webhooks (testbed/webhooks.py): the stored MutatingWebhookConfigurations' webhooks are called over
    HTTPS BEFORE the lock is taken (upstream mutates before storage too; an update whose object changed meanwhile
    starts again, as GuaranteedUpdate does); their patches are applied and the object defaulted again; their
    warnings go to the client as `Warning` headers; a webhook's `service` is reached through `service_resolver`;
  * ValidatingAdmissionPolicy (testbed/admission.py): the stored policies and bindings are evaluated;
  * ResourceQuota (testbed/quota.py): a create in a namespace with quotas is checked and charged to their
    status.used; the quota controller's work (status.hard, usage replenished on deletion or when a pod becomes
    terminal) is done at once.
A write with `?dryRun=All` is admitted (webhooks see dryRun: true) and stored nowhere, quotas included.

Not served (on purpose): authorization (RBAC: `request_attributes` below lets a test check what each component
called against its rules), namespaces as objects, consistent paging
(`limit` and `continue` page through the current objects, without a snapshot), server-side apply, graceful
deletion and finalizers of anything but pods, protobuf.

Faults (testbed/faults.py): rules installed by a test, in the process (`.faults`) or over HTTP
(`/standin/faults`), make matching requests fail, wait, time out, or make watches stall, drop or answer 410.

Recording (`ApiServerStandIn(record_requests=True)`): every request is kept with the bearer token it carried, so a
test can give each component a kubeconfig with its own token and compare what each one called with its RBAC rules;
`request_attributes` turns a request into what kube-apiserver's authorizer is asked (verb, group, resource, ...).

Persistence (`--data FILE`): every change is appended to `FILE.journal` before it is acknowledged and the
journal is folded into the snapshot `FILE` (written atomically) from time to time, so the process can be killed
with SIGKILL and restarted and keep its objects and resourceVersions, like etcd. After a restart the watch
history is empty: a watch resuming from the current resourceVersion continues, an older one gets 410.

Run: `python -m vgpu.testbed.apiserver --listen 127.0.0.1:0 --data FILE --kubeconfig-out PATH` prints the URL on
its first stdout line. From Python: `ApiServerStandIn` (in-process thread) or `ApiServerProcess` (subprocess with
start / stop / kill / restart on the same port).
"""

from __future__ import annotations

import argparse
import builtins
import collections
import contextlib
import logging
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from vgpu.testbed import disruption, graceful, priority, quota, resourceapi
from vgpu.testbed.admission import Attributes, Denied, PolicyAdmission, UserInfo
from vgpu.testbed.discovery import CORE_VERSIONS, ServedResource, api_groups, as_table, resource_list, wants_table
from vgpu.testbed.faults import FaultPlan
from vgpu.testbed.kubemath import Quantity, QuantityError
from vgpu.testbed.podlogs import LogError, fetch_log, log_location
from vgpu.testbed.webhooks import MutatingWebhooks, ServiceResolver, default_configuration, warning_header

__all__ = [
    "ApiServerProcess",
    "ApiServerStandIn",
    "RecordedRequest",
    "RequestAttributes",
    "StatusError",
    "Store",
    "read_users",
    "request_attributes",
    "write_kubeconfig",
]

log = logging.getLogger(__name__)

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    has_status: bool = False

    @property
    def key(self) -> str:
        return f"{self.group}/{self.version}/{self.plural}" if self.group else f"{self.version}/{self.plural}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


# what kubectl gets as a Table: testbed.discovery prints them, PriorityClasses testbed.priority
TABLE_KINDS = ("Pod", "Node", "Event", "Lease", "PodDisruptionBudget", "PriorityClass")
_RESOURCES = {
    r.key: r
    for r in (
        _Resource("", "v1", "nodes", "Node", namespaced=False, has_status=True),
        _Resource("", "v1", "pods", "Pod", namespaced=True, has_status=True),
        _Resource("", "v1", "events", "Event", namespaced=True),
        _Resource("events.k8s.io", "v1", "events", "Event", namespaced=True),
        _Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True),
        _Resource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", namespaced=False),
        _Resource("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False),
        _Resource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", namespaced=True, has_status=True),
        _Resource("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", namespaced=True),
        _Resource("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy",
                  namespaced=False, has_status=True),
        _Resource("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings",
                  "ValidatingAdmissionPolicyBinding", namespaced=False),
        _Resource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                  "MutatingWebhookConfiguration", namespaced=False),
        _Resource("", "v1", "resourcequotas", "ResourceQuota", namespaced=True, has_status=True),
        _Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True, has_status=True),
        _Resource("apps", "v1", "deployments", "Deployment", namespaced=True, has_status=True),
        _Resource("apps", "v1", "replicasets", "ReplicaSet", namespaced=True, has_status=True),
        _Resource("apps", "v1", "statefulsets", "StatefulSet", namespaced=True, has_status=True),
        _Resource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False),
    )
}
_POLICIES = "admissionregistration.k8s.io/v1/validatingadmissionpolicies"
_POLICY_BINDINGS = "admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
_WEBHOOKS = "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
_QUOTAS = "v1/resourcequotas"
_PODS = "v1/pods"
_PDBS = "policy/v1/poddisruptionbudgets"
_EVENTS = "v1/events"
_PRIORITY_CLASSES = "scheduling.k8s.io/v1/priorityclasses"
# kinds with metadata.generation kept by their registry strategy (created 1, bumped by a change of spec)
_GENERATION_KINDS = ("PodDisruptionBudget", "Deployment", "ReplicaSet", "StatefulSet", "PriorityClass")
# discovery of the kinds served here beyond testbed.discovery's list (as kube-apiserver lists them)
_ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
_MORE_SERVED = (
    ServedResource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                   "MutatingWebhookConfiguration", False, _ALL_VERBS, (), ("api-extensions",)),
    ServedResource("", "v1", "resourcequotas", "ResourceQuota", True, _ALL_VERBS, ("quota",)),
    ServedResource("", "v1", "resourcequotas/status", "ResourceQuota", True, ("get", "patch", "update")),
    ServedResource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, _ALL_VERBS, ("pc",)),
)
# how often an update whose object changed while webhooks were called is started again (GuaranteedUpdate's retry)
_UPDATE_ATTEMPTS = 20
# who a request is when the stand-in authenticates nobody (no `users` table): a cluster admin
ANONYMOUS_ADMIN = UserInfo("standin-admin", groups=("system:masters", "system:authenticated"))


class StatusError(Exception):
    """An API failure answered as a metav1.Status (code, reason, message)."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> Obj:
        """The metav1.Status body of this error."""
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details, "code": self.code}


def _check_resource_api(res: _Resource, name: str, check: Callable[[], None]) -> None:
    """Run a testbed.resourceapi check; its Invalid becomes kube-apiserver's 422 naming the field."""
    try:
        check()
    except resourceapi.Invalid as exc:
        raise StatusError(422, "Invalid", f'{res.kind} "{name}" is invalid: {exc}',
                          {"name": name, "kind": res.plural, "causes": [{"field": exc.field, "message": exc.what}]}
                          ) from None


def _validate_pod(name: str, spec: Any) -> None:
    """What kube-apiserver refuses at create before anything can see the pod: a spec that is not an object, no
    containers, a container that is not an object or has no name, resources that are not maps (422 Invalid)."""
    def invalid(field: str, what: str) -> StatusError:
        return StatusError(422, "Invalid", f'Pod "{name}" is invalid: {field}: {what}',
                           {"name": name, "kind": "pods", "causes": [{"field": field, "message": what}]})

    if not isinstance(spec, dict):
        raise invalid("spec", "Invalid value: must be an object")
    if not isinstance(spec.get("containers"), list) or not spec["containers"]:
        raise invalid("spec.containers", "Required value")
    for field in ("initContainers", "containers"):
        items = spec.get(field) or []
        if not isinstance(items, list):
            raise invalid(f"spec.{field}", "Invalid value: must be a list")
        for i, container in enumerate(items):
            where = f"spec.{field}[{i}]"
            if not isinstance(container, dict):
                raise invalid(where, "Invalid value: must be an object")
            if not isinstance(container.get("name"), str) or not container["name"]:
                raise invalid(f"{where}.name", "Required value")
            resources = container.get("resources", {})
            if not isinstance(resources, dict):
                raise invalid(f"{where}.resources", "Invalid value: must be an object")
            for kind in ("limits", "requests"):
                if not isinstance(resources.get(kind, {}), dict):
                    raise invalid(f"{where}.resources.{kind}", "Invalid value: must be a map of quantities")


def _page(items: list[Obj], limit: str | None, token: str | None) -> tuple[list[Obj], str]:
    """One page of a list (`limit`, `continue`: an offset here) and the token of the next ("" at the end)."""
    try:
        start = int(token or 0)
        size = int(limit) if limit else 0
    except ValueError:
        raise StatusError(400, "BadRequest", f"invalid limit {limit!r} or continue {token!r}") from None
    if size <= 0:
        return items[start:], ""
    page = items[start:start + size]
    return page, str(start + size) if start + size < len(items) else ""


def _drop_consumable_capacity(spec: Any) -> None:
    """What kube-apiserver drops from a ResourceSlice with the DRAConsumableCapacity gate off."""
    for device in (spec.get("devices") or ()) if isinstance(spec, dict) else ():
        if not isinstance(device, dict):
            continue
        device.pop("allowMultipleAllocations", None)
        for entry in (device.get("capacity") or {}).values() if isinstance(device.get("capacity"), dict) else ():
            if isinstance(entry, dict):
                entry.pop("requestPolicy", None)


def _canonical(quantities: Any) -> None:
    """Rewrite each readable quantity of a resource list in the form kube-apiserver stores it: a Quantity is decoded
    and encoded again (apimachinery `pkg/api/resource/quantity.go` `MarshalJSON`, its canonical `String()`), so
    `4000` is stored as `4k` and `0.5` as `500m`; an unreadable one is left for validation to refuse."""
    if not isinstance(quantities, dict):
        return
    for name, value in list(quantities.items()):
        try:
            quantities[name] = str(Quantity.parse(value))
        except (QuantityError, TypeError, ValueError, AssertionError):
            continue


def _default_pod_spec(spec: Any) -> None:
    """kube-apiserver's defaulting of a pod spec (pkg/apis/core/v1/defaults.go): an empty schedulerName becomes
    `default-scheduler` (SetDefaults_PodSpec), a container's limit without a request of the same resource is copied
    to requests; every quantity is stored in its canonical form (`_canonical`)."""
    if not isinstance(spec, dict):
        return
    if not spec.get("schedulerName"):
        spec["schedulerName"] = "default-scheduler"
    for field in ("initContainers", "containers"):
        for container in spec.get(field) or ():
            resources = container.get("resources") if isinstance(container, dict) else None
            if not isinstance(resources, dict):
                continue
            limits = resources.get("limits")
            if isinstance(limits, dict) and limits:
                requests = resources.setdefault("requests", {})
                if isinstance(requests, dict):
                    for name, value in limits.items():
                        requests.setdefault(name, value)
            _canonical(resources.get("limits"))
            _canonical(resources.get("requests"))
    pod_level = spec.get("resources")
    if isinstance(pod_level, dict):
        _canonical(pod_level.get("limits"))
        _canonical(pod_level.get("requests"))
    _canonical(spec.get("overhead"))


def _denied(exc: Denied) -> StatusError:
    """An admission refusal as the Status kube-apiserver answers."""
    status = exc.status
    return StatusError(exc.code, str(status.get("reason") or ""), str(status.get("message") or ""),
                       status.get("details") if isinstance(status.get("details"), dict) else None)


def _check_budget(name: str, errors: list[str]) -> None:
    """What pkg/apis/policy/validation refuses of a PodDisruptionBudget: 422 Invalid naming each field."""
    if not errors:
        return
    causes = [{"field": e.partition(": ")[0], "message": e.partition(": ")[2]} for e in errors]
    shown = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    raise StatusError(422, "Invalid", f'PodDisruptionBudget.policy "{name}" is invalid: {shown}',
                      {"name": name, "group": "policy", "kind": "PodDisruptionBudget", "causes": causes})


class _EvictionAttributes(Attributes):
    """A pods/eviction CREATE as admission sees it: resource core/v1 pods, subresource eviction, and the object a
    policy/v1 Eviction (EvictionREST.GroupVersionKind)."""

    def request(self) -> Obj:
        out = super().request()
        out["kind"] = out["requestKind"] = {"group": "policy", "version": "v1", "kind": "Eviction"}
        return out


def _pod_conflict(name: str, why: str) -> StatusError:
    """errors.NewConflict(schema.GroupResource{Resource: "Pod"}, ...) of addConditionAndDeletePod."""
    return StatusError(409, "Conflict", f'Operation cannot be fulfilled on Pod "{name}": {why}',
                       {"name": name, "kind": "Pod"})


def _check_quota(name: str, obj: Obj) -> None:
    """What the stand-in validates of a ResourceQuota (testbed.quota.validate): 422 Invalid naming the field."""
    why = quota.validate(obj)
    if why is not None:
        field, _, what = why.partition(": ")
        raise StatusError(422, "Invalid", f'ResourceQuota "{name}" is invalid: {why}',
                          {"name": name, "kind": "resourcequotas", "causes": [{"field": field, "message": what}]})


def _check_priority(check: Callable[[], None]) -> None:
    """Run a testbed.priority check (admission, validation, the delete guard); a refusal becomes a StatusError."""
    try:
        check()
    except Denied as exc:
        raise _denied(exc) from None


def _table(kind: str, items: list[Obj], resource_version: str, include: str) -> Obj:
    """The meta.k8s.io/v1 Table of `items` as kube-apiserver prints them."""
    if kind == "PriorityClass":
        return priority.as_table(items, resource_version, include)
    return as_table(kind, items, resource_version, include)


def _not_found(res: _Resource, name: str) -> StatusError:
    return StatusError(404, "NotFound", f'{res.plural} "{name}" not found', {"name": name, "kind": res.plural})


def _conflict(res: _Resource, name: str, why: str) -> StatusError:
    return StatusError(409, "Conflict", f'Operation cannot be fulfilled on {res.plural} "{name}": {why}',
                       {"name": name, "kind": res.plural})


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _clone(obj: Any) -> Any:
    return orjson.loads(orjson.dumps(obj))


# ----------------------------------------------------------------------------------------------- selectors / patches

def _field_value(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def _parse_field_selector(text: str | None) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    for term in (text or "").split(","):
        term = term.strip()
        if not term:
            continue
        m = re.fullmatch(r"([^!=]+)(==|!=|=)(.*)", term)
        if not m:
            raise StatusError(400, "BadRequest", f"invalid field selector term {term!r}")
        out.append((m.group(1).strip(), "!=" if m.group(2) == "!=" else "=", m.group(3).strip()))
    return out


_LABEL_TERM = re.compile(r"\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(==|!=|=|\bnotin\b|\bin\b)\s*(\([^)]*\)|[^,]*))?\s*")


def _parse_label_selector(text: str | None) -> list[tuple[str, str, tuple[str, ...]]]:
    out: list[tuple[str, str, tuple[str, ...]]] = []
    rest = (text or "").strip()
    while rest:
        m = _LABEL_TERM.match(rest)
        if not m or m.end() == 0:
            raise StatusError(400, "BadRequest", f"invalid label selector {text!r}")
        neg, key, op, val = m.groups()
        if op is None:
            out.append((key, "!exists" if neg else "exists", ()))
        elif neg:
            raise StatusError(400, "BadRequest", f"invalid label selector {text!r}")
        elif op in ("in", "notin"):
            vals = tuple(v.strip() for v in val.strip().strip("()").split(",") if v.strip())
            out.append((key, op, vals))
        else:
            out.append((key, "!=" if op == "!=" else "=", (val.strip(),)))
        rest = rest[m.end():]
        if rest.startswith(","):
            rest = rest[1:]
        elif rest:
            raise StatusError(400, "BadRequest", f"invalid label selector {text!r}")
    return out


class _Selector:
    __slots__ = ("fields", "labels", "namespace")

    def __init__(self, namespace: str | None, field_selector: str | None, label_selector: str | None) -> None:
        self.namespace = namespace
        self.fields = _parse_field_selector(field_selector)
        self.labels = _parse_label_selector(label_selector)

    def matches(self, obj: Obj) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        for path, op, want in self.fields:
            if (_field_value(obj, path) == want) != (op == "="):
                return False
        labels = meta.get("labels") or {}
        for key, op, vals in self.labels:
            have = labels.get(key)
            if (op == "exists" and have is None) or (op == "!exists" and have is not None):
                return False
            if (op == "=" and have != vals[0]) or (op == "!=" and have == vals[0]):
                return False
            if (op == "in" and have not in vals) or (op == "notin" and have in vals):
                return False
        return True


def merge_patch(target: Any, patch: Any, strategic: bool = False) -> Any:
    """RFC 7386 merge patch; with `strategic`, lists named `conditions` merge element-wise by `type`."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if strategic and key.startswith("$"):
            continue
        if value is None:
            out.pop(key, None)
        elif strategic and key == "conditions" and isinstance(value, list) and isinstance(out.get(key), list):
            merged = list(out[key])
            for cond in value:
                idx = next((i for i, c in enumerate(merged)
                            if isinstance(c, dict) and isinstance(cond, dict) and c.get("type") == cond.get("type")),
                           None)
                if idx is None:
                    merged.append(cond)
                else:
                    merged[idx] = merge_patch(merged[idx], cond, strategic)
            out[key] = merged
        else:
            out[key] = merge_patch(out.get(key), value, strategic)
    return out


def _json_pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise StatusError(422, "Invalid", f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc: Any, ops: list[Obj]) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, test, copy, move)."""
    doc = _clone(doc)

    def parent(parts: list[str]) -> tuple[Any, str]:
        cur = doc
        for p in parts[:-1]:
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        return cur, parts[-1]

    def get(parts: list[str]) -> Any:
        cur = doc
        for p in parts:
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        return cur

    try:
        for op in ops:
            kind, parts = op["op"], _json_pointer(op["path"])
            if kind in ("copy", "move"):
                src = _json_pointer(op["from"])
                value = _clone(get(src))
                if kind == "move":
                    p, k = parent(src)
                    p.pop(int(k)) if isinstance(p, list) else p.pop(k)
                kind, op = "add", {"value": value}
            if kind == "test":
                if get(parts) != op["value"]:
                    raise StatusError(422, "Invalid", f"JSON patch test failed at {op['path']}")
                continue
            if not parts:
                if kind in ("add", "replace"):
                    doc = op["value"]
                    continue
                raise StatusError(422, "Invalid", "cannot remove the document root")
            p, k = parent(parts)
            if kind == "remove":
                p.pop(int(k)) if isinstance(p, list) else p.pop(k)
            elif kind == "replace":
                if isinstance(p, list):
                    p[int(k)] = op["value"]
                else:
                    if k not in p:
                        raise KeyError(k)
                    p[k] = op["value"]
            elif kind == "add":
                if isinstance(p, list):
                    p.insert(len(p) if k == "-" else int(k), op["value"])
                else:
                    p[k] = op["value"]
            else:
                raise StatusError(422, "Invalid", f"unknown JSON patch op {kind!r}")
    except StatusError:
        raise
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        raise StatusError(422, "Invalid", f"JSON patch cannot be applied: {exc!r}") from None
    return doc


# ------------------------------------------------------------------------------------------------------- the store

@dataclass(slots=True)
class _Change:
    rv: int
    res: str
    type: str  # ADDED | MODIFIED | DELETED
    obj: Obj
    prev: Obj | None


class Store:
    """The object store: objects per resource, a global resourceVersion, a bounded change history, a journal.

    Thread-safe; stored objects are never mutated after they are stored (every change stores a new dict).
    """

    def __init__(self, data_path: str | os.PathLike[str] | None = None, history_size: int = 10000) -> None:
        self.cond = threading.Condition()
        self.rv = 0
        self.compacted_rv = 0  # watches from a resourceVersion below this get 410 Gone
        self.history_size = max(1, int(history_size))
        self.history: collections.deque[_Change] = collections.deque()
        self.objects: dict[str, dict[tuple[str, str], Obj]] = {k: {} for k in _RESOURCES}
        self.closing = False
        self.watch_epoch = 0  # bumped by compact(drop_watches=True) to end every open watch with 410
        self.delivering = threading.Event()  # cleared by ApiServerStandIn.hold_watches(): changes wait to be sent
        self.delivering.set()
        self.consumable_capacity = True  # the DRAConsumableCapacity feature gate
        self.disruption_controller = True  # kube-controller-manager's disruption controller runs (testbed.disruption)
        self.graceful_deletion = False  # pods are deleted gracefully, their finalizers honoured (testbed.graceful)
        self.admission = PolicyAdmission()
        self.webhooks = MutatingWebhooks(json_patch)  # its service_resolver: ApiServerStandIn(service_resolver=...)
        self._data = Path(data_path) if data_path else None
        self._journal: Any = None
        self._journal_entries = 0
        if self._data is not None:
            self._load()
        for pc in priority.system_classes():  # storage_scheduling.go AddSystemPriorityClasses, a post-start hook
            if ("", pc["metadata"]["name"]) not in self.objects[_PRIORITY_CLASSES]:
                self.create(_PRIORITY_CLASSES, "", pc)

    # -- persistence
    def _load(self) -> None:
        assert self._data is not None
        if self._data.exists():
            snap = orjson.loads(self._data.read_bytes())
            self.rv = int(snap.get("rv", 0))
            for key, items in snap.get("objects", {}).items():
                if key in self.objects:
                    for obj in items:
                        m = obj["metadata"]
                        self.objects[key][(m.get("namespace", ""), m["name"])] = obj
        jpath = self._data.with_name(self._data.name + ".journal")
        if jpath.exists():
            for line in jpath.read_bytes().splitlines():
                try:
                    entry = orjson.loads(line)
                except orjson.JSONDecodeError:
                    break  # a torn last line from a kill in the middle of a write
                if entry["rv"] <= self.rv:
                    continue
                self.rv = entry["rv"]
                k = (entry["ns"], entry["name"])
                if entry["op"] == "del":
                    self.objects[entry["res"]].pop(k, None)
                else:
                    self.objects[entry["res"]][k] = entry["obj"]
        self.compacted_rv = self.rv
        self._write_snapshot()

    def _write_snapshot(self) -> None:
        assert self._data is not None
        body = orjson.dumps({"rv": self.rv, "objects": {k: list(v.values()) for k, v in self.objects.items()}})
        tmp = self._data.with_name(self._data.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._data)
        if self._journal is not None:
            self._journal.close()
        # kept open for appends until the next fold or close()
        self._journal = open(self._data.with_name(self._data.name + ".journal"), "wb")  # noqa: SIM115
        self._journal_entries = 0

    def _persist(self, change: _Change) -> None:
        if self._journal is None:
            return
        m = change.obj["metadata"]
        entry = {"rv": change.rv, "op": "del" if change.type == "DELETED" else "put", "res": change.res,
                 "ns": m.get("namespace", ""), "name": m["name"]}
        if change.type != "DELETED":
            entry["obj"] = change.obj
        self._journal.write(orjson.dumps(entry) + b"\n")
        self._journal.flush()  # in the OS page cache: survives SIGKILL of this process
        self._journal_entries += 1
        if self._journal_entries >= max(5000, sum(len(v) for v in self.objects.values())):
            self._write_snapshot()

    def close(self) -> None:
        """Stop all watches and fold the journal into the snapshot."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()
            if self._data is not None and self._journal is not None:
                self._write_snapshot()
                self._journal.close()
                self._journal = None

    # -- changes
    def _commit(self, res: _Resource, typ: str, obj: Obj, prev: Obj | None) -> Obj:
        """Assign the next resourceVersion, store, journal, record history and wake watchers (lock held)."""
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        m = obj["metadata"]
        key = (m.get("namespace", ""), m["name"])
        if typ == "DELETED":
            self.objects[res.key].pop(key, None)
        else:
            self.objects[res.key][key] = obj
        change = _Change(self.rv, res.key, typ, obj, prev)
        self._persist(change)
        self.history.append(change)
        while len(self.history) > self.history_size:
            self.compacted_rv = self.history.popleft().rv
        self.cond.notify_all()
        self._after_commit(res, typ, obj, prev)
        return obj

    def compact(self, drop_watches: bool = False) -> int:
        """Forget all watch history (as etcd compaction does); optionally end open watches with 410."""
        with self.cond:
            self.history.clear()
            self.compacted_rv = self.rv
            if drop_watches:
                self.watch_epoch += 1
            self.cond.notify_all()
            return self.rv

    @staticmethod
    def _res(key: str) -> _Resource:
        return _RESOURCES[key]

    def _existing(self, res: _Resource, ns: str, name: str) -> Obj:
        obj = self.objects[res.key].get((ns if res.namespaced else "", name))
        if obj is None:
            raise _not_found(res, name)
        return obj

    def _admit(self, operation: str, res: _Resource, subresource: str | None, name: str, ns: str, obj: Obj | None,
               old: Obj | None, user: UserInfo | None, kind: str | None = None, dry_run: bool = False) -> None:
        """Validating admission of a change about to be stored, in kube-apiserver's order (lock held): Priority's
        (testbed.priority), ValidatingAdmissionPolicy (testbed.admission), then ResourceQuota's check (`_charge`, by
        the caller)."""
        if res.key == _PRIORITY_CLASSES and not subresource and operation in ("CREATE", "UPDATE") and obj:
            classes = list(self.objects[_PRIORITY_CLASSES].values())
            _check_priority(lambda: priority.validate_class(operation, obj, classes))
        policies = self.objects[_POLICIES]
        if not policies:
            return
        attrs = self._attributes(operation, res, subresource, name, ns, obj, old, user, kind, dry_run)
        try:
            self.admission.validate(list(policies.values()), list(self.objects[_POLICY_BINDINGS].values()), attrs)
        except Denied as exc:
            raise _denied(exc) from None

    @staticmethod
    def _attributes(operation: str, res: _Resource, subresource: str | None, name: str, ns: str, obj: Obj | None,
                    old: Obj | None, user: UserInfo | None, kind: str | None = None,
                    dry_run: bool = False) -> Attributes:
        return Attributes(operation, res.group, res.version, res.plural, subresource or "", kind or res.kind, name,
                          ns if res.namespaced else "", obj, old, user or ANONYMOUS_ADMIN, dry_run)

    def _admit_priority(self, pod: Obj) -> None:
        """The Priority plugin's Admit of a created pod (testbed.priority), before the mutating webhooks, over the
        PriorityClasses as its informer's lister has them (a snapshot taken under the lock)."""
        with self.cond:
            classes = list(self.objects[_PRIORITY_CLASSES].values())
        _check_priority(lambda: priority.admit_pod(pod, classes))

    def _webhook_configurations(self) -> builtins.list[Obj]:
        """The stored MutatingWebhookConfigurations (a snapshot, taken under the lock)."""
        with self.cond:
            return list(self.objects[_WEBHOOKS].values())

    def _mutate(self, operation: str, res: _Resource, subresource: str | None, name: str, ns: str, obj: Obj | None,
                old: Obj | None, user: UserInfo | None, dry_run: bool, warnings: builtins.list[str] | None,
                configurations: builtins.list[Obj], kind: str | None = None, options: Obj | None = None) -> Obj | None:
        """Mutating admission webhooks (testbed.webhooks), called WITHOUT the lock: the object they leave."""
        attrs = self._attributes(operation, res, subresource, name, ns, obj, old, user, kind, dry_run)
        if options is None:
            options = {"kind": {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions"}.get(operation, "DeleteOptions"),
                       "apiVersion": "meta.k8s.io/v1"}
            if dry_run:
                options["dryRun"] = ["All"]
        default = (lambda o: _default_pod_spec(o.get("spec"))) if (kind or res.kind) == "Pod" else None
        try:
            return self.webhooks.admit(configurations, attrs, options=options, default=default, warnings=warnings)
        except Denied as exc:
            raise _denied(exc) from None

    def _charge(self, res: _Resource, ns: str, obj: Obj, old: Obj | None, user: UserInfo | None,
                dry_run: bool) -> builtins.list[tuple[Obj, Obj]]:
        """ResourceQuota admission of a create (or, `old` given, an update) of the main resource (testbed.quota, lock
        held): the quotas to write, old and new."""
        if not res.namespaced:
            return []
        quotas = sorted((q for (n, _), q in self.objects[_QUOTAS].items() if n == ns),
                        key=lambda q: q["metadata"]["name"])
        if not quotas:
            return []
        attrs = self._attributes("CREATE" if old is None else "UPDATE", res, None, obj["metadata"].get("name", ""),
                                 ns, obj, old, user, dry_run=dry_run)
        try:
            charged = quota.check_request(quotas, attrs)
        except Denied as exc:
            raise _denied(exc) from None
        return [(q, c) for q, c in zip(quotas, charged) if c is not q]

    def _after_commit(self, res: _Resource, typ: str, obj: Obj, prev: Obj | None) -> None:
        """The resourcequota controller's work, done at once (lock held): a quota's status when it is created or its
        spec.hard changes; a namespace's quotas replenished when a counted object is deleted or a pod stops being
        charged (resource_quota_monitor.go). Before that, the disruption controller's (`_disruption`)."""
        if not res.namespaced:
            return
        self._disruption(res, typ, obj, prev)
        ns = obj["metadata"].get("namespace", "")
        if res.key == _QUOTAS:
            if typ != "DELETED" and (prev is None or (prev.get("spec") or {}).get("hard")
                                     != (obj.get("spec") or {}).get("hard")):
                self._sync_quota(obj)
            if typ != "DELETED":
                return
        replenish = typ == "DELETED" or (res.key == "v1/pods" and prev is not None and quota.quota_v1_pod(prev)
                                         and not quota.quota_v1_pod(obj))
        if not replenish:
            return
        evaluator = quota.evaluator_for(res.group, res.plural)
        if evaluator is None:
            return
        for (n, _), q in builtins.list(self.objects[_QUOTAS].items()):
            if n == ns and evaluator.matching_resources(((q.get("status") or {}).get("hard") or {}).keys()):
                self._sync_quota(q)

    def _disruption(self, res: _Resource, typ: str, obj: Obj, prev: Obj | None) -> None:
        """The disruption controller's event handlers, done at once (lock held): a created or updated budget is
        synced; a pod's change syncs the budgets of its namespace that select it before or after the change."""
        if not self.disruption_controller:
            return
        if res.key == _PDBS:
            if typ != "DELETED":
                self._sync_budget(obj)
            return
        if res.key != _PODS:
            return
        ns = obj["metadata"].get("namespace", "")
        for (n, name), pdb in builtins.list(self.objects[_PDBS].items()):
            if n != ns or not (disruption.matching_budgets([pdb], obj)
                               or (prev is not None and disruption.matching_budgets([pdb], prev))):
                continue
            current = self.objects[_PDBS].get((n, name))  # an earlier sync may have written it
            if current is not None:
                self._sync_budget(current)

    def _sync_budget(self, pdb: Obj) -> None:
        """disruption.go sync for one budget (testbed.disruption.sync): its events recorded, its status written when
        it changed (which syncs it again and finds nothing more to do)."""
        ns = pdb["metadata"].get("namespace", "")
        pods = [p for (n, _), p in self.objects[_PODS].items() if n == ns]
        result = disruption.sync(pdb, pods, lambda key, n, name: self.objects[key].get((n, name)))
        for kind, reason, message in result.events:
            self._record_event(pdb, kind, reason, message)
        if result.status is not None:
            new = _clone(pdb)
            new["status"] = result.status
            self._commit(self._res(_PDBS), "MODIFIED", new, pdb)

    def _record_event(self, pdb: Obj, kind: str, reason: str, message: str) -> None:
        """An event about a budget as the controller's recorder writes it (source controllermanager); the same event
        again bumps its count and lastTimestamp, as client-go's event correlator does (lock held)."""
        meta, ns, now = pdb["metadata"], pdb["metadata"].get("namespace", ""), _now()
        for (n, _), ev in self.objects[_EVENTS].items():
            involved = ev.get("involvedObject") or {}
            if (n == ns and involved.get("uid") == meta.get("uid") and ev.get("reason") == reason
                    and ev.get("message") == message and ev.get("type") == kind):
                bumped = _clone(ev)
                bumped["count"], bumped["lastTimestamp"] = int(ev.get("count") or 1) + 1, now
                self._commit(self._res(_EVENTS), "MODIFIED", bumped, ev)
                return
        event = {"kind": "Event", "apiVersion": "v1",
                 "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": ns, "uid": str(uuid.uuid4()),
                              "creationTimestamp": now},
                 "involvedObject": {"kind": "PodDisruptionBudget", "namespace": ns, "name": meta["name"],
                                    "uid": meta.get("uid"), "apiVersion": "policy/v1",
                                    "resourceVersion": meta.get("resourceVersion")},
                 "reason": reason, "message": message, "source": {"component": "controllermanager"},
                 "firstTimestamp": now, "lastTimestamp": now, "count": 1, "type": kind, "eventTime": None,
                 "reportingComponent": "controllermanager", "reportingInstance": ""}
        self._commit(self._res(_EVENTS), "ADDED", event, None)

    def _sync_quota(self, q: Obj) -> None:
        """resource_quota_controller.go syncResourceQuota for one quota (lock held)."""
        ns = q["metadata"].get("namespace", "")

        def items(evaluator: quota.Evaluator) -> builtins.list[Obj]:
            key = f"{evaluator.group}/v1/{evaluator.resource}" if evaluator.group else f"v1/{evaluator.resource}"
            return [o for (n, _), o in self.objects.get(key, {}).items() if n == ns]

        evaluators = [e for r in _RESOURCES.values() if r.namespaced and r.version == "v1"
                      for e in [quota.evaluator_for(r.group, r.plural)] if e is not None]
        synced = quota.sync(q, evaluators, items)
        if synced is not None:
            self._commit(self._res(_QUOTAS), "MODIFIED", _clone(synced), q)

    def get(self, res_key: str, ns: str, name: str) -> Obj:
        """One object or 404."""
        res = self._res(res_key)
        with self.cond:
            return self._existing(res, ns, name)

    def list(self, res_key: str, namespace: str | None = None, field_selector: str | None = None,
             label_selector: str | None = None) -> tuple[builtins.list[Obj], int]:
        """Matching objects and the resourceVersion of the list."""
        sel = _Selector(namespace, field_selector, label_selector)
        with self.cond:
            items = [o for o in self.objects[res_key].values() if sel.matches(o)]
            return items, self.rv

    def create(self, res_key: str, ns: str, body: Obj, user: UserInfo | None = None, *, dry_run: bool = False,
               warnings: builtins.list[str] | None = None) -> Obj:
        """Create an object (name or generateName); 409 AlreadyExists. The mutating webhooks are called first,
        without the lock; `dry_run` admits everything and stores nothing; the webhooks' warnings go to
        `warnings`."""
        res = self._res(res_key)
        if not isinstance(body, dict):
            raise StatusError(400, "BadRequest", "request body must be a JSON object")
        obj = self._prepare_create(res, ns, _clone(body))
        if res.kind == "Pod":
            _default_pod_spec(obj.get("spec"))  # decoding defaults the object before admission
            self._admit_priority(obj)
        elif res.kind == "PriorityClass":
            priority.default(obj)
        configurations = self._webhook_configurations()
        if configurations:
            mutated = self._mutate("CREATE", res, None, obj["metadata"].get("name") or "", ns, obj, None, user,
                                   dry_run, warnings, configurations)
            obj = self._prepare_create(res, ns, mutated if isinstance(mutated, dict) else obj)
        meta = obj["metadata"]
        with self.cond:
            if not meta.get("name"):
                if not meta.get("generateName"):
                    raise StatusError(422, "Invalid", f"{res.kind}: metadata.name or generateName is required")
                while True:
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                    if (ns if res.namespaced else "", meta["name"]) not in self.objects[res.key]:
                        break
            if (ns if res.namespaced else "", meta["name"]) in self.objects[res.key]:
                raise StatusError(409, "AlreadyExists", f'{res.plural} "{meta["name"]}" already exists',
                                  {"name": meta["name"], "kind": res.plural})
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            meta.pop("resourceVersion", None)
            meta.pop("deletionTimestamp", None)
            if res.kind == "Pod":
                _validate_pod(meta["name"], obj.setdefault("spec", {}))
                obj["status"] = {"phase": "Pending"}
                _default_pod_spec(obj["spec"])
            elif res.kind in ("ResourceClaim", "ResourceQuota", *_GENERATION_KINDS):
                obj.pop("status", None)  # written through the status subresource (a quota's by its controller)
            elif res.kind == "ResourceSlice" and not self.consumable_capacity:
                _drop_consumable_capacity(obj.get("spec"))
            elif res.kind == "MutatingWebhookConfiguration":
                default_configuration(obj)
            if res.kind == "ResourceQuota":
                _check_quota(meta["name"], obj)
            elif res.kind == "PriorityClass":
                _check_priority(lambda: priority.check(obj))
            if res.kind in _GENERATION_KINDS:
                meta["generation"] = 1
            if res.kind == "PodDisruptionBudget":
                _check_budget(meta["name"], disruption.validate(obj))
            _check_resource_api(res, meta["name"], lambda: resourceapi.check_create(res.kind, obj))
            self._admit("CREATE", res, None, meta["name"], ns, obj, None, user, dry_run=dry_run)
            charged = self._charge(res, ns, obj, None, user, dry_run)
            if dry_run:
                return obj
            for old_quota, new_quota in charged:
                self._commit(self._res(_QUOTAS), "MODIFIED", _clone(new_quota), old_quota)
            return self._commit(res, "ADDED", obj, None)

    @staticmethod
    def _prepare_create(res: _Resource, ns: str, obj: Obj) -> Obj:
        """The request's namespace, kind and apiVersion on a created object (again after the webhooks)."""
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        if res.namespaced:
            if meta.get("namespace") not in (None, "", ns):
                raise StatusError(400, "BadRequest", "the namespace of the object does not match the request")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        obj["kind"], obj["apiVersion"] = res.kind, res.api_version
        return obj

    def _store_update(self, res: _Resource, old: Obj, new: Obj, subresource: str | None,
                      user: UserInfo | None, dry_run: bool = False) -> Obj:
        """Keep the fields a client may not change, then commit unless nothing changed (lock held)."""
        m_old, m_new = old["metadata"], new.setdefault("metadata", {})
        if not isinstance(m_new, dict):
            m_new = new["metadata"] = {}
        if m_new.get("name", m_old["name"]) != m_old["name"]:
            raise StatusError(400, "BadRequest", "metadata.name cannot be changed")
        kept: tuple[str, ...] = ("name", "namespace", "uid", "creationTimestamp")
        if self._graceful(res):  # rest.BeforeUpdate: an update never changes or removes the deletion fields
            kept += ("deletionTimestamp", "deletionGracePeriodSeconds")
        for k in kept:
            if k in m_old:
                m_new[k] = m_old[k]
            else:
                m_new.pop(k, None)
        new["kind"], new["apiVersion"] = res.kind, res.api_version
        if res.has_status:
            if subresource == "status":
                new = {**_clone(old), "status": new.get("status", {})}
            elif "status" in old:
                new["status"] = _clone(old["status"])
            else:
                new.pop("status", None)
        new["metadata"]["resourceVersion"] = m_old.get("resourceVersion")
        if res.kind in _GENERATION_KINDS:
            generation = int(m_old.get("generation") or 0)
            changed = subresource is None and new.get("spec") != old.get("spec")
            new["metadata"]["generation"] = generation + 1 if changed else generation
        if res.kind == "PodDisruptionBudget":
            _check_budget(m_old["name"], disruption.validate(new) if subresource is None
                          else disruption.validate_status(new))
        if res.kind == "ResourceSlice" and not self.consumable_capacity:
            _drop_consumable_capacity(new.get("spec"))
        elif res.kind == "MutatingWebhookConfiguration":
            default_configuration(new)
        elif res.kind == "ResourceQuota" and subresource is None:
            _check_quota(m_old["name"], new)
        elif res.kind == "PriorityClass":
            _check_priority(lambda: priority.check(new, old))
        self._admit("UPDATE", res, subresource, m_old["name"], m_old.get("namespace", ""), new, old, user,
                    dry_run=dry_run)
        if new == old:
            return old
        if subresource is None:
            _check_resource_api(res, m_old["name"], lambda: resourceapi.check_update(res.kind, old, new))
        charged = self._charge(res, m_old.get("namespace", ""), new, old, user, dry_run) if subresource is None else []
        if dry_run:
            return new
        for old_quota, new_quota in charged:
            self._commit(self._res(_QUOTAS), "MODIFIED", _clone(new_quota), old_quota)
        if self._graceful(res) and graceful.delete_during_update(old, new):
            log.info("event=pod_removed pod=%s/%s why=finalizers_emptied", m_old.get("namespace"), m_old["name"])
            return self._commit(res, "DELETED", new, old)
        return self._commit(res, "MODIFIED", new, old)

    def _update_with(self, res: _Resource, ns: str, name: str, prepare: Callable[[Obj], Obj],
                     subresource: str | None, user: UserInfo | None, dry_run: bool,
                     warnings: builtins.list[str] | None) -> Obj:
        """An update as GuaranteedUpdate makes it: `prepare` the new object from the current one; with mutating
        webhooks stored, call them without the lock and start again when the object changed meanwhile."""
        for _ in range(_UPDATE_ATTEMPTS):
            with self.cond:
                old = self._existing(res, ns, name)
                new = prepare(old)
                if res.key == _PODS and subresource is None:
                    priority.keep_pod_priority(new, old)  # the Priority plugin's Admit of an update
                configurations = list(self.objects[_WEBHOOKS].values())
                if not configurations:
                    return self._store_update(res, old, new, subresource, user, dry_run)
            mutated = self._mutate("UPDATE", res, subresource, name, ns, new, old, user, dry_run, warnings,
                                   configurations)
            new = mutated if isinstance(mutated, dict) else new
            with self.cond:
                if self.objects[res.key].get((ns if res.namespaced else "", name)) is not old:
                    continue
                return self._store_update(res, old, new, subresource, user, dry_run)
        raise _conflict(res, name, "the object has been modified; please apply your changes to the latest version "
                                   "and try again")

    def update(self, res_key: str, ns: str, name: str, body: Obj, subresource: str | None = None,
               user: UserInfo | None = None, *, dry_run: bool = False,
               warnings: builtins.list[str] | None = None) -> Obj:
        """PUT: replace the object; 409 when body.metadata.resourceVersion is set and stale."""
        res = self._res(res_key)
        if not isinstance(body, dict):
            raise StatusError(400, "BadRequest", "request body must be a JSON object")
        want = (body.get("metadata") or {}).get("resourceVersion")

        def prepare(old: Obj) -> Obj:
            if want and want != old["metadata"]["resourceVersion"]:
                raise _conflict(res, name, "the object has been modified; please apply your changes to the latest "
                                           "version and try again")
            return _clone(body)

        return self._update_with(res, ns, name, prepare, subresource, user, dry_run, warnings)

    def patch(self, res_key: str, ns: str, name: str, patch: Any, content_type: str,
              subresource: str | None = None, user: UserInfo | None = None, *, dry_run: bool = False,
              warnings: builtins.list[str] | None = None) -> Obj:
        """PATCH (merge, strategic merge, JSON patch); 409 when the patch carries a stale resourceVersion."""
        res = self._res(res_key)
        ctype = content_type.split(";")[0].strip().lower()

        def prepare(old: Obj) -> Obj:
            if ctype == "application/merge-patch+json" or ctype == "application/strategic-merge-patch+json":
                if not isinstance(patch, dict):
                    raise StatusError(400, "BadRequest", f"a {ctype} body must be a JSON object")
                want = (patch.get("metadata") or {}).get("resourceVersion")
                new = merge_patch(old, patch, strategic=ctype.startswith("application/strategic"))
            elif ctype == "application/json-patch+json":
                if not isinstance(patch, builtins.list):
                    raise StatusError(400, "BadRequest", "a JSON patch body must be a JSON array")
                new = json_patch(old, patch)
                want = (new.get("metadata") or {}).get("resourceVersion")
                want = None if want == old["metadata"]["resourceVersion"] else want
            else:
                raise StatusError(415, "UnsupportedMediaType", f"the content type {content_type!r} is not supported")
            if want and want != old["metadata"]["resourceVersion"]:
                raise _conflict(res, name, "the object has been modified; please apply your changes to the latest "
                                           "version and try again")
            return _clone(new)

        return self._update_with(res, ns, name, prepare, subresource, user, dry_run, warnings)

    def delete(self, res_key: str, ns: str, name: str, options: Obj | None = None,
               user: UserInfo | None = None, *, dry_run: bool = False,
               warnings: builtins.list[str] | None = None) -> Obj:
        """Remove the object at once, or a pod gracefully under `graceful_deletion`; honours preconditions uid /
        resourceVersion."""
        res = self._res(res_key)
        if res.key == _PRIORITY_CLASSES:
            _check_priority(lambda: priority.check_delete(name))
        pre = (options or {}).get("preconditions") or {}
        for _ in range(_UPDATE_ATTEMPTS):
            with self.cond:
                old = self._existing(res, ns, name)
                if pre.get("uid") and pre["uid"] != old["metadata"].get("uid"):
                    raise _conflict(res, name, f"Precondition failed: UID in precondition: {pre['uid']}, "
                                               f"UID in object meta: {old['metadata'].get('uid')}")
                if pre.get("resourceVersion") and pre["resourceVersion"] != old["metadata"]["resourceVersion"]:
                    raise _conflict(res, name, "Precondition failed: resourceVersion does not match")
                configurations = list(self.objects[_WEBHOOKS].values())
                if not configurations:
                    return self._finish_delete(res, ns, name, old, options, user, dry_run)
            opts = {**(options or {}), "kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1"}
            if dry_run:
                opts["dryRun"] = ["All"]
            self._mutate("DELETE", res, None, name, ns, None, old, user, dry_run, warnings, configurations,
                         options=opts)
            with self.cond:
                if self.objects[res.key].get((ns if res.namespaced else "", name)) is not old:
                    continue
                return self._finish_delete(res, ns, name, old, options, user, dry_run)
        raise _conflict(res, name, "the object has been modified; please apply your changes to the latest version "
                                   "and try again")

    def _graceful(self, res: _Resource) -> bool:
        """Whether `res` is deleted gracefully (pods under `graceful_deletion`)."""
        return self.graceful_deletion and res.key == _PODS

    def _finish_delete(self, res: _Resource, ns: str, name: str, old: Obj, options: Obj | None,
                       user: UserInfo | None, dry_run: bool) -> Obj:
        """Validating admission of a delete, then the delete (lock held)."""
        if self._graceful(res):
            deletion = graceful.plan(old, options, datetime.now(UTC))
            if not (deletion.update or deletion.remove):
                return old  # store.go: a pending graceful deletion answers the pod, before any admission
            self._admit("DELETE", res, None, name, ns, None, old, user, dry_run=dry_run)
            return deletion.obj if dry_run else self._delete_pod(res, old, deletion)
        self._admit("DELETE", res, None, name, ns, None, old, user, dry_run=dry_run)
        gone = _clone(old)
        gone["metadata"]["deletionTimestamp"] = _now()
        gone["metadata"]["deletionGracePeriodSeconds"] = 0
        if dry_run:
            return gone
        return self._commit(res, "DELETED", gone, old)

    def _delete_pod(self, res: _Resource, old: Obj, deletion: graceful.Deletion) -> Obj:
        """Store a graceful deletion (lock held): the pod updated (MODIFIED), then removed (DELETED) when its
        deletion has no grace left and no finalizers; the pod as last stored."""
        obj, meta = old, old["metadata"]
        if deletion.update:
            obj = self._commit(res, "MODIFIED", _clone(deletion.obj), old)
            log.info("event=pod_terminating pod=%s/%s deletionTimestamp=%s grace=%s", meta.get("namespace"),
                     meta["name"], obj["metadata"].get("deletionTimestamp"),
                     obj["metadata"].get("deletionGracePeriodSeconds"))
        if deletion.remove:
            obj = self._commit(res, "DELETED", _clone(obj), obj)
            log.info("event=pod_removed pod=%s/%s", meta.get("namespace"), meta["name"])
        return obj

    def bind(self, ns: str, name: str, binding: Obj, user: UserInfo | None = None, *, dry_run: bool = False,
             warnings: builtins.list[str] | None = None) -> None:
        """pods/binding: set spec.nodeName and merge the Binding's annotations, as kube-apiserver does."""
        res = self._res("v1/pods")
        if not isinstance(binding, dict):
            raise StatusError(400, "BadRequest", "request body must be a JSON object")
        bmeta = binding.get("metadata") or {}
        if bmeta.get("name") not in (None, "", name):
            raise StatusError(400, "BadRequest", "Binding.metadata.name does not match the pod name")
        obj = {**_clone(binding), "kind": "Binding", "apiVersion": "v1",
               "metadata": {**_clone(bmeta), "name": name, "namespace": ns}}
        configurations = self._webhook_configurations()
        if configurations:
            mutated = self._mutate("CREATE", res, "binding", name, ns, obj, None, user, dry_run, warnings,
                                   configurations, kind="Binding")
            obj = mutated if isinstance(mutated, dict) else obj
            bmeta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        target = (obj.get("target") or {}).get("name") if isinstance(obj.get("target"), dict) else None
        if not target:
            raise StatusError(422, "Invalid", "Binding.target.name: Required value")
        with self.cond:
            self._admit("CREATE", res, "binding", name, ns, obj, None, user, kind="Binding", dry_run=dry_run)
            old = self._existing(res, ns, name)
            if bmeta.get("uid") and bmeta["uid"] != old["metadata"].get("uid"):
                raise _conflict(res, name, f"Precondition failed: UID in precondition: {bmeta['uid']}, "
                                           f"UID in object meta: {old['metadata'].get('uid')}")
            bound = (old.get("spec") or {}).get("nodeName")
            if bound:
                raise _conflict(res, name, f"pod {name} is already assigned to node \"{bound}\"")
            new = _clone(old)
            new.setdefault("spec", {})["nodeName"] = target
            annotations = bmeta.get("annotations") or {}
            if annotations:
                new["metadata"].setdefault("annotations", {}).update(annotations)
            status = new.setdefault("status", {})
            conds = [c for c in status.get("conditions", []) if c.get("type") != "PodScheduled"]
            conds.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                          "lastTransitionTime": _now()})
            status["conditions"] = conds
            if not dry_run:
                self._commit(res, "MODIFIED", new, old)

    # -- eviction
    def evict(self, ns: str, name: str, body: Any, user: UserInfo | None = None, *, dry_run: bool = False,
              warnings: builtins.list[str] | None = None) -> Obj:
        """pods/eviction as EvictionREST.Create does it (pkg/registry/core/pod/storage/eviction.go, with
        testbed.disruption): the answer's Status (201 Success), or StatusError as kube-apiserver answers."""
        res = self._res(_PODS)
        if not isinstance(body, dict):
            raise StatusError(400, "BadRequest", "request body must be a JSON object")
        version, kind = body.get("apiVersion"), body.get("kind")
        if version not in (None, "", "policy/v1", "policy/v1beta1") or kind not in (None, "", "Eviction"):
            # AcceptsGroupVersion: policy/v1 and policy/v1beta1 Evictions (an empty type is policy/v1's)
            raise StatusError(400, "BadRequest", f"the API version in the data ({version}) does not match the "
                                                 "expected API version (policy/v1)")
        raw_meta = body.get("metadata")
        meta: Obj = raw_meta if isinstance(raw_meta, dict) else {}
        if meta.get("namespace") not in (None, "", ns):  # rest.EnsureObjectNamespaceMatchesRequestNamespace
            raise StatusError(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                                                 "sent on the request")
        eviction: Obj = {**_clone(body), "apiVersion": "policy/v1", "kind": "Eviction",
                         "metadata": {**_clone(meta), "namespace": ns}}
        attrs = _EvictionAttributes("CREATE", res.group, res.version, res.plural, "eviction", "Eviction", name, ns,
                                    eviction, None, user or ANONYMOUS_ADMIN, dry_run)
        configurations = self._webhook_configurations()
        if configurations:  # mutating admission of the Eviction, before the registry's Create
            options: Obj = {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
            if dry_run:
                options["dryRun"] = ["All"]
            try:
                mutated = self.webhooks.admit(configurations, attrs, options=options, warnings=warnings)
            except Denied as exc:
                raise _denied(exc) from None
            if isinstance(mutated, dict):
                eviction = mutated
                attrs = replace(attrs, object=eviction)
        if (eviction.get("metadata") or {}).get("name") != name:
            raise StatusError(400, "BadRequest", "name in URL does not match name in Eviction object")
        delete_options = self._propagate_dry_run(eviction, dry_run)
        dry = bool(delete_options.get("dryRun"))  # dryrun.IsDryRun
        rv_unset = not (delete_options.get("preconditions") or {}).get("resourceVersion")
        with self.cond:
            policies = self.objects[_POLICIES]
            if policies:  # createValidation: the validating admission of the Eviction
                try:
                    self.admission.validate(list(policies.values()), list(self.objects[_POLICY_BINDINGS].values()),
                                            attrs)
                except Denied as exc:
                    raise _denied(exc) from None
            pod = self._existing(res, ns, name)
            if disruption.can_ignore_pdb(pod):
                options = delete_options
                if disruption.should_enforce_resource_version(pod) and rv_unset:
                    options = self._with_resource_version(options, pod)
                self._evicted(res, ns, name, options, dry)
                return disruption.eviction_success()
            budgets = disruption.matching_budgets(
                [p for (n, _), p in self.objects[_PDBS].items() if n == ns], pod)
            if len(budgets) > 1:
                raise _denied(disruption.several_budgets())
            pin_version = False
            if budgets:
                pdb = budgets[0]
                if disruption.unready_may_go(pdb, pod):
                    pin_version = True  # deleted without touching the budget, if the pod is still what we saw
                else:
                    try:
                        decremented = disruption.check_and_decrement(pdb, name, dry)
                    except Denied as exc:
                        raise _denied(exc) from None
                    if decremented is not None:
                        self._commit(self._res(_PDBS), "MODIFIED", _clone(decremented), pdb)
            options = self._with_resource_version(delete_options, pod) if pin_version else delete_options
            try:
                self._evicted(res, ns, name, options, dry)
            except StatusError as exc:
                if exc.code == 409 and pin_version and rv_unset:
                    raise _denied(disruption.still_processing(budgets[0]["metadata"]["name"])) from None
                raise
            return disruption.eviction_success()

    @staticmethod
    def _propagate_dry_run(eviction: Obj, dry_run: bool) -> Obj:
        """eviction.go propagateDryRun: the Eviction's deleteOptions with the request's dryRun."""
        request = ["All"] if dry_run else []
        options = eviction.get("deleteOptions")
        if not isinstance(options, dict):
            return {"dryRun": request} if request else {}
        options = _clone(options)
        if not options.get("dryRun"):
            if request:
                options["dryRun"] = request
            return options
        if request and options["dryRun"] != request:
            raise StatusError(500, "", "Non-matching dry-run options in request and content: "
                                       f"[{' '.join(request)}] and [{' '.join(map(str, options['dryRun']))}]")
        return options

    @staticmethod
    def _with_resource_version(options: Obj, pod: Obj) -> Obj:
        """setPreconditionsResourceVersion: the options with the pod's resourceVersion as a precondition."""
        out = _clone(options)
        out.setdefault("preconditions", {})["resourceVersion"] = pod["metadata"]["resourceVersion"]
        return out

    def _evicted(self, res: _Resource, ns: str, name: str, options: Obj, dry_run: bool) -> None:
        """addConditionAndDeletePod (lock held): the preconditions checked against the pod, the DisruptionTarget
        condition added, then the registry's delete (no delete admission; at once, or gracefully under
        `graceful_deletion` with the eviction's deleteOptions). A dry run deletes nothing."""
        pod = self._existing(res, ns, name)
        pre = options.get("preconditions") or {}
        if dry_run:  # the registry's Delete alone, which writes nothing on a dry run
            if pre.get("uid") and pre["uid"] != pod["metadata"].get("uid"):
                raise _conflict(res, name, f"Precondition failed: UID in precondition: {pre['uid']}, "
                                           f"UID in object meta: {pod['metadata'].get('uid')}")
            if pre.get("resourceVersion") and pre["resourceVersion"] != pod["metadata"]["resourceVersion"]:
                raise _conflict(res, name, "Precondition failed: resourceVersion does not match")
            return
        if pre.get("uid") and pre["uid"] != pod["metadata"].get("uid"):
            raise _pod_conflict(name, f"the UID in the precondition ({pre['uid']}) does not match the UID in record "
                                      f"({pod['metadata'].get('uid')}). The object might have been deleted and then "
                                      "recreated")
        if pre.get("resourceVersion") and pre["resourceVersion"] != pod["metadata"]["resourceVersion"]:
            raise _pod_conflict(name, f"the ResourceVersion in the precondition ({pre['resourceVersion']}) does not "
                                      f"match the ResourceVersion in record ({pod['metadata']['resourceVersion']}). "
                                      "The object might have been modified")
        marked = disruption.disruption_target(_clone(pod))
        if marked != pod:
            pod = self._commit(res, "MODIFIED", marked, pod)
        if self._graceful(res):
            deletion = graceful.plan(pod, options, datetime.now(UTC))
            if deletion.update or deletion.remove:
                self._delete_pod(res, pod, deletion)
            return
        gone = _clone(pod)
        gone["metadata"]["deletionTimestamp"] = _now()
        gone["metadata"]["deletionGracePeriodSeconds"] = 0
        self._commit(res, "DELETED", gone, pod)

    # -- watch
    def watch(self, res_key: str, sel: _Selector, since: int | None, deadline: float,
              alive: Any = None, bookmark_every: float | None = None) -> Iterator[builtins.list[Obj]]:
        """Yield batches of watch events ({type, object}) from `since` (None: current state as ADDED first)."""
        res = self._res(res_key)
        with self.cond:
            epoch = self.watch_epoch
            if since is None:
                pos = self.rv
                initial = [{"type": "ADDED", "object": o} for o in self.objects[res_key].values() if sel.matches(o)]
            else:
                if since < self.compacted_rv or since > self.rv:
                    yield [self._expired(since)]
                    return
                pos, initial = since, []
        if initial:
            yield initial
        last_sent = time.monotonic()
        while True:
            batch: list[Obj] = []
            with self.cond:
                while True:
                    if self.closing:
                        return
                    if self.watch_epoch != epoch or pos < self.compacted_rv:
                        yield [self._expired(pos)]
                        return
                    if self.rv > pos:
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self.cond.wait(min(left, 1.0))
                    if bookmark_every is not None and time.monotonic() - last_sent >= bookmark_every:
                        break
                    if alive is not None and not alive():
                        return
                changes = []
                for ch in reversed(self.history):
                    if ch.rv <= pos:
                        break
                    changes.append(ch)
                changes.reverse()
                newest = self.rv
            for ch in changes:
                if ch.res != res_key:
                    continue
                now_in = ch.type != "DELETED" and sel.matches(ch.obj)
                was_in = ch.prev is not None and sel.matches(ch.prev)
                if ch.type == "DELETED":
                    if was_in:
                        batch.append({"type": "DELETED", "object": ch.obj})
                elif now_in:
                    batch.append({"type": "MODIFIED" if was_in else "ADDED", "object": ch.obj})
                elif was_in:
                    gone = dict(ch.obj)
                    batch.append({"type": "DELETED", "object": gone})
            pos = newest
            if not batch and bookmark_every is not None and time.monotonic() - last_sent >= bookmark_every:
                batch.append({"type": "BOOKMARK", "object": {"kind": res.kind, "apiVersion": res.api_version,
                                                             "metadata": {"resourceVersion": str(pos)}}})
            if batch:
                while not self.delivering.wait(0.05):
                    if self.closing or (alive is not None and not alive()):
                        return
                last_sent = time.monotonic()
                yield batch

    @staticmethod
    def _expired(rv: int) -> Obj:
        err = StatusError(410, "Expired", f"too old resource version: {rv}")
        return {"type": "ERROR", "object": err.status()}


# ------------------------------------------------------------------------------------------ requests as authorized

@dataclass(frozen=True, slots=True)
class RequestAttributes:
    """What kube-apiserver's authorizer decides on for one request (its RequestInfo).

    `resource` is "plural" or "plural/subresource" as RBAC rules name it, "" for a non-resource URL (then `path`
    is the URL path and `verb` the lower-case method, as for RBAC's nonResourceURLs)."""

    verb: str
    api_group: str
    resource: str
    namespace: str
    name: str
    path: str


_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}  # Go's strconv.ParseBool


def request_attributes(method: str, target: str) -> RequestAttributes:
    """The authorization attributes of `method` on `target` (path and query), by kube-apiserver's rules:
    a GET of a collection is `list` (`watch` with watch=true or under /watch/), a DELETE of one `deletecollection`,
    a fieldSelector `metadata.name=X` names the object."""
    url = urlsplit(target)
    query = {k: v[-1] for k, v in parse_qs(url.query).items()}
    parts = [p for p in url.path.split("/") if p]
    group, rest = "", []
    if parts[:1] == ["api"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"] and len(parts) > 1:
        group, rest = parts[1], parts[3:]
    if not rest:
        return RequestAttributes(method.lower(), "", "", "", "", url.path)  # a non-resource URL
    verb = _VERBS.get(method, method.lower())
    if rest[0] == "watch":
        verb, rest = "watch", rest[1:]
    namespace = ""
    if len(rest) > 1 and rest[0] == "namespaces":
        namespace = rest[1]
        rest = rest[2:] if len(rest) > 2 else rest  # /namespaces/x itself is the namespace named x
    resource, name, subresource = (rest + ["", ""])[:3]
    if not name and verb == "get":
        verb = "watch" if query.get("watch") in _TRUE else "list"
        name = next((term.split("=", 1)[1] for term in (query.get("fieldSelector") or "").split(",")
                     if term.startswith("metadata.name=")), "")
    elif not name and verb == "delete":
        verb = "deletecollection"
    return RequestAttributes(verb, group, f"{resource}/{subresource}" if subresource else resource, namespace, name,
                             url.path)


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the stand-in received it: the bearer token ("" without one), method, path with query, body."""

    token: str
    method: str
    target: str
    body: bytes

    @property
    def attributes(self) -> RequestAttributes:
        """What kube-apiserver would authorize for this request."""
        return request_attributes(self.method, self.target)


# ------------------------------------------------------------------------------------------------------- HTTP layer

_PATH = re.compile(r"^/(?:api/(?P<cv>v1)|apis/(?P<g>[^/]+)/(?P<gv>[^/]+))"
                   r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?/?$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    _raw = b""
    _user = ANONYMOUS_ADMIN
    _warnings: list[str]

    def setup(self) -> None:
        super().setup()
        # headers and body go out in separate writes: without this, Nagle + delayed ACK add ~40 ms per request
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: the stand-in logs at DEBUG only
        log.debug("http %s", fmt % args)

    def _send_json(self, code: int, body: Any) -> None:
        data = orjson.dumps(body)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        details = body.get("details") if isinstance(body, dict) and body.get("kind") == "Status" else None
        if isinstance(details, dict) and isinstance(details.get("retryAfterSeconds"), int) \
                and details["retryAfterSeconds"] > 0:  # responsewriters.ErrorNegotiated
            self.send_header("Retry-After", str(details["retryAfterSeconds"]))
        seen: set[str] = set()
        for text in getattr(self, "_warnings", ()):  # the warning recorder: each text once, in order
            header = warning_header(text)
            if header is not None and text not in seen:
                seen.add(text)
                self.send_header("Warning", header)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        if not self._raw:
            return None
        try:
            return orjson.loads(self._raw)
        except orjson.JSONDecodeError:
            raise StatusError(400, "BadRequest", "request body is not valid JSON") from None

    def _dispatch(self, method: str) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        self._raw = self.rfile.read(n) if n else b""
        self._warnings = []
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        if self.server.recorded is not None:
            self.server.record(RecordedRequest(token, method, self.path, self._raw))
        try:
            self._user = self._authenticate(token)
            if not self.path.startswith("/standin/") and self._inject(method, token):
                return
            self._route(method)
        except StatusError as exc:
            self._send_json(exc.code, exc.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug in the stand-in: answer 500 and say what happened
            log.exception("apiserver stand-in failed on %s %s", method, self.path)
            self._send_json(500, StatusError(500, "InternalError", repr(exc)).status())

    do_GET = lambda self: self._dispatch("GET")  # noqa: E731
    do_POST = lambda self: self._dispatch("POST")  # noqa: E731
    do_PUT = lambda self: self._dispatch("PUT")  # noqa: E731
    do_PATCH = lambda self: self._dispatch("PATCH")  # noqa: E731
    do_DELETE = lambda self: self._dispatch("DELETE")  # noqa: E731

    def _authenticate(self, token: str) -> UserInfo:
        """The user of a bearer token: from the `users` table when the stand-in has one (401 for any other token,
        as kube-apiserver's token authenticators answer), else a cluster admin."""
        users = self.server.users
        if users is None:
            return ANONYMOUS_ADMIN
        user = users.get(token) if token else None
        if user is None:
            raise StatusError(401, "Unauthorized", "Unauthorized")
        return user

    def _inject(self, method: str, token: str) -> bool:
        """Act on the first fault rule matching this request (testbed.faults); True when it was answered."""
        is_watch = parse_qs(urlsplit(self.path).query).get("watch", [""])[-1] in ("true", "1")
        rule = self.server.faults.pick(method, self.path, is_watch, token)
        if rule is None or (rule.action in ("stall", "drop", "gone") and not is_watch):
            return False
        if rule.action == "delay":
            time.sleep(rule.seconds)
            return False
        if rule.action == "error":
            err = StatusError(rule.status, {429: "TooManyRequests", 503: "ServiceUnavailable",
                                            504: "Timeout"}.get(rule.status, "InternalError"),
                              f"injected fault: {rule.status}")
            data = orjson.dumps(err.status())
            self.send_response(rule.status)
            self.send_header("Content-Type", "application/json")
            if rule.retry_after is not None:
                self.send_header("Retry-After", str(rule.retry_after))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return True
        if rule.action == "timeout":
            time.sleep(rule.seconds)
            self.close_connection = True
            return True
        self.send_response(200)  # a watch: stall, drop or gone
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if rule.action == "stall":
            deadline = time.monotonic() + rule.seconds
            while time.monotonic() < deadline and self._alive():
                time.sleep(0.05)
        elif rule.action == "gone":
            data = orjson.dumps(Store._expired(0)) + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        return True

    def _route(self, method: str) -> None:
        url = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        store = self.server.store
        if url.path in ("/healthz", "/readyz", "/livez"):
            data = b"ok"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if url.path == "/version":
            self._send_json(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-vgpu-standin",
                                  "platform": "linux/amd64"})
            return
        if url.path == "/standin/faults":
            if method == "POST":
                try:
                    self.server.faults.set((self._body() or {}).get("rules") or [])
                except (TypeError, ValueError, re.error) as exc:
                    raise StatusError(400, "BadRequest", f"fault rules: {exc}") from None
            elif method == "DELETE":
                self.server.faults.clear()
            self._send_json(200, {"rules": self.server.faults.view()})
            return
        if url.path == "/standin/compact" and method == "POST":
            rv = store.compact(drop_watches=q.get("dropWatches") in ("true", "1"))
            self._send_json(200, {"resourceVersion": str(rv)})
            return
        if method == "GET" and self._discovery(url.path):
            return
        m = _PATH.match(url.path)
        if not m:
            raise StatusError(404, "NotFound", f"the server could not find the requested resource ({url.path})")
        group = m.group("g") or ""
        version = m.group("cv") or m.group("gv")
        res_key = f"{group}/{version}/{m.group('plural')}" if group else f"{version}/{m.group('plural')}"
        res = _RESOURCES.get(res_key)
        if res is None:
            raise StatusError(404, "NotFound", f"the server could not find the requested resource ({url.path})")
        ns, name, sub = m.group("ns"), m.group("name"), m.group("sub")
        if res.namespaced and name is not None and ns is None:
            raise StatusError(404, "NotFound", f"{res.plural} is namespaced: use /namespaces/<ns>/{res.plural}")
        if not res.namespaced and ns is not None:
            raise StatusError(404, "NotFound", f"{res.plural} is cluster-scoped")
        ns = ns or ""
        if sub is not None and not ((sub == "status" and res.has_status)
                                    or (sub in ("binding", "eviction", "log") and res.kind == "Pod")):
            raise StatusError(404, "NotFound", f"subresource {sub!r} of {res.plural} is not served")
        if (sub in ("binding", "eviction") and method != "POST") \
                or (sub == "status" and method not in ("GET", "PUT", "PATCH")) or (sub == "log" and method != "GET"):
            raise StatusError(405, "MethodNotAllowed", f"{method} is not allowed on {res.plural}/{sub}")
        if sub == "log":
            self._pod_log(ns, str(name), q)
            return

        dry_run = self._dry_run(method, sub, parse_qs(url.query).get("dryRun") or [])
        if method == "GET" and name is None:
            if q.get("watch") in ("true", "1"):
                self._watch(res, m.group("ns"), q)
                return
            items, rv = store.list(res.key, m.group("ns"), q.get("fieldSelector"), q.get("labelSelector"))
            if res.kind in TABLE_KINDS and wants_table(self.headers.get("Accept", "")):
                self._send_json(200, _table(res.kind, items, str(rv), q.get("includeObject", "Metadata")))
                return
            list_meta: dict[str, Any] = {"resourceVersion": str(rv)}
            items, list_meta["continue"] = _page(items, q.get("limit"), q.get("continue"))
            self._send_json(200, {"kind": res.kind + "List", "apiVersion": res.api_version, "metadata": list_meta,
                                  "items": items})
        elif method == "GET":
            obj = store.get(res.key, ns, name)
            if sub is None and res.kind in TABLE_KINDS and wants_table(self.headers.get("Accept", "")):
                version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                self._send_json(200, _table(res.kind, [obj], version, q.get("includeObject", "Metadata")))
                return
            self._send_json(200, obj)
        elif method == "POST" and name is None:
            if not res.namespaced or m.group("ns") is not None:
                self._send_json(201, store.create(res.key, ns, self._body(), user=self._user, dry_run=dry_run,
                                                  warnings=self._warnings))
            else:
                raise StatusError(405, "MethodNotAllowed", f"create {res.plural} in a namespace")
        elif method == "POST" and sub == "binding":
            store.bind(ns, name, self._body(), user=self._user, dry_run=dry_run, warnings=self._warnings)
            self._send_json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                  "code": 201})
        elif method == "POST" and sub == "eviction":
            self._send_json(201, store.evict(ns, name, self._body(), user=self._user, dry_run=dry_run,
                                             warnings=self._warnings))
        elif method == "PUT" and name is not None:
            self._send_json(200, store.update(res.key, ns, name, self._body(), sub, user=self._user, dry_run=dry_run,
                                              warnings=self._warnings))
        elif method == "PATCH" and name is not None:
            self._send_json(200, store.patch(res.key, ns, name, self._body(), self.headers.get("Content-Type", ""),
                                             sub, user=self._user, dry_run=dry_run, warnings=self._warnings))
        elif method == "DELETE" and name is not None:
            options = self._body()
            if options is None and q.get("gracePeriodSeconds", "").lstrip("-").isdigit():
                options = {"gracePeriodSeconds": int(q["gracePeriodSeconds"])}  # DeleteOptions as query parameters
            self._send_json(200, store.delete(res.key, ns, name, options, user=self._user, dry_run=dry_run,
                                              warnings=self._warnings))
        else:
            raise StatusError(405, "MethodNotAllowed", f"{method} is not allowed on {url.path}")

    def _pod_log(self, ns: str, name: str, q: dict[str, str]) -> None:
        """GET pods/{name}/log: the container's log from its node's kubelet (testbed/podlogs.py), as text."""
        store = self.server.store
        pod = store.get(_PODS, ns, name)
        node_name = (pod.get("spec") or {}).get("nodeName")
        node = None
        if node_name:
            with contextlib.suppress(StatusError):
                node = store.get("v1/nodes", "", node_name)
        try:
            url = log_location(pod, node, q)
            body = b"" if url is None else fetch_log(url, name)
        except LogError as exc:
            raise StatusError(exc.code, exc.reason, exc.message) from None
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    @staticmethod
    def _dry_run(method: str, sub: str | None, values: list[str]) -> bool:
        """The `dryRun` query parameter of a write: only `All` is valid (ValidateDryRun), else 422 as
        kube-apiserver's options validation answers."""
        if not values or method in ("GET", "HEAD"):
            return False
        if any(v != "All" for v in values):
            kind = {"POST": "CreateOptions", "PUT": "UpdateOptions", "PATCH": "PatchOptions"}.get(method,
                                                                                                 "DeleteOptions")
            shown = "[]string{" + ", ".join(f'"{v}"' for v in values) + "}"
            raise StatusError(422, "Invalid", f'{kind}.meta.k8s.io "" is invalid: dryRun: Unsupported value: {shown}: '
                                              'supported values: "All"')
        return True

    def _discovery(self, path: str) -> bool:
        """Answer a discovery path (testbed.discovery); False when `path` is not one."""
        path = path.rstrip("/")
        body: Any = None
        if path == "/api":
            body = CORE_VERSIONS
        elif path == "/apis":
            body = api_groups()
            listed = {g["name"] for g in body["groups"]}
            for group in sorted({r.group for r in _MORE_SERVED if r.group} - listed):
                served = {"groupVersion": f"{group}/v1", "version": "v1"}
                body["groups"].append({"name": group, "versions": [served], "preferredVersion": served})
        elif path == "/api/v1":
            body = resource_list("", "v1")
        elif path.startswith("/apis/") and path.count("/") == 3:
            _, _, group, version = path.split("/")
            body = resource_list(group, version)
            if body is None and any(r.group == group and r.version == version for r in _MORE_SERVED):
                body = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}",
                        "resources": []}
        if isinstance(body, dict) and body.get("kind") == "APIResourceList":
            group, _, version = str(body["groupVersion"]).rpartition("/")
            body["resources"] += [r.entry() for r in _MORE_SERVED if r.group == group and r.version == version]
        if body is None:
            return False
        self._send_json(200, body)
        return True

    def _alive(self) -> bool:
        """False once the client has closed its end of the connection."""
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if r:
                return self.connection.recv(1, socket.MSG_PEEK) != b""
            return True
        except OSError:
            return False

    def _watch(self, res: _Resource, ns: str | None, q: dict[str, str]) -> None:
        sel = _Selector(ns, q.get("fieldSelector"), q.get("labelSelector"))
        rv_text = q.get("resourceVersion", "")
        try:
            since = None if rv_text in ("", "0") else int(rv_text)
        except ValueError:
            raise StatusError(400, "BadRequest", f"invalid resourceVersion {rv_text!r}") from None
        timeout = float(q.get("timeoutSeconds") or self.server.watch_timeout)
        bookmarks = self.server.bookmark_interval if q.get("allowWatchBookmarks") in ("true", "1") else None
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        self.server.track_watch(self, +1)
        try:
            for batch in self.server.store.watch(res.key, sel, since, time.monotonic() + timeout, self._alive,
                                                 bookmarks):
                data = b"".join(orjson.dumps(ev) + b"\n" for ev in batch)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True
        finally:
            self.server.track_watch(self, -1)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(self, addr: tuple[str, int], store: Store, watch_timeout: float, bookmark_interval: float,
                 record_requests: bool = False, users: dict[str, UserInfo] | None = None) -> None:
        super().__init__(addr, _Handler)
        self.users = users
        self.store = store
        self.watch_timeout = watch_timeout
        self.bookmark_interval = bookmark_interval
        self.open_watches = 0
        self.faults = FaultPlan()
        self.recorded: list[RecordedRequest] | None = [] if record_requests else None
        self._lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-request (a watch it stopped) is not an error worth a traceback."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    def track_watch(self, _h: Any, delta: int) -> None:
        with self._lock:
            self.open_watches += delta

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            assert self.recorded is not None
            self.recorded.append(request)


def read_users(path: str | os.PathLike[str]) -> dict[str, UserInfo]:
    """A users file: JSON {token: {"username": ..., "uid": ..., "groups": [...], "extra": {key: [...]}}}."""
    try:
        doc = orjson.loads(Path(path).read_bytes())
        return {str(token): UserInfo(str(u["username"]), str(u.get("uid", "")), tuple(u.get("groups") or ()),
                                     {str(k): tuple(v) for k, v in (u.get("extra") or {}).items()})
                for token, u in doc.items()}
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
        raise ValueError(f"users file {path}: {exc}") from None


def write_kubeconfig(path: str | os.PathLike[str], url: str, context: str = "vgpu-standin",
                     token: str = "standin") -> str:
    """Write a kubeconfig pointing at `url` with bearer `token` (accepted whatever it is) and return its path."""
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": context,
        "clusters": [{"name": context, "cluster": {"server": url}}],
        "users": [{"name": context, "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context, "namespace": "default"}}],
    }
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))  # JSON is valid YAML
    os.replace(tmp, p)
    return str(p)


class ApiServerStandIn:
    """TEST INFRASTRUCTURE: the stand-in served from a thread of this process (`start()` / `stop()`)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, data_path: str | os.PathLike[str] | None = None,
                 history_size: int = 10000, watch_timeout: float = 1800.0, bookmark_interval: float = 60.0,
                 record_requests: bool = False, consumable_capacity: bool = True,
                 users: dict[str, UserInfo] | None = None, service_resolver: ServiceResolver | None = None,
                 disruption_controller: bool = True, graceful_deletion: bool = False) -> None:
        self.store = Store(data_path, history_size)
        self.store.consumable_capacity = consumable_capacity
        self.store.disruption_controller = disruption_controller  # False: budgets' status is left to clients
        self.store.graceful_deletion = graceful_deletion  # True: pods end through their kubelet (module docstring)
        self.store.webhooks.service_resolver.update(service_resolver or {})
        self._server = _Server((host, port), self.store, watch_timeout, bookmark_interval, record_requests, users)
        self._thread: threading.Thread | None = None
        self.kubeconfig: str | None = None  # set by write_kubeconfig()

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:34567."""
        host, port = self._server.server_address[:2]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{port}"

    @property
    def service_resolver(self) -> dict[tuple[str, str, int], tuple[str, int]]:
        """Where a webhook's `service` is reached: (namespace, name, port) -> (host, port); change it at will (the
        stand-in has no Service network; the TLS server name stays `<name>.<namespace>.svc`)."""
        return self.store.webhooks.service_resolver

    @property
    def open_watches(self) -> int:
        """Number of watch streams being served right now."""
        return self._server.open_watches

    @property
    def faults(self) -> FaultPlan:
        """The faults this stand-in injects (testbed.faults)."""
        return self._server.faults

    @contextlib.contextmanager
    def hold_watches(self) -> Iterator[None]:
        """Within the block, open watches send no change (a lagging watch); lists and writes are served as usual.

        What was held is sent, in order, when the block ends."""
        self.store.delivering.clear()
        try:
            yield
        finally:
            self.store.delivering.set()

    def authenticate(self, users: dict[str, UserInfo] | None) -> None:
        """From now on only these bearer tokens are accepted, each as its user (None: any token, as an admin)."""
        self._server.users = dict(users) if users is not None else None

    def write_kubeconfig(self, path: str | os.PathLike[str], token: str = "standin") -> str:
        """Write a kubeconfig for this server with bearer `token`, remember it as `.kubeconfig`, return its path."""
        self.kubeconfig = write_kubeconfig(path, self.url, token=token)
        return self.kubeconfig

    def requests(self, token: str) -> list[RecordedRequest]:
        """The requests received so far with bearer `token` (needs `record_requests=True`), oldest first."""
        recorded = self._server.recorded
        if recorded is None:
            raise RuntimeError("this stand-in does not record requests (record_requests=False)")
        with self._server._lock:
            return [r for r in recorded if r.token == token]

    def start(self) -> ApiServerStandIn:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="apiserver-standin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End watches, stop serving and persist."""
        self.store.close()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> ApiServerStandIn:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class ApiServerProcess:
    """TEST INFRASTRUCTURE: the stand-in as a real subprocess that tests can stop, kill and restart.

    The first start picks a free port; restarts reuse it, so clients keep their kubeconfig. With `data_path`
    (default: `<workdir>/apiserver.json`) objects and resourceVersions survive restarts.
    """

    def __init__(self, workdir: str | os.PathLike[str], history_size: int = 10000, persist: bool = True,
                 host: str = "127.0.0.1", port: int = 0, extra_args: list[str] | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_path = self.workdir / "apiserver.json" if persist else None
        self.kubeconfig = str(self.workdir / "kubeconfig")
        self.history_size = history_size
        self.host, self.port = host, port
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 15.0) -> ApiServerProcess:
        """Start the process and wait until it serves."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("apiserver stand-in already running")
        env = dict(os.environ)
        cmd = [sys.executable, "-m", "vgpu.testbed.apiserver", "--listen", f"{self.host}:{self.port}",
               "--kubeconfig-out", self.kubeconfig, "--history", str(self.history_size), *self.extra_args]
        if self.data_path is not None:
            cmd += ["--data", str(self.data_path)]
        deadline = time.monotonic() + timeout
        while True:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=None, env=env)
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline().decode().strip()
            if line.startswith("http://"):
                break
            self.proc.wait()
            # the port may still be held for a moment by the previous process: retry until the deadline
            if time.monotonic() > deadline:
                raise RuntimeError(f"apiserver stand-in did not start (exit {self.proc.returncode})")
            time.sleep(0.1)
        self.url = line
        self.port = int(line.rsplit(":", 1)[1])
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM and wait (the journal is folded into the snapshot)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close_pipe()

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_pipe()

    def restart(self, kill: bool = True) -> ApiServerProcess:
        """Kill (or stop) and start again on the same port."""
        self.kill() if kill else self.stop()
        return self.start()

    def _close_pipe(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> ApiServerProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _parse_service_route(text: str) -> tuple[tuple[str, str, int], tuple[str, int]]:
    """`NS/NAME:PORT=HOST:PORT` (--webhook-service) as a service_resolver entry; ValueError otherwise."""
    m = re.fullmatch(r"([^/=]+)/([^/:=]+):(\d+)=(.+):(\d+)", text.strip())
    if not m:
        raise ValueError(f"--webhook-service {text!r}: expected NS/NAME:PORT=HOST:PORT")
    return (m[1], m[2], int(m[3])), (m[4], int(m[5]))


def main(argv: list[str] | None = None) -> int:
    """Command line entry: serve until SIGTERM / SIGINT."""
    ap = argparse.ArgumentParser(prog="python -m vgpu.testbed.apiserver",
                                 description="TEST INFRASTRUCTURE: kube-apiserver stand-in for vgpu-sharing")
    ap.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0 picks a free one)")
    ap.add_argument("--data", default=None, help="snapshot file; objects survive restarts (journal FILE.journal)")
    ap.add_argument("--kubeconfig-out", default=None, help="write a kubeconfig for this server here")
    ap.add_argument("--history", type=int, default=10000, help="watch history window in changes (older: 410)")
    ap.add_argument("--watch-timeout", type=float, default=1800.0, help="default watch timeout in seconds")
    ap.add_argument("--bookmark-interval", type=float, default=60.0,
                    help="idle seconds between BOOKMARK events (kube-apiserver: a minute)")
    ap.add_argument("--feature-gates", default="",
                    help="NAME=true|false,... as kube-apiserver's; known: DRAConsumableCapacity (default true)")
    ap.add_argument("--users-file", default=None,
                    help="JSON {token: {username, uid, groups, extra}}: only these bearer tokens are accepted")
    ap.add_argument("--webhook-service", action="append", default=[], metavar="NS/NAME:PORT=HOST:PORT",
                    help="where an admission webhook's service is reached (repeatable)")
    ap.add_argument("--graceful-deletion", action="store_true",
                    help="delete pods gracefully, as kube-apiserver does: their kubelet removes them")
    ap.add_argument("--log-level", default="WARNING")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    host, _, port = args.listen.rpartition(":")
    gates = {k.strip(): v.strip().lower() == "true"
             for k, _, v in (g.partition("=") for g in args.feature_gates.split(",") if g.strip())}
    try:
        users = read_users(args.users_file) if args.users_file else None
        services = dict(_parse_service_route(text) for text in args.webhook_service)
        srv = ApiServerStandIn(host or "127.0.0.1", int(port), args.data, args.history, args.watch_timeout,
                               args.bookmark_interval, consumable_capacity=gates.get("DRAConsumableCapacity", True),
                               users=users, service_resolver=services, graceful_deletion=args.graceful_deletion)
    except (OSError, ValueError) as exc:
        print(f"apiserver stand-in: cannot start: {exc}", file=sys.stderr)
        return 2
    if args.kubeconfig_out:
        srv.write_kubeconfig(args.kubeconfig_out)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    srv.start()
    print(srv.url, flush=True)
    log.info("apiserver stand-in serving url=%s data=%s", srv.url, args.data)
    stop.wait()
    srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
