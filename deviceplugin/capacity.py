"""The node's last check before it hands out limits: would this grant over-commit one of its GPUs?

The extender never places more than a GPU holds, but two extenders acting at once (a leader hand-over, a stale
replica) could. Before Allocate answers a container, `overcommit` adds up what the pods already admitted on the
node hold on the container's GPUs (their assignments, counted at what each container's spec asks, so a pod that
rewrote its own claim counts no more than its spec: pods answered by this process, marked bind-phase=success, or
running; pods that ended free theirs; pods still waiting for admission hold nothing yet) and the whole assignment
of the container's own pod, and names a GPU whose memory, compute or share count that would exceed. The first pod
admitted keeps its grant; the allocator refuses the later one (deviceplugin.allocator).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from vgpu import grants, keys
from vgpu.assignment import salvage
from vgpu.errors import RequestError
from vgpu.node.response import ContainerGrant
from vgpu.requests import pod_requests
from vgpu.resources import SharingConfig

__all__ = ["overcommit"]

_ENDED = ("Succeeded", "Failed")


def overcommit(grant: ContainerGrant, pods: Iterable[Mapping[str, Any]], answered: Collection[str],
               card_memory: Mapping[str, int], sharing: SharingConfig, scheduler_names: frozenset[str]) -> str:
    """Why answering `grant` would over-commit one of its GPUs ("" when everything fits).

    `pods` are the node's pods, `answered` the UIDs of pods this process has answered containers of; only pods of
    `scheduler_names` count (others are never served); `card_memory` is each GPU's memory in memory units;
    `sharing` gives the resource names and how many containers one GPU may hold."""
    mine = {g.uuid for g in grant.grants}
    totals = {uuid: [0, 0, 0, 0] for uuid in mine}  # memory, cores, shares, exclusive holders

    def add(held: Iterable[tuple[str, int, int]]) -> None:
        for uuid, memory, cores in held:
            if uuid in totals:
                total = totals[uuid]
                total[0] += memory
                total[1] += cores
                total[2] += 1
                total[3] += cores >= 100

    for pod in pods:
        meta = pod.get("metadata") or {}
        if str(meta.get("uid") or "") == grant.pod_uid:
            continue
        if (pod.get("status") or {}).get("phase") in _ENDED:
            continue
        if ((pod.get("spec") or {}).get("schedulerName") or "default-scheduler") not in scheduler_names:
            continue
        annotations = meta.get("annotations") or {}
        admitted = (str(meta.get("uid") or "") in answered
                    or annotations.get(keys.BIND_PHASE) == keys.BIND_PHASE_SUCCESS
                    or (pod.get("status") or {}).get("phase") == "Running")
        if admitted:
            try:
                requests = pod_requests(pod, sharing)
            except RequestError:
                continue  # a spec that asks nothing readable was never served
            add(grants.spec_charges(salvage(annotations.get(keys.VGPU_IDS, "")), requests, card_memory))
    add((g.uuid, g.memory, g.cores) for segment in grant.segments for g in segment)
    for uuid, (memory, cores, shares, exclusive) in sorted(totals.items()):
        card = card_memory.get(uuid)
        if card is not None and memory > card:
            return f"GPU {uuid} would hold {memory} of its {card} memory units"
        if cores > 100:
            return f"GPU {uuid} would hold {cores}% of its compute"
        if shares > sharing.split_count:
            return f"GPU {uuid} would hold {shares} containers, its split count is {sharing.split_count}"
        if exclusive and shares > 1:
            return f"GPU {uuid} is held exclusively (100% cores) and would be shared by {shares} containers"
    return ""
