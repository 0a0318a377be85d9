"""Does a node satisfy a pod's own placement constraints (nodeSelector, required node affinity)?

kube-scheduler checks these before it calls the extender; /bind checks them again, so that a caller of /bind who
is not kube-scheduler (or a pod that was never filtered) cannot have a pod bound to a node it excludes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["constraint_failure", "expression_holds"]


def expression_holds(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether one `matchExpressions` requirement holds for these labels (In, NotIn, Exists, DoesNotExist, and Gt and
    Lt of node selectors); an unknown operator never holds."""
    key = expression.get("key")
    operator = expression.get("operator")
    values = [str(v) for v in expression.get("values") or ()]
    present = key in labels
    if operator == "In":
        return present and labels[str(key)] in values
    if operator == "NotIn":
        return not present or labels[str(key)] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, bound = int(labels[str(key)]), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False  # an operator kube-scheduler would reject: never satisfied


def _term_holds(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no node
    if not all(expression_holds(e, labels) for e in expressions if isinstance(e, Mapping)):
        return False
    return all(expression_holds({**f, "key": "metadata.name"}, {"metadata.name": name})
               for f in fields if isinstance(f, Mapping) and f.get("key") == "metadata.name")


def constraint_failure(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str:
    """Why `node` violates the pod's nodeSelector or required node affinity ("" when it does not)."""
    spec = pod.get("spec") or {}
    meta = node.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    name = str(meta.get("name") or "")
    selector = spec.get("nodeSelector") or {}
    for key, value in selector.items():
        if labels.get(str(key)) != str(value):
            return f"node {name} does not match the pod's nodeSelector {key}={value}"
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {})
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = [t for t in required.get("nodeSelectorTerms") or () if isinstance(t, Mapping)]
    if terms and not any(_term_holds(t, labels, name) for t in terms):
        return f"node {name} does not satisfy the pod's required node affinity"
    return ""
