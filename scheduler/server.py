"""HTTP front of the extender: the routes kube-scheduler calls, and nothing else.

POST /filter, /prioritize, /bind, /preempt take kube-scheduler's extender JSON (Go field names, any
capitalisation) and answer with orjson; GET /healthz is liveness (503 once a replica that should serve has not been
ready for long), GET /readyz is 200 only while the caches have synced and this replica leads. Unparseable JSON
answers 400, a body over the cap 413, a well-formed but invalid request 200 with `Error`; an unexpected exception
is logged and also answered 200 with `Error`, never 500.
The four POST verbs are answered by the `ExtenderVerbs` ASGI middleware in front of FastAPI (see its docstring);
bodies over INLINE_PARSE_BYTES are parsed on a worker thread, LARGE_BODIES_AT_ONCE at a time.
Built by `create_app`, whose lifespan also runs periodic housekeeping (the ledger's reservation expiry), served
by uvicorn (vgpu.httpserve.make_uvicorn_server, with HTTPS and client certificates when configured); started by
`vgpu scheduler` (vgpu.scheduler.cli) and by tests.
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
from vgpu.units import KIB, MIB

__all__ = ["DEFAULT_MAX_BODY", "ExtenderVerbs", "create_app"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 4 * MIB
INLINE_PARSE_BYTES = 256 * KIB  # bodies up to this size are parsed on the event loop (a /filter of 5,000 names)
# Larger bodies are parsed and answered this many at a time, once read whole: parsed JSON can take ~25x the body's
# size (a 4 MiB body of `{"a":[]}` items is 110 MiB of objects), so that concurrent ones do not multiply it past the
# memory limit. The gate is taken only after the body has arrived, so that a sender who stalls holds none of it.
# kube-scheduler sends one /filter or /prioritize at a time.
LARGE_BODIES_AT_ONCE = 2
# Seconds a client has to send a request's body once its headers are in (the headers' own deadline is
# vgpu.httpserve.HEADER_SECONDS); kube-scheduler gives up on a call after its httpTimeout (10 s in deploy/).
BODY_SECONDS = 10.0


class _TooLarge(Exception):
    pass


class _LargeBodySlot:
    """One request's claim on the shared gate for large bodies: taken before such a body is read on, held until it
    is answered, released once (`release` is safe to call when nothing was taken)."""

    def __init__(self, gate: asyncio.Semaphore) -> None:
        self.gate = gate
        self.held = False

    async def take(self) -> None:
        if not self.held:
            await self.gate.acquire()
            self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.gate.release()


def _filter_error(message: str) -> dict[str, Any]:
    return {"Nodes": None, "NodeNames": [], "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message}


class ExtenderVerbs:
    """Pure-ASGI middleware answering POST /filter, /prioritize, /bind and /preempt itself.

    FastAPI's request machinery costs about 1 ms per 40 KB body (a /filter with 1000 node names), half the
    /filter budget, so the four verbs are served here directly on uvicorn's receive/send; everything else
    (/healthz, /readyz, 404s) falls through to the FastAPI app. A body over `max_body` is answered 413 unread
    (declared) or as soon as it passes the cap (streamed), one not received within BODY_SECONDS 408; bodies over
    INLINE_PARSE_BYTES are parsed on a worker thread, at most LARGE_BODIES_AT_ONCE of them in flight.
    """

    def __init__(self, app: Any, extender: Extender, metrics: SchedulerMetrics | None, max_body: int) -> None:
        self.app = app
        self.max_body = max_body
        self.metrics = metrics
        self.large_bodies = asyncio.Semaphore(LARGE_BODIES_AT_ONCE)
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
        slot = _LargeBodySlot(self.large_bodies)
        try:
            status, payload, outcome, decision = await self._answer(scope, receive, call, on_error, threaded, verb,
                                                                    slot)
        finally:
            slot.release()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
        if self.metrics is not None:
            self.metrics.latency.labels(verb).observe(time.perf_counter() - start)
            self.metrics.requests.labels(verb, outcome).inc()
            if decision:
                self.metrics.decisions.labels(verb, decision).inc()

    async def _answer(self, scope: dict[str, Any], receive: Any, call: Callable[[Any], Any],
                      on_error: Callable[[str], Any], threaded: bool, verb: str,
                      slot: _LargeBodySlot) -> tuple[int, bytes, str, str]:
        """Status, body, outcome and decision (_decision) of one call."""
        try:
            body = await asyncio.wait_for(self._body(scope, receive), BODY_SECONDS)
        except _TooLarge:
            return 413, orjson.dumps({"Error": f"request body over {self.max_body} bytes"}), "too_large", ""
        except TimeoutError:
            return 408, orjson.dumps({"Error": f"request body not received within {BODY_SECONDS:g} s"}), "slow", ""
        if len(body) > INLINE_PARSE_BYTES:
            await slot.take()
        try:
            # a large body is parsed on a worker thread so that it never holds up the event loop
            inline = len(body) <= INLINE_PARSE_BYTES
            args = orjson.loads(body) if inline else await run_in_threadpool(orjson.loads, body)
        except orjson.JSONDecodeError as exc:
            return 400, orjson.dumps({"Error": f"request body is not valid JSON: {exc}"}), "bad_json", ""
        try:
            result = await run_in_threadpool(call, args) if threaded else call(args)
        except VGPUError as exc:
            return 200, orjson.dumps(on_error(str(exc))), "invalid", ""
        except Exception as exc:
            log.exception("extender %s failed", verb)
            return 200, orjson.dumps(on_error(f"internal error: {type(exc).__name__}: {exc}")), "internal", ""
        outcome = "error" if isinstance(result, dict) and result.get("Error") else "ok"
        return 200, orjson.dumps(result), outcome, _decision(verb, result)

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


def _decision(verb: str, result: Any) -> str:
    """What a filter or bind answer decided ("" for other verbs and for answers that carry an Error about the
    request rather than the pod)."""
    if not isinstance(result, dict):
        return ""
    if verb == "bind":
        return "refused" if result.get("Error") else "bound"
    if verb == "filter" and not result.get("Error"):
        return "placed" if result.get("NodeNames") or (result.get("Nodes") or {}).get("items") else "unschedulable"
    return ""


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
    stuck: Callable[[], str] | None = None,
) -> ExtenderVerbs:
    """The ASGI application serving `extender`: the verbs, in front of a FastAPI application for the rest;
    `ready()` returns "" when ready, else why not.

    `housekeeping` (the ledger's reservation expiry) runs every `housekeeping_interval` seconds while the server
    runs, so that reservations expire and metrics follow even when no request comes. `stuck()` returns "" while
    the process is live, else why it should be restarted (GET /healthz then answers 503)."""

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

    @app.get("/healthz")
    async def healthz() -> Response:
        reason = stuck() if stuck is not None else ""
        if reason:
            return Response(f"unhealthy: {reason}".encode(), status_code=503, media_type="text/plain")
        return Response(b"ok", media_type="text/plain")

    @app.get("/readyz")
    async def readyz() -> Response:
        reason = not_ready()
        if metrics is not None:
            metrics.ready.set(0 if reason else 1)
        if reason:
            return Response(f"not ready: {reason}".encode(), status_code=503, media_type="text/plain")
        return Response(b"ok", media_type="text/plain")

    # outside FastAPI's own layers (error handling, body limit, telemetry): a verb passes through none of them
    return ExtenderVerbs(app, extender=extender, metrics=metrics, max_body=max_body)
