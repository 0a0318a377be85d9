"""kube-scheduler's extender wire format: arguments in any capitalisation, candidate nodes, results.

The argument dicts use the Go field names of k8s.io/kube-scheduler/extender/v1 (`Pod`, `NodeNames`, `Nodes`, ...),
matched case-insensitively as Go's JSON decoder does; results use the exact capitalised names. Used by
scheduler.extender; no HTTP here (scheduler.server).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vgpu.errors import VGPUError

__all__ = ["MAX_PRIORITY", "InvalidArgs", "candidate_nodes", "failure_message", "filter_result", "lower_keys",
           "pod_ref", "priorities"]

MAX_PRIORITY = 10  # extenderv1.MaxExtenderPriority


class InvalidArgs(VGPUError):
    """A well-formed JSON body that is not valid extender arguments (answered with `Error`, HTTP 200)."""



def lower_keys(value: Any) -> dict[str, Any]:
    """A dict's keys lowercased (Go's JSON decoder matches struct fields case-insensitively)."""
    if not isinstance(value, Mapping):
        raise InvalidArgs(f"expected a JSON object, got {type(value).__name__}")
    return {str(k).lower(): v for k, v in value.items()}



def pod_ref(pod: Mapping[str, Any]) -> dict[str, str]:
    """The namespace, name and UID of a pod, for events and charges."""
    meta = pod.get("metadata") or {}
    return {
        "namespace": str(meta.get("namespace") or "default"),
        "name": str(meta.get("name") or ""),
        "uid": str(meta.get("uid") or ""),
    }



def candidate_nodes(args: dict[str, Any]) -> tuple[list[str], dict[str, Mapping[str, Any]] | None]:
    """The candidate node names of ExtenderArgs, and the node objects when kube-scheduler sent whole nodes."""
    names = args.get("nodenames")
    nodes = args.get("nodes")
    if nodes is not None:
        items = lower_keys(nodes).get("items") if isinstance(nodes, Mapping) else None
        if not isinstance(items, list):
            raise InvalidArgs("Nodes must be a NodeList with items")
        objects: dict[str, Mapping[str, Any]] = {}
        for item in items:
            name = ((item or {}).get("metadata") or {}).get("name") if isinstance(item, Mapping) else None
            if not isinstance(name, str) or not name:
                raise InvalidArgs("Nodes.items entry without metadata.name")
            objects[name] = item
        return list(objects), objects
    if names is None:
        return [], None
    if not isinstance(names, list):
        raise InvalidArgs("NodeNames must be a list of strings")
    return names, None


def filter_result(
    names: list[str],
    objects: dict[str, Mapping[str, Any]] | None,
    feasible: list[str],
    failed: dict[str, str],
    unresolvable: dict[str, str],
    error: str = "",
) -> dict[str, Any]:
    """ExtenderFilterResult: the feasible nodes in the form they came in (names or a NodeList), the failures."""
    nodes = None
    if objects is not None:
        nodes = {"apiVersion": "v1", "kind": "NodeList", "metadata": {},
                 "items": [objects[n] for n in feasible if n in objects]}
    return {
        "Nodes": nodes,
        "NodeNames": list(feasible) if not error else [],
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": error,
    }


def failure_message(total: int, failed: dict[str, str], unresolvable: dict[str, str]) -> str:
    """The FailedScheduling-style summary of why no node can hold the pod (the three most common reasons)."""
    counts: dict[str, int] = {}
    for reason in (*failed.values(), *unresolvable.values()):
        counts[reason] = counts.get(reason, 0) + 1
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    detail = "; ".join(f"{n} node(s): {reason}" for reason, n in top)
    return f"0/{total} nodes can hold the pod's vGPU request. {detail}".strip()


def priorities(names: list[Any], scores: list[float | None]) -> list[dict[str, Any]]:
    """HostPriorityList from policy scores: the best MAX_PRIORITY, the worst that fits 0, nodes that do not fit 0."""
    values = [s for s in scores if s is not None]
    if not values:
        return [{"Host": n, "Score": 0} for n in names]
    low, high = min(values), max(values)
    span = high - low
    if span <= 1e-12:
        return [{"Host": n, "Score": 0 if s is None else MAX_PRIORITY} for n, s in zip(names, scores)]
    factor = MAX_PRIORITY / span
    return [{"Host": n, "Score": 0 if s is None else round((s - low) * factor)} for n, s in zip(names, scores)]
