"""Which of the node's GPUs are healthy, with a version that moves at every change (for the slice publisher and the
device-health stream)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from vgpu.node.backends import GPUInfo, HealthEvent

__all__ = ["DeviceHealthState", "GPUHealth"]


@dataclass(frozen=True, slots=True)
class DeviceHealthState:
    """One GPU's health as last recorded: since when (Unix seconds) and why."""

    gpu: GPUInfo
    healthy: bool
    since: int
    reason: str


class GPUHealth:
    """The health of the node's GPUs; thread-safe. Every GPU starts healthy."""

    def __init__(self, gpus: list[GPUInfo]) -> None:
        self.gpus = list(gpus)
        now = int(time.time())
        self._states = {g.uuid: DeviceHealthState(g, True, now, "") for g in gpus}
        self._version = 0
        self._changed = threading.Condition()

    def apply(self, event: HealthEvent) -> bool:
        """Record a health event; True when it changed a known GPU's health (waiters are woken)."""
        with self._changed:
            state = self._states.get(event.uuid)
            if state is None or state.healthy == event.healthy:
                return False
            self._states[event.uuid] = DeviceHealthState(state.gpu, event.healthy, int(time.time()), event.reason)
            self._version += 1
            self._changed.notify_all()
            return True

    def is_healthy(self, uuid: str) -> bool:
        """Whether the GPU is known and healthy."""
        with self._changed:
            state = self._states.get(uuid)
            return state is not None and state.healthy

    def healthy(self) -> list[GPUInfo]:
        """The healthy GPUs."""
        with self._changed:
            return [g for g in self.gpus if self._states[g.uuid].healthy]

    def snapshot(self) -> tuple[int, list[DeviceHealthState]]:
        """The current version and every GPU's state, in the node's order."""
        with self._changed:
            return self._version, [self._states[g.uuid] for g in self.gpus]

    def wait_change(self, version: int, timeout: float) -> bool:
        """Wait until the version moves past `version`; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._version != version, timeout)
