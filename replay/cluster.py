"""The trace's nodes as the extender sees them: one `NodeState` per node, plus kube-scheduler's CPU and memory.

Nodes are charged through the same `NodeState.charge` the extender's ledger uses, so placement's memo keys follow
every change exactly as in the extender. Free CPU and memory are also kept as arrays, for the vectorised
NodeResourcesFit check kube-scheduler runs before it asks the extender. A node with `islands` publishes each GPU's
NVLink island and NUMA node (`GPUDevice.island`, `.numa`: the island's number); others leave the island unknown.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vgpu.inventory import GPUDevice
from vgpu.replay.trace import CARD_MIB, DEFAULT_CARD_MIB, DEVICE_PREFIX, MEMORY_UNITS_PER_MIB, SPLIT, TraceNode
from vgpu.scheduler.fit import FitResult
from vgpu.scheduler.nodestate import NodeState, flat_grants

__all__ = ["ReplayCluster"]


def _island(g: int, node: TraceNode) -> int:
    """GPU g's NVLink island on `node`, also its NUMA node (-1 when the node's islands are not known)."""
    return g * node.islands // node.gpus if node.islands else -1


class ReplayCluster:
    """The nodes of a trace; `reset(rank)` empties them and sets the seed's tie-breaking ranks."""

    def __init__(self, nodes: Sequence[TraceNode]) -> None:
        self.nodes = list(nodes)
        self.devices: list[tuple[GPUDevice, ...]] = []
        for node in nodes:
            card = CARD_MIB.get(node.model, DEFAULT_CARD_MIB) * MEMORY_UNITS_PER_MIB
            self.devices.append(tuple(
                GPUDevice(uuid=f"{node.name}-gpu{g}", split=SPLIT, memory=card, type=DEVICE_PREFIX + node.model,
                          index=g, island=_island(g, node), numa=max(_island(g, node), 0))
                for g in range(node.gpus)
            ))
        self.cpu_total = np.array([n.cpu for n in nodes], dtype=np.int64)
        self.mem_total = np.array([n.memory for n in nodes], dtype=np.int64)
        self.capacity_milli = 1000 * sum(n.gpus for n in nodes)
        self.reset(np.zeros(len(nodes), dtype=np.int64))

    def reset(self, rank: np.ndarray) -> None:
        """Empty every node; `rank[n]` breaks score ties for node n (lower wins)."""
        self.cpu_free = self.cpu_total.copy()
        self.mem_free = self.mem_total.copy()
        self.states: list[NodeState] = []
        for n, node in enumerate(self.nodes):
            state = NodeState(name=node.name, rank=int(rank[n]), cpu_allocatable=node.cpu,
                              memory_allocatable=node.memory)
            state.set_devices(self.devices[n])
            self.states.append(state)

    def fitting(self, cpu: int, memory: int) -> np.ndarray:
        """Indices of the nodes with `cpu` milli and `memory` MiB free (kube-scheduler's NodeResourcesFit)."""
        return np.flatnonzero((self.cpu_free >= cpu) & (self.mem_free >= memory))

    def place(self, n: int, cpu: int, memory: int, result: FitResult) -> None:
        """Charge a placed pod to node n."""
        state = self.states[n]
        state.charge(flat_grants(result.assignment))
        state.set_requested(state.cpu_requested + cpu, state.memory_requested + memory)
        self.cpu_free[n] -= cpu
        self.mem_free[n] -= memory

    def remove(self, n: int, cpu: int, memory: int, result: FitResult) -> None:
        """Release a pod placed on node n (`place` with the same arguments)."""
        state = self.states[n]
        state.charge(flat_grants(result.assignment), -1)
        state.set_requested(state.cpu_requested - cpu, state.memory_requested - memory)
        self.cpu_free[n] += cpu
        self.mem_free[n] += memory
