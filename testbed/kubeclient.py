"""TEST INFRASTRUCTURE: the official `kubernetes` client as the stand-ins use it, without the product's API access
layer (its rate limiter and retries): an ApiClient from a kubeconfig, and plain-dict objects from raw responses."""

from __future__ import annotations

from typing import Any

import orjson
from kubernetes import client as k8s
from kubernetes import config as k8s_config

__all__ = ["api_client", "read_json"]


def api_client(kubeconfig: str | None, pool_size: int = 16) -> k8s.ApiClient:
    """An ApiClient for `kubeconfig` (None: the default kubeconfig)."""
    cfg = k8s.Configuration()
    k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    cfg.connection_pool_maxsize = pool_size
    return k8s.ApiClient(cfg)


def read_json(resp: Any) -> Any:
    """The JSON document of a `_preload_content=False` response, its connection released."""
    try:
        data = resp.data
    finally:
        resp.release_conn()
    return orjson.loads(data) if data else None
