"""`vgpu consolidate --execute`: a plan carried out one move at a time, checked after each, stopped on a surprise.

For each step of the plan (vgpu.planning.consolidate):
1. The room is held: an entry for the pod it is for (a stand-in name for `--free-gpus`) is added to the node's
   `vgpu-sharing.io/consolidation-hold` annotation (vgpu.holds), which the extender charges on those GPUs until the
   pod is placed or the hold's time (`hold_seconds`) runs out, so no replacement lands there. The first eviction
   waits `HOLD_SETTLE` seconds for the extender's node watch to bring it the hold; a replacement that lands on a
   held GPU all the same (a watch later than that) is a surprise, never a silent failure.
2. Each moved pod gets a Normal `Consolidating` Event saying why, and is evicted through the Eviction API (a
   PodDisruptionBudget's refusal stops the run). Then its replacement is awaited: a pod of the same controller,
   not there before, bound to a node with an assignment. It must come within `timeout` and must not have taken a
   held GPU; a node other than the plan's is reported, not a surprise (the extender decides on the cluster as it
   is then, which may differ from the plan's simulation).
3. The pod the room is for is awaited until it is bound (it must be, within `timeout`), and its hold removed.
A surprise (a refusal, a replacement late or on the held GPUs, the pod not placed) stops the run: what was done is
reported, and holds written stay until their time runs out, so that the room made is still kept for its pod.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s

from vgpu import keys
from vgpu.assignment import salvage
from vgpu.errors import CodecError, VGPUError
from vgpu.holds import Hold, decode_holds, encode_holds
from vgpu.kube import EventRecorder, patch_node_metadata
from vgpu.kube.client import read_json, read_object
from vgpu.kube.errors import ConflictError, NotFoundError, translate
from vgpu.kube.eviction import EvictionRefused, evict_pod
from vgpu.planning.consolidate import ConsolidationPlan, Move, Step

__all__ = ["COMPONENT", "ExecutionReport", "Surprise", "execute_plan"]

COMPONENT = "vgpu-consolidate"
HOLD_SETTLE = 2.0  # seconds between writing a hold and the first eviction it covers
STAND_IN_NAMESPACE = "vgpu-consolidate"  # the namespace written in a `--free-gpus` hold (no pod of it exists)


class Surprise(VGPUError):
    """The cluster did something the plan did not expect; the run stops."""


@dataclass
class ExecutionReport:
    """What was done: per move, where its replacement went; the steps completed; why the run stopped."""

    lines: list[str] = field(default_factory=list)
    steps_done: int = 0
    evicted: int = 0  # pods evicted (their replacements placed or not)
    moves_done: int = 0  # pods evicted whose replacement was placed as checked
    stopped: str = ""


class _Cluster:
    """The reads and writes the run needs, through one API client."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self.api = api
        self.core = k8s.CoreV1Api(api)

    def pods(self, namespace: str) -> list[Mapping[str, Any]]:
        try:
            items = read_json(self.core.list_namespaced_pod(namespace, _preload_content=False, _request_timeout=30))
        except Exception as exc:
            raise translate(exc, f"list pods of {namespace}") from exc
        return list((items or {}).get("items") or ())

    def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            return read_object(self.core.read_namespaced_pod(name, namespace, _preload_content=False,
                                                             _request_timeout=30))
        except Exception as exc:
            err = translate(exc, f"read pod {namespace}/{name}")
            if isinstance(err, NotFoundError):
                return None
            raise err from exc

    def holds(self, node: str) -> tuple[tuple[Hold, ...], str]:
        """The node's holds (a malformed annotation reads as none) and its resourceVersion."""
        try:
            obj = read_object(self.core.read_node(node, _preload_content=False, _request_timeout=30))
        except Exception as exc:
            raise translate(exc, f"read node {node}") from exc
        meta = obj.get("metadata") or {}
        try:
            holds = decode_holds((meta.get("annotations") or {}).get(keys.CONSOLIDATION_HOLD) or "[]")
        except CodecError:
            holds = ()
        return holds, str(meta.get("resourceVersion") or "")

    def set_holds(self, node: str, change: Callable[[tuple[Hold, ...]], list[Hold]]) -> None:
        """Rewrite the node's holds as `change` says, retried when the node changed meanwhile."""
        for attempt in range(5):
            holds, version = self.holds(node)
            kept = change(holds)
            value = encode_holds(kept) if kept else None
            try:
                patch_node_metadata(self.api, node, {keys.CONSOLIDATION_HOLD: value}, resource_version=version)
                return
            except ConflictError:
                if attempt == 4:
                    raise


def _controller(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return str(ref.get("kind") or ""), str(ref.get("name") or "")
    return None


def _gpus(pod: Mapping[str, Any]) -> set[str]:
    ids = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.VGPU_IDS)
    return {g.uuid.split("[", 1)[0] for segment in salvage(ids) for g in segment} if ids else set()


