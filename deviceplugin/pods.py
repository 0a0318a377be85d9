"""The node-scoped pod view of the device plugin: a WatchCache of pods with `spec.nodeName=<node>`.

Implements matching.PodSource over vgpu.kube: `pods()` reads the cache, `refresh()` lists from the API server (used
on a cache miss; the cache stands in when the list fails), `list_fresh()` lists or raises (the clean-up runs only on
a fresh list), `patch_annotations` merge-patches a pod.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s

from vgpu.kube.cache import WatchCache
from vgpu.kube.client import read_json
from vgpu.kube.errors import ApiError, translate
from vgpu.kube.patch import patch_pod_metadata

__all__ = ["NodePods"]

log = logging.getLogger(__name__)


class NodePods:
    """Pods bound to one node."""

    def __init__(self, api_client: k8s.ApiClient, node_name: str) -> None:
        self.api = api_client
        self.node_name = node_name
        self.selector = f"spec.nodeName={node_name}"
        self.cache = WatchCache(api_client, "pods", field_selector=self.selector, name=f"pods[{node_name}]")

    def start(self, timeout: float = 10.0) -> NodePods:
        """Start the cache and wait (bounded) for its first list."""
        self.cache.start()
        if not self.cache.wait_synced(timeout):
            log.warning("event=pod_cache_not_synced node=%s", self.node_name)
        return self

    def stop(self) -> None:
        """Stop the cache."""
        self.cache.stop()

    def pods(self) -> list[dict[str, Any]]:
        """Cached pods on this node."""
        return self.cache.list()

    def refresh(self) -> list[dict[str, Any]]:
        """Pods on this node listed from the API server now (falls back to the cache on error)."""
        try:
            return self.list_fresh()
        except ApiError as exc:
            log.warning("event=pod_list_failed node=%s error=%s", self.node_name, exc)
            return self.cache.list()

    def list_fresh(self) -> list[dict[str, Any]]:
        """Pods on this node listed from the API server now; raises ApiError when it cannot answer."""
        try:
            resp = k8s.CoreV1Api(self.api).list_pod_for_all_namespaces(
                field_selector=self.selector, _preload_content=False, _request_timeout=10
            )
            doc = read_json(resp)
        except Exception as exc:
            raise translate(exc, f"list pods on node {self.node_name}") from exc
        if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
            raise ApiError(f"list pods on node {self.node_name}", message="the answer is not a pod list")
        return list(doc["items"])

    def patch_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        """Merge-patch annotations of a pod; raises ApiError."""
        patch_pod_metadata(self.api, namespace, name, annotations=annotations)
