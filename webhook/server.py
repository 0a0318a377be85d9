"""HTTPS front of the admission webhook: `POST /mutate-pods` answers admission.k8s.io/v1 AdmissionReview, and
`GET /healthz` says it is up.

kube-apiserver sends an AdmissionReview whose `request` names the object; the answer echoes the request's uid,
allows the object and carries the JSON Patch of `mutation.mutate_pod`, base64-encoded, when there is one. A pod
whose vGPU requests cannot be read is refused (`allowed: false`, code 400, the reason in one line). A body that is
not an AdmissionReview v1 gets 400 and a one-line reason (kube-apiserver then applies the webhook's failurePolicy),
a body over MAX_BODY gets 413; nothing answers 500. Requests for other resources or operations are allowed
unchanged.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from vgpu.errors import RequestError
from vgpu.webhook.mutation import MutationSettings, mutate_pod

__all__ = ["MAX_BODY", "create_app", "review_answer"]

log = logging.getLogger(__name__)

# kube-apiserver stores objects of at most 1.5 MiB (etcd's default request limit); a review carries the object
# (and for updates the old one too) in JSON, so 8 MiB leaves room without letting a client fill memory.
MAX_BODY = 8 * 1024 * 1024
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


def create_app(settings: MutationSettings) -> Starlette:
    """The webhook's ASGI application."""

    async def mutate_pods(request: Request) -> Response:
        body = await _read_body(request)
        if body is None:
            return _json(413, {"error": f"the body is over {MAX_BODY} bytes"})
        try:
            review = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return _json(400, {"error": f"the body is not JSON: {exc}"})
        try:
            return _json(200, review_answer(review, settings))
        except _BadReview as exc:
            return _json(400, {"error": str(exc)})
        except Exception as exc:  # a bug: refuse this review (failurePolicy decides), keep serving, never 500
            log.exception("review failed")
            return _json(400, {"error": f"unexpected {type(exc).__name__}: {exc}"})

    async def healthz(_: Request) -> Response:
        return Response("ok", media_type="text/plain")

    return Starlette(routes=[Route("/mutate-pods", mutate_pods, methods=["POST"]),
                             Route("/healthz", healthz, methods=["GET"])])
