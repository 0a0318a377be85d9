"""The node-policy interface and its registry.

The extender calls `make_policy(name)` once, then `.score` for every feasible node of a pod and `.observe` once
for every vGPU pod it sees (in the pod watch or at /filter). The trace replay (`vgpu.replay.run`) calls the same
objects. Both pass the optional node context (free CPU and memory) and pod context (CPU and memory requests) to
policies that declare `context_bins`, such as `fgd` and `fragaware`, whenever the node reports its allocatable
CPU and memory; every policy must also work without them.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from vgpu.errors import ConfigError
from vgpu.inventory import GPUDevice
from vgpu.requests import ContainerRequest, Selectors
from vgpu.scheduler.fit import FitResult, GPUOrder, GPUUsage

__all__ = ["NODE_POLICIES", "NodeContext", "NodePolicy", "PodContext", "gpu_order_of", "make_policy", "register"]


@dataclass(frozen=True, slots=True)
class NodeContext:
    """Optional node facts beyond its GPUs: free and allocatable CPU (milli) and memory (MiB), and the model."""

    cpu_free: int
    memory_free: int
    cpu_total: int = 0
    memory_total: int = 0
    model: str = ""


@dataclass(frozen=True, slots=True)
class PodContext:
    """Optional pod facts beyond its GPU requests: CPU (milli) and memory (MiB) requests and GPU selectors."""

    cpu: int = 0
    memory: int = 0
    selectors: Selectors = Selectors()


class NodePolicy(Protocol):
    """Scores a feasible placement of a pod on a node; higher is better.

    Optional members a policy may add (callers use `getattr` with a default):
    - `gpu_order_for(node: NodeContext | None, pod: PodContext | None) -> GPUOrder | None`: a GPU order that
      depends on the node context (`gpu_order` is then the order used without context);
    - `context_bins(cpu_free, memory_free, pod) -> numpy int array`: for arrays of node free CPU / memory, a
      class per node such that two nodes with the same GPU state and class get the same score for this pod, and
      the same GPU order for every pod with the same GPU requests and class (the replay memoises on it). Without
      it the score must not depend on the node context at all.
    """

    name: str
    # The GPU order this policy wants inside a node, or None to use the configured --gpu-policy.
    gpu_order: GPUOrder | None

    def score(
        self,
        devices: Sequence[GPUDevice],
        usage: Sequence[GPUUsage],
        requests: Sequence[ContainerRequest],
        result: FitResult,
        node: NodeContext | None = None,
        pod: PodContext | None = None,
    ) -> float:
        """Score placing `requests` on this node as `result` says (usage is the state before)."""
        ...

    def observe(self, requests: Sequence[ContainerRequest], pod: PodContext | None = None) -> None:
        """Learn from a pod the scheduler has seen (policies that learn the workload online)."""
        ...


NODE_POLICIES: dict[str, Callable[[], NodePolicy]] = {}


def register(name: str) -> Callable[[Callable[[], NodePolicy]], Callable[[], NodePolicy]]:
    """Class decorator adding a policy factory to NODE_POLICIES under `name`."""

    def add(factory: Callable[[], NodePolicy]) -> Callable[[], NodePolicy]:
        NODE_POLICIES[name] = factory
        return factory

    return add


def make_policy(name: str) -> NodePolicy:
    """Build the policy registered as `name`, or raise ConfigError listing the known ones."""
    try:
        return NODE_POLICIES[name]()
    except KeyError:
        known = ", ".join(sorted(NODE_POLICIES))
        raise ConfigError(f"--node-policy: unknown policy {name!r} (known: {known})") from None


def gpu_order_of(
    policy: NodePolicy, node: NodeContext | None, pod: PodContext | None, default: GPUOrder
) -> GPUOrder:
    """The GPU order `policy` wants for this node (context-aware when it offers one), else `default`."""
    order_for = getattr(policy, "gpu_order_for", None)
    order = order_for(node, pod) if order_for is not None else policy.gpu_order
    return order if order is not None else default
