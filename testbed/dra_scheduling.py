"""TEST INFRASTRUCTURE: the DynamicResources plugin of the kube-scheduler stand-in (DRA, `resource.k8s.io/v1`).

Written from upstream's documented behaviour (pkg/scheduler/framework/plugins/dynamicresources, KEP-4381 and
KEP-5004), sharing nothing with the DRA code it tests. `scheduler_driver.SchedulerDriver` calls it at the points
kube-scheduler's framework does:

  PreEnqueue  a pod whose claims do not all exist yet waits, without an event: `pod "ns/name": ResourceClaim not
              created yet` for a template claim the controller has not created, the lister's not-found text for a
              missing named claim, `ResourceClaim ... (pod is not owner)`, `resourceclaim "x" is being deleted`;
  PreFilter   `resourceclaim in use` (allocated, not reserved for the pod, reservedFor full), `resource claim ns/x
              is in the process of being allocated` (another pod's cycle allocated it, not written yet),
              `request r: device class c does not exist`; these fail the pod on every node;
  Filter      per node: allocated claims pin the pod to their allocation's nodeSelector (`resourceclaim not
              available on the node`), the unallocated ones and the node's extended-resource claim must all be
              allocatable from the node's slices (`cannot allocate all claims`, see dra_allocator);
  Reserve     the chosen node's allocations count as in use for the next cycles until the informer shows them;
  PreBind     adds the delete-protection finalizer, writes status.allocation (with allocationTimestamp) and adds the
              pod to status.reservedFor through the status subresource, creates the extended-resource claim and
              sets pod.status.extendedResourceClaimStatus; a failure un-reserves and the pod is retried.

Extended resources (KEP-5004): a container's request for a resource some DeviceClass names in
spec.extendedResourceName (or `deviceclass.resource.kubernetes.io/<class>`) is served by DRA on a node whose
status.allocatable does not list it: one request `container-<i>-request-<j>` per container and resource (i over
initContainers + containers, j the index of the resource among the container's sorted request names), count =
the amount, in one special claim `<pod>-extended-resources-<suffix>` with the annotation
`resource.kubernetes.io/extended-resource-claim: "true"`. On a node that lists it, the device-plugin path
(the in-tree fit) is kept.

Changes to slices, classes and claims requeue unschedulable pods; the resourceclaim controller's side (claims from
templates, release) is claim_controller.ClaimController, started from here.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from vgpu.testbed.claim_controller import DELETE_PROTECTION_FINALIZER, ClaimController
from vgpu.testbed.dra_allocator import (
    DEFAULT_KUBERNETES_VERSION,
    AllocatedState,
    Allocator,
    KubernetesVersion,
    SelectorCache,
    node_selector_matches,
    parse_kubernetes_version,
    parse_quantity,
)

__all__ = [
    "EXTENDED_RESOURCE_CLAIM_ANNOTATION",
    "IMPLICIT_EXTENDED_RESOURCE_PREFIX",
    "ApiError",
    "DraBindError",
    "DynamicResources",
    "PodDra",
    "ResourceApi",
]

log = logging.getLogger(__name__)

Obj = dict[str, Any]

EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_EXTENDED_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"
RESERVED_FOR_MAX_SIZE = 256  # resource.k8s.io/v1 ResourceClaimReservedForMaxSize
UNAVAILABLE_ON_NODE = "resourceclaim not available on the node"
CANNOT_ALLOCATE = "cannot allocate all claims"


class DraBindError(Exception):
    """PreBind could not write a claim or the pod's status."""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _key(obj: Obj) -> str:
    meta = _meta(obj)
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


# ------------------------------------------------------------------------------------------------ API access

