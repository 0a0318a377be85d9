"""Error types of the Kubernetes access layer and the translation from the client's ApiException.

Callers (scheduler extender, device plugin) catch ConflictError / NotFoundError to decide between retry and
give-up; everything else is an ApiError. All derive from vgpu.errors.VGPUError.
"""

from __future__ import annotations

from typing import Any

import orjson

from vgpu.errors import VGPUError

__all__ = [
    "AlreadyExistsError",
    "ApiError",
    "ConflictError",
    "GoneError",
    "NotFoundError",
    "UnavailableError",
    "translate",
]


class ApiError(VGPUError):
    """The API server refused or failed a request; `status` is the HTTP code (0: no answer)."""

    def __init__(self, what: str, status: int = 0, reason: str = "", message: str = "",
                 retry_after: float | None = None) -> None:
        self.what = what
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after  # seconds the server's Retry-After asked for (None: it did not say)
        detail = f"{status} {reason}".strip() if status else "no answer"
        super().__init__(f"{what}: {detail}: {message}" if message else f"{what}: {detail}")


class ConflictError(ApiError):
    """409: a resourceVersion / uid precondition failed or the object changed (re-read and retry)."""


class AlreadyExistsError(ConflictError):
    """409 AlreadyExists on create."""


class NotFoundError(ApiError):
    """404: the object (or resource) does not exist."""


class GoneError(ApiError):
    """410: the requested resourceVersion is no longer available (relist)."""


class UnavailableError(ApiError):
    """The API server could not be reached (connection refused, timeout, reset)."""


def translate(exc: BaseException, what: str) -> ApiError:
    """Map a kubernetes-client / urllib3 exception to our error type; `what` names the object and the verb."""
    status = int(getattr(exc, "status", 0) or 0)
    if not status:
        return UnavailableError(what, 0, type(exc).__name__, str(exc))
    reason, message = str(getattr(exc, "reason", "") or ""), ""
    body: Any = getattr(exc, "body", None)
    if body:
        try:
            doc = orjson.loads(body)
            reason = doc.get("reason") or reason
            message = doc.get("message") or ""
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            message = str(body)[:200]
    if status == 409:
        cls: type[ApiError] = AlreadyExistsError if reason == "AlreadyExists" else ConflictError
    elif status == 404:
        cls = NotFoundError
    elif status == 410:
        cls = GoneError
    else:
        cls = ApiError
    return cls(what, status, reason, message, _retry_after(getattr(exc, "headers", None)))


def status_causes(exc: BaseException) -> list[str]:
    """The messages of a refusal's `details.causes` (a Status body; none when it has no such list): where the API
    server says which object refused, such as the PodDisruptionBudget behind a 429 to an eviction."""
    try:
        doc = orjson.loads(getattr(exc, "body", None) or b"")
        causes = doc["details"]["causes"]
        return [str(c["message"]) for c in causes if isinstance(c, dict) and c.get("message")]
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return []


def _retry_after(headers: Any) -> float | None:
    """The Retry-After of a response's headers in seconds (the delay form; None when absent or a date)."""
    try:
        value = headers.get("Retry-After") if headers is not None else None
        return float(value) if value is not None else None
    except (AttributeError, TypeError, ValueError):
        return None
