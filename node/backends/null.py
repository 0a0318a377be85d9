"""A backend with no GPUs: the plugin registers nothing useful but stays up (nodes without GPUs, dry runs)."""

import time

from vgpu.node.backends import GPUInfo, GPUReading, HealthEvent

__all__ = ["NullBackend"]


class NullBackend:
    """No devices, no events."""

    init_error: str | None = None

    def devices(self) -> list[GPUInfo]:
        """No GPUs."""
        return []

    def poll_health(self, timeout: float) -> list[HealthEvent]:
        """Sleep `timeout`; nothing ever changes."""
        time.sleep(timeout)
        return []

    def usage(self) -> dict[str, GPUReading]:
        """Nothing to report."""
        return {}

    def close(self) -> None:
        """Nothing to release."""
