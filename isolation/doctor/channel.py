"""The worker's side of its pipes, and the shape of an action: `(params, channel) -> Outcome`."""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import IO, Any

from vgpu.isolation.doctor.outcome import Outcome

Params = dict[str, Any]


class Channel:
    """JSON lines out (to the process that started the worker), command lines in."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def emit(self, message: dict[str, Any]) -> None:
        """Write one JSON line for the parent."""
        self.out.write(json.dumps(message) + "\n")
        self.out.flush()

    def expect(self) -> str:
        """The next line the parent sends ("" when it closed our stdin)."""
        return sys.stdin.readline().strip()


Action = Callable[[Params, Channel], Outcome]
