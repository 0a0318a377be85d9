"""Helper processes a probe starts from its worker: a second process of the same container, a run without the
library, a run at another limit. They run the same worker module, in the probe's session (killed with it)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vgpu.isolation.doctor import envs
from vgpu.isolation.doctor.outcome import Outcome
from vgpu.isolation.doctor.spawn import Worker

LEG_TIMEOUT_S = 60.0


def reference(params: dict[str, Any]) -> dict[str, str]:
    """The environment without the library."""
    return envs.reference_env(os.environ, params.get("driver_dir"))


def limited(params: dict[str, Any], tag: str, cores: int | None = None) -> dict[str, str]:
    """A limited environment with an accounting file of its own (named after `tag` in the probe's folder)."""
    return envs.limited_env(os.environ, params.get("driver_dir"), params["lib"],
                            Path(params["workdir"]) / f"{tag}.cache", params["limit"], params["devices"], cores)


def same_container() -> dict[str, str]:
    """This process's environment: the library, its limits and its accounting file."""
    return dict(os.environ)


def start(action: str, params: dict[str, Any], env: dict[str, str]) -> Worker:
    """An interactive helper (messages both ways)."""
    return Worker(action, params, env, Path(params["workdir"]), interactive=True)


def run(action: str, params: dict[str, Any], env: dict[str, str], timeout: float = LEG_TIMEOUT_S) -> Outcome:
    """Run a helper to its verdict."""
    with Worker(action, params, env, Path(params["workdir"])) as leg:
        return leg.result(timeout)
