"""List-then-watch caches of nodes, pods, ResourceQuotas, and DRA ResourceSlices and ResourceClaims (plain dicts),
the informer of vgpu-sharing.

Used by the scheduler extender (all nodes, all pods: usage ledger) and by the device plugin (its node's pods, via
`field_selector="spec.nodeName=<node>"`). One thread per cache: it lists, then watches from the list's
resourceVersion, resumes from the last seen resourceVersion after a dropped or timed-out watch, relists on
410 Gone (emitting the adds, updates and deletes the relist implies, so handlers stay consistent with the store),
and backs off exponentially with jitter while the API server is unreachable.

A watch can also go silent without ending (a proxy or an API server that stops delivering). A progress check
(`progress_interval`, default 5 s) notices it: once the open watch has delivered nothing, not even a bookmark, for
`stall_after` (default 150 s), it asks the API server for the collection's current resourceVersion (a list of one
object); when that is newer than what the watch delivered at two checks in a row, the watch is closed and resumed
from its last resourceVersion (a 410 then relists). Silence alone proves nothing, and neither does a newer list
resourceVersion: a list's resourceVersion is etcd's revision, shared by every object of every kind
(staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go `GetList`), so it moves whenever anything in the cluster
changes while a watch of quiet nodes, slices or one node's pods rightly delivers nothing. What a live watch does
deliver is a BOOKMARK about once a minute (kube-apiserver's watch cache, staging/src/k8s.io/apiserver/pkg/storage/
cacher/cacher.go `defaultBookmarkFrequency`, to watchers that allow bookmarks, as these do), so a watch silent for
well over that while the cluster moved on is taken as stalled.

Handlers run in order on the cache thread: on_add(obj), on_update(old, new), on_delete(obj). They must be quick
and must not mutate the dicts they receive (the cache shares them). A handler that raises is logged and skipped.
`wait_for` lets a reader wait a moment for an object whose watch event is on its way (the scheduler extender's
/filter of a pod created a moment ago), instead of reading it from the API server.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
from kubernetes import client as k8s

from vgpu.kube.client import read_json
from vgpu.kube.errors import GoneError, translate

__all__ = ["Backoff", "WatchCache"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
AddHandler = Callable[[Obj], None]
UpdateHandler = Callable[[Obj, Obj], None]
DeleteHandler = Callable[[Obj], None]


class Backoff:
    """Exponential backoff with full jitter between `base` and `cap` seconds."""

    def __init__(self, base: float = 0.2, cap: float = 10.0, rng: random.Random | None = None) -> None:
        self.base, self.cap = base, cap
        self.attempt = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        """Seconds to wait before the next attempt."""
        ceiling = min(self.cap, self.base * (2 ** self.attempt))
        self.attempt += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        """Back to the first step after a success."""
        self.attempt = 0


class _Expired(Exception):
    pass


KINDS = ("pods", "nodes", "resourceslices", "resourceclaims", "resourcequotas")
NAMESPACED = ("pods", "resourceclaims", "resourcequotas")


def _key_of(kind: str, obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}" if kind in NAMESPACED else str(meta.get("name", ""))


def _rv_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


class WatchCache:
    """A list-then-watch cache of `kind` (`KINDS`: pods, nodes, resourcequotas, resource.k8s.io/v1 resourceslices
    and resourceclaims); keys are "ns/name" for namespaced kinds, "name" for the others."""

    def __init__(self, api_client: k8s.ApiClient, kind: str = "pods", *, field_selector: str | None = None,
                 label_selector: str | None = None, namespace: str | None = None,
                 on_add: AddHandler | None = None, on_update: UpdateHandler | None = None,
                 on_delete: DeleteHandler | None = None, watch_timeout: int = 300,
                 backoff: Backoff | None = None, name: str | None = None, progress_interval: float = 5.0,
                 stall_after: float = 150.0) -> None:
        if kind not in KINDS:
            raise ValueError(f"WatchCache kind must be one of {', '.join(KINDS)}, not {kind!r}")
        if kind not in NAMESPACED and namespace:
            raise ValueError(f"{kind} are cluster-scoped: no namespace")
        self.kind = kind
        self.field_selector = field_selector
        self.label_selector = label_selector
        self.namespace = namespace
        self.watch_timeout = watch_timeout
        self.progress_interval = progress_interval  # 0: no progress check
        # the silence after which a watch that is behind counts as stalled (see the module docstring)
        self.stall_after = stall_after
        self.name = name or f"watch-{kind}" + (f"[{field_selector}]" if field_selector else "")
        self._core = k8s.CoreV1Api(api_client)
        self._resource = k8s.ResourceV1Api(api_client)
        self._handlers: list[tuple[AddHandler | None, UpdateHandler | None, DeleteHandler | None]] = []
        if on_add or on_update or on_delete:
            self._handlers.append((on_add, on_update, on_delete))
        self._store: dict[str, Obj] = {}
        self._lock = threading.RLock()
        self._arrived = threading.Condition(self._lock)  # notified when a new key is stored
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp: Any = None
        self._backoff = backoff or Backoff()
        self.resource_version = ""
        self.relists = 0  # how many lists were done (the first one included)
        self.watches = 0  # how many watch requests were started
        self.errors = 0  # failed list/watch attempts
        self.stalls = 0  # silent watches the progress check closed
        self._last_event = time.monotonic()  # when the open watch last delivered anything

    # -- public API
    def add_handlers(self, on_add: AddHandler | None = None, on_update: UpdateHandler | None = None,
                     on_delete: DeleteHandler | None = None) -> None:
        """Register handlers; call before start() to see every object's add."""
        self._handlers.append((on_add, on_update, on_delete))

    def start(self) -> WatchCache:
        """Start the cache thread."""
        if self._thread is not None:
            raise RuntimeError(f"{self.name} already started")
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        if self.progress_interval > 0:
            threading.Thread(target=self._check_progress, name=f"{self.name}-progress", daemon=True).start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (interrupts a blocked watch)."""
        self._stop.set()
        resp = self._resp
        if resp is not None:
            try:
                resp.shutdown()
            except Exception:
                pass
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Block until the first list has been applied; False on timeout."""
        return self._synced.wait(timeout)

    @property
    def synced(self) -> bool:
        """True once the first list has been applied."""
        return self._synced.is_set()

    def get(self, key: str) -> Obj | None:
        """The object with `key` ("ns/name" or "name"), or None."""
        with self._lock:
            return self._store.get(key)

    def wait_for(self, key: str, timeout: float) -> Obj | None:
        """The object with `key`, waiting up to `timeout` seconds for the watch to deliver it; None if it has not
        come by then."""
        with self._arrived:
            self._arrived.wait_for(lambda: key in self._store, timeout)
            return self._store.get(key)

    def items(self) -> list[tuple[str, Obj]]:
        """A snapshot of (key, object) pairs."""
        with self._lock:
            return list(self._store.items())

    def list(self) -> list[Obj]:
        """A snapshot of the objects."""
        with self._lock:
            return list(self._store.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._store)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._store

    # -- internals
    def _emit(self, typ: str, obj: Obj, old: Obj | None = None) -> None:
        for on_add, on_update, on_delete in self._handlers:
            try:
                if typ == "add" and on_add:
                    on_add(obj)
                elif typ == "update" and on_update:
                    on_update(old, obj)  # type: ignore[arg-type]
                elif typ == "delete" and on_delete:
                    on_delete(obj)
            except Exception:
                log.exception("cache=%s handler failed on %s of %s", self.name, typ, _key_of(self.kind, obj))

    def _apply(self, typ: str, obj: Obj) -> None:
        key = _key_of(self.kind, obj)
        with self._lock:
            old = self._store.get(key)
            if typ == "DELETED":
                if old is None:
                    return
                del self._store[key]
            else:
                self._store[key] = obj
                if old is None:
                    self._arrived.notify_all()
        if typ == "DELETED":
            self._emit("delete", obj)
        elif old is None:
            self._emit("add", obj)
        elif _rv_of(old) != _rv_of(obj) or old != obj:
            self._emit("update", obj, old)

    def _call(self, **kw: Any) -> Any:
        kw.update(field_selector=self.field_selector, label_selector=self.label_selector, _preload_content=False)
        if self.kind == "nodes":
            return self._core.list_node(**kw)
        if self.kind == "resourceslices":
            return self._resource.list_resource_slice(**kw)
        if self.kind == "resourceclaims":
            if self.namespace:
                return self._resource.list_namespaced_resource_claim(self.namespace, **kw)
            return self._resource.list_resource_claim_for_all_namespaces(**kw)
        if self.kind == "resourcequotas":
            if self.namespace:
                return self._core.list_namespaced_resource_quota(self.namespace, **kw)
            return self._core.list_resource_quota_for_all_namespaces(**kw)
        if self.namespace:
            return self._core.list_namespaced_pod(self.namespace, **kw)
        return self._core.list_pod_for_all_namespaces(**kw)

    def _relist(self) -> None:
        try:
            doc = read_json(self._call(_request_timeout=(5, 60)))
        except Exception as exc:
            raise translate(exc, f"list {self.kind}") from exc
        self.relists += 1
        fresh = {_key_of(self.kind, o): o for o in doc.get("items") or []}
        with self._lock:
            gone = [o for k, o in self._store.items() if k not in fresh]
        for obj in gone:
            self._apply("DELETED", obj)
        for obj in fresh.values():
            self._apply("MODIFIED", obj)
        self.resource_version = str((doc.get("metadata") or {}).get("resourceVersion", ""))
        if not self._synced.is_set():
            log.info("cache=%s synced objects=%d rv=%s", self.name, len(fresh), self.resource_version)
        self._synced.set()

    def _events(self, resp: Any) -> Iterator[Obj]:
        buf = b""
        for chunk in resp.stream(65536, decode_content=False):
            buf += chunk
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    break
                line, buf = buf[:nl], buf[nl + 1:]
                if line.strip():
                    yield orjson.loads(line)
        if buf.strip():
            yield orjson.loads(buf)

    def _watch(self) -> None:
        self.watches += 1
        try:
            resp = self._call(watch=True, resource_version=self.resource_version or None,
                              allow_watch_bookmarks=True, timeout_seconds=self.watch_timeout,
                              _request_timeout=(5, self.watch_timeout + 30))
        except Exception as exc:
            err = translate(exc, f"watch {self.kind}")
            if isinstance(err, GoneError):
                raise _Expired() from exc
            raise err from exc
        self._last_event = time.monotonic()
        self._resp = resp
        try:
            if self._stop.is_set():
                return
            self._backoff.reset()
            for ev in self._events(resp):
                self._last_event = time.monotonic()
                typ, obj = ev.get("type"), ev.get("object") or {}
                if typ == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired()
                    raise translate(_StatusLike(obj), f"watch {self.kind}")
                rv = _rv_of(obj)
                if typ in ("ADDED", "MODIFIED", "DELETED"):
                    self._apply(typ, obj)
                if rv:
                    self.resource_version = rv
                if self._stop.is_set():
                    return
        finally:
            self._resp = None
            try:
                resp.release_conn()
            except Exception:
                pass

    def _current_version(self) -> int | None:
        """The collection's resourceVersion now (a consistent list of at most one object); None if unknown."""
        try:
            doc = read_json(self._call(limit=1, _request_timeout=(5, 10)))
            return int(str((doc.get("metadata") or {}).get("resourceVersion", "")))
        except Exception:
            return None

    def _check_progress(self) -> None:
        """Close an open watch that stays silent while the collection moves on (see the module docstring)."""
        suspect: float | None = None  # when the watch was first found behind
        while not self._stop.wait(self.progress_interval):
            resp = self._resp
            silent = time.monotonic() - self._last_event
            if resp is None or silent < self.progress_interval or silent < self.stall_after:
                suspect = None
                continue
            try:
                delivered = int(self.resource_version)
            except ValueError:
                continue  # resourceVersions that are not numbers cannot be compared
            current = self._current_version()
            if current is None or current <= delivered:
                suspect = None
                continue
            if suspect is None or suspect < self._last_event:
                suspect = time.monotonic()
                continue
            self.stalls += 1
            log.warning("cache=%s event=watch_stalled silent_s=%.1f delivered_rv=%d current_rv=%d: resuming",
                        self.name, time.monotonic() - self._last_event, delivered, current)
            try:
                resp.shutdown()
            except Exception:
                pass
            suspect = None

    def _run(self) -> None:
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    self._relist()
                    need_list = False
                started, seen = time.monotonic(), self.resource_version
                self._watch()
                if time.monotonic() - started < 0.5 and seen == self.resource_version and not self._stop.is_set():
                    self._stop.wait(self._backoff.next())  # a watch that ends at once: do not spin
            except _Expired:
                log.info("cache=%s watch expired (410) at rv=%s: relisting", self.name, self.resource_version)
                need_list = True
            except Exception as exc:
                if self._stop.is_set():
                    break
                self.errors += 1
                delay = self._backoff.next()
                log.warning("cache=%s error=%r retry_in=%.2fs", self.name, exc, delay)
                self._stop.wait(delay)


class _StatusLike(Exception):
    """Adapter so that an ERROR watch event goes through `translate` like an ApiException."""

    def __init__(self, status: Obj) -> None:
        super().__init__(status.get("message", ""))
        self.status = int(status.get("code") or 500)
        self.reason = status.get("reason", "")
        self.body = orjson.dumps(status)
