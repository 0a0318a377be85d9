"""Subcommand `vgpu demo`: a cluster in a box (see testbed/demo.py), registered through the `vgpu.subcommands`
entry point (setup.py), so that nothing outside the test bed imports it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["register"]


def _positive(text: str) -> int:
    """A whole number of at least 1 (argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    """A positive number of seconds (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def register(subparsers: Any) -> None:
    """Add the `demo` subcommand."""
    p = subparsers.add_parser(
        "demo", help="run a simulated GPU cluster with sample pods",
        description="Start an API-server, kubelet and kube-scheduler stand-in around the real extender and device "
                    "plugins over simulated GPUs, submit sample pods and show nodes, GPUs and pods live.")
    p.add_argument("--nodes", type=_positive, default=None,
                   help="simulated GPU nodes (default 3; 1 with --dra; 2 with --real-kubernetes)")
    p.add_argument("--gpus", default=None,
                   help="GPUs per node, e.g. 4xA100-40GB or 2xA100-80GB,2xT4 (default 4xA100-40GB; 1xA100-40GB "
                        "with --dra)")
    p.add_argument("--dra", action="store_true",
                   help="DRA mode: the real DRA plugin serves the GPUs; the samples ask through ResourceClaims "
                        "(docs/dra.md)")
    p.add_argument("--real-kubernetes", action="store_true",
                   help="run the samples on upstream Kubernetes (kube-apiserver, kube-scheduler, kubelet and "
                        "containerd, built by testbed/upstream/build.sh) instead of the stand-ins")
    p.add_argument("--pods", default=None, help="YAML file of pods to submit instead of the samples")
    p.add_argument("--headless", action="store_true", help="no live table: print a summary, exit 0 on success")
    p.add_argument("--duration", type=_seconds, default=None,
                   help="seconds to run (default: until the pods finish when headless, else until Ctrl-C)")
    p.add_argument("--hold", type=_seconds, default=None,
                   help="seconds each sample workload keeps its memory (default 2 headless, 20 live)")
    p.add_argument("--workdir", default=None,
                   help="keep state and logs here (an empty or previous demo directory; default: a temporary one)")
    p.add_argument("--keep-workdir", action="store_true",
                   help="keep the temporary directory (deleted after a successful run otherwise)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import importlib.util

    from vgpu.errors import ConfigError

    if importlib.util.find_spec("httpx") is None:
        raise ConfigError("the test bed needs its extra dependencies: pip install 'vgpu-sharing[testbed]'")
    if args.workdir:
        parent = Path(args.workdir).absolute().parent
        if not parent.is_dir():
            raise ConfigError(f"--workdir {args.workdir}: {parent} does not exist (the demo makes only the last "
                              "directory)")
    if args.real_kubernetes:
        for option, given in (("--dra", args.dra), ("--pods", args.pods)):
            if given:
                raise ConfigError(f"{option} works on the stand-ins only, not with --real-kubernetes")
        from vgpu.testbed.demo_real import run_real_demo

        args.nodes = args.nodes or 2
        args.gpus = args.gpus or "4xA100-40GB"
        return run_real_demo(args)
    if args.dra:
        from vgpu.testbed.demo_dra import run_dra_demo

        return run_dra_demo(args)
    from vgpu.testbed.demo import run_demo

    args.nodes = args.nodes or 3
    args.gpus = args.gpus or "4xA100-40GB"
    return run_demo(args)