def _placed(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName")) and bool(_gpus(pod))


def _holder(step: Step, index: int) -> tuple[str, str, str]:
    """(uid, namespace, name) the step's room is held for."""
    if step.beneficiary is not None:
        return step.beneficiary.uid, step.beneficiary.namespace, step.beneficiary.name
    return f"consolidate/{step.node}/{index}", STAND_IN_NAMESPACE, f"free-gpu-{index}"


class _Run:
    def __init__(self, api: k8s.ApiClient, timeout: float, hold_seconds: float, poll: float,
                 say: Callable[[str], None], events: EventRecorder | None) -> None:
        self.cluster = _Cluster(api)
        self.timeout, self.hold_seconds, self.poll = timeout, hold_seconds, poll
        self.settle = HOLD_SETTLE
        self.say = say
        self.events = events
        self.report = ExecutionReport()

    def line(self, text: str) -> None:
        self.report.lines.append(text)
        self.say(text)

    def step(self, index: int, step: Step) -> None:
        uid, namespace, name = _holder(step, index)
        hold = Hold(uid=uid, namespace=namespace, name=name, until=time.time() + self.hold_seconds,
                    assignment=step.hold)
        self.cluster.set_holds(step.node, lambda holds: [h for h in holds if h.uid != uid] + [hold])
        time.sleep(self.settle)   # the extender's node watch brings it the hold before any replacement is placed
        target = step.beneficiary.ref if step.beneficiary else f"{len(step.gpus)} whole GPU(s)"
        self.line(f"step {index + 1}: holding {', '.join(step.gpus)} on {step.node} for {target}")
        for move in step.moves:
            self.move(move, step, target)
        if step.beneficiary is not None:
            self.await_beneficiary(step)
        self.cluster.set_holds(step.node, lambda holds: [h for h in holds if h.uid != uid])
        self.report.steps_done += 1

    def move(self, move: Move, step: Step, target: str) -> None:
        pod = move.pod
        before = {str((p.get("metadata") or {}).get("uid")) for p in self.cluster.pods(pod.namespace)}
        obj = {"metadata": {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid}}
        if self.events is not None:
            self.events.normal(obj, "Consolidating", f"evicted by vgpu consolidate to free {', '.join(step.gpus)} on "
                               f"{step.node} for {target}; its controller re-creates it (expected on {move.target})",
                               kind="Pod")
        try:
            evict_pod(self.cluster.api, pod.namespace, pod.name, pod.uid)
        except EvictionRefused as exc:
            raise Surprise(f"the eviction of {pod.ref} was refused: {exc}") from None
        self.report.evicted += 1
        deadline = time.monotonic() + self.timeout
        while True:
            fresh = [p for p in self.cluster.pods(pod.namespace)
                     if str((p.get("metadata") or {}).get("uid")) not in before and _controller(p) == pod.controller
                     and not (p.get("metadata") or {}).get("deletionTimestamp")]
            placed = [p for p in fresh if _placed(p)]
            if placed:
                break
            if time.monotonic() >= deadline:
                what = "was not re-created" if not fresh else "was not placed"
                raise Surprise(f"{pod.ref}'s replacement {what} within {self.timeout:g} s")
            time.sleep(self.poll)
        replacement = placed[0]
        meta = replacement.get("metadata") or {}
        node = str((replacement.get("spec") or {}).get("nodeName"))
        taken = _gpus(replacement) & set(step.gpus)
        if taken:
            raise Surprise(f"{pod.ref}'s replacement {meta.get('name')} took held GPU(s) {', '.join(sorted(taken))}")
        self.report.moves_done += 1
        note = "" if node == move.target else f" (the plan expected {move.target})"
        self.line(f"  moved {pod.ref} from {move.source}: replacement {meta.get('name')} on {node}{note}")

    def await_beneficiary(self, step: Step) -> None:
        pod = step.beneficiary
        assert pod is not None
        deadline = time.monotonic() + self.timeout
        while True:
            obj = self.cluster.pod(pod.namespace, pod.name)
            if obj is None or str((obj.get("metadata") or {}).get("uid")) != pod.uid:
                raise Surprise(f"{pod.ref} is gone")
            node = (obj.get("spec") or {}).get("nodeName")
            if node:
                note = "" if node == step.node else f" (the plan expected {step.node})"
                self.line(f"  {pod.ref} placed on {node}{note}")
                return
            if time.monotonic() >= deadline:
                raise Surprise(f"{pod.ref} was not placed within {self.timeout:g} s of its room being made")
            time.sleep(self.poll)


def execute_plan(api: k8s.ApiClient, plan: ConsolidationPlan, *, timeout: float = 180.0,
                 hold_seconds: float = 600.0, poll: float = 1.0, say: Callable[[str], None] = print,
                 events: bool = True) -> ExecutionReport:
    """Carry the plan out (module docstring); `say` gets each line of progress as it happens."""
    recorder = EventRecorder(api, COMPONENT) if events else None
    run = _Run(api, timeout, hold_seconds, poll, say, recorder)
    try:
        for index, step in enumerate(plan.steps):
            run.step(index, step)
    except Surprise as exc:
        run.report.stopped = str(exc)
        run.line(f"stopped: {exc}")
    finally:
        if recorder is not None:
            recorder.close()
    return run.report
