"""One node as placement sees it: its published GPUs, what is charged on each, and its free CPU and memory.

The ledger (the extender's view of the cluster) and the trace replay both keep one `NodeState` per node and
change it only through `charge`, `set_devices`, `set_requested` and `set_allocatable`, which mark it changed for
the placement loop (`scheduler.placement`): a new GPU state key, and an entry in the change log of the placement the
node is registered with.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from vgpu.assignment import Assignment
from vgpu.errors import CodecError
from vgpu.inventory import GPUDevice, decode_topology
from vgpu.scheduler.fit import GPUUsage
from vgpu.scheduler.policies.base import NodeContext

__all__ = ["Grant", "NodeState", "flat_grants", "gpu_state", "gpu_types", "with_topology"]

log = logging.getLogger(__name__)

# (GPU UUID, memory units, cores) of one granted device
Grant = tuple[str, int, int]


def flat_grants(assignment: Assignment) -> tuple[Grant, ...]:
    """A pod's grants, containers flattened; a MIG entry (GPU-xxxx[group-pos]) charges its physical GPU."""
    return tuple((g.uuid.split("[", 1)[0], g.memory, g.cores) for segment in assignment for g in segment)


_topology_problems: dict[str, str] = {}  # node -> its topology annotation's problem, as last logged
_TOPOLOGY_PROBLEMS_MAX = 10_000


def with_topology(node: str, devices: tuple[GPUDevice, ...], value: object) -> tuple[GPUDevice, ...]:
    """`devices` with the NVLink island and NUMA node that the node's topology annotation (`value`; None: absent)
    gives each; GPUs it does not name keep theirs. A value that does not decode changes nothing and is logged once
    per node and problem: the node is placed without topology."""
    if value is None or not devices:
        return devices
    try:
        topology = decode_topology(value)
    except CodecError as exc:
        if _topology_problems.get(node) != str(exc):
            if len(_topology_problems) >= _TOPOLOGY_PROBLEMS_MAX:
                _topology_problems.clear()
            _topology_problems[node] = str(exc)
            log.warning("event=node_topology_ignored node=%s error=%s", node, exc)
        return devices
    _topology_problems.pop(node, None)
    placed = []
    for device in devices:
        where = topology.get(device.uuid)
        placed.append(device if where is None else replace(
            device, island=where.island, numa=where.numa if where.numa >= 0 else device.numa))
    return tuple(placed)


def gpu_state(devices: tuple[GPUDevice, ...], usage: list[GPUUsage]) -> tuple[Any, ...]:
    """Everything fit and the node policies read of a node's GPUs, UUIDs left out: nodes whose GPUs are in the
    same state share placement results (a pod that names GPU UUIDs is placed per node)."""
    return tuple((d.memory, d.type, d.healthy, d.split, d.mode, d.cores, u.shares, u.memory, u.cores)
                 for d, u in zip(devices, usage))


def gpu_types(states: Iterable[NodeState]) -> dict[str, int]:
    """GPUs per device type over the nodes that can take vGPU pods (what a learning policy weighs its target
    against: `NodePolicy.relearn`)."""
    counts: dict[str, int] = {}
    for state in states:
        if not state.error:
            for device in state.devices:
                counts[device.type] = counts.get(device.type, 0) + 1
    return counts


@dataclass(slots=True, eq=False)
class NodeState:
    """One node: `error` is non-empty when it cannot take vGPU pods (inventory absent or malformed, no allocatable
    GPUs), and `devices` is then empty. `rank` breaks ties between equal scores (lower wins; the ledger numbers
    nodes in name order, the replay by the seed's random order). `generation` counts changes; `key` is the
    placement memo's key of the GPU state, valid while `key_tag` is the placement's current numbering."""

    name: str
    devices: tuple[GPUDevice, ...] = ()
    error: str = ""
    usage: list[GPUUsage] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)
    rank: int = 0
    generation: int = 0
    key: int = -1
    key_tag: object = None
    cpu_allocatable: int | None = None  # milli; None when the node does not say
    memory_allocatable: int | None = None  # MiB
    cpu_requested: int = 0  # milli, by the pods bound to the node
    memory_requested: int = 0  # MiB
    raw: tuple[Any, ...] = ()  # the ledger's change detector
    obj: Mapping[str, Any] | None = None
    slot: int = -1
    changes: list[int] | None = None

    def set_devices(self, devices: tuple[GPUDevice, ...], error: str = "") -> None:
        """Publish a new inventory; usage starts empty (the caller charges what is held)."""
        self.devices = devices
        self.error = error
        self.index = {d.uuid: i for i, d in enumerate(devices)}
        self.usage = [GPUUsage() for _ in devices]
        self.touch()

    def charge(self, grants: tuple[Grant, ...], sign: int = 1) -> None:
        """Add (sign 1) or take off (sign -1) one pod's grants; grants on GPUs the node does not have are ignored."""
        for uuid, memory, cores in grants:
            i = self.index.get(uuid)
            if i is None:
                continue
            if sign > 0:
                self.usage[i].add(memory, cores)
            else:
                self.usage[i].sub(memory, cores)
        self.touch()

    def touch(self) -> None:
        """Mark the node's GPUs changed: placement results cached for it are recomputed."""
        self.generation += 1
        self.key_tag = None
        if self.changes is not None:
            self.changes.append(self.slot)

    def set_requested(self, cpu: int, memory: int) -> None:
        """What the pods bound to the node request (CPU milli, memory MiB)."""
        if (cpu, memory) != (self.cpu_requested, self.memory_requested):
            self.cpu_requested, self.memory_requested = cpu, memory
            self._context_changed()

    def set_allocatable(self, cpu: int | None, memory: int | None) -> None:
        """The node's allocatable CPU (milli) and memory (MiB); None where it does not say."""
        if (cpu, memory) != (self.cpu_allocatable, self.memory_allocatable):
            self.cpu_allocatable, self.memory_allocatable = cpu, memory
            self._context_changed()

    def _context_changed(self) -> None:
        self.generation += 1
        if self.changes is not None:
            self.changes.append(self.slot)

    @property
    def cpu_free(self) -> int | None:
        """Allocatable CPU (milli) minus what bound pods request; None when the node does not say."""
        return None if self.cpu_allocatable is None else self.cpu_allocatable - self.cpu_requested

    @property
    def memory_free(self) -> int | None:
        """Allocatable memory (MiB) minus what bound pods request; None when the node does not say."""
        return None if self.memory_allocatable is None else self.memory_allocatable - self.memory_requested

    def context(self) -> NodeContext | None:
        """Free and allocatable CPU and memory for the node policies; None when the node reports no allocatable."""
        if self.cpu_allocatable is None or self.memory_allocatable is None:
            return None
        return NodeContext(cpu_free=self.cpu_allocatable - self.cpu_requested,
                           memory_free=self.memory_allocatable - self.memory_requested,
                           cpu_total=self.cpu_allocatable, memory_total=self.memory_allocatable)
