"""How a node agent's process lives: serving from start until SIGTERM or SIGINT, stopped on the way out.

`vgpu device-plugin` and `vgpu dra-plugin` both run this way; a GPU backend that cannot start ends the process
with status 1 and one line on stderr.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from typing import Protocol

from vgpu.node.backends import BackendUnavailable

__all__ = ["NodeAgent", "serve_until_signalled"]


class NodeAgent(Protocol):
    """A plugin's runtime: everything the process serves."""

    def start(self) -> object:
        """Start serving (what it returns is not used); raises BackendUnavailable when the GPU backend cannot
        start."""
        ...

    def stop(self) -> None:
        """Stop serving and remove what start made on the host (sockets); safe after a failed start."""
        ...


def serve_until_signalled(command: str, make_agent: Callable[[], NodeAgent]) -> int:
    """Build and start an agent, serve until SIGTERM or SIGINT, stop it; the process's exit status."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    agent = make_agent()
    try:
        agent.start()
        done.wait()
    except BackendUnavailable as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 1
    finally:
        agent.stop()
    return 0
