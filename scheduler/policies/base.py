"""The node-policy interface and its registry.

Placement (`scheduler.placement`, used by the extender and the trace replay) builds a policy with
`make_policy(name)`, calls `observe` once for every vGPU pod it sees (in the pod watch or at /filter), then `score`
for every node a pod fits on, with the GPU order of `gpu_order`. A policy that learns only counts in `observe`; its
callers run `relearn` off the request path (the extender's learner thread, the replay between pods). Every member a
policy may have is declared on `NodePolicy` with its default; a policy overrides what it needs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal, NamedTuple

from vgpu.errors import ConfigError
from vgpu.inventory import GPUDevice
from vgpu.requests import ContainerRequest, Selectors
from vgpu.scheduler.fit import FitResult, GPUOrder, GPUUsage

__all__ = ["NODE_POLICIES", "NodeContext", "NodePolicy", "PodContext", "make_policy", "register"]


class NodeContext(NamedTuple):
    """Node facts beyond its GPUs: free and allocatable CPU (milli) and memory (MiB)."""

    cpu_free: int
    memory_free: int
    cpu_total: int = 0
    memory_total: int = 0


@dataclass(frozen=True, slots=True)
class PodContext:
    """Pod facts beyond its GPU requests: CPU (milli) and memory (MiB) requests and GPU selectors."""

    cpu: int = 0
    memory: int = 0
    selectors: Selectors = field(default_factory=Selectors)


class NodePolicy(ABC):
    """Scores a feasible placement of a pod on a node; higher is better.

    Contract: `score` depends on a node only through its GPUs' state (memory, type, health, split, mode and usage,
    not their UUIDs) and, for a policy with `uses_node_context`, the class `context_class` gives the node; placement
    shares results between nodes on that basis. `epoch` changes whenever the scores of unchanged nodes change (a
    policy that learns the workload), so that placement recomputes them.
    """

    name: ClassVar[str] = ""
    # How placement breaks equal scores: "rank" (lower rank, then name) or "random" (uniform among the best).
    tie_break: ClassVar[Literal["rank", "random"]] = "rank"
    # Whether `score` or `gpu_order` reads the node context (free CPU and memory); see `context_class`.
    uses_node_context: ClassVar[bool] = False

    def __init__(self) -> None:
        self.epoch = 0

    @abstractmethod
    def score(
        self,
        devices: Sequence[GPUDevice],
        usage: Sequence[GPUUsage],
        requests: Sequence[ContainerRequest],
        result: FitResult,
        node: NodeContext | None = None,
        pod: PodContext | None = None,
    ) -> float:
        """Score placing `requests` on this node as `result` says (`usage` is the state before)."""

    def gpu_order(self, node: NodeContext | None, pod: PodContext | None) -> GPUOrder | None:
        """The GPU order this policy wants inside a node (given its context), or None for the configured one."""
        return None

    def order_class(self, node: NodeContext | None, pod: PodContext) -> int:
        """The class of a node's context that `gpu_order` reads: nodes with the same GPU state and order class get
        the same GPU order for this pod, so placement shares their fits (0: the order reads no context)."""
        return 0

    def context_class(self, cpu_free: int, memory_free: int, pod: PodContext) -> int:
        """A class of a node's free CPU (milli) and memory (MiB) such that nodes with the same GPU state and class
        get the same score and GPU order for this pod. Policies without node context: one class."""
        return 0

    def observe(self, requests: Sequence[ContainerRequest], pod: PodContext | None = None) -> None:
        """Count a pod the scheduler has seen (policies that learn the workload online); cheap, never rebuilds."""
        return None

    @property
    def due(self) -> bool:
        """Whether `relearn` would rebuild from what was observed (the extender wakes its learner thread only then)."""
        return False

    def relearn(self, capacity: Mapping[str, int] | None = None) -> bool:
        """Rebuild what is learned from the pods observed, if due, against the cluster's `capacity` (GPUs per device
        type); True when scores changed (`epoch` bumped). May take milliseconds: never called on a request path."""
        return False

    def seed(self, seed: int) -> None:
        """Reseed any randomness (the replay seeds each run)."""
        return None

    def set_workload(self, pods: Iterable[tuple[Sequence[ContainerRequest], PodContext]]) -> None:
        """Be told the whole workload in advance (the replay's oracle; only FGD uses it)."""
        return None


NODE_POLICIES: dict[str, Callable[[], NodePolicy]] = {}


def register(name: str) -> Callable[[type[NodePolicy]], type[NodePolicy]]:
    """Class decorator adding a policy to NODE_POLICIES under `name`."""

    def add(cls: type[NodePolicy]) -> type[NodePolicy]:
        NODE_POLICIES[name] = cls
        return cls

    return add


def make_policy(name: str) -> NodePolicy:
    """Build the policy registered as `name`, or raise ConfigError listing the known ones."""
    try:
        return NODE_POLICIES[name]()
    except KeyError:
        known = ", ".join(sorted(NODE_POLICIES))
        raise ConfigError(f"--node-policy: unknown policy {name!r} (known: {known})") from None
