"""Kubernetes API client factory with client-side rate limiting.

Called once per process by the scheduler extender, the device plugin and the tools. The official Python client has
no rate limiter (client-go has one, QPS 5 / burst 10); `make_api_client` adds a token bucket in front of every
request, with defaults sized for a scheduler (50 / 100). Objects are handled as plain dicts: call the generated
API methods with `_preload_content=False` and parse with `read_json`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from vgpu.errors import ConfigError

__all__ = ["RateLimitedApiClient", "TokenBucket", "make_api_client", "read_json", "read_object"]

log = logging.getLogger(__name__)

_SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class TokenBucket:
    """Token bucket: `burst` tokens at most, refilled at `qps` per second; `acquire` blocks until one is free.

    `clock` and `sleep` are injectable so that tests can count tokens without waiting.
    """

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if qps <= 0 or burst < 1:
            raise ConfigError(f"client rate limit: qps must be > 0 and burst >= 1 (got qps={qps}, burst={burst})")
        self.qps = float(qps)
        self.burst = int(burst)
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()
        self.granted = 0  # tokens handed out so far
        self.waited = 0.0  # total seconds callers were told to wait

    def _refill(self) -> None:
        now = self._clock()
        if now > self._last:
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now

    def try_acquire(self) -> bool:
        """Take a token if one is available now."""
        with self._lock:
            self._refill()
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                self.granted += 1
                return True
            return False

    def reserve(self) -> float:
        """Take a token, possibly borrowed from the future; return how long the caller must wait for it."""
        with self._lock:
            self._refill()
            self._tokens -= 1.0
            self.granted += 1
            wait = 0.0 if self._tokens >= 0 else -self._tokens / self.qps
            self.waited += wait
            return wait

    def acquire(self) -> None:
        """Block until a token is available (FIFO by reservation)."""
        wait = self.reserve()
        if wait > 0:
            self._sleep(wait)

    @property
    def available(self) -> float:
        """Tokens available now (negative when callers are queued)."""
        with self._lock:
            self._refill()
            return self._tokens


class RateLimitedApiClient(k8s.ApiClient):
    """kubernetes.client.ApiClient that takes a token from `rate_limiter` before every HTTP request."""

    def __init__(self, configuration: k8s.Configuration, rate_limiter: TokenBucket) -> None:
        super().__init__(configuration)
        self.rate_limiter = rate_limiter

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        self.rate_limiter.acquire()
        return super().call_api(*args, **kwargs)


def make_api_client(kubeconfig: str | None = None, qps: float = 50, burst: int = 100,
                    pool_size: int = 64) -> RateLimitedApiClient:
    """An ApiClient for `kubeconfig` (None: in-cluster config inside a pod, else the default kubeconfig)."""
    cfg = k8s.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(_SA_TOKEN):
            k8s_config.load_incluster_config(client_configuration=cfg)
        else:
            k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    except (k8s_config.ConfigException, OSError, TypeError, ValueError) as exc:
        raise ConfigError(f"kubeconfig {kubeconfig or '(default)'}: {exc}") from exc
    cfg.connection_pool_maxsize = max(pool_size, cfg.connection_pool_maxsize or 0)
    api = RateLimitedApiClient(cfg, TokenBucket(qps, burst))
    log.debug("api client host=%s qps=%s burst=%s", cfg.host, qps, burst)
    return api


def read_json(resp: Any) -> Any:
    """Read a `_preload_content=False` response completely, release its connection and parse it with orjson."""
    try:
        data = resp.data
    finally:
        resp.release_conn()
    return orjson.loads(data) if data else None


def read_object(resp: Any) -> dict[str, Any]:
    """`read_json` of a response that must be one JSON object (an API object); raises ValueError otherwise."""
    doc = read_json(resp)
    if not isinstance(doc, dict):
        raise ValueError(f"expected a JSON object from the API server, got {type(doc).__name__}")
    return doc
