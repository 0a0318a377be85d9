"""The probe process: `python -m vgpu.isolation.doctor.worker ACTION PARAMS_JSON`.

Runs one action (a probe, a helper of a probe, or `info`) and writes its `Outcome` as the last JSON line of its
stdout. Whatever else writes to stdout (a framework, the driver) is sent to stderr, so that stdout carries our
JSON lines only. An action that raises is a failed probe whose reason names the exception.
"""
from __future__ import annotations

import json
import os
import sys
import time

from vgpu.isolation.doctor.channel import Action, Channel
from vgpu.isolation.doctor.outcome import Outcome


def actions() -> dict[str, Action]:
    """Every action a worker can run, by name."""
    from vgpu.isolation.doctor import info, probes_compute, probes_frameworks, probes_memory

    return {"info": info.facts, **probes_memory.ACTIONS, **probes_compute.ACTIONS, **probes_frameworks.ACTIONS}


def main(argv: list[str]) -> int:
    """Run the action; the exit status is 0 when a verdict was written."""
    if len(argv) != 2:
        print("usage: python -m vgpu.isolation.doctor.worker ACTION PARAMS_JSON", file=sys.stderr)
        return 2
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)                   # stray prints of frameworks and drivers go to stderr
    sys.stdout = sys.stderr
    channel = Channel(out)
    name, params = argv[0], json.loads(argv[1])
    if params.get("hang"):          # test hook: a probe that never ends, for the time box
        while True:
            time.sleep(3600)
    action = actions().get(name)
    if action is None:
        channel.emit(Outcome.failed(f"unknown action {name!r}").to_json())
        return 0
    try:
        outcome = action(params, channel)
    except Exception as exc:
        outcome = Outcome.failed(f"{type(exc).__name__}: {exc}")
    channel.emit(outcome.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
