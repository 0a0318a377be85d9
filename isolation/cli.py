"""`vgpu run`: run any program with GPU memory/compute limits on this machine (no Kubernetes)."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Add the `run` subcommand."""
    p = subparsers.add_parser(
        "run", help="run a command under libvgpu.so with GPU memory / compute limits",
        description="Run COMMAND with hard GPU limits enforced by libvgpu.so (LD_PRELOAD).",
    )
    p.add_argument("--memory", help="device memory limit per GPU, e.g. 4Gi, 4096m, 4g (binary units)")
    p.add_argument("--cores", help="percent of each GPU's compute (1..100)")
    p.add_argument("--devices", help="comma list of GPU indexes to expose, e.g. 0,1")
    p.add_argument("--policy", choices=["default", "force", "disable"], help="GPU_CORE_UTILIZATION_POLICY")
    p.add_argument("--cache", help="shared accounting file (default: a fresh temporary file)")
    p.add_argument("--driver-dir", help="directory searched first for libcuda.so.1 and libnvidia-ml.so.1 "
                                        "(e.g. a simulated driver)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    p.set_defaults(func=_run)


def _fail(msg: str) -> int:
    print(f"vgpu run: {msg}", file=sys.stderr)
    return 2


def _run(args: argparse.Namespace) -> int:
    from vgpu.isolation.region import parse_size
    from vgpu.isolation.runner import Limits, run

    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        return _fail("no command given (usage: vgpu run [options] -- COMMAND...)")
    limits = Limits(policy=args.policy, cache=args.cache)
    if args.memory is not None:
        try:
            limits.memory = parse_size(args.memory)
        except ValueError as exc:
            return _fail(f"--memory: {exc}")
        if limits.memory == 0:
            return _fail("--memory: must be > 0")
    if args.cores is not None:
        if not args.cores.isdigit() or not 1 <= int(args.cores) <= 100:
            return _fail(f"--cores: invalid value {args.cores!r}: expected an integer 1..100")
        limits.cores = int(args.cores)
    if args.devices:
        try:
            limits.devices = [int(x) for x in args.devices.split(",")]
        except ValueError:
            return _fail(f"--devices: invalid value {args.devices!r}: expected a comma list of indexes")
        if any(d < 0 for d in limits.devices):
            return _fail(f"--devices: invalid value {args.devices!r}: negative index")
    if args.driver_dir is not None and not os.path.isdir(args.driver_dir):
        return _fail(f"--driver-dir {args.driver_dir}: not a directory")
    if args.cache is not None and not os.path.isdir(os.path.dirname(os.path.abspath(args.cache))):
        return _fail(f"--cache {args.cache}: its directory does not exist")
    try:
        return run(cmd, limits, driver_dir=args.driver_dir)
    except FileNotFoundError:
        return _fail(f"command not found: {cmd[0]}")
