"""The extender's path for nodes whose GPUs come through DRA, beside its device-plugin path.

The verbs of `scheduler.extender` hand what concerns DRA nodes to one `ClaimPlacement`, whether the extender runs
with `--dra` or not, so they carry no DRA branches:

- `DRAPlacement` answers from the cluster's ResourceSlices and ResourceClaims (`scheduler.draview.DRAView`), with the
  extender's node policy;
- `NO_CLAIMS` stands for an extender without DRA mode: it passes every candidate for pods without our extended
  resources, adds no node for pods with them, and leaves every bind to the device-plugin path.

What a DRA node takes (docs/dra.md): pods asking our DeviceClass through ResourceClaims, placed by the node policy
over the DRA view; and pods asking `volcano.sh/vgpu-number` in their limits, which kube-scheduler's DynamicResources
plugin serves as whole GPUs through the DeviceClass with `extendedResourceName` (an amount of memory or cores has no
such mapping, so those pods fail there with the reason). When the extender is asked to bind on a DRA node, the
claims have been allocated already (kube-scheduler's PreBind runs before the binder), so the Binding carries no
assignment and the ledger charges nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from vgpu.errors import VGPUError
from vgpu.requests import ContainerRequest, pod_cpu_memory
from vgpu.scheduler.draview import NEEDS_CLAIM, DRAView
from vgpu.scheduler.ledger import Ledger
from vgpu.scheduler.policies.base import PodContext
from vgpu.scheduler.wire import failure_message, filter_result, pod_ref, priorities

__all__ = ["NO_CLAIMS", "ClaimPlacement", "DRAPlacement", "ExtenderHost", "NoClaims", "asks_whole_gpus"]

log = logging.getLogger(__name__)

# seconds /filter waits for the claims of a pod that the claim watch has not delivered yet (kube-scheduler sends
# /filter only once they exist: their watch events are on their way) before answering without them
CLAIM_ARRIVAL_WAIT = 0.002


def asks_whole_gpus(requests: tuple[ContainerRequest, ...]) -> bool:
    """Whether every container asks whole GPUs only (vgpu-number without a memory amount or a share)."""
    return all(r.memory == 0 and r.memory_percent == 100 for r in requests)


class ExtenderHost(Protocol):
    """What a claim placement uses of the extender that calls it."""

    ledger: Ledger
    events: Callable[[Mapping[str, str], str, str, str], None]

    def show_policy(self, requests: tuple[ContainerRequest, ...], context: PodContext) -> None:
        """Let the node policy learn from a pod's requests."""
        ...

    def bound_requests(self, key: str, namespace: str, name: str) -> tuple[ContainerRequest, ...]:
        """The extended-resource requests of a pod being bound; raises VGPUError when it cannot be read."""
        ...

    def bind_plain(self, ref: dict[str, str], node: str, what: str) -> dict[str, str]:
        """Bind a pod without an assignment (`what` says what it got, for its event)."""
        ...

    def bind_failed(self, ref: dict[str, str], node: str, message: str) -> dict[str, str]:
        """Refuse a bind with `message` (logged and recorded as an event)."""
        ...


class ClaimPlacement(Protocol):
    """The DRA side of the extender's verbs; see the module docstring."""

    def filter(self, host: ExtenderHost, names: list[Any], objects: dict[str, Mapping[str, Any]] | None,
               pod: Mapping[str, Any]) -> dict[str, Any]:
        """ExtenderFilterResult for a pod without our extended resources."""
        ...

    def prioritize(self, host: ExtenderHost, names: list[Any], pod: Mapping[str, Any]) -> list[dict[str, Any]]:
        """HostPriorityList for a pod without our extended resources."""
        ...

    def whole_gpu_nodes(self, host: ExtenderHost, pod: Mapping[str, Any], requests: tuple[ContainerRequest, ...],
                        failed: dict[str, str], unresolvable: dict[str, str]) -> list[str]:
        """For a pod with our extended resources: the DRA nodes among `unresolvable` (nodes without vGPU inventory)
        that can take it, moving each of them from `unresolvable` to the answer or to `failed`."""
        ...

    def bind(self, host: ExtenderHost, ref: dict[str, str], key: str, node: str) -> dict[str, str] | None:
        """ExtenderBindingResult when `node` is a DRA node, else None (the device-plugin path binds)."""
        ...

    def unwarmed(self) -> bool:
        """Whether DRA nodes changed since the recent pod shapes last saw them (`warm` has work)."""
        ...

    def warm(self, budget: int) -> int:
        """Off the request path (the caller holds the ledger's lock): the DRA nodes' stale scores rescored and their
        changed nodes evaluated, at most `budget` evaluations; how many were made."""
        ...


