"""HTTP front of the extender: the routes kube-scheduler calls, and nothing else.

POST /filter, /prioritize, /bind, /preempt take kube-scheduler's extender JSON (Go field names, any
capitalisation) and answer with orjson; GET /healthz is liveness, GET /readyz is 200 only while the caches have
synced and this replica leads. Unparseable JSON answers 400, a body over the cap 413, a well-formed but invalid
request 200 with `Error`; an unexpected exception is logged and also answered 200 with `Error`, never 500.
The four POST verbs are answered by the `ExtenderVerbs` ASGI middleware in front of FastAPI (see its docstring).
Built by `create_app`, whose lifespan also runs periodic housekeeping (the ledger's reservation expiry), served
by `serve` (uvicorn); started by `vgpu scheduler` (vgpu.scheduler.cli) and by tests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from vgpu.errors import VGPUError
from vgpu.scheduler.extender import Extender
from vgpu.scheduler.metrics import SchedulerMetrics

__all__ = ["DEFAULT_MAX_BODY", "ExtenderVerbs", "create_app", "make_uvicorn_server", "parse_listen", "serve"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 64 * 1024 * 1024


class _TooLarge(Exception):
    pass


def _filter_error(message: str) -> dict[str, Any]:
    return {"Nodes": None, "NodeNames": [], "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message}


class ExtenderVerbs:
    """Pure-ASGI middleware answering POST /filter, /prioritize, /bind and /preempt itself.

    FastAPI's request machinery costs about 1 ms per 40 KB body (a /filter with 1000 node names), half the
    /filter budget, so the four verbs are served here directly on uvicorn's receive/send; everything else
    (/healthz, /readyz, 404s) falls through to the FastAPI app.
    """

    def __init__(self, app: Any, extender: Extender, metrics: SchedulerMetrics | None, max_body: int) -> None:
        self.app = app
        self.max_body = max_body
        self.metrics = metrics
        self.routes: dict[str, tuple[str, Callable[[Any], Any], Callable[[str], Any], bool]] = {
            "/filter": ("filter", extender.filter, _filter_error, False),
            # HostPriorityList has no Error field; kube-scheduler ignores a failed prioritize, so [] it is.
            "/prioritize": ("prioritize", extender.prioritize, lambda message: [], False),
            "/bind": ("bind", extender.bind, lambda message: {"Error": message}, True),
            "/preempt": ("preempt", extender.preempt,
                         lambda message: {"NodeNameToMetaVictims": {}, "Error": message}, False),
        }

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        route = self.routes.get(scope.get("path", "")) if scope["type"] == "http" else None
        if route is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        verb, call, on_error, threaded = route
        start = time.perf_counter()
        status, payload, outcome = await self._answer(scope, receive, call, on_error, threaded, verb)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
        if self.metrics is not None:
            self.metrics.latency.labels(verb).observe(time.perf_counter() - start)
            self.metrics.requests.labels(verb, outcome).inc()

    async def _answer(self, scope: dict[str, Any], receive: Any, call: Callable[[Any], Any],
                      on_error: Callable[[str], Any], threaded: bool, verb: str) -> tuple[int, bytes, str]:
        try:
            body = await self._body(scope, receive)
        except _TooLarge:
            return 413, orjson.dumps({"Error": f"request body over {self.max_body} bytes"}), "too_large"
        try:
            args = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return 400, orjson.dumps({"Error": f"request body is not valid JSON: {exc}"}), "bad_json"
        try:
            result = await run_in_threadpool(call, args) if threaded else call(args)
        except VGPUError as exc:
            return 200, orjson.dumps(on_error(str(exc))), "invalid"
        except Exception as exc:
            log.exception("extender %s failed", verb)
            return 200, orjson.dumps(on_error(f"internal error: {type(exc).__name__}: {exc}")), "internal"
        outcome = "error" if isinstance(result, dict) and result.get("Error") else "ok"
        return 200, orjson.dumps(result), outcome

    async def _body(self, scope: dict[str, Any], receive: Any) -> bytes:
        for name, value in scope.get("headers") or ():
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body:
                raise _TooLarge
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        return b"".join(chunks)


async def _every(interval: float, job: Callable[[], Any]) -> None:
    """Run `job` every `interval` seconds until cancelled; a failing run is logged and the next one still comes."""
    while True:
        await asyncio.sleep(interval)
        try:
            job()
        except Exception:  # housekeeping must outlive a bad run
            log.exception("housekeeping failed")


def create_app(
    extender: Extender,
    ready: Callable[[], str] | None = None,
    metrics: SchedulerMetrics | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    housekeeping: Callable[[], Any] | None = None,
    housekeeping_interval: float = 1.0,
) -> FastAPI:
    """The FastAPI application serving `extender`; `ready()` returns "" when ready, else why not.

    `housekeeping` (the ledger's reservation expiry) runs every `housekeeping_interval` seconds while the server
    runs, so that reservations expire and metrics follow even when no request comes."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_every(housekeeping_interval, housekeeping)) if housekeeping else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task

    app = FastAPI(title="vgpu-scheduler extender", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    not_ready = ready or extender.ready
    app.add_middleware(ExtenderVerbs, extender=extender, metrics=metrics, max_body=max_body)

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(b"ok", media_type="text/plain")

    @app.get("/readyz")
    async def readyz() -> Response:
        reason = not_ready()
        if metrics is not None:
            metrics.ready.set(0 if reason else 1)
        if reason:
            return Response(f"not ready: {reason}".encode(), status_code=503, media_type="text/plain")
        return Response(b"ok", media_type="text/plain")

    return app


def parse_listen(value: str, default_port: int) -> tuple[str, int]:
    """'HOST:PORT', ':PORT' or 'HOST' -> (host, port); an empty host means all interfaces."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = value, str(default_port)
    host = host.strip("[]") or "0.0.0.0"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise VGPUError(f"listen address {value!r}: port must be 0..65535")
    return host, int(port)


def make_uvicorn_server(app: FastAPI, host: str, port: int, **kwargs: Any) -> Any:
    """A uvicorn.Server for `app` (quiet, no access log; uvloop/httptools when installed)."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            timeout_keep_alive=75, **kwargs)
    return uvicorn.Server(config)


def serve(app: FastAPI, host: str, port: int) -> None:
    """Serve `app` until SIGINT/SIGTERM."""
    server = make_uvicorn_server(app, host, port)
    asyncio.run(server.serve())
