"""A job run every few seconds on a thread of its own (the node agents' memory guard, pacer and the like)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Periodic"]

log = logging.getLogger(__name__)


class Periodic:
    """Runs `job` every `interval` seconds on a thread of its own until stopped; a failing run is logged."""

    def __init__(self, name: str, interval: float, job: Callable[[], Any]) -> None:
        self.interval = interval
        self.job = job
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Periodic:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.job()
            except Exception:
                log.exception("event=periodic_failed thread=%s", self._thread.name)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
