"""Quota totals: what a container takes over all its GPUs, in the per-container resources a ResourceQuota counts.

A container's `vgpu-memory` and `vgpu-cores` are per GPU, so a namespace quota on them counts a 4-GPU container of
10,000 MiB as 10,000. The admission webhook therefore writes two more extended resources on each GPU container,
`QUOTA_MEMORY` (MiB over all its GPUs) and `QUOTA_CORES` (percent of one GPU over all its GPUs), and kube-apiserver's
own ResourceQuota admission counts them under `requests.<name>` as it counts any extended resource. The scheduler
checks them (`check_quota_totals`): a total written by hand, or changed after admission, keeps the pod off every
node, so that a pod author cannot shrink what the quota counts. A pod the webhook did not see (it was down: its
`failurePolicy` is Ignore) has no totals, which no quota counts; `limits_totals` tells the namespaces where that
matters, those whose ResourceQuota limits a total, and there the scheduler refuses such a pod by default
(`SharingConfig.require_quota_totals`).
"""

import threading
from collections.abc import Mapping
from typing import Any

from vgpu.errors import RequestError
from vgpu.quantity import parse_integer_quantity
from vgpu.requests import ContainerRequest, gpu_containers
from vgpu.resources import QUOTA_CORES, QUOTA_MEMORY, SharingConfig

__all__ = ["LimitedNamespaces", "check_quota_totals", "container_totals", "limits_totals"]

# how a ResourceQuota names the totals in spec.hard (an extended resource is quota'd as requests.<name>; the bare
# name is taken too, as a quota a reader could mistake for one)
_QUOTA_KEYS = frozenset({f"requests.{QUOTA_MEMORY}", f"requests.{QUOTA_CORES}", QUOTA_MEMORY, QUOTA_CORES})


def limits_totals(quota: Mapping[str, Any]) -> bool:
    """Whether a ResourceQuota (a dict) limits one of the quota totals, whatever its scopes."""
    hard = (quota.get("spec") or {}).get("hard")
    return isinstance(hard, Mapping) and any(key in _QUOTA_KEYS for key in hard)


def container_totals(request: ContainerRequest, config: SharingConfig) -> tuple[int, int]:
    """(memory MiB, cores percent) a container takes over all its GPUs; memory given as a percentage of the card, or
    not at all, counts that share of `config.quota_card_mib`."""
    if request.memory:
        per_gpu = config.memory_unit.mib(request.memory)
    else:
        per_gpu = config.quota_card_mib * request.memory_percent // 100
    return request.count * per_gpu, request.count * request.cores


def _declared(container: Mapping[str, Any], name: str) -> Any:
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        return None
    for table in (resources.get("limits"), resources.get("requests")):
        if isinstance(table, Mapping) and name in table:
            return table[name]
    return None


def check_quota_totals(pod: Mapping[str, Any], requests: tuple[ContainerRequest, ...], config: SharingConfig,
                       required: bool = False) -> None:
    """Raise RequestError where a container's quota totals differ from what its requests (`pod_requests` of the pod)
    make (a container without vGPU requests must have none, or 0), or, with `required`, where a vGPU container has
    none."""
    totals = {request.container: container_totals(request, config) for request in requests}
    for container, _init in gpu_containers(pod):
        cname = str(container.get("name") or "")
        expected = totals.get(cname)
        for name, want in ((QUOTA_MEMORY, expected[0] if expected else 0),
                           (QUOTA_CORES, expected[1] if expected else 0)):
            raw = _declared(container, name)
            if raw is None:
                if required and expected is not None:
                    raise RequestError(cname, name, "absent: the admission webhook did not see this pod, so the "
                                       "namespace's quota did not count it (re-create the pod)")
                continue
            try:
                value = parse_integer_quantity(raw)
            except ValueError:
                value = None
            if value != want:
                raise RequestError(cname, name, f"is {raw!r}, but the container's requests make {want}: quota totals "
                                   "are written by the admission webhook, not by hand")


class LimitedNamespaces:
    """The namespaces whose ResourceQuotas limit a quota total, kept from a ResourceQuota watch (`on_quota`,
    `on_quota_delete` are its handlers); called with a namespace, whether it is one of them."""

    def __init__(self) -> None:
        self._limiting: dict[str, set[str]] = {}  # namespace -> names of its quotas that limit a total
        self._lock = threading.Lock()

    def on_quota(self, quota: Mapping[str, Any]) -> None:
        """A quota was added or changed."""
        meta = quota.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        with self._lock:
            names = self._limiting.setdefault(namespace, set())
            if limits_totals(quota):
                names.add(name)
            else:
                names.discard(name)
            if not names:
                del self._limiting[namespace]

    def on_quota_delete(self, quota: Mapping[str, Any]) -> None:
        """A quota was deleted."""
        meta = quota.get("metadata") or {}
        namespace = str(meta.get("namespace") or "")
        with self._lock:
            names = self._limiting.get(namespace)
            if names is not None:
                names.discard(str(meta.get("name") or ""))
                if not names:
                    del self._limiting[namespace]

    def __call__(self, namespace: str) -> bool:
        with self._lock:
            return namespace in self._limiting