class NoClaims:
    """The claim placement of an extender without DRA mode."""

    def filter(self, host: ExtenderHost, names: list[Any], objects: dict[str, Mapping[str, Any]] | None,
               pod: Mapping[str, Any]) -> dict[str, Any]:
        """Every candidate: the pod asks nothing the extender places."""
        return filter_result(names, objects, names, {}, {})

    def prioritize(self, host: ExtenderHost, names: list[Any], pod: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Score 0 everywhere."""
        return [{"Host": n, "Score": 0} for n in names]

    def whole_gpu_nodes(self, host: ExtenderHost, pod: Mapping[str, Any], requests: tuple[ContainerRequest, ...],
                        failed: dict[str, str], unresolvable: dict[str, str]) -> list[str]:
        """No DRA node is known."""
        return []

    def bind(self, host: ExtenderHost, ref: dict[str, str], key: str, node: str) -> dict[str, str] | None:
        """No node is a DRA node."""
        return None

    def unwarmed(self) -> bool:
        """Nothing to evaluate."""
        return False

    def warm(self, budget: int) -> int:
        """Nothing to evaluate."""
        return 0


NO_CLAIMS = NoClaims()


class DRAPlacement:
    """The claim placement of an extender in DRA mode, over the cluster's DRA view."""

    def __init__(self, view: DRAView) -> None:
        self.view = view

    def filter(self, host: ExtenderHost, names: list[Any], objects: dict[str, Mapping[str, Any]] | None,
               pod: Mapping[str, Any]) -> dict[str, Any]:
        """All candidates unless the pod asks our DeviceClass through claims, then the nodes our arithmetic says
        can hold it (decide mode: the best of them). Claims the view has not seen are awaited for
        CLAIM_ARRIVAL_WAIT first."""
        try:
            asked = self.view.pod_requests(pod)
            if asked.unknown:
                self.view.wait_claims(asked.unknown, CLAIM_ARRIVAL_WAIT)
                asked = self.view.pod_requests(pod)
            if not asked.requests:
                if asked.problem:
                    log.info("event=dra_pod_neutral pod=%s reason=%s", pod_ref(pod)["name"], asked.problem)
                return filter_result(names, objects, names, {}, {})
            context = PodContext(*pod_cpu_memory(pod))
            self._show(host, pod, asked.requests, context)
            with host.ledger.lock:  # the policy's learner rebuilds under this lock
                choice, skipped = self.view.choose(names, pod, asked.requests, context)
        except VGPUError as exc:
            host.events(pod_ref(pod), "Warning", "FilteringFailed", str(exc))
            return filter_result(names, objects, [], {}, {}, error=str(exc))
        feasible = [state.name for state in choice.feasible]
        unresolvable = {**skipped, **choice.unresolvable}
        if not feasible:
            host.events(pod_ref(pod), "Warning", "FilteringFailed",
                        failure_message(len(names), choice.failed, unresolvable))
        return filter_result(names, objects, feasible, choice.failed, unresolvable)

    def prioritize(self, host: ExtenderHost, names: list[Any], pod: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The node policy's scores when the pod asks our DeviceClass through claims (and there is a choice), else
        0 everywhere."""
        asked = self.view.pod_requests(pod) if len(names) > 1 else None
        if asked is None or not asked.requests:
            return [{"Host": n, "Score": 0} for n in names]
        self._show(host, pod, asked.requests)
        with host.ledger.lock:  # the policy's learner rebuilds under this lock
            scores = self.view.scores(names, pod, asked.requests)
        return priorities(names, scores)

    def whole_gpu_nodes(self, host: ExtenderHost, pod: Mapping[str, Any], requests: tuple[ContainerRequest, ...],
                        failed: dict[str, str], unresolvable: dict[str, str]) -> list[str]:
        """DRA nodes serve `volcano.sh/vgpu-number` as whole GPUs, one per unit; a pod asking an amount of memory
        or cores fails there with the reason."""
        nodes = [name for name in unresolvable if self.view.serves(name)]
        if not nodes:
            return []
        for name in nodes:
            del unresolvable[name]
        if not asks_whole_gpus(requests):
            failed.update({name: NEEDS_CLAIM for name in nodes})
            return []
        with host.ledger.lock:  # the policy's learner rebuilds under this lock
            choice, skipped = self.view.choose(nodes, pod, requests)
        failed.update(choice.failed)
        unresolvable.update({**skipped, **choice.unresolvable})
        return [state.name for state in choice.feasible]

    def bind(self, host: ExtenderHost, ref: dict[str, str], key: str, node: str) -> dict[str, str] | None:
        """Bind without an assignment on a node without vGPU inventory whose GPUs our DRA plugin serves: the pod's
        claims, or the claim kube-scheduler made for its `volcano.sh/vgpu-number`, hold its GPUs."""
        with host.ledger.lock:
            state = host.ledger.nodes.get(node)
            if state is not None and not state.error:
                return None  # a node with vGPU inventory: the device-plugin path
        if not self.view.serves(node):
            return None
        try:
            requests = host.bound_requests(key, ref["namespace"], ref["name"])
        except VGPUError as exc:
            return host.bind_failed(ref, node, str(exc))
        if not asks_whole_gpus(requests):
            return host.bind_failed(ref, node, NEEDS_CLAIM)
        with host.ledger.lock:
            if key in host.ledger.charges:
                host.ledger.release(key)  # a reservation on a device-plugin node this pod did not take
        return host.bind_plain(ref, node, "whole GPUs through DRA" if requests else "its claims through DRA")

    def unwarmed(self) -> bool:
        """Whether DRA nodes changed since the recent pod shapes last saw them (`warm` has work)."""
        return self.view.unwarmed()

    def warm(self, budget: int) -> int:
        """`DRAView.warm`: stale scores of the DRA nodes rescored, then the changed ones evaluated."""
        return self.view.warm(budget)

    def _show(self, host: ExtenderHost, pod: Mapping[str, Any], requests: tuple[ContainerRequest, ...],
              context: PodContext | None = None) -> None:
        """Show a DRA pod to the node policy once, as the pod watch does for pods with our extended resources
        (`context`: its CPU and memory, when already read)."""
        if self.view.first_sight(pod):
            host.show_policy(requests, PodContext(*pod_cpu_memory(pod)) if context is None else context)
