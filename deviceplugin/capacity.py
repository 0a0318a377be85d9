"""The node's last check before it hands out limits: would this grant over-commit one of its GPUs?

The extender never places more than a GPU holds, but two extenders acting at once (a leader hand-over, a stale
replica) could. Before Allocate answers a container, `overcommit` adds up what the pods already admitted on the
node hold on the container's GPUs (their assignments: pods answered by this process, marked bind-phase=success, or
running; pods that ended free theirs; pods still waiting for admission hold nothing yet) and the whole assignment
of the container's own pod, and names a GPU whose memory, compute or share count that would exceed. The first pod
admitted keeps its grant; the allocator refuses the later one (deviceplugin.allocator).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from vgpu import keys
from vgpu.assignment import Assignment, salvage
from vgpu.node.response import ContainerGrant

__all__ = ["overcommit"]

_ENDED = ("Succeeded", "Failed")


def overcommit(grant: ContainerGrant, pods: Iterable[Mapping[str, Any]], answered: Collection[str],
               card_memory: Mapping[str, int], split: int, scheduler_names: frozenset[str]) -> str:
    """Why answering `grant` would over-commit one of its GPUs ("" when everything fits).

    `pods` are the node's pods, `answered` the UIDs of pods this process has answered containers of; only pods of
    `scheduler_names` count (others are never served); `card_memory` is each GPU's memory in memory units, `split`
    how many containers one GPU may hold."""
    mine = {g.uuid for g in grant.grants}
    totals = {uuid: [0, 0, 0, 0] for uuid in mine}  # memory, cores, shares, exclusive holders

    def add(assignment: Assignment) -> None:
        for segment in assignment:
            for g in segment:
                if g.uuid in totals:
                    total = totals[g.uuid]
                    total[0] += g.memory
                    total[1] += g.cores
                    total[2] += 1
                    total[3] += g.cores >= 100

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
            add(salvage(annotations.get(keys.VGPU_IDS, "")))
    add(grant.segments)
    for uuid, (memory, cores, shares, exclusive) in sorted(totals.items()):
        card = card_memory.get(uuid)
        if card is not None and memory > card:
            return f"GPU {uuid} would hold {memory} of its {card} memory units"
        if cores > 100:
            return f"GPU {uuid} would hold {cores}% of its compute"
        if shares > split:
            return f"GPU {uuid} would hold {shares} containers, its split count is {split}"
        if exclusive and shares > 1:
            return f"GPU {uuid} is held exclusively (100% cores) and would be shared by {shares} containers"
    return ""
