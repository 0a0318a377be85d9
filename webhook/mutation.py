"""What the admission webhook changes in a pod, as JSON Patch operations on the pod it is shown.

A pod that asks for vGPU resources, under our names or HAMi's, is opted in without being edited by its author:
  * HAMi's names become ours (`nvidia.com/gpumem` -> `volcano.sh/vgpu-memory`, ...), so that kubelet allocates the
    GPU count from our device plugin even on a node where NVIDIA's plugin serves whole `nvidia.com/gpu` cards. Under
    `hami_names: shared` (the default) only containers that ask for one of HAMi's share names are translated: a
    container asking `nvidia.com/gpu` alone keeps it (a whole card of NVIDIA's plugin); under `all`, every one.
  * a container that asks for memory or cores but names no GPU count gets the count it is read with (1), so that
    kubelet asks our device plugin for its GPU (HAMi's webhook adds `nvidia.com/gpu: 1` alike);
  * each container that asks for vGPU resources gets the quota totals (vgpu.quota): GPUs x memory and GPUs x cores,
    in its limits and requests, so that ResourceQuota counts them; values its author wrote there are replaced;
  * the pod's `spec.schedulerName`, when it is one this webhook replaces (`default-scheduler`, what the API server
    fills in when a pod names none), becomes the vGPU scheduler's.
Pods without vGPU requests, and pods of other schedulers (a schedulerName neither ours nor replaced, such as
`hami-scheduler` or `volcano`, perhaps written by their own webhook called before ours), are not changed. A pod
whose vGPU requests cannot be read raises RequestError, which the server answers with a refusal naming the
container and the resource.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpu.errors import RequestError
from vgpu.quota import container_totals
from vgpu.requests import ContainerRequest, pod_requests
from vgpu.resources import HAMI_NAMES, QUOTA_CORES, QUOTA_MEMORY, SCHEDULER_NAME, ResourceNames, SharingConfig

__all__ = ["DEFAULT_REPLACED", "MutationSettings", "mutate_pod"]

DEFAULT_REPLACED = frozenset({"default-scheduler"})
_FIELDS = ("number", "memory", "memory_percentage", "cores")
_CONTAINER_LISTS = ("initContainers", "containers")


@dataclass(frozen=True)
class MutationSettings:
    """How the webhook opts pods in."""

    sharing: SharingConfig = field(default_factory=SharingConfig)
    scheduler_name: str = SCHEDULER_NAME
    replace_scheduler_names: frozenset[str] = DEFAULT_REPLACED
    translate_hami_names: bool = True


def _tables(resources: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [t for t in (resources.get("limits"), resources.get("requests")) if isinstance(t, dict)]


def _translate(name: str, resources: dict[str, Any], ours: ResourceNames, sharing: SharingConfig) -> bool:
    """Rename HAMi's resource names to ours in one container's resources (in place); True when any was renamed."""
    tables = _tables(resources)
    asks = {f for f in _FIELDS if any(getattr(HAMI_NAMES, f) in t for t in tables)}
    if not asks or (sharing.hami_mode() == "shared" and asks == {"number"}):
        return False
    for f in sorted(asks):
        theirs, mine = getattr(HAMI_NAMES, f), getattr(ours, f)
        for table in tables:
            if mine in table:
                raise RequestError(name, theirs, f"asked together with {mine}: give one of the two")
        for table in tables:
            if theirs in table:
                table[mine] = table.pop(theirs)
    return True


def _complete(resources: dict[str, Any], request: ContainerRequest | None, sharing: SharingConfig) -> None:
    """Write a container's GPU count where it names none, and its quota totals, in its limits and requests (in
    place); remove quota totals from a container without vGPU requests."""
    number = sharing.resources.number
    names_count = any(number in t or HAMI_NAMES.number in t for t in _tables(resources))
    totals = container_totals(request, sharing) if request is not None else (0, 0)
    for key in ("limits", "requests"):
        table = resources.get(key)
        if request is None:
            if isinstance(table, dict):
                table.pop(QUOTA_MEMORY, None)
                table.pop(QUOTA_CORES, None)
            continue
        if not isinstance(table, dict):
            if key == "requests" and table is None:
                continue  # kube-apiserver defaults requests from limits
            table = {}
        if not names_count:
            table[number] = str(request.count)
        table[QUOTA_MEMORY] = str(totals[0])
        table[QUOTA_CORES] = str(totals[1])
        resources[key] = table


def mutate_pod(pod: Mapping[str, Any], settings: MutationSettings) -> list[dict[str, Any]]:
    """The JSON Patch operations that opt `pod` in (empty when it asks for no vGPU resources); raises RequestError
    when its vGPU requests cannot be read."""
    sharing = settings.sharing
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return []
    scheduler = spec.get("schedulerName") or "default-scheduler"
    if scheduler != settings.scheduler_name and scheduler not in settings.replace_scheduler_names:
        return []  # another scheduler's pod (HAMi's, Volcano's): its names and its quota are not ours to change
    new_spec: dict[str, Any] = {f: copy.deepcopy(spec.get(f)) for f in _CONTAINER_LISTS}
    translate = (settings.translate_hami_names and sharing.hami_mode() != "off"
                 and sharing.resources != HAMI_NAMES)
    for f in _CONTAINER_LISTS:
        containers = new_spec[f]
        for container in containers if isinstance(containers, list) else ():
            resources = container.get("resources") if isinstance(container, dict) else None
            if translate and isinstance(resources, dict):
                _translate(str(container.get("name") or ""), resources, sharing.resources, sharing)
    requests = {r.container: r for r in pod_requests({"spec": new_spec}, sharing)}
    if not requests:
        return []
    ops: list[dict[str, Any]] = []
    for f in _CONTAINER_LISTS:
        containers = new_spec[f]
        if not isinstance(containers, list):
            continue
        for index, container in enumerate(containers):
            if not isinstance(container, dict):
                continue
            resources = container.get("resources")
            if not isinstance(resources, dict):
                continue  # asks for nothing (pod_requests reads only a mapping)
            _complete(resources, requests.get(str(container.get("name") or "")), sharing)
            if resources != (spec[f][index].get("resources") or {}):
                ops.append({"op": "add", "path": f"/spec/{f}/{index}/resources", "value": resources})
    if scheduler != settings.scheduler_name:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": settings.scheduler_name})
    return ops
