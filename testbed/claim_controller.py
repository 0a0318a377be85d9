"""TEST INFRASTRUCTURE: kube-controller-manager's resourceclaim controller (and the garbage collector's share of it).

Written from upstream's documented behaviour (pkg/controller/resourceclaim), sharing nothing with the DRA code it
tests. Driven by the scheduler stand-in's pod and claim events, one worker thread:

  * claims from templates: for each `spec.resourceClaims[]` entry with `resourceClaimTemplateName` and no entry in
    `status.resourceClaimStatuses`, the claim is found (owned by the pod, annotation
    `resource.kubernetes.io/pod-claim-name` = the entry's name) or created from the template (generateName
    `<pod>-<entry>-`, both parts shortened proportionally past 57 characters; the template's labels and
    annotations; a controller owner reference to the pod), then `{name, resourceClaimName}` is written into the
    pod's status through the status subresource. A failure (a template that does not exist yet, say) is retried
    with backoff (0.5 s doubling to 30 s), as the controller's work queue does;
  * release: a `status.reservedFor` entry for a pod that is gone, replaced (other uid) or done (Succeeded /
    Failed, or being deleted before it got a node) is removed; when the last one goes, the allocation is cleared
    too (deallocation), then the `resource.kubernetes.io/delete-protection` finalizer is dropped;
  * an unreserved claim generated for a pod (controller owner reference) whose pod is done or replaced is deleted;
    the API-server stand-in has no garbage collector, so a claim whose owning pod no longer exists (checked with
    the API server) is deleted here as well.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["DELETE_PROTECTION_FINALIZER", "POD_CLAIM_NAME_ANNOTATION", "ClaimApi", "ClaimController", "generate_name"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]

POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
DELETE_PROTECTION_FINALIZER = "resource.kubernetes.io/delete-protection"
_MAX_BASE_LEN = 57  # 63 minus the hyphen and the five random characters
RETRY_INITIAL, RETRY_MAX = 0.5, 30.0  # seconds


class ClaimApi(Protocol):
    """The API calls the controller makes (dra_scheduling.ResourceApi); errors carry an HTTP `status`."""

    def get_claim(self, ns: str, name: str) -> Obj: ...
    def resource_claim_template(self, ns: str, name: str) -> Obj: ...
    def create_claim(self, ns: str, body: Obj) -> Obj: ...
    def replace_claim(self, claim: Obj) -> Obj: ...
    def replace_claim_status(self, claim: Obj) -> Obj: ...
    def delete_claim(self, ns: str, name: str, uid: str) -> None: ...
    def get_pod(self, ns: str, name: str) -> Obj: ...
    def patch_pod_status(self, ns: str, name: str, patch: Obj) -> Obj: ...


def generate_name(pod_name: str, claim_name: str) -> str:
    """The generateName of a claim made for `pod_name`'s entry `claim_name`."""
    base = f"{pod_name}-{claim_name}"
    if len(base) > _MAX_BASE_LEN:
        base = pod_name[:len(pod_name) * _MAX_BASE_LEN // len(base)] + "-" + \
            claim_name[:len(claim_name) * _MAX_BASE_LEN // len(base)]
    return base + "-"


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _done(pod: Obj) -> bool:
    """No container of the pod runs now or ever will."""
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed") or \
        bool(_meta(pod).get("deletionTimestamp") and not (pod.get("spec") or {}).get("nodeName"))


def _owner(claim: Obj) -> tuple[str, str]:
    for ref in _meta(claim).get("ownerReferences") or ():
        if ref.get("controller") and ref.get("apiVersion") == "v1" and ref.get("kind") == "Pod":
            return str(ref.get("name")), str(ref.get("uid"))
    return "", ""


def _status_code(exc: BaseException) -> int:
    status = getattr(exc, "status", 0)
    return status if isinstance(status, int) else 0


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0][:200] if text else type(exc).__name__


class ClaimController:
    """The resourceclaim controller stand-in (see the module docstring)."""

    def __init__(self, api: ClaimApi, claims: Callable[[], list[Obj]],
                 pod_lookup: Callable[[str, str], Obj | None]) -> None:
        self.api = api
        self.claims = claims
        self.pod_lookup = pod_lookup
        self.work: queue.Queue[tuple[str, Obj] | None] = queue.Queue()
        self.deleted_pods: set[str] = set()  # uids of pods seen deleted
        self.retries: dict[str, int] = {}  # pod uid -> failed syncs in a row
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the worker."""
        self.thread = threading.Thread(target=self._run, name="resourceclaim-controller", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop the worker after the item at hand."""
        self.stopped.set()
        self.work.put(None)

    def _retry_later(self, pod: Obj) -> None:
        uid = str(_meta(pod).get("uid"))
        failures = self.retries[uid] = self.retries.get(uid, 0) + 1
        delay = min(RETRY_MAX, RETRY_INITIAL * 2 ** (failures - 1))
        timer = threading.Timer(delay, lambda: None if self.stopped.is_set() else self.work.put(("pod", pod)))
        timer.daemon = True
        timer.start()

    # -- events
    def pod_changed(self, old: Obj | None, new: Obj | None) -> None:
        """A pod was added, updated (old and new) or deleted (new None)."""
        if new is None:
            if old is not None:
                self.deleted_pods.add(str(_meta(old).get("uid")))
                self.work.put(("pod-gone", old))
            return
        spec = new.get("spec") or {}
        if not spec.get("resourceClaims") and not (new.get("status") or {}).get("extendedResourceClaimStatus"):
            return
        self.work.put(("pod-gone" if _done(new) else "pod", new))

    def claim_changed(self, claim: Obj) -> None:
        """A claim was added or updated."""
        if (claim.get("status") or {}).get("reservedFor") or _owner(claim)[1]:
            self.work.put(("claim", claim))

    # -- the worker
    def _run(self) -> None:
        while True:
            item = self.work.get()
            if item is None:
                return
            kind, obj = item
            try:
                if kind == "pod":
                    self._sync_pod(obj)
                elif kind == "pod-gone":
                    self._release_pod(obj)
                else:
                    self._sync_claim(obj)
            except Exception as exc:
                log.info("event=claim_controller_error kind=%s object=%s error=%s", kind,
                         _meta(obj).get("name"), _short(exc))

    def _sync_pod(self, pod: Obj) -> None:
        meta = _meta(pod)
        ns, name, uid = meta.get("namespace") or "default", str(meta.get("name")), meta.get("uid")
        current = self.pod_lookup(ns, name)
        if current is None or _meta(current).get("uid") != uid:
            return
        pod = current
        statuses = list((pod.get("status") or {}).get("resourceClaimStatuses") or [])
        known = {s.get("name") for s in statuses}
        added = missing = False
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
            template = entry.get("resourceClaimTemplateName")
            if not template or entry.get("name") in known:
                continue
            claim = self._find_claim(uid, str(entry.get("name"))) or self._create_claim(pod, entry, str(template))
            if claim is None:
                missing = True
                continue
            statuses.append({"name": entry.get("name"), "resourceClaimName": _meta(claim).get("name")})
            added = True
        if added:
            self.api.patch_pod_status(ns, name, {"status": {"resourceClaimStatuses": statuses}})
            log.info("event=pod_claims_recorded pod=%s/%s claims=%d", ns, name, len(statuses))
        if missing:
            self._retry_later(pod)
        else:
            self.retries.pop(str(uid), None)

    def _find_claim(self, pod_uid: Any, entry: str) -> Obj | None:
        for claim in self.claims():
            if _owner(claim)[1] == pod_uid and \
                    (_meta(claim).get("annotations") or {}).get(POD_CLAIM_NAME_ANNOTATION) == entry:
                return claim
        return None

    def _create_claim(self, pod: Obj, entry: Obj, template_name: str) -> Obj | None:
        meta = _meta(pod)
        ns = meta.get("namespace") or "default"
        try:
            template = self.api.resource_claim_template(ns, template_name)
        except Exception as exc:
            log.info("event=claim_template_missing pod=%s/%s template=%s error=%s", ns, meta.get("name"),
                     template_name, _short(exc))
            return None
        tspec = template.get("spec") or {}
        tmeta = tspec.get("metadata") or {}
        annotations = dict(tmeta.get("annotations") or {})
        annotations[POD_CLAIM_NAME_ANNOTATION] = str(entry.get("name"))
        body: Obj = {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"generateName": generate_name(str(meta.get("name")), str(entry.get("name"))),
                         "namespace": ns, "annotations": annotations,
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"),
                                              "uid": meta.get("uid"), "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": tspec.get("spec") or {},
        }
        if tmeta.get("labels"):
            body["metadata"]["labels"] = dict(tmeta["labels"])
        created: Obj = self.api.create_claim(ns, body)
        log.info("event=claim_created claim=%s/%s pod=%s template=%s", ns, _meta(created).get("name"),
                 meta.get("name"), template_name)
        return created

    def _release_pod(self, pod: Obj) -> None:
        uid = _meta(pod).get("uid")
        for claim in self.claims():
            reserved = any(r.get("uid") == uid for r in (claim.get("status") or {}).get("reservedFor") or ())
            if reserved or _owner(claim)[1] == uid:
                self._sync_claim(claim)

    def _pod_state(self, ns: str, name: str, uid: str) -> str:
        """'live', 'done' or 'gone' for the pod `ns/name` with `uid` (the API server decides when unsure)."""
        if uid in self.deleted_pods:
            return "gone"
        pod = self.pod_lookup(ns, name)
        if pod is None:
            try:
                pod = self.api.get_pod(ns, name)
            except Exception as exc:
                if _status_code(exc) != 404:
                    raise
                return "gone"
        if _meta(pod).get("uid") != uid:
            return "gone"
        return "done" if _done(pod) else "live"

    def _sync_claim(self, seen: Obj) -> None:
        meta = _meta(seen)
        ns, name = str(meta.get("namespace") or "default"), str(meta.get("name"))
        try:
            claim = self.api.get_claim(ns, name)
        except Exception as exc:
            if _status_code(exc) == 404:
                return
            raise
        if _meta(claim).get("uid") != meta.get("uid"):
            return
        status = claim.setdefault("status", {})
        reserved = list(status.get("reservedFor") or [])
        valid = [r for r in reserved if r.get("resource") != "pods" or r.get("apiGroup") or
                 self._pod_state(ns, str(r.get("name")), str(r.get("uid"))) == "live"]
        if len(valid) < len(reserved):
            status["reservedFor"] = valid
            if not valid:
                status.pop("reservedFor", None)
                if DELETE_PROTECTION_FINALIZER in (_meta(claim).get("finalizers") or ()):
                    status.pop("allocation", None)  # deallocate: the last consumer is gone
            claim = self.api.replace_claim_status(claim)
            log.info("event=claim_unreserved claim=%s/%s left=%d deallocated=%s", ns, name, len(valid),
                     not (claim.get("status") or {}).get("allocation"))
            finalizers = list(_meta(claim).get("finalizers") or [])
            if DELETE_PROTECTION_FINALIZER in finalizers and not (claim.get("status") or {}).get("allocation"):
                finalizers.remove(DELETE_PROTECTION_FINALIZER)
                claim["metadata"]["finalizers"] = finalizers
                claim = self.api.replace_claim(claim)
        if valid:
            return
        pod_name, pod_uid = _owner(claim)
        if not pod_name:
            return
        if self._pod_state(ns, pod_name, pod_uid) in ("done", "gone"):
            self.api.delete_claim(ns, name, str(_meta(claim).get("uid")))
            log.info("event=claim_deleted claim=%s/%s pod=%s", ns, name, pod_name)
