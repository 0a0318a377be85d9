"""Kubernetes access for vgpu-sharing through the official `kubernetes` client.

Objects are plain dicts in API JSON form (camelCase), never client model objects. Modules: `client` (factory with
rate limiting), `cache` (list-then-watch caches), `patch` (metadata / status merge-patches), `binding`
(pods/binding with annotations), `eviction` (pods/eviction), `events` (event recorder), `leader` (Lease leader
election), `errors`.
"""

from vgpu.kube.binding import bind_pod
from vgpu.kube.cache import WatchCache
from vgpu.kube.client import make_api_client
from vgpu.kube.errors import AlreadyExistsError, ApiError, ConflictError, NotFoundError
from vgpu.kube.events import EventRecorder
from vgpu.kube.leader import LeaderElector, LeaseFollower
from vgpu.kube.patch import patch_node_metadata, patch_pod_metadata, patch_pod_status

__all__ = [
    "AlreadyExistsError",
    "ApiError",
    "ConflictError",
    "EventRecorder",
    "LeaderElector",
    "LeaseFollower",
    "NotFoundError",
    "WatchCache",
    "bind_pod",
    "make_api_client",
    "patch_node_metadata",
    "patch_pod_metadata",
    "patch_pod_status",
]
