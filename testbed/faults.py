"""TEST INFRASTRUCTURE: faults the API-server stand-in (testbed/apiserver.py) injects on demand.

A test installs rules, in the process (`ApiServerStandIn.faults.set(...)`) or over HTTP for a stand-in that runs as
its own process (`POST /standin/faults` with `{"rules": [...]}`, `DELETE /standin/faults`, `GET /standin/faults`
for the rules and how often each one hit). Each request is matched against the rules in order; the first that
matches and is still live acts:

  error     answer `status` (a metav1.Status; 429 and 503 carry `Retry-After: retry_after`)
  delay     wait `seconds`, then serve the request as usual
  timeout   wait `seconds` without answering, then close the connection
  stall     (watches) send the response headers, then nothing at all for `seconds` (no events, no bookmarks),
            then end the stream: a watch that silently stops delivering
  drop      (watches) end the stream at once, with no event
  gone      (watches resuming from a resourceVersion) answer with an ERROR event carrying a 410 Status

A rule matches on the HTTP method (`*` for any), a regular expression searched in the path with query, whether
the request is a watch (`watch`: true, false, or null for both) and the bearer token (`token`, null for any). It
stays live for `times` hits (null: no limit) and `for_seconds` after it was installed (null: until removed).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ACTIONS", "FaultPlan", "FaultRule"]

ACTIONS = ("error", "delay", "timeout", "stall", "drop", "gone")


@dataclass(slots=True)
class FaultRule:
    """One fault and what it applies to (see the module docstring)."""

    action: str
    path: str = ""
    method: str = "*"
    watch: bool | None = None
    token: str | None = None
    status: int = 503
    retry_after: int | None = None
    seconds: float = 0.0
    times: int | None = None
    for_seconds: float | None = None
    hits: int = 0
    installed: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"fault action {self.action!r} is not one of {', '.join(ACTIONS)}")
        re.compile(self.path)

    def live(self, now: float) -> bool:
        """Whether the rule still acts."""
        if self.times is not None and self.hits >= self.times:
            return False
        return self.for_seconds is None or now - self.installed < self.for_seconds

    def matches(self, method: str, target: str, is_watch: bool, token: str) -> bool:
        """Whether the rule applies to this request."""
        return ((self.method == "*" or self.method == method)
                and (self.watch is None or self.watch == is_watch)
                and (self.token is None or self.token == token)
                and re.search(self.path, target) is not None)

    def view(self) -> dict[str, Any]:
        """The rule as JSON, with its hit count."""
        out = asdict(self)
        out.pop("installed")
        return out


class FaultPlan:
    """The stand-in's rules; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []

    def set(self, rules: Iterable[FaultRule | Mapping[str, Any]]) -> None:
        """Replace the rules (dicts are read as FaultRule fields); raises ValueError on a bad rule."""
        parsed = []
        for rule in rules:
            if isinstance(rule, FaultRule):
                parsed.append(rule)
                continue
            unknown = set(rule) - {"action", "path", "method", "watch", "token", "status", "retry_after", "seconds",
                                   "times", "for_seconds"}
            if unknown:
                raise ValueError(f"fault rule: unknown keys {sorted(unknown)}")
            parsed.append(FaultRule(**rule))
        with self._lock:
            self._rules = parsed

    def clear(self) -> None:
        """Remove every rule."""
        self.set(())

    def pick(self, method: str, target: str, is_watch: bool, token: str) -> FaultRule | None:
        """The first live rule matching this request, its hit counted; None when the request is served as usual."""
        now = time.monotonic()
        with self._lock:
            for rule in self._rules:
                if rule.live(now) and rule.matches(method, target, is_watch, token):
                    rule.hits += 1
                    return rule
        return None

    def view(self) -> list[dict[str, Any]]:
        """The rules as JSON with their hit counts."""
        with self._lock:
            return [rule.view() for rule in self._rules]
