"""TEST INFRASTRUCTURE: the kubelet stand-in's view of its node's pods, kept as kubelet's reflector keeps it.

Kubelet's API-server pod source (`pkg/kubelet/config/apiserver.go`, `NewSourceApiserver`) runs a client-go
reflector (`staging/src/k8s.io/client-go/tools/cache/reflector.go`, `ListAndWatch`) on pods with the field
selector `spec.nodeName=<node>`: it lists, then watches from the list's resourceVersion with bookmarks allowed and
a watch timeout drawn between the minimum and twice it (`minWatchTimeout` = 5 min); when a watch ends it watches
again from the last resourceVersion seen (bookmarks included); an expired resourceVersion (410 Gone, or an ERROR
event) or a failed call makes it list again after a back-off. A relist replaces the store: objects no longer listed
are deleted. No progress check: a watch that goes silent is waited on until its timeout, as client-go does (the
read timeout below only guards against a connection that never ends).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import orjson
from kubernetes import client as k8s

from vgpu.testbed.kubeclient import read_json

__all__ = ["PodInformer"]

log = logging.getLogger(__name__)
Obj = dict[str, Any]
MIN_WATCH_TIMEOUT = 300  # seconds; client-go's reflector default


def pod_key(pod: Obj) -> str:
    """`namespace/name`, client-go's MetaNamespaceKeyFunc."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


class PodInformer:
    """List-and-watch of the pods matching `field_selector`, with add / update / delete callbacks."""

    def __init__(self, api_client: k8s.ApiClient, field_selector: str, on_add: Callable[[Obj], None],
                 on_update: Callable[[Obj, Obj], None], on_delete: Callable[[Obj], None], name: str = "pods",
                 min_watch_timeout: int = MIN_WATCH_TIMEOUT) -> None:
        self._core: Any = k8s.CoreV1Api(api_client)
        self.field_selector = field_selector
        self._on: dict[str, Callable[..., None]] = {"add": on_add, "update": on_update, "delete": on_delete}
        self.name = name
        self.min_watch_timeout = min_watch_timeout
        self._store: dict[str, Obj] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread: threading.Thread | None = None

    # -- public
    def start(self) -> PodInformer:
        """Start listing and watching in a thread."""
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop, interrupting a watch in progress."""
        self._stop.set()
        resp = self._resp
        if resp is not None:
            try:
                resp.shutdown()
            except Exception:
                pass
        if self._thread is not None:
            self._thread.join(5)

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Whether the first list was applied within `timeout`."""
        return self._synced.wait(timeout)

    def get(self, key: str) -> Obj | None:
        """The pod `namespace/name`, or None."""
        with self._lock:
            return self._store.get(key)

    def list(self) -> list[Obj]:
        """A snapshot of the pods."""
        with self._lock:
            return list(self._store.values())

    # -- the reflector
    def _emit(self, what: str, *args: Obj) -> None:
        try:
            self._on[what](*args)
        except Exception:
            log.exception("informer=%s %s handler failed", self.name, what)

    def _apply(self, typ: str, obj: Obj) -> None:
        key = pod_key(obj)
        with self._lock:
            old = self._store.get(key)
            if typ == "DELETED":
                if old is None:
                    return
                del self._store[key]
            else:
                self._store[key] = obj
        if typ == "DELETED":
            self._emit("delete", obj)
        elif old is None:
            self._emit("add", obj)
        else:
            self._emit("update", old, obj)

    def _list(self) -> str:
        doc = read_json(self._core.list_pod_for_all_namespaces(field_selector=self.field_selector,
                                                               _preload_content=False, _request_timeout=(5, 60)))
        fresh = {pod_key(o): o for o in doc.get("items") or []}
        with self._lock:
            gone = [o for k, o in self._store.items() if k not in fresh]
        for obj in gone:
            self._apply("DELETED", obj)
        for obj in fresh.values():
            self._apply("MODIFIED", obj)
        self._synced.set()
        return str((doc.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self, rv: str) -> Iterator[Obj]:
        timeout = random.randint(self.min_watch_timeout, 2 * self.min_watch_timeout)
        resp = self._core.list_pod_for_all_namespaces(
            field_selector=self.field_selector, watch=True, resource_version=rv, allow_watch_bookmarks=True,
            timeout_seconds=timeout, _preload_content=False, _request_timeout=(5, timeout + 30))
        self._resp = resp
        try:
            buf = b""
            for chunk in resp.stream(65536, decode_content=False):
                buf += chunk
                while (nl := buf.find(b"\n")) >= 0:
                    line, buf = buf[:nl], buf[nl + 1:]
                    if line.strip():
                        yield orjson.loads(line)
        finally:
            self._resp = None
            resp.release_conn()

    def _run(self) -> None:
        rv = ""
        backoff = 0.2
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._list()
                for event in self._watch(rv):
                    typ, obj = event.get("type"), event.get("object") or {}
                    if typ == "ERROR":  # 410 Gone and the like: list again
                        rv = ""
                        break
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if typ in ("ADDED", "MODIFIED", "DELETED"):
                        self._apply(str(typ), obj)
                backoff = 0.2
            except Exception as exc:
                if self._stop.is_set():
                    return
                log.info("informer=%s list/watch failed, listing again error=%s", self.name, str(exc)[:200])
                rv = ""
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
