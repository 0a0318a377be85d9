"""Kubernetes API client factory with client-side rate limiting and retries.

Called once per process by the scheduler extender, the device plugin and the tools. The official Python client has
no rate limiter (client-go has one, QPS 5 / burst 10); `make_api_client` adds a token bucket in front of every
request, with defaults sized for a scheduler (50 / 100), and `ApiRetry`: a request the API server turned away
(429, 503: not acted on, any method) or that failed in a way that is safe to repeat (500, 502, 504, a lost
connection, for reads and our idempotent patches) is retried with exponential backoff and jitter, honouring
Retry-After (capped), for a few seconds at most. Objects are handled as plain dicts: call the generated API methods
with `_preload_content=False` and parse with `read_json`.
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
from urllib3.util.retry import Retry

from vgpu.errors import ConfigError

__all__ = [
    "ApiRetry", "RateLimitedApiClient", "TokenBucket", "api_retry", "make_api_client", "read_json", "read_object",
]

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


class ApiRetry(Retry):
    """urllib3's Retry with the API server's semantics: 429 and 503 mean the request was not acted on, so any
    method may be sent again; other retryable failures only for reads, PUT, DELETE and PATCH (ours are merge
    patches of metadata, the same result however often applied), never for POST (a binding, an event)."""

    NOT_ACTED_ON = frozenset({429, 503})

    def is_retry(self, method: str, status_code: int, has_retry_after: bool = False) -> bool:
        if status_code in self.NOT_ACTED_ON:
            return bool(self.total)
        return bool(super().is_retry(method, status_code, has_retry_after))


def api_retry() -> ApiRetry:
    """The retry policy of our API clients: up to 5 retries (3 when the server cannot be reached), 0.2 s doubling
    to 3 s with 0.2 s of jitter, a Retry-After honoured up to 10 s."""
    return ApiRetry(total=5, connect=3, read=2, status=5, other=0, redirect=0, backoff_factor=0.2, backoff_max=3.0,
                    backoff_jitter=0.2, status_forcelist=(429, 500, 502, 503, 504), raise_on_status=False,
                    allowed_methods=frozenset({"GET", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"}),
                    respect_retry_after_header=True, retry_after_max=10)


class RateLimitedApiClient(k8s.ApiClient):
    """kubernetes.client.ApiClient that takes a token from `rate_limiter` before every HTTP request."""

    def __init__(self, configuration: k8s.Configuration, rate_limiter: TokenBucket) -> None:
        super().__init__(configuration)
        self.rate_limiter = rate_limiter

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        self.rate_limiter.acquire()
        return super().call_api(*args, **kwargs)


def make_api_client(kubeconfig: str | None = None, qps: float = 50, burst: int = 100,
                    pool_size: int = 64, retries: bool = True) -> RateLimitedApiClient:
    """An ApiClient for `kubeconfig` (None: in-cluster config inside a pod, else the default kubeconfig), retrying
    as `api_retry` says unless `retries` is False."""
    cfg = k8s.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(_SA_TOKEN):
            k8s_config.load_incluster_config(client_configuration=cfg)
        else:
            k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    except (k8s_config.ConfigException, OSError, TypeError, ValueError) as exc:
        raise ConfigError(f"kubeconfig {kubeconfig or '(default)'}: {exc}") from exc
    cfg.connection_pool_maxsize = max(pool_size, cfg.connection_pool_maxsize or 0)
    cfg.retries = api_retry() if retries else False
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
