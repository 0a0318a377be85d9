"""pods/eviction (policy/v1): the only way our components take a pod off a node, so PodDisruptionBudgets hold.

Used by the extender's preemption (scheduler.preemption) and by `vgpu consolidate --execute` (vgpu.planning).
"""

from __future__ import annotations

from kubernetes import client as k8s

from vgpu.errors import VGPUError
from vgpu.kube.errors import ConflictError, NotFoundError, status_causes, translate

__all__ = ["EvictionRefused", "evict_pod"]


class EvictionRefused(VGPUError):
    """The API server refused an eviction (a PodDisruptionBudget, 429) or it failed otherwise."""


def evict_pod(api: k8s.ApiClient, namespace: str, name: str, uid: str, dry_run: bool = False) -> None:
    """Evict the pod of this UID (`uid` empty: whichever has the name), or only ask whether it would be allowed.
    A pod already gone (404, or another pod under its name: 409) counts as evicted; a refusal raises
    EvictionRefused with the budget's reason when the server gives one."""
    body = k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name=name, namespace=namespace),
                          delete_options=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid or None)))
    try:
        k8s.CoreV1Api(api).create_namespaced_pod_eviction(
            name, namespace, body, dry_run="All" if dry_run else None, _request_timeout=10)
    except Exception as exc:
        err = translate(exc, f"evict pod {namespace}/{name}")
        if isinstance(err, (NotFoundError, ConflictError)):
            return
        causes = status_causes(exc)  # which budget refused, and why
        raise EvictionRefused(f"{err} ({'; '.join(causes)})" if causes else str(err)) from exc