class ResourceApi:
    """The resource.k8s.io/v1 and pod-status calls of the plugin and the claim controller (raw JSON)."""

    KINDS = ("deviceclasses", "resourceslices", "resourceclaims")

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client as k8s

        self.resource: Any = k8s.ResourceV1Api(api_client)
        self.core: Any = k8s.CoreV1Api(api_client)

    @staticmethod
    def _json(resp: Any) -> Any:
        from vgpu.testbed.kubeclient import read_json

        return read_json(resp)

    def _lister(self, kind: str) -> Callable[..., Any]:
        listers: dict[str, Callable[..., Any]] = {
            "deviceclasses": self.resource.list_device_class,
            "resourceslices": self.resource.list_resource_slice,
            "resourceclaims": self.resource.list_resource_claim_for_all_namespaces,
        }
        return listers[kind]

    def list(self, kind: str) -> Obj:
        """List all objects of `kind` (one of KINDS)."""
        result: Obj = self._json(self._lister(kind)(_preload_content=False))
        return result

    def watch(self, kind: str, rv: str, timeout: int = 240) -> Iterator[Obj]:
        """Watch events of `kind` from resourceVersion `rv`."""
        from kubernetes.watch import watch as k8s_watch

        iter_resp_lines: Any = k8s_watch.iter_resp_lines
        resp = self._lister(kind)(watch=True, resource_version=rv, allow_watch_bookmarks=True,
                                  timeout_seconds=timeout, _preload_content=False, _request_timeout=(5, timeout + 30))
        try:
            for line in iter_resp_lines(resp):
                if line:
                    yield orjson.loads(line)
        finally:
            resp.release_conn()

    def _request(self, method: str, path: str, body: Any = None,
                 content_type: str = "application/json") -> Obj:
        """One raw call with a plain-dict body (the typed methods would coerce it into their models)."""
        client = self.resource.api_client
        serialized = client.param_serialize(method=method, resource_path=path, body=body,
                                            header_params={"Content-Type": content_type,
                                                           "Accept": "application/json"},
                                            auth_settings=["BearerToken"])
        _method, url, headers, data, _post = serialized
        resp = client.call_api(method, url, header_params=headers, body=data, _request_timeout=(5, 30))
        raw = resp.read()
        if resp.status >= 300:
            raise ApiError(resp.status, f"{method} {path}: {resp.status} {raw[:300]!r}")
        result: Obj = orjson.loads(raw) if raw else {}
        return result

    @staticmethod
    def _claims(ns: str, name: str = "") -> str:
        return f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims" + (f"/{name}" if name else "")

    def get_claim(self, ns: str, name: str) -> Obj:
        """GET a ResourceClaim."""
        return self._request("GET", self._claims(ns, name))

    def resource_claim_template(self, ns: str, name: str) -> Obj:
        """GET a ResourceClaimTemplate."""
        return self._request("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates/{name}")

    def create_claim(self, ns: str, body: Obj) -> Obj:
        """POST a ResourceClaim."""
        return self._request("POST", self._claims(ns), body)

    def replace_claim(self, claim: Obj) -> Obj:
        """PUT a ResourceClaim (metadata changes; 409 when its resourceVersion is stale)."""
        meta = _meta(claim)
        return self._request("PUT", self._claims(meta["namespace"], meta["name"]), claim)

    def replace_claim_status(self, claim: Obj) -> Obj:
        """PUT resourceclaims/status (409 when its resourceVersion is stale)."""
        meta = _meta(claim)
        return self._request("PUT", self._claims(meta["namespace"], meta["name"]) + "/status", claim)

    def delete_claim(self, ns: str, name: str, uid: str) -> None:
        """DELETE a ResourceClaim, only if it still has `uid`."""
        self._request("DELETE", self._claims(ns, name), {"kind": "DeleteOptions", "apiVersion": "v1",
                                                         "preconditions": {"uid": uid}})

    def get_pod(self, ns: str, name: str) -> Obj:
        """GET a pod."""
        return self._request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")

    def patch_pod_status(self, ns: str, name: str, patch: Obj) -> Obj:
        """Strategic-merge patch of pods/status."""
        return self._request("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", patch,
                             "application/strategic-merge-patch+json")


