"""`vgpu replay`: replay the openb GPU-sharing trace through our fit and node policies and compare them.

Registered by vgpu/cli.py; the work is in replay/run.py and replay/report.py (imported inside the command).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vgpu.replay.events import DeparturesResult
    from vgpu.replay.run import RunResult

__all__ = ["register"]

OURS = "fragaware"


def register(subparsers: Any) -> None:
    """Add the `replay` subcommand."""
    p = subparsers.add_parser(
        "replay",
        help="replay the openb trace (ATC'23 FGD protocol) through our node policies",
        description="Replay a GPU-sharing trace: shuffle per seed, inflate to 130% of GPU capacity, schedule "
        "each pod once (never deleted), and report the unallocated GPU share at 100% and 130% arrived.",
    )
    p.add_argument("--trace", metavar="openb[:PODS]",
                   help="the public openb trace, downloaded once into the cache and checked by SHA-256 (replay/"
                   "traces.py); PODS: default (the default), gpushare20, 40, 60, 80 or 100. Or give --nodes and --pods")
    p.add_argument("--trace-url", default=None, help="where to download the trace's files from (a mirror)")
    p.add_argument("--nodes", help="node list CSV (sn,cpu_milli,memory_mib,gpu,model)")
    p.add_argument("--pods", help="pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli,...)")
    p.add_argument(
        "--policy",
        action="append",
        default=None,
        help=f"node policy to replay (repeatable; 'ours' = {OURS}; NAME@flat: placement without topology "
        "awareness); default: fgd, bestfit, ours",
    )
    p.add_argument("--mode", default="deviceplugin", choices=("deviceplugin", "dra", "dra-naive"),
                   help="who picks the GPUs inside the chosen node: deviceplugin (our fit), dra (kube-scheduler's "
                   "allocator, first fit, with our policy scoring nodes on that choice), dra-naive (the allocator's "
                   "first fit on the node chosen as in deviceplugin mode); docs/dra.md")
    p.add_argument("--variant", default="", help="replay a variant derived from the pod list (replay/variants.py: "
                   "multigpu30, gpuspec25, nodes4, ...)")
    p.add_argument("--seeds", type=int, default=10, help="number of seeds, 42, 43, ... (default 10)")
    p.add_argument("--first-seed", type=int, default=42, help="first seed (default 42)")
    p.add_argument("--ratio", type=float, default=None,
                   help="inflate arrivals to this share of capacity (1.3; 2.0 with --departures)")
    p.add_argument("--departures", action="store_true",
                   help="event-ordered replay: pods arrive and leave at their trace times, what does not fit waits "
                   "and is retried on departures (replay/events.py)")
    p.add_argument("--time-scale", type=float, default=None,
                   help="with --departures: trace seconds per replayed second (default 3000)")
    p.add_argument("--jobs", type=int, default=1, help="parallel processes (default 1)")
    p.add_argument("--json", action="store_true", help='print {"results": [...]} instead of the table')
    p.add_argument("--plot", metavar="PNG", help="draw unallocated %% vs arrived %% (median, quartile band)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=_main)


class _Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, result: RunResult | DeparturesResult, done: int, total: int) -> None:
        if not self.enabled:
            return
        from vgpu.replay.events import DeparturesResult

        width = 30
        filled = width * done // total
        bar = "#" * filled + "-" * (width - filled)
        if isinstance(result, DeparturesResult):
            what = f"{result.allocated_pct_mean:.2f}% allocated on average"
        else:
            what = f"{result.unallocated_pct_at_100:.2f}% unallocated at 100%"
        line = f"\r[{bar}] {done}/{total} {result.policy} seed {result.seed}: {what} ({result.seconds:.1f}s)"
        sys.stderr.write(line.ljust(100))
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _trace_files(args: argparse.Namespace) -> tuple[str, str]:
    """The node and pod lists: --nodes and --pods, or those of --trace (fetched when not cached)."""
    from vgpu.errors import ConfigError
    from vgpu.replay.traces import OPENB_URL, openb

    if args.trace is None:
        if not args.nodes or not args.pods:
            raise ConfigError("give --trace openb, or both --nodes and --pods")
        return args.nodes, args.pods
    if args.nodes or args.pods:
        raise ConfigError("--trace and --nodes/--pods: give one or the other")
    name, _, pods = args.trace.partition(":")
    if name != "openb":
        raise ConfigError(f"--trace: unknown trace {name!r} (known: openb)")
    nodes_path, pods_path = openb(pods or "default", base_url=args.trace_url or OPENB_URL)
    return str(nodes_path), str(pods_path)


def _main(args: argparse.Namespace) -> int:
    import functools
    import json

    from vgpu.errors import ConfigError
    from vgpu.replay.events import DEFAULT_RATIO, DEFAULT_TIME_SCALE, run_departures
    from vgpu.replay.report import format_departures_table, format_table, summarise, summarise_departures
    from vgpu.replay.run import FLAT, run_many, run_one
    from vgpu.replay.trace import Trace
    from vgpu.replay.variants import VARIANTS
    from vgpu.scheduler.policies import NODE_POLICIES

    names = [OURS + n[4:] if n.startswith("ours") else n for n in (args.policy or ["fgd", "bestfit", "ours"])]
    for n in names:
        if n.removesuffix(FLAT) not in NODE_POLICIES or (args.departures and n.endswith(FLAT)):
            raise ConfigError(f"--policy: unknown policy {n!r} (known: ours, {', '.join(sorted(NODE_POLICIES))}, "
                              f"each with {FLAT} for placement without topology, except with --departures)")
    if args.variant and args.variant not in VARIANTS:
        raise ConfigError(f"--variant: unknown variant {args.variant!r} (known: {', '.join(VARIANTS)})")
    if args.seeds < 1 or args.jobs < 1:
        raise ConfigError("--seeds and --jobs must be at least 1")
    ratio = args.ratio if args.ratio is not None else DEFAULT_RATIO if args.departures else 1.3
    if not 1.0 <= ratio <= 3.0:
        raise ConfigError(f"--ratio: {ratio} is outside 1.0..3.0")
    if args.time_scale is not None and (not args.departures or args.time_scale <= 0):
        raise ConfigError("--time-scale: needs --departures and a positive value")
    if args.departures and args.mode != "deviceplugin":
        raise ConfigError("--mode: the departures replay runs in deviceplugin mode only")
    if args.plot:
        folder = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise ConfigError(f"--plot {args.plot}: cannot write in {folder}")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    args.nodes, args.pods = _trace_files(args)
    trace = Trace.load(args.nodes, args.pods)  # a bad file is one error line before any progress is drawn
    if args.departures and not any(p.created >= 0 for p in trace.pods):
        raise ConfigError(f"--departures: {args.pods} has no creation_time column (or no value in it): the "
                          "departures replay needs when each pod arrives")
    progress = _Progress(not args.no_progress)
    if progress.enabled:
        sys.stderr.write(f"replaying {len(names)} policies x {args.seeds} seeds ...")
        sys.stderr.flush()
    common = {"jobs": args.jobs, "ratio": ratio, "on_result": progress, "variant": args.variant}
    if args.departures:
        runner = functools.partial(run_departures, time_scale=args.time_scale or DEFAULT_TIME_SCALE)
        departures = run_many(args.nodes, args.pods, names, seeds, runner=runner, **common)
        rows = [r.summary() for r in departures]
        table = format_departures_table(summarise_departures(departures, names))
    else:
        runner_one = functools.partial(run_one, mode=args.mode)
        results = run_many(args.nodes, args.pods, names, seeds, runner=runner_one, **common)
        rows = [r.summary() for r in results]
        table = format_table(summarise(results, names))
    print(json.dumps({"results": rows}) if args.json else table)
    if args.plot:
        from vgpu.replay.report import plot_curves, plot_departures

        if args.departures:
            plot_departures(departures, names, args.plot)
        else:
            plot_curves(results, names, args.plot)
    return 0
