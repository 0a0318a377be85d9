"""Annotation writes the device plugin could not make at Allocate, made later.

When the API server cannot take the patch that records an answered container (bind-phase, devices-to-allocate)
even after the client's retries, failing Allocate would fail the pod's admission for bookkeeping that can wait:
the grant is decided and the matcher remembers in memory what this process answered. The allocator hands the
patch to `DeferredPatches`, which merges the patches of one pod in order and retries them on its own thread, with
backoff, until the API server takes them or the pod is gone. Used by deviceplugin.allocator.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from vgpu.errors import VGPUError
from vgpu.kube.cache import Backoff
from vgpu.kube.errors import NotFoundError

__all__ = ["DeferredPatches"]

log = logging.getLogger(__name__)

Patcher = Callable[[str, str, Mapping[str, str | None]], None]


class DeferredPatches:
    """Pending annotation patches by pod (namespace, name); thread-safe."""

    def __init__(self, patch: Patcher, backoff: Backoff | None = None) -> None:
        self._patch = patch
        self._backoff = backoff or Backoff(base=0.5, cap=15.0)
        self._pending: dict[tuple[str, str], dict[str, str | None]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        """Queue a patch (merged over one still pending for the pod) and make sure the retry thread runs."""
        with self._lock:
            self._pending.setdefault((namespace, name), {}).update(annotations)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="deferred-patches", daemon=True)
                self._thread.start()
        self._wake.set()

    def pending(self) -> dict[tuple[str, str], dict[str, str | None]]:
        """A copy of what waits to be written."""
        with self._lock:
            return {key: dict(value) for key, value in self._pending.items()}

    def flush(self) -> bool:
        """Try every pending patch once; True when none is left."""
        with self._lock:
            work = list(self._pending.items())
        for (namespace, name), patch in work:
            try:
                self._patch(namespace, name, patch)
            except NotFoundError:
                log.info("event=deferred_patch_dropped pod=%s/%s reason=the pod is gone", namespace, name)
            except VGPUError as exc:
                log.debug("event=deferred_patch_failed pod=%s/%s error=%s", namespace, name, exc)
                continue
            else:
                log.info("event=deferred_patch_written pod=%s/%s keys=%s", namespace, name, ",".join(patch))
            with self._lock:
                if self._pending.get((namespace, name)) == patch:
                    del self._pending[(namespace, name)]
        with self._lock:
            return not self._pending

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            while not self._stop.is_set() and not self.flush():
                self._stop.wait(self._backoff.next())
            self._backoff.reset()

    def stop(self) -> None:
        """End the retry thread (what is pending stays pending)."""
        self._stop.set()
        self._wake.set()