class ApiError(Exception):
    """An API call answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def api_status(exc: BaseException) -> int:
    """The HTTP status of a kubernetes client ApiException (0 for anything else)."""
    status = getattr(exc, "status", 0)
    return status if isinstance(status, int) else 0


def short_error(exc: BaseException) -> str:
    """The first line of an exception, for logs and messages."""
    text = str(exc)
    return text.splitlines()[0][:200] if text else type(exc).__name__


# ------------------------------------------------------------------------------------------------ per-pod state

@dataclass(slots=True)
class PodDra:
    """What PreFilter found for one pod; Filter and Reserve fill in the per-node parts."""

    claims: list[Obj]  # the pod's claims, in spec.resourceClaims order (existing ones only)
    to_allocate: list[Obj]
    pinned: list[Obj]  # allocated claims: their nodeSelector must match
    extended: list[tuple[str, str, str, str, int]]  # container, resource, request name, class, count
    state: AllocatedState
    classes: dict[str, Obj]
    slices: list[Obj]
    per_node: dict[str, tuple[list[Obj], Obj | None]] = field(default_factory=dict)  # node -> (results, ext claim)
    chosen: str = ""


# ------------------------------------------------------------------------------------------------ the plugin

class DynamicResources:
    """Caches of DeviceClasses, ResourceSlices and ResourceClaims, and the plugin's extension points.
    `kubernetes_version` picks the allocator behaviour of that kube-scheduler release (dra_allocator.Allocator)."""

    def __init__(self, api_client: Any, on_change: Callable[[str], None],
                 pod_lookup: Callable[[str, str], Obj | None],
                 kubernetes_version: KubernetesVersion = DEFAULT_KUBERNETES_VERSION) -> None:
        self.kubernetes_version = parse_kubernetes_version(kubernetes_version)
        self.api = ResourceApi(api_client)
        self.on_change = on_change
        self.lock = threading.Lock()
        self.objects: dict[str, dict[str, Obj]] = {kind: {} for kind in ResourceApi.KINDS}
        self.synced = {kind: threading.Event() for kind in ResourceApi.KINDS}
        self.stop_event = threading.Event()
        self.in_flight: dict[str, Obj] = {}  # claim uid (or "pod:<uid>") -> claim with its reserved allocation
        self.reserved: dict[str, list[str]] = {}  # pod key -> in_flight keys it holds
        self.extended_mapping: dict[str, str] = {}  # extended resource -> DeviceClass, kept with the class cache
        self.selectors = SelectorCache()
        self.controller = ClaimController(self.api, self.claims_snapshot, pod_lookup)
        self.threads: list[threading.Thread] = []

    # -- lifecycle
    def start(self, sync_timeout: float = 30.0) -> None:
        """Start the reflectors and the claim controller; wait until the caches are synced."""
        for kind in ResourceApi.KINDS:
            thread = threading.Thread(target=self._reflect, args=(kind,), name=f"reflect-{kind}", daemon=True)
            thread.start()
            self.threads.append(thread)
        for event in self.synced.values():
            if not event.wait(sync_timeout):
                raise RuntimeError("scheduler driver: DRA caches did not sync (does the API server serve "
                                   "resource.k8s.io/v1?)")
        self.controller.start()

    def stop(self) -> None:
        """Stop reflecting and the controller."""
        self.stop_event.set()
        self.controller.stop()

    # -- reflectors
    def _reflect(self, kind: str) -> None:
        rv = ""
        while not self.stop_event.is_set():
            try:
                if not rv:
                    listing = self.api.list(kind)
                    rv = str(_meta(listing).get("resourceVersion") or "")
                    with self.lock:
                        self.objects[kind] = {_key(o): o for o in listing.get("items") or []}
                    self.synced[kind].set()
                    self._changed(kind, None, None)
                for event in self.api.watch(kind, rv):
                    if self.stop_event.is_set():
                        return
                    typ, obj = event.get("type"), event.get("object") or {}
                    if typ == "ERROR":
                        rv = ""
                        break
                    rv = str(_meta(obj).get("resourceVersion") or rv)
                    if typ == "BOOKMARK":
                        continue
                    with self.lock:
                        old = self.objects[kind].get(_key(obj))
                        if typ == "DELETED":
                            self.objects[kind].pop(_key(obj), None)
                        else:
                            self.objects[kind][_key(obj)] = obj
                    self._changed(kind, old, None if typ == "DELETED" else obj)
            except Exception as exc:
                if self.stop_event.is_set():
                    return
                log.info("event=dra_reflector_error kind=%s error=%s", kind, short_error(exc))
                rv = ""
                self.stop_event.wait(0.5)

    def _changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if kind == "deviceclasses":
            with self.lock:
                self.extended_mapping = self._extended_classes(self.objects["deviceclasses"])
        if kind == "resourceclaims":
            with self.lock:
                # the informer now shows what Reserve assumed (or the claim is gone): stop counting it twice
                if new is None and old is not None:  # deleted
                    self.in_flight.pop(str(_meta(old).get("uid")), None)
                else:
                    shown = [new] if new is not None else list(self.objects[kind].values())  # an event, or a relist
                    for claim in shown:
                        if (claim.get("status") or {}).get("allocation"):
                            self.in_flight.pop(str(_meta(claim).get("uid")), None)
            if new is not None:
                self.controller.claim_changed(new)
        self.on_change(f"{kind} changed")

    def claims_snapshot(self) -> list[Obj]:
        """All cached claims."""
        with self.lock:
            return list(self.objects["resourceclaims"].values())

    def pod_event(self, old: Obj | None, new: Obj | None) -> bool:
        """Tell the claim controller; True when the pod's claim statuses changed (a waiting pod may go on)."""
        self.controller.pod_changed(old, new)
        if old is None or new is None:
            return False
        before, after = old.get("status") or {}, new.get("status") or {}
        return bool(before.get("resourceClaimStatuses") != after.get("resourceClaimStatuses") or
                    before.get("extendedResourceClaimStatus") != after.get("extendedResourceClaimStatus"))

    # -- extended resources
    @staticmethod
    def _extended_classes(classes: dict[str, Obj]) -> dict[str, str]:
        """Extended resource name -> DeviceClass name (explicit extendedResourceName first, then implicit)."""
        mapping = {IMPLICIT_EXTENDED_RESOURCE_PREFIX + name: name for name in classes}
        for name in sorted(classes, reverse=True):  # of two classes naming one resource, the first by name wins
            ext = (classes[name].get("spec") or {}).get("extendedResourceName")
            if ext:
                mapping[str(ext)] = name
        return mapping

    def serves_extended(self, resource: str, node: Obj) -> bool:
        """Whether DRA serves `resource` on `node` (a class maps it and the node does not advertise it)."""
        if "/" not in resource or resource in ((node.get("status") or {}).get("allocatable") or {}):
            return False
        with self.lock:
            return resource in self.extended_mapping

    def _pod_extended(self, pod: Obj, mapping: dict[str, str]) -> list[tuple[str, str, str, str, int]]:
        spec = pod.get("spec") or {}
        out = []
        containers = list(spec.get("initContainers") or []) + list(spec.get("containers") or [])
        for index, ctr in enumerate(containers):
            resources = (ctr or {}).get("resources") or {}
            requests = dict(resources.get("limits") or {})
            requests.update(resources.get("requests") or {})
            for ridx, name in enumerate(sorted(requests)):
                if name not in mapping:
                    continue
                try:
                    count = parse_quantity(requests[name]).value
                except ValueError:
                    continue
                if count > 0:
                    out.append((str(ctr.get("name")), name, f"container-{index}-request-{ridx}", mapping[name],
                                int(count)))
        return out

    # -- PreEnqueue / PreFilter
    def pre_filter(self, pod: Obj) -> tuple[PodDra | None, str, bool]:
        """(state or None when DRA has nothing to do, message, wait): a message fails the pod on every node;
        with `wait` the pod waits for its claims without an event (PreEnqueue)."""
        meta, spec, status = _meta(pod), pod.get("spec") or {}, pod.get("status") or {}
        ns, pod_name, uid = meta.get("namespace") or "default", meta.get("name"), meta.get("uid")
        ext_status = status.get("extendedResourceClaimStatus") or {}
        with self.lock:
            mapping = self.extended_mapping
        extended = [] if ext_status.get("resourceClaimName") else self._pod_extended(pod, mapping)
        if not spec.get("resourceClaims") and not ext_status.get("resourceClaimName") and not extended:
            return None, "", False
        with self.lock:
            cached = dict(self.objects["resourceclaims"])
            classes = dict(self.objects["deviceclasses"])
            slices = list(self.objects["resourceslices"].values())
            in_flight = dict(self.in_flight)
            mine = set(self.reserved.get(f"{ns}/{pod_name}", ()))
        names: list[tuple[str, bool]] = []
        statuses = {s.get("name"): s for s in status.get("resourceClaimStatuses") or ()}
        for entry in spec.get("resourceClaims") or ():
            if entry.get("resourceClaimName"):
                names.append((str(entry["resourceClaimName"]), False))
            elif entry.get("resourceClaimTemplateName"):
                found = statuses.get(entry.get("name"))
                if found is None:
                    return None, f'pod "{ns}/{pod_name}": ResourceClaim not created yet', True
                if found.get("resourceClaimName"):
                    names.append((str(found["resourceClaimName"]), True))
        if ext_status.get("resourceClaimName"):
            names.append((str(ext_status["resourceClaimName"]), True))
        claims = []
        for name, check_owner in names:
            claim = cached.get(f"{ns}/{name}")
            if claim is None:
                return None, f'resourceclaim.resource.k8s.io "{name}" not found', True
            if _meta(claim).get("deletionTimestamp"):
                return None, f'resourceclaim "{name}" is being deleted', True
            if check_owner and not any(o.get("uid") == uid and o.get("controller")
                                       for o in _meta(claim).get("ownerReferences") or ()):
                return None, (f"ResourceClaim {ns}/{name} was not created for pod {ns}/{pod_name} "
                              f"(pod is not owner)"), True
            claims.append(claim)
        if not claims and not extended:
            return None, "", False
        to_allocate, pinned = [], []
        for claim in claims:
            claim_status = claim.get("status") or {}
            reserved = claim_status.get("reservedFor") or []
            if claim_status.get("allocation"):
                if len(reserved) >= RESERVED_FOR_MAX_SIZE and not any(r.get("uid") == uid for r in reserved):
                    return None, "resourceclaim in use", False
                pinned.append(claim)
                continue
            claim_uid = _meta(claim).get("uid")
            if claim_uid in in_flight and claim_uid not in mine:
                return None, f"resource claim {ns}/{_meta(claim).get('name')} is in the process of being allocated", \
                    False
            for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
                bodies = [(str(request.get("name")), request.get("exactly") or {})] if request.get("exactly") else \
                    [(f"{request.get('name')}/{sub.get('name')}", sub) for sub in request.get("firstAvailable") or ()]
                for req_name, body in bodies:
                    class_name = body.get("deviceClassName")
                    if not class_name:
                        return None, f"request {req_name}: unsupported request type", False
                    if class_name not in classes:
                        return None, f"request {req_name}: device class {class_name} does not exist", False
            to_allocate.append(claim)
        allocated = [c for c in cached.values() if _meta(c).get("uid") not in in_flight]
        state = AllocatedState.of(allocated + list(in_flight.values()))
        return PodDra(claims, to_allocate, pinned, extended, state, classes, slices), "", False

    # -- Filter
    def _extended_claim(self, pod: Obj, node: Obj, dra: PodDra) -> Obj | None:
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        requests = [{"name": req, "exactly": {"deviceClassName": klass, "allocationMode": "ExactCount",
                                              "count": count}}
                    for _ctr, resource, req, klass, count in dra.extended if resource not in allocatable]
        if not requests:
            return None
        meta = _meta(pod)
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"generateName": f"{meta.get('name')}-extended-resources-",
                             "namespace": meta.get("namespace") or "default",
                             "annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"),
                                                  "uid": meta.get("uid"), "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": {"devices": {"requests": requests}}}

    def filter(self, pod: Obj, dra: PodDra, node: Obj) -> str:
        """Empty when the pod's claims fit `node` (the allocation is kept for Reserve), else the reason.
        AllocationError when a claim or class is broken (the cycle ends with that error)."""
        name = str(_meta(node).get("name"))
        unavailable = any(not node_selector_matches(((c.get("status") or {}).get("allocation") or {})
                                                    .get("nodeSelector"), node) for c in dra.pinned)
        ext_claim = self._extended_claim(pod, node, dra)
        to_allocate = dra.to_allocate + ([ext_claim] if ext_claim is not None else [])
        results: list[Obj] = []
        if to_allocate:
            allocator = Allocator(to_allocate, dra.state, dra.classes, dra.slices, self.selectors,
                                  self.kubernetes_version)
            found = allocator.allocate(node)
            if found is None:
                return CANNOT_ALLOCATE
            results = found
        if unavailable:
            return UNAVAILABLE_ON_NODE
        dra.per_node[name] = (results, ext_claim)
        return ""

    # -- Reserve / Unreserve
    def reserve(self, key: str, pod: Obj, dra: PodDra, node: str) -> None:
        """Count the chosen node's allocations as in use until PreBind's writes show up in the cache."""
        dra.chosen = node
        results, ext_claim = dra.per_node.get(node, ([], None))
        held = []
        with self.lock:
            for claim, allocation in zip(dra.to_allocate + ([ext_claim] if ext_claim else []), results):
                assumed = copy.deepcopy(claim)
                assumed.setdefault("status", {})["allocation"] = allocation
                slot = _meta(claim).get("uid") or f"pod:{_meta(pod).get('uid')}"
                self.in_flight[slot] = assumed
                held.append(slot)
            self.reserved[key] = held

    def unreserve(self, key: str, pod: Obj | None = None, dra: PodDra | None = None) -> None:
        """Forget what Reserve assumed for the pod `key`; after a failed PreBind or binding (`pod`, `dra` given)
        also take the pod out of its claims' reservedFor, undo this cycle's allocations and delete the
        extended-resource claim it created."""
        with self.lock:
            for slot in self.reserved.pop(key, ()):
                self.in_flight.pop(slot, None)
        if pod is not None and dra is not None:
            self._release(pod, dra)
        self.on_change("claim allocation released")

    def _release(self, pod: Obj, dra: PodDra) -> None:
        uid = _meta(pod).get("uid")
        allocated_here = {_meta(c).get("uid") for c in dra.to_allocate}
        ns = _meta(pod).get("namespace") or "default"
        names = [(str(_meta(c).get("name")), _meta(c).get("uid") in allocated_here) for c in dra.claims]
        ext_name = ((self._fresh_pod(pod).get("status") or {}).get("extendedResourceClaimStatus") or {}) \
            .get("resourceClaimName")
        for name, ours in names:
            try:
                claim = self.api.get_claim(ns, name)
                status = claim.setdefault("status", {})
                kept = [r for r in status.get("reservedFor") or () if r.get("uid") != uid]
                if len(kept) == len(status.get("reservedFor") or ()):
                    continue
                status["reservedFor"] = kept
                if not kept and ours:
                    status.pop("allocation", None)
                self.api.replace_claim_status(claim)
            except Exception as exc:
                log.info("event=unreserve_failed claim=%s/%s error=%s", ns, name, short_error(exc))
        for claim in self.claims_snapshot():
            annotations = _meta(claim).get("annotations") or {}
            owned = any(o.get("uid") == uid for o in _meta(claim).get("ownerReferences") or ())
            if owned and annotations.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true" and \
                    _meta(claim).get("name") != ext_name:
                try:
                    self.api.delete_claim(ns, str(_meta(claim).get("name")), str(_meta(claim).get("uid")))
                except Exception as exc:
                    log.info("event=extended_claim_delete_failed claim=%s error=%s", _key(claim), short_error(exc))

    def _fresh_pod(self, pod: Obj) -> Obj:
        meta = _meta(pod)
        try:
            return self.api.get_pod(meta.get("namespace") or "default", str(meta.get("name")))
        except Exception:
            return pod

    def forget(self, key: str) -> None:
        """The binding went through: the pod no longer holds Reserve's slots (the claims' informer clears them)."""
        with self.lock:
            self.reserved.pop(key, None)

    # -- PreBind
    def pre_bind(self, pod: Obj, dra: PodDra) -> None:
        """Write allocations and reservations of the pod's claims, create its extended-resource claim."""
        results, ext_claim = dra.per_node.get(dra.chosen, ([], None))
        allocations = dict(zip((_meta(c).get("uid") for c in dra.to_allocate), results))
        meta = _meta(pod)
        consumer = {"resource": "pods", "name": meta.get("name"), "uid": meta.get("uid")}
        for claim in dra.claims:
            self._bind_claim(claim, allocations.get(_meta(claim).get("uid")), consumer)
        if ext_claim is not None:
            body = copy.deepcopy(ext_claim)
            body["metadata"]["finalizers"] = [DELETE_PROTECTION_FINALIZER]
            try:
                created = self.api.create_claim(body["metadata"]["namespace"], body)
            except Exception as exc:
                raise DraBindError(f"create extended resource claim: {short_error(exc)}") from None
            allocation = results[len(dra.to_allocate)]
            with self.lock:
                assumed = self.in_flight.pop(f"pod:{meta.get('uid')}", None)
                if assumed is not None:
                    self.in_flight[_meta(created)["uid"]] = {**created, "status": assumed.get("status") or {}}
            self._bind_claim(created, allocation, consumer)
            mappings = [{"containerName": ctr, "resourceName": resource, "requestName": req}
                        for ctr, resource, req, _klass, _count in dra.extended
                        if req in {r["name"] for r in body["spec"]["devices"]["requests"]}]
            patch = {"status": {"extendedResourceClaimStatus": {
                "requestMappings": mappings, "resourceClaimName": _meta(created)["name"]}}}
            try:
                self.api.patch_pod_status(meta.get("namespace") or "default", str(meta.get("name")), patch)
            except Exception as exc:
                raise DraBindError(f"update pod status with the extended resource claim: {short_error(exc)}") \
                    from None

    def _bind_claim(self, claim: Obj, allocation: Obj | None, consumer: Obj) -> None:
        meta = _meta(claim)
        ns, name, uid = str(meta.get("namespace")), str(meta.get("name")), meta.get("uid")
        for _attempt in range(5):
            try:
                current = self.api.get_claim(ns, name)
                if _meta(current).get("uid") != uid:
                    raise DraBindError(f"claim {ns}/{name} got replaced")
                status = current.setdefault("status", {})
                reserved = status.setdefault("reservedFor", [])
                if any(r.get("uid") == consumer["uid"] for r in reserved):
                    return
                if allocation is not None:
                    if status.get("allocation"):
                        raise DraBindError(f"claim {ns}/{name} got allocated elsewhere")
                    finalizers = _meta(current).setdefault("finalizers", [])
                    if DELETE_PROTECTION_FINALIZER not in finalizers:
                        finalizers.append(DELETE_PROTECTION_FINALIZER)
                        current = self.api.replace_claim(current)
                        status = current.setdefault("status", {})
                        reserved = status.setdefault("reservedFor", [])
                    status["allocation"] = {**allocation, "allocationTimestamp": _now()}
                elif not status.get("allocation"):
                    raise DraBindError(f"claim {ns}/{name} is not allocated any more")
                if len(reserved) >= RESERVED_FOR_MAX_SIZE:
                    raise DraBindError(f"claim {ns}/{name}: resourceclaim in use")
                reserved.append(consumer)
                written = self.api.replace_claim_status(current)
            except DraBindError:
                raise
            except Exception as exc:
                if api_status(exc) == 409:
                    time.sleep(0.01)
                    continue
                raise DraBindError(f"update claim {ns}/{name}: {short_error(exc)}") from None
            if allocation is not None:
                with self.lock:
                    if uid in self.in_flight:
                        self.in_flight[str(uid)] = written
            log.info("event=claim_reserved claim=%s/%s pod=%s allocated=%s", ns, name, consumer["name"],
                     allocation is not None)
            return
        raise DraBindError(f"update claim {ns}/{name}: conflicts, gave up")
