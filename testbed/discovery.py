"""TEST INFRASTRUCTURE: what the API-server stand-in (testbed/apiserver.py) answers so that real clients such as
`kubectl` work against it: API discovery and server-side printing.

Discovery: `/api` (APIVersions), `/apis` (APIGroupList), `/api/v1` and `/apis/<group>/<version>` (APIResourceList,
with verbs, short names and subresources), in the legacy (unaggregated) form; kubectl asks for the aggregated form
first and falls back to this one when the answer is a plain list.

Server-side printing: kubectl asks for a `meta.k8s.io/v1` Table (`Accept: ...;as=Table;...`) and prints its cells.
`as_table` builds the columns kube-apiserver prints for pods, nodes, events, leases and PodDisruptionBudgets
(pkg/printers/internalversion/printers.go; the `priority: 1` columns are the ones `-o wide` adds), with rows carrying
the object's metadata (or the whole object with `includeObject=Object`), from which kubectl takes the NAMESPACE
column of `-A`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = ["API_GROUPS", "CORE_VERSIONS", "ServedResource", "api_groups", "as_table", "resource_list", "short_age",
           "wants_table"]

Obj = dict[str, Any]

_RW = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True, slots=True)
class ServedResource:
    """One resource (or subresource) as discovery names it."""

    group: str
    version: str
    name: str  # "pods" or "pods/status"
    kind: str
    namespaced: bool
    verbs: tuple[str, ...]
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    kind_group: str | None = None  # the group and version of `kind` when not the resource's own (pods/eviction)
    kind_version: str | None = None

    def entry(self) -> Obj:
        """The APIResource of this resource."""
        out: Obj = {"name": self.name, "singularName": "" if "/" in self.name else self.kind.lower(),
                    "namespaced": self.namespaced, "kind": self.kind, "verbs": list(self.verbs)}
        if self.kind_group is not None:
            out["group"], out["version"] = self.kind_group, self.kind_version or ""
        if self.short_names:
            out["shortNames"] = list(self.short_names)
        if self.categories:
            out["categories"] = list(self.categories)
        return out


SERVED = (
    ServedResource("", "v1", "nodes", "Node", False, tuple(_RW), ("no",)),
    ServedResource("", "v1", "nodes/status", "Node", False, ("get", "patch", "update")),
    ServedResource("", "v1", "pods", "Pod", True, tuple(_RW), ("po",), ("all",)),
    ServedResource("", "v1", "pods/status", "Pod", True, ("get", "patch", "update")),
    ServedResource("", "v1", "pods/binding", "Binding", True, ("create",)),
    # kubectl drain evicts only where /api/v1 lists pods/eviction with its kind's group and version
    # (k8s.io/kubectl/pkg/drain CheckEvictionSupport)
    ServedResource("", "v1", "pods/eviction", "Eviction", True, ("create",), kind_group="policy", kind_version="v1"),
    ServedResource("", "v1", "events", "Event", True, tuple(_RW), ("ev",)),
    ServedResource("events.k8s.io", "v1", "events", "Event", True, tuple(_RW), ("ev",)),
    ServedResource("coordination.k8s.io", "v1", "leases", "Lease", True, tuple(_RW)),
    ServedResource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False, tuple(_RW)),
    ServedResource("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False, tuple(_RW)),
    ServedResource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True, tuple(_RW)),
    ServedResource("resource.k8s.io", "v1", "resourceclaims/status", "ResourceClaim", True, ("get", "patch", "update")),
    ServedResource("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True, tuple(_RW)),
    ServedResource("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy",
                   False, tuple(_RW), ("vap",), ("api-extensions",)),
    ServedResource("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies/status",
                   "ValidatingAdmissionPolicy", False, ("get", "patch", "update")),
    ServedResource("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings",
                   "ValidatingAdmissionPolicyBinding", False, tuple(_RW), ("vapb",), ("api-extensions",)),
    ServedResource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, tuple(_RW), ("pdb",)),
    ServedResource("policy", "v1", "poddisruptionbudgets/status", "PodDisruptionBudget", True,
                   ("get", "patch", "update")),
    # the workloads whose scale the disruption controller reads (stored only: no controller acts on them)
    ServedResource("apps", "v1", "deployments", "Deployment", True, tuple(_RW), ("deploy",), ("all",)),
    ServedResource("apps", "v1", "deployments/status", "Deployment", True, ("get", "patch", "update")),
    ServedResource("apps", "v1", "replicasets", "ReplicaSet", True, tuple(_RW), ("rs",), ("all",)),
    ServedResource("apps", "v1", "replicasets/status", "ReplicaSet", True, ("get", "patch", "update")),
    ServedResource("apps", "v1", "statefulsets", "StatefulSet", True, tuple(_RW), ("sts",), ("all",)),
    ServedResource("apps", "v1", "statefulsets/status", "StatefulSet", True, ("get", "patch", "update")),
)
CORE_VERSIONS: Obj = {"kind": "APIVersions", "versions": ["v1"],
                      "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
API_GROUPS = sorted({r.group for r in SERVED if r.group})


def api_groups() -> Obj:
    """`/apis`: every group with its one version."""
    groups = []
    for group in API_GROUPS:
        version = {"groupVersion": f"{group}/v1", "version": "v1"}
        groups.append({"name": group, "versions": [version], "preferredVersion": version})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def resource_list(group: str, version: str) -> Obj | None:
    """`/api/v1` or `/apis/<group>/<version>`; None when the stand-in serves no such group version."""
    entries = [r.entry() for r in SERVED if r.group == group and r.version == version]
    if not entries:
        return None
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version, "resources": entries}


def wants_table(accept: str) -> bool:
    """Whether an Accept header asks for a meta.k8s.io Table (kubectl get's server-side printing)."""
    return any("as=Table" in part for part in accept.split(","))


# ------------------------------------------------------------------------------------------------------ tables

def short_age(timestamp: str | None, now: datetime) -> str:
    """kubectl's short age: 45s, 12m, 5h, 3d, 2y (<unknown> when absent)."""
    if not timestamp:
        return "<unknown>"
    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    seconds = max(0, int((now - then).total_seconds()))
    steps = ((120, 1, "s"), (2 * 3600, 60, "m"), (2 * 86400, 3600, "h"), (2 * 365 * 86400, 86400, "d"))
    for bound, size, unit in steps:
        if seconds < bound:
            return f"{seconds // size}{unit}"
    return f"{seconds // (365 * 86400)}y"


def _pod_cells(pod: Obj, now: datetime) -> list[Any]:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    reason = status.get("reason") or status.get("phase") or "Pending"
    for s in statuses:
        state = s.get("state") or {}
        detail = (state.get("waiting") or {}).get("reason") or (state.get("terminated") or {}).get("reason")
        if detail and reason in ("Running", "Pending", "Failed"):
            reason = detail
    if meta.get("deletionTimestamp"):
        reason = "Terminating"
    restarts = sum(int(s.get("restartCount") or 0) for s in statuses)
    return [meta.get("name", ""), f"{ready}/{len(spec.get('containers') or [])}", reason, restarts,
            short_age(meta.get("creationTimestamp"), now), status.get("podIP") or "<none>",
            spec.get("nodeName") or "<none>", status.get("nominatedNodeName") or "<none>", "<none>"]


def _node_cells(node: Obj, now: datetime) -> list[Any]:
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    ready = next((c for c in status.get("conditions") or () if c.get("type") == "Ready"), None)
    state = "Unknown" if ready is None else ("Ready" if ready.get("status") == "True" else "NotReady")
    if spec.get("unschedulable"):
        state += ",SchedulingDisabled"
    roles = sorted(k.split("/", 1)[1] for k in (meta.get("labels") or {})
                   if k.startswith("node-role.kubernetes.io/") and "/" in k)
    info = status.get("nodeInfo") or {}
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or ()}
    return [meta.get("name", ""), state, ",".join(roles) or "<none>", short_age(meta.get("creationTimestamp"), now),
            info.get("kubeletVersion") or "", addresses.get("InternalIP") or "<none>",
            addresses.get("ExternalIP") or "<none>", info.get("osImage") or "<unknown>",
            info.get("kernelVersion") or "<unknown>", info.get("containerRuntimeVersion") or "<unknown>"]


