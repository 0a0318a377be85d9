"""`vgpu dra-plugin`: the DRA kubelet plugin (ResourceSlice publisher and NodePrepareResources server).

Parses and dispatches only: the options and their checks are vgpu.draplugin.config, the wiring
vgpu.draplugin.runtime. The process runs until SIGTERM / SIGINT and removes its sockets on the way out.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = ["register", "run"]

# (flag, environment variable, default as shown, help)
_FLAGS: tuple[tuple[str, str | None, str, str], ...] = (
    ("--node-name", "NODE_NAME", "none, required", "this node's name: the slice's node and pool"),
    ("--kubeconfig", None, "in-cluster", "kubeconfig file"),
    ("--backend", None, "nvml", "GPU source: nvml or sim"),
    ("--sim-gpus", None, "none", "simulated GPUs, e.g. 2xA100-40GB (backend sim)"),
    ("--sim-control", None, "none", "fault-injection control file (backend sim), as the device plugin's"),
    ("--plugins-dir", None, "/var/lib/kubelet/plugins",
     "kubelet's plugins directory; the DRA socket and the checkpoint are in <dir>/gpu.vgpu-sharing.io/"),
    ("--registry-dir", None, "/var/lib/kubelet/plugins_registry",
     "kubelet's plugin registry directory (registration socket gpu.vgpu-sharing.io-reg.sock)"),
    ("--cdi-dir", None, "/var/run/cdi", "directory of the CDI specs written for prepared claims"),
    ("--hook-path", "HOOK_PATH", "/usr/local", "host directory holding vgpu/ (libvgpu.so, ld.so.preload, "
                                               "containers/)"),
    ("--lock-dir", None, "/tmp/vgpulock", "host root of the per-claim directories mounted at /tmp/vgpulock"),
    ("--container-storage", "CONTAINER_STORAGE", "directory",
     "tmpfs: each container's accounting and lock directories are tmpfs mounts of their own, sized up front (needs "
     "CAP_SYS_ADMIN and Bidirectional mount propagation); directory: plain directories on the node's filesystem"),
    ("--isolation-fail-open", None, "false",
     "let the library run without limits when a container's accounting file is unusable"),
    ("--xid-recovery-seconds", None, "60",
     "seconds without a critical Xid before a GPU that answers again is healthy (nvml)"),
    ("--pace-seconds", "PACE_SECONDS", "1",
     "how often the pacer corrects the library's kernel timings from what NVML says each claim's pods ran (nvml; "
     "needs hostPID); 0: off"),
)


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def register(subparsers: Any) -> None:
    """Add the `dra-plugin` subcommand."""
    p = subparsers.add_parser(
        "dra-plugin",
        help="run the DRA kubelet plugin (GPU shares through ResourceClaims)",
        description="Publish this node's GPUs as a ResourceSlice and prepare allocated ResourceClaims for kubelet "
                    "(CDI specs with the isolation library's limits).",
    )
    for flag, env, default, text in _FLAGS:
        where = f"default {default}" + (f"; env {env}" if env else "")
        kwargs: dict[str, Any] = {"dest": _dest(flag), "help": f"{text} ({where})".replace("%", "%%")}
        if flag == "--isolation-fail-open":
            kwargs.update(nargs="?", const="true", metavar="BOOL")
        else:
            kwargs["metavar"] = _dest(flag).upper()
        p.add_argument(flag, **kwargs)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Start everything and block until SIGTERM or SIGINT."""
    from vgpu.draplugin.config import DRAConfig
    from vgpu.draplugin.runtime import DRAPluginRuntime
    from vgpu.node.process import serve_until_signalled

    config = DRAConfig.from_flags({_dest(flag): getattr(args, _dest(flag)) for flag, *_ in _FLAGS}, os.environ)
    return serve_until_signalled("vgpu dra-plugin", lambda: DRAPluginRuntime(config))
