"""Kubernetes event recorder (core/v1 Event), fire-and-forget.

Used by the scheduler extender (FilteringFailed, BindingSucceeded, ...) and the device plugin (allocation results).
`event()` never blocks on the network and never raises: it enqueues, and a background thread creates the Event.
Repeats of the same (object, type, reason, message) are aggregated the way kubectl shows them: the first creates
an Event, later ones bump `count` and `lastTimestamp` of that Event with one merge-patch; repeats that arrive while
the previous one is still queued are coalesced into it without any API call. Failures are logged, not raised.

What is kept to aggregate repeats is bounded three ways: at most `cache_size` Events, none older than
`aggregate_window` (its repeats would create a new Event anyway), and none about an object the caller has reported
gone with `forget` (the scheduler extender does so for every deleted pod: most pods get one event, so without it
the memory of a busy extender would fill with Events of pods that no longer exist).
"""

from __future__ import annotations

import collections
import logging
import socket
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s

from vgpu.kube.client import read_json
from vgpu.kube.errors import NotFoundError, translate

__all__ = ["EventRecorder"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
_Key = tuple[str, str, str, str, str, str, str]  # the object (_Object), then type, reason and message
_Object = tuple[str, str, str, str]  # kind, namespace, name, uid


def _ts(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Records events about pods and nodes for `component` (the Event's source.component)."""

    def __init__(self, api_client: k8s.ApiClient, component: str, *, host: str | None = None,
                 max_queue: int = 1000, cache_size: int = 4096, aggregate_window: float = 600.0) -> None:
        self.component = component
        self.host = host or socket.gethostname()
        self.max_queue = max_queue
        self.cache_size = cache_size
        self.aggregate_window = aggregate_window
        self._core = k8s.CoreV1Api(api_client)
        self._cond = threading.Condition()
        self._pending: collections.OrderedDict[_Key, list[Any]] = collections.OrderedDict()  # key -> [obj-ref, n, t]
        # Events created, least recently sent first: key -> (name, namespace, count, creation time); written by the
        # sender thread only, under `_cond`
        self._sent: collections.OrderedDict[_Key, tuple[str, str, int, float]] = collections.OrderedDict()
        self._sent_by: dict[_Object, set[_Key]] = {}  # the keys of `_sent` by object
        self._gone: set[_Object] = set()  # objects `forget` reported whose Events the sender thread has not dropped
        self._busy = False
        self._closed = False
        self.created = 0
        self.updated = 0
        self.dropped = 0
        self.failed = 0
        self._thread = threading.Thread(target=self._run, name=f"events-{component}", daemon=True)
        self._thread.start()

    def event(self, obj: Mapping[str, Any], type: str, reason: str, message: str, kind: str | None = None) -> None:
        """Record an event about `obj` (API dict); `type` is "Normal" or "Warning". Never raises, never blocks."""
        try:
            ref = _ref(obj, kind)
            key: _Key = (ref["kind"], ref["namespace"], ref["name"], ref["uid"], type, reason, message)
            with self._cond:
                if self._closed:
                    return
                entry = self._pending.get(key)
                if entry is not None:
                    entry[1] += 1
                    entry[2] = time.time()
                    return
                if len(self._pending) >= self.max_queue:
                    self.dropped += 1
                    log.debug("event dropped (queue full) reason=%s object=%s", reason, ref["name"])
                    return
                self._pending[key] = [ref, 1, time.time()]
                self._cond.notify()
        except Exception:
            log.exception("event recording failed reason=%s", reason)

    def normal(self, obj: Mapping[str, Any], reason: str, message: str, kind: str | None = None) -> None:
        """Record a Normal event."""
        self.event(obj, "Normal", reason, message, kind)

    def warning(self, obj: Mapping[str, Any], reason: str, message: str, kind: str | None = None) -> None:
        """Record a Warning event."""
        self.event(obj, "Warning", reason, message, kind)

    def forget(self, obj: Mapping[str, Any], kind: str | None = None) -> None:
        """`obj` (API dict, as given to `event`) is gone: drop the Events kept to aggregate its repeats, once its
        queued events are sent. Never raises, never blocks on the network."""
        try:
            ref = _ref(obj, kind)
            gone: _Object = (ref["kind"], ref["namespace"], ref["name"], ref["uid"])
            with self._cond:
                # the sender thread is woken only when something about the object may be kept, queued or in flight
                if not self._closed and (gone in self._sent_by or self._pending or self._busy):
                    self._gone.add(gone)
                    self._cond.notify()
        except Exception:
            log.exception("forgetting an object's events failed")

    @property
    def remembered(self) -> int:
        """How many Events are kept to aggregate repeats into."""
        with self._cond:
            return len(self._sent)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued has been sent (or failed) and every `forget` applied; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._busy or self._gone:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (up to `timeout`) and stop the thread."""
        self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._gone and not self._closed:
                    self._cond.wait()
                if self._gone:
                    self._drop_gone()
                if not self._pending:
                    if self._closed:
                        return
                    continue
                key, (ref, n, last) = self._pending.popitem(last=False)
                self._busy = True
            try:
                self._send(key, ref, n, last)
            except Exception as exc:
                self.failed += 1
                log.warning("event not recorded reason=%s object=%s/%s error=%s", key[5], ref["namespace"],
                            ref["name"], exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _send(self, key: _Key, ref: Obj, n: int, last: float) -> None:
        _kind, ns, name, _uid, type_, reason, message = key
        event_ns = ns or "default"
        prior = self._sent.get(key)
        if prior is not None and last - prior[3] <= self.aggregate_window:
            ev_name, ev_ns, count, first = prior
            patch: Any = {"count": count + n, "lastTimestamp": _ts(last)}
            try:
                read_json(self._core.patch_namespaced_event(ev_name, ev_ns, patch,
                                                            _content_type="application/merge-patch+json",
                                                            _preload_content=False, _request_timeout=10))
                self._remember(key, (ev_name, ev_ns, count + n, first))
                self.updated += 1
                return
            except Exception as exc:
                if not isinstance(translate(exc, "patch event"), NotFoundError):
                    raise translate(exc, f"patch event {ev_ns}/{ev_name}") from exc
        now = time.time()
        ev_name = f"{name}.{time.time_ns():x}"
        body: Any = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": ev_name, "namespace": event_ns},
            "involvedObject": {k: v for k, v in ref.items() if v},
            "reason": reason, "message": message[:1024], "type": type_, "count": n,
            "firstTimestamp": _ts(now), "lastTimestamp": _ts(last), "eventTime": None,
            "source": {"component": self.component, "host": self.host},
            "reportingComponent": self.component, "reportingInstance": self.host,
        }
        try:
            read_json(self._core.create_namespaced_event(event_ns, body, _preload_content=False,
                                                         _request_timeout=10))
        except Exception as exc:
            raise translate(exc, f"create event {event_ns}/{ev_name}") from exc
        self._remember(key, (ev_name, event_ns, n, now))
        self.created += 1

    def _drop_gone(self) -> None:
        """Drop the kept Events of the objects reported gone, except those with events still queued (called with
        `_cond` held, on the sender thread, so that no send is in flight)."""
        queued = {key[:4] for key in self._pending}
        for gone in self._gone - queued:
            for key in self._sent_by.pop(gone, ()):
                del self._sent[key]
        self._gone &= queued
        self._cond.notify_all()

    def _remember(self, key: _Key, value: tuple[str, str, int, float]) -> None:
        """Keep the Event of `key` for its repeats, and drop the least recently sent ones past `cache_size` or
        older than `aggregate_window`."""
        oldest = time.time() - self.aggregate_window
        with self._cond:
            self._sent[key] = value
            self._sent.move_to_end(key)
            self._sent_by.setdefault(key[:4], set()).add(key)
            while self._sent:
                first = next(iter(self._sent.items()))
                if len(self._sent) <= self.cache_size and first[1][3] >= oldest:
                    break
                self._drop_key(first[0])

    def _drop_key(self, key: _Key) -> None:
        del self._sent[key]
        obj: _Object = key[:4]
        keys = self._sent_by.get(obj)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._sent_by[obj]


def _ref(obj: Mapping[str, Any], kind: str | None) -> dict[str, str]:
    """The involvedObject reference of `obj` (every field present, "" where unknown)."""
    meta = obj.get("metadata") or {}
    kind = kind or obj.get("kind") or ("Pod" if meta.get("namespace") else "Node")
    return {"kind": kind, "apiVersion": obj.get("apiVersion", "v1"), "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""), "uid": meta.get("uid", "")}
