"""Quota totals: what a container takes over all its GPUs, in the per-container resources a ResourceQuota counts.

A container's `vgpu-memory` and `vgpu-cores` are per GPU, so a namespace quota on them counts a 4-GPU container of
10,000 MiB as 10,000. The admission webhook therefore writes two more extended resources on each GPU container,
`QUOTA_MEMORY` (MiB over all its GPUs) and `QUOTA_CORES` (percent of one GPU over all its GPUs), and kube-apiserver's
own ResourceQuota admission counts them under `requests.<name>` as it counts any extended resource. The scheduler
checks them (`check_quota_totals`): a total written by hand, or changed after admission, keeps the pod off every
node, so that a pod author cannot shrink what the quota counts.
"""

from collections.abc import Mapping
from typing import Any

from vgpu.errors import RequestError
from vgpu.quantity import parse_integer_quantity
from vgpu.requests import ContainerRequest, gpu_containers
from vgpu.resources import QUOTA_CORES, QUOTA_MEMORY, SharingConfig

__all__ = ["check_quota_totals", "container_totals"]


def container_totals(request: ContainerRequest, config: SharingConfig) -> tuple[int, int]:
    """(memory MiB, cores percent) a container takes over all its GPUs; memory given as a percentage of the card, or
    not at all, counts that share of `config.quota_card_mib`."""
    if request.memory:
        per_gpu = request.memory * config.gpu_memory_factor
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
