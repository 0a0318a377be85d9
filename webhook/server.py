"""HTTPS front of the admission webhook: `POST /mutate-pods` answers admission.k8s.io/v1 AdmissionReview, and
`GET /healthz` says it is up.

kube-apiserver sends an AdmissionReview whose `request` names the object; the answer echoes the request's uid,
allows the object and carries the JSON Patch of `mutation.mutate_pod`, base64-encoded, when there is one. A pod
whose vGPU requests cannot be read is refused (`allowed: false`, code 400, the reason in one line). A body that is
not an AdmissionReview v1 gets 400 and a one-line reason (kube-apiserver then applies the webhook's failurePolicy),
a body over MAX_BODY gets 413 and one not received within BODY_SECONDS 408; nothing answers 500. Requests for other
resources or operations are allowed unchanged.

Anyone in the cluster can reach the webhook, so one client must not hold up the reviews of others (kube-apiserver
gives each review `timeoutSeconds`, then admits the pod unmutated under failurePolicy Ignore): a body over
INLINE_PARSE_BYTES is parsed and reviewed on a worker thread, LARGE_BODIES_AT_ONCE at a time, and a pod of more than
MAX_CONTAINERS containers is refused before any of them is read.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from vgpu.errors import RequestError
from vgpu.units import KIB, MIB
from vgpu.webhook.mutation import MutationSettings, mutate_pod

__all__ = ["BODY_SECONDS", "MAX_BODY", "MAX_CONTAINERS", "create_app", "review_answer"]

log = logging.getLogger(__name__)

# kube-apiserver stores objects of at most 1.5 MiB (etcd's default request limit); a review of a creation carries
# the object once, with a little around it, so 3 MiB leaves room without letting a client fill memory.
MAX_BODY = 3 * MIB
# Seconds a client has to send the body once its headers are in (the headers' own deadline is
# vgpu.httpserve.HEADER_SECONDS); kube-apiserver's timeoutSeconds for this webhook is 5.
BODY_SECONDS = 5.0
INLINE_PARSE_BYTES = 64 * KIB  # reviews up to this size are answered on the event loop (a pod of ~50 containers)
LARGE_BODIES_AT_ONCE = 2  # larger ones, on worker threads, this many at a time, once received whole
# containers, init containers and ephemeral containers of one pod: far above what pods have (kube-apiserver sets
# no limit), far below what keeps a review within kube-apiserver's timeout
MAX_CONTAINERS = 256
_REVIEW_VERSION = "admission.k8s.io/v1"


class _BadReview(Exception):
    pass


def _json(code: int, body: Any) -> Response:
    return Response(orjson.dumps(body), status_code=code, media_type="application/json")


def _request_of(review: Any) -> dict[str, Any]:
    """The `request` of an AdmissionReview v1; raises _BadReview naming what is missing."""
    if not isinstance(review, dict):
        raise _BadReview("the body is not a JSON object")
    if review.get("apiVersion") != _REVIEW_VERSION or review.get("kind") != "AdmissionReview":
        raise _BadReview(f"expected apiVersion {_REVIEW_VERSION} and kind AdmissionReview, got "
                         f"{review.get('apiVersion')!r} and {review.get('kind')!r}")
    request = review.get("request")
    if not isinstance(request, dict):
        raise _BadReview("the review has no request")
    if not isinstance(request.get("uid"), str) or not request["uid"]:
        raise _BadReview("the review's request has no uid")
    return request


def review_answer(review: Any, settings: MutationSettings) -> dict[str, Any]:
    """The AdmissionReview that answers `review`; raises _BadReview when it is not one."""
    request = _request_of(review)
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    resource = request.get("resource") or {}
    is_pod_create = (request.get("operation") == "CREATE" and isinstance(resource, dict)
                     and resource.get("group", "") == "" and resource.get("resource") == "pods"
                     and not request.get("subResource"))
    obj = request.get("object")
    if is_pod_create and isinstance(obj, dict):
        spec = obj.get("spec")
        lists = [spec.get(field) for field in ("containers", "initContainers", "ephemeralContainers")] \
            if isinstance(spec, dict) else []
        count = sum(len(items) for items in lists if isinstance(items, list))
        if count > MAX_CONTAINERS:
            message = f"the pod has {count} containers, over the {MAX_CONTAINERS} the vGPU webhook reviews"
            response.update(allowed=False, status={"code": 400, "reason": "BadRequest", "message": message})
            log.info("pod refused namespace=%s reason=%r", request.get("namespace"), message)
            return {"apiVersion": _REVIEW_VERSION, "kind": "AdmissionReview", "response": response}
        try:
            patch = mutate_pod(obj, settings)
        except RequestError as exc:
            response.update(allowed=False, status={"code": 400, "reason": "BadRequest", "message": str(exc)})
            log.info("pod refused namespace=%s name=%s reason=%r", request.get("namespace"),
                     request.get("name") or (obj.get("metadata") or {}).get("generateName"), str(exc))
        else:
            if patch:
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
                log.debug("pod opted in namespace=%s name=%s operations=%d", request.get("namespace"),
                          request.get("name"), len(patch))
    return {"apiVersion": _REVIEW_VERSION, "kind": "AdmissionReview", "response": response}


async def _read_body(request: Request) -> bytes | None:
    """The body, or None when it is over MAX_BODY (read no further)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _answer(body: bytes, settings: MutationSettings) -> tuple[int, dict[str, Any]]:
    """Status and JSON answer of one received body."""
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return 400, {"error": f"the body is not JSON: {exc}"}
    try:
        return 200, review_answer(review, settings)
    except _BadReview as exc:
        return 400, {"error": str(exc)}
    except Exception as exc:  # a bug: refuse this review (failurePolicy decides), keep serving, never 500
        log.exception("review failed")
        return 400, {"error": f"unexpected {type(exc).__name__}: {exc}"}


def create_app(settings: MutationSettings) -> Starlette:
    """The webhook's ASGI application."""
    large = asyncio.Semaphore(LARGE_BODIES_AT_ONCE)  # made on the serving loop's first use (Python 3.10+)

    async def mutate_pods(request: Request) -> Response:
        try:
            body = await asyncio.wait_for(_read_body(request), BODY_SECONDS)
        except TimeoutError:
            return _json(408, {"error": f"the body was not received within {BODY_SECONDS:g} s"})
        if body is None:
            return _json(413, {"error": f"the body is over {MAX_BODY} bytes"})
        if len(body) <= INLINE_PARSE_BYTES:
            code, answer = _answer(body, settings)
        else:
            async with large:
                code, answer = await run_in_threadpool(_answer, body, settings)
        return _json(code, answer)

    async def healthz(_: Request) -> Response:
        return Response("ok", media_type="text/plain")

    return Starlette(routes=[Route("/mutate-pods", mutate_pods, methods=["POST"]),
                             Route("/healthz", healthz, methods=["GET"])])