def _event_cells(event: Obj, now: datetime) -> list[Any]:
    meta = event.get("metadata") or {}
    regarding = event.get("involvedObject") or event.get("regarding") or {}
    last = event.get("lastTimestamp") or event.get("eventTime") or meta.get("creationTimestamp")
    source = event.get("source") or {}
    return [short_age(last, now), event.get("type", ""), event.get("reason", ""),
            f"{str(regarding.get('kind', '')).lower()}/{regarding.get('name', '')}",
            event.get("message") or event.get("note") or "", regarding.get("fieldPath") or "",
            source.get("component") or event.get("reportingController") or "",
            short_age(event.get("firstTimestamp") or meta.get("creationTimestamp"), now), event.get("count") or 1,
            meta.get("name", "")]


def _lease_cells(lease: Obj, now: datetime) -> list[Any]:
    meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
    return [meta.get("name", ""), spec.get("holderIdentity") or "<none>", short_age(meta.get("creationTimestamp"), now)]


def _int_or_string(value: Any) -> str:
    """intstr.IntOrString.String(): the integer or the string as it is."""
    return str(value)


def _pdb_cells(pdb: Obj, now: datetime) -> list[Any]:
    """printers.go printPodDisruptionBudget: N/A for the field not set, status.disruptionsAllowed."""
    meta, spec, status = pdb.get("metadata") or {}, pdb.get("spec") or {}, pdb.get("status") or {}
    min_available = "N/A" if spec.get("minAvailable") is None else _int_or_string(spec["minAvailable"])
    max_unavailable = "N/A" if spec.get("maxUnavailable") is None else _int_or_string(spec["maxUnavailable"])
    return [meta.get("name", ""), min_available, max_unavailable, int(status.get("disruptionsAllowed") or 0),
            short_age(meta.get("creationTimestamp"), now)]


