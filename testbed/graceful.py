"""TEST INFRASTRUCTURE: what kube-apiserver does when a pod is deleted: graceful deletion and finalizers.

Pure functions over a stored pod and the request's DeleteOptions; the API-server stand-in (testbed/apiserver.py,
`graceful_deletion=True`) stores what they decide. Written from kubernetes/kubernetes:

  * `pkg/registry/core/pod/strategy.go` `CheckGracefulDelete`: the period is DeleteOptions.gracePeriodSeconds, else
    the pod's spec.terminationGracePeriodSeconds (30 when unset, `pkg/apis/core/v1/defaults.go`); 0 for a pod not
    bound to a node or already Succeeded / Failed; a negative period becomes 1;
  * `staging/src/k8s.io/apiserver/pkg/registry/rest/delete.go` `BeforeDelete`: a first graceful delete sets
    metadata.deletionTimestamp = now + period and deletionGracePeriodSeconds = period (generation + 1 when set); a
    delete of a pod already being deleted may only shorten the period (the timestamp moves back by the difference),
    a longer or equal one, or none, changes nothing; one whose stored period is 0 (or unset) is deleted at once;
  * `staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go` `Delete`,
    `updateForGracefulDeletionAndFinalizers`, `markAsDeleting`, `ShouldDeleteDuringUpdate`: a graceful delete is an
    update of the stored pod; it is removed in the same request only when the period is 0 and it has no finalizers;
    finalizers keep it (deletionGracePeriodSeconds 0, deletionTimestamp now unless earlier) until an update empties
    them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["DEFAULT_TERMINATION_GRACE", "Deletion", "delete_during_update", "grace_period", "plan"]

Obj = dict[str, Any]

DEFAULT_TERMINATION_GRACE = 30  # pkg/apis/core/v1/defaults.go SetDefaults_PodSpec


@dataclass(frozen=True, slots=True)
class Deletion:
    """What a DELETE does to a stored pod: `update` stores `obj` (MODIFIED) first, `remove` then removes it
    (DELETED); neither (a graceful deletion already pending) leaves the pod as it is."""

    obj: Obj
    update: bool
    remove: bool


def _stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(stamp: str) -> datetime:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def grace_period(pod: Obj, requested: int | None) -> int:
    """strategy.go CheckGracefulDelete: the period a first delete of `pod` gets."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    period = requested if requested is not None else spec.get("terminationGracePeriodSeconds",
                                                               DEFAULT_TERMINATION_GRACE)
    if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
        period = 0
    return 1 if period < 0 else int(period)


def plan(pod: Obj, options: Obj | None, now: datetime) -> Deletion:
    """Delete + BeforeDelete + updateForGracefulDeletionAndFinalizers for one stored pod."""
    requested = (options or {}).get("gracePeriodSeconds")
    if requested is not None:
        requested = 1 if int(requested) < 0 else int(requested)  # BeforeDelete: negative means 1
    new = copy.deepcopy(pod)
    meta = new["metadata"]
    finalizers = bool(meta.get("finalizers"))
    stamp, current = meta.get("deletionTimestamp"), meta.get("deletionGracePeriodSeconds")
    if stamp is None:
        period = grace_period(pod, requested)
        meta["deletionTimestamp"] = _stamp(now + timedelta(seconds=period))
        meta["deletionGracePeriodSeconds"] = period
        if int(meta.get("generation") or 0) > 0:
            meta["generation"] = int(meta["generation"]) + 1
        return Deletion(new, update=True, remove=period == 0 and not finalizers)
    if current:  # being deleted gracefully
        if requested is None or requested >= current:
            return Deletion(pod, update=False, remove=False)
        meta["deletionTimestamp"] = _stamp(_parse(stamp) - timedelta(seconds=current - requested))
        meta["deletionGracePeriodSeconds"] = requested
        return Deletion(new, update=True, remove=requested == 0 and not finalizers)
    if finalizers:  # markAsDeleting: the period is already 0, the finalizers hold it
        if _parse(stamp) > now:
            meta["deletionTimestamp"] = _stamp(now)
        meta["deletionGracePeriodSeconds"] = 0
        return Deletion(new, update=new != pod, remove=False)
    return Deletion(pod, update=False, remove=True)


def delete_during_update(old: Obj, new: Obj) -> bool:
    """store.go ShouldDeleteDuringUpdate: an update that empties the finalizers of a pod whose deletion has no
    grace left removes it."""
    old_meta, new_meta = old.get("metadata") or {}, new.get("metadata") or {}
    return (not new_meta.get("finalizers") and bool(old_meta.get("deletionTimestamp"))
            and not old_meta.get("deletionGracePeriodSeconds"))
