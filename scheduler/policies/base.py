"""The node-policy interface and its registry."""

from collections.abc import Callable, Sequence
from typing import Protocol

from scheduler.fit import FitResult, GPUOrder, GPUUsage
from vgpu.errors import ConfigError
from vgpu.inventory import GPUDevice
from vgpu.requests import ContainerRequest

__all__ = ["NodePolicy", "NODE_POLICIES", "register", "make_policy"]


class NodePolicy(Protocol):
    """Scores a feasible placement of a pod on a node; higher is better."""

    name: str
    # The GPU order this policy wants inside a node, or None to use the configured --gpu-policy.
    gpu_order: GPUOrder | None

    def score(
        self,
        devices: Sequence[GPUDevice],
        usage: Sequence[GPUUsage],
        requests: Sequence[ContainerRequest],
        result: FitResult,
    ) -> float:
        """Score placing `requests` on this node as `result` says (usage is the state before)."""
        ...

    def observe(self, requests: Sequence[ContainerRequest]) -> None:
        """Learn from a pod that was placed (policies that learn the workload online)."""
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
