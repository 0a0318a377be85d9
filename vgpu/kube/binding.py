"""Create a `pods/binding` that carries annotations, so that spec.nodeName and the scheduler's decision land on
the pod in one write (kube-apiserver merges the Binding's metadata.annotations into the pod).

Called by the scheduler extender's /bind. The pod uid, when given, is sent as the Binding's metadata.uid, which the
API server checks as a precondition: a pod deleted and re-created under the same name is not bound by mistake.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s

from vgpu.kube.client import read_json
from vgpu.kube.errors import translate

__all__ = ["bind_pod", "binding_body"]


def binding_body(name: str, node: str, annotations: Mapping[str, str] | None = None,
                 uid: str | None = None) -> dict[str, Any]:
    """The v1 Binding for pod `name` to `node`."""
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = dict(annotations)
    if uid:
        meta["uid"] = uid
    return {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}


def bind_pod(api_client: k8s.ApiClient, namespace: str, name: str, node: str,
             annotations: Mapping[str, str] | None = None, uid: str | None = None, timeout: float = 10.0) -> None:
    """Bind pod namespace/name to `node` with `annotations`. Raises ConflictError (already bound / uid mismatch),
    NotFoundError, ApiError."""
    body: Any = binding_body(name, node, annotations, uid)
    try:
        resp = k8s.CoreV1Api(api_client).create_namespaced_pod_binding(
            name, namespace, body, _preload_content=False, _request_timeout=timeout)
        read_json(resp)
    except Exception as exc:
        raise translate(exc, f"bind pod {namespace}/{name} to node {node}") from exc
