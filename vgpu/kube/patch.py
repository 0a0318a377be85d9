"""Merge-patches of pod and node metadata (annotations, labels) and of pod status.

Used by the device plugin (node inventory annotation, `bind-phase` on pods) and the scheduler extender. A value of
None deletes the key. With `resource_version`, the patch carries metadata.resourceVersion and the API server
answers 409 if the object changed since: that surfaces as ConflictError, so the caller can re-read and decide.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s

from vgpu.kube.client import read_object
from vgpu.kube.errors import translate

__all__ = ["metadata_patch", "patch_node_metadata", "patch_pod_metadata", "patch_pod_status"]

MERGE_PATCH = "application/merge-patch+json"

Obj = dict[str, Any]


def metadata_patch(annotations: Mapping[str, str | None] | None = None,
                   labels: Mapping[str, str | None] | None = None, resource_version: str | None = None) -> Obj:
    """The merge-patch body changing `annotations` / `labels` (None values delete) under an optional precondition."""
    meta: Obj = {}
    if annotations:
        meta["annotations"] = dict(annotations)
    if labels:
        meta["labels"] = dict(labels)
    if resource_version:
        meta["resourceVersion"] = str(resource_version)
    return {"metadata": meta}


def patch_pod_metadata(api_client: k8s.ApiClient, namespace: str, name: str,
                       annotations: Mapping[str, str | None] | None = None,
                       labels: Mapping[str, str | None] | None = None,
                       resource_version: str | None = None, timeout: float = 10.0) -> Obj:
    """Merge-patch a pod's annotations/labels; returns the patched pod. Raises ConflictError, NotFoundError."""
    body = metadata_patch(annotations, labels, resource_version)
    try:
        resp = k8s.CoreV1Api(api_client).patch_namespaced_pod(
            name, namespace, body, _content_type=MERGE_PATCH, _preload_content=False, _request_timeout=timeout)
        return read_object(resp)
    except Exception as exc:
        raise translate(exc, f"patch pod {namespace}/{name} metadata") from exc


def patch_node_metadata(api_client: k8s.ApiClient, name: str,
                        annotations: Mapping[str, str | None] | None = None,
                        labels: Mapping[str, str | None] | None = None,
                        resource_version: str | None = None, timeout: float = 10.0) -> Obj:
    """Merge-patch a node's annotations/labels; returns the patched node. Raises ConflictError, NotFoundError."""
    body = metadata_patch(annotations, labels, resource_version)
    try:
        resp = k8s.CoreV1Api(api_client).patch_node(
            name, body, _content_type=MERGE_PATCH, _preload_content=False, _request_timeout=timeout)
        return read_object(resp)
    except Exception as exc:
        raise translate(exc, f"patch node {name} metadata") from exc


def patch_pod_status(api_client: k8s.ApiClient, namespace: str, name: str, status: Mapping[str, Any],
                     resource_version: str | None = None, timeout: float = 10.0) -> Obj:
    """Merge-patch `pods/status` (e.g. {"phase": "Running"}); returns the patched pod."""
    body: Obj = {"status": dict(status)}
    if resource_version:
        body["metadata"] = {"resourceVersion": str(resource_version)}
    try:
        resp = k8s.CoreV1Api(api_client).patch_namespaced_pod_status(
            name, namespace, body, _content_type=MERGE_PATCH, _preload_content=False, _request_timeout=timeout)
        return read_object(resp)
    except Exception as exc:
        raise translate(exc, f"patch pod {namespace}/{name} status") from exc