def _columns(*names: tuple[str, str, int]) -> list[Obj]:
    return [{"name": n, "type": t, "format": "name" if n == "Name" else "", "description": n, "priority": p}
            for n, t, p in names]


_TABLES: dict[str, tuple[list[Obj], Callable[[Obj, datetime], list[Any]]]] = {
    "Pod": (_columns(("Name", "string", 0), ("Ready", "string", 0), ("Status", "string", 0),
                     ("Restarts", "integer", 0), ("Age", "string", 0), ("IP", "string", 1), ("Node", "string", 1),
                     ("Nominated Node", "string", 1), ("Readiness Gates", "string", 1)), _pod_cells),
    "Node": (_columns(("Name", "string", 0), ("Status", "string", 0), ("Roles", "string", 0), ("Age", "string", 0),
                      ("Version", "string", 0), ("Internal-IP", "string", 1), ("External-IP", "string", 1),
                      ("OS-Image", "string", 1), ("Kernel-Version", "string", 1),
                      ("Container-Runtime", "string", 1)), _node_cells),
    "Event": (_columns(("Last Seen", "string", 0), ("Type", "string", 0), ("Reason", "string", 0),
                       ("Object", "string", 0), ("Message", "string", 0), ("Subobject", "string", 1),
                       ("Source", "string", 1), ("First Seen", "string", 1), ("Count", "integer", 1),
                       ("Name", "string", 1)), _event_cells),
    "Lease": (_columns(("Name", "string", 0), ("Holder", "string", 0), ("Age", "string", 0)), _lease_cells),
    "PodDisruptionBudget": (_columns(("Name", "string", 0), ("Min Available", "string", 0),
                                     ("Max Unavailable", "string", 0), ("Allowed Disruptions", "integer", 0),
                                     ("Age", "string", 0)), _pdb_cells),
}


def as_table(kind: str, items: Iterable[Obj], resource_version: str,
             include: str = "Metadata", now: datetime | None = None) -> Obj:
    """A meta.k8s.io/v1 Table of `items` of `kind` (as kube-apiserver prints them); `include` is the request's
    includeObject (None, Metadata or Object)."""
    columns, cells = _TABLES[kind]
    when = now or datetime.now(UTC)
    rows = []
    for item in items:
        row: Obj = {"cells": cells(item, when)}
        if include == "Object":
            row["object"] = item
        elif include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": _metadata(item.get("metadata") or {})}
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": columns, "rows": rows}


def _metadata(meta: Mapping[str, Any]) -> Obj:
    return {k: v for k, v in meta.items() if k != "managedFields"}
