"""Subcommands `vgpu whatif` and `vgpu consolidate` (docs/consolidation.md).

Discovered by vgpu/cli.py; the work is in the modules beside this one, imported inside the command functions.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from typing import Any

from vgpu.errors import ConfigError

__all__ = ["parse_duration", "register", "render_plan"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """"90", "90s", "15m", "2h", "1d" -> seconds."""
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (such as 90s, 15m, 2h)")
    return float(match.group(1)) * _SECONDS[match.group(2) or "s"]


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster, else ~/.kube/config)")
    p.add_argument("--config", help="the extender's YAML configuration: its resource names, node and GPU policies "
                                    "and scheduler names are used (default: the extender's defaults)")
    p.add_argument("--scheduler-names", type=_names,
                   help="comma list of the spec.schedulerName values of vGPU pods (default: the configuration's, "
                        "vgpu-scheduler)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")


def register(subparsers: Any) -> None:
    """Add the `whatif` and `consolidate` subcommands."""
    from vgpu.planning.whatif import POLICIES

    p = subparsers.add_parser(
        "whatif", help="replay the cluster's pods under each placement policy (read-only)",
        description="Read the nodes, running and pending vGPU pods, and place them again under each policy: the "
                    "running pods kept (pending ones placed under the extender's policy), and from scratch under "
                    "each policy. Reports pending pods that would fit, GPUs wholly free, the unallocated and the "
                    "fragmented GPU share. Writes nothing to the cluster.")
    _common(p)
    p.add_argument("--policy", action="append", default=None,
                   help=f"a policy to re-place under (repeatable; default: {', '.join(POLICIES)})")
    p.add_argument("--pods", metavar="YAML", help="hypothetical pods to add, as pending: Pods, Lists, or "
                                                  "Deployments, ReplicaSets, StatefulSets, Jobs (template x replicas)")
    p.add_argument("--export", metavar="DIR", help="also write the cluster as the replay's nodes.csv and pods.csv")
    p.add_argument("--anonymise", action="store_true", help="with --export: hash node and pod names")
    p.set_defaults(func=_whatif)

    q = subparsers.add_parser(
        "consolidate", help="plan (or carry out) the fewest moves that free whole GPUs for pending pods",
        description="Plan evictions of controller-owned vGPU pods so that pending pods that fit nowhere find "
                    "room (or --free-gpus N GPUs are wholly free), honouring PodDisruptionBudgets, priorities, "
                    "the vgpu-sharing.io/no-consolidate annotation and --min-age. Prints the plan (--dry-run, the "
                    "default) or carries it out step by step (--execute).")
    _common(q)
    q.add_argument("--free-gpus", type=int, metavar="N", help="make N GPUs wholly free instead of making room for "
                                                              "the pending pods")
    q.add_argument("--min-age", type=parse_duration, default=0.0,
                   help="never move a pod running for less than this (90s, 15m, 2h; default 0)")
    q.add_argument("--max-moves", type=int, default=20, help="moves the plan may make at most (default 20)")
    mode = q.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the plan and its expected result (default)")
    mode.add_argument("--execute", action="store_true", help="carry the plan out, one move at a time")
    q.add_argument("--timeout", type=parse_duration, default=180.0,
                   help="with --execute: how long a replacement or the pod made room for may take to be placed "
                        "(default 180s)")
    q.add_argument("--hold", type=parse_duration, default=600.0, dest="hold_seconds",
                   help="with --execute: how long the extender keeps the room made for its pod (default 600s, "
                        "at most 1h)")
    mode.add_argument("--watch", action="store_true",
                      help="run as a controller: every --interval, make room for the pods pending longer than "
                           "--pending-for that fit nowhere, and carry the plan out")
    q.add_argument("--interval", type=parse_duration, default=30.0, help="with --watch: time between looks "
                                                                         "(default 30s)")
    q.add_argument("--pending-for", type=parse_duration, default=300.0,
                   help="with --watch: how long a pod waits before room is made for it (default 5m)")
    q.add_argument("--move-share", type=float, default=0.05,
                   help="with --watch: pods moved per hour at most, as a share of the running vGPU pods (default "
                        "0.05; at least one an hour)")
    q.add_argument("--leader-elect", action="store_true", help="with --watch: run Lease leader election (several "
                                                               "replicas)")
    q.add_argument("--lease-namespace", default="kube-system",
                   help="with --leader-elect: namespace of the Lease vgpu-consolidate (default kube-system)")
    q.add_argument("--metrics-listen", default=":9396",
                   help="with --watch: metrics address HOST:PORT (default :9396; '' disables)")
    q.set_defaults(func=_consolidate)


def _setup(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The extender's configuration (from --config, flags over it) and the snapshot of the cluster."""
    from vgpu.kube import make_api_client
    from vgpu.planning.snapshot import read_cluster
    from vgpu.scheduler.config import load_config

    config = load_config(args.config, {"scheduler_names": args.scheduler_names})
    api = make_api_client(args.kubeconfig, qps=config.qps, burst=config.burst)
    snapshot = read_cluster(api, config.sharing, frozenset(config.scheduler_names))
    return config, api, snapshot


def _whatif(args: argparse.Namespace) -> int:
    import orjson

    from vgpu.planning.export import export_trace
    from vgpu.planning.whatif import POLICIES, load_extra_pods, render_table, whatif
    from vgpu.scheduler.policies import make_policy

    if args.anonymise and not args.export:
        raise ConfigError("--anonymise goes with --export")
    policies = args.policy or list(POLICIES)
    for name in policies:
        make_policy(name)  # an unknown name: one clear line before anything is read
    config, _, snapshot = _setup(args)
    extra = load_extra_pods(args.pods, snapshot) if args.pods else []
    rows = whatif(snapshot, policies, config.node_policy, extra)
    if args.export:
        nodes, pods = export_trace(snapshot, args.export, args.anonymise)
        print(f"wrote {nodes} and {pods}", file=sys.stderr)
    if args.json:
        sys.stdout.write(orjson.dumps({"rows": [r.summary() for r in rows], "unreadable": snapshot.unreadable},
                                      option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    sys.stdout.write(f"{len(snapshot.nodes)} nodes, {len(snapshot.running)} running and {len(snapshot.pending)} "
                     f"pending vGPU pods{f', {len(extra)} hypothetical' if extra else ''}; current policy "
                     f"{config.node_policy}\n")
    sys.stdout.write(render_table(rows))
    for line in snapshot.unreadable:
        sys.stdout.write(f"left out (its spec does not parse): {line}\n")
    return 0


def render_plan(plan: Any) -> str:
    """The plan as `vgpu consolidate --dry-run` prints it."""
    lines = []
    for n, step in enumerate(plan.steps):
        target = step.beneficiary.ref if step.beneficiary else f"{len(step.gpus)} whole GPU(s)"
        lines.append(f"step {n + 1}: free {', '.join(step.gpus)} on {step.node} for {target} "
                     f"({len(step.moves)} move{'s' if len(step.moves) != 1 else ''})")
        for move in step.moves:
            lines.append(f"  evict {move.pod.ref} from {move.source}: expected on {move.target} "
                         f"({', '.join(move.gpus)})")
    for target, why in plan.unmet:
        lines.append(f"no plan for {target}: {why}")
    if not plan.steps and not plan.unmet:
        lines.append("nothing to do: " + ("no pending vGPU pod waits for room" if plan.pending == len(plan.fitting)
                                          else "already as asked"))
    lines.append(f"expected: {plan.moves} move(s); pending pods placed {plan.pending_placed_before} -> "
                 f"{plan.pending_placed_after} of {plan.pending}; GPUs wholly free {plan.gpus_free_before} -> "
                 f"{plan.gpus_free_after} of {plan.gpus}")
    return "\n".join(lines) + "\n"


def _consolidate(args: argparse.Namespace) -> int:
    import orjson

    from vgpu.planning.consolidate import plan_consolidation
    from vgpu.planning.execute import execute_plan

    if args.free_gpus is not None and args.free_gpus < 1:
        raise ConfigError("--free-gpus must be at least 1")
    if args.max_moves < 1:
        raise ConfigError("--max-moves must be at least 1")
    if args.watch:
        return _watch(args)
    config, api, snapshot = _setup(args)
    plan = plan_consolidation(snapshot, config.node_policy, now=time.time(), min_age=args.min_age,
                              free_gpus=args.free_gpus, max_moves=args.max_moves, gpu_policy=config.gpu_policy)
    if not args.execute:
        if args.json:
            sys.stdout.write(orjson.dumps(plan.summary(), option=orjson.OPT_INDENT_2).decode() + "\n")
        else:
            sys.stdout.write(render_plan(plan))
        return 0
    if not args.json:
        sys.stdout.write(render_plan(plan))
    report = execute_plan(api, plan, timeout=args.timeout, hold_seconds=min(args.hold_seconds, 3600.0),
                          say=(lambda line: None) if args.json else print)
    if args.json:
        sys.stdout.write(orjson.dumps({"plan": plan.summary(), "lines": report.lines, "steps_done": report.steps_done,
                                       "evicted": report.evicted, "moves_done": report.moves_done,
                                       "stopped": report.stopped},
                                      option=orjson.OPT_INDENT_2).decode() + "\n")
    return 1 if report.stopped else 0


def _watch(args: argparse.Namespace) -> int:
    import signal
    import threading

    from prometheus_client import CollectorRegistry, start_http_server

    from vgpu.httpserve import parse_listen
    from vgpu.kube import LeaderElector, make_api_client
    from vgpu.planning.controller import controller_for
    from vgpu.scheduler.config import load_config

    if args.interval <= 0 or args.move_share < 0:
        raise ConfigError("--interval must be positive and --move-share at least 0")
    config = load_config(args.config, {"scheduler_names": args.scheduler_names})
    api = make_api_client(args.kubeconfig, qps=config.qps, burst=config.burst)
    registry = CollectorRegistry()
    controller = controller_for(api, config, args, registry)
    if args.metrics_listen:
        host, port = parse_listen(args.metrics_listen, 9396)
        start_http_server(port, host, registry=registry)
    elector = LeaderElector(api, "vgpu-consolidate", args.lease_namespace) if args.leader_elect else None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    if elector is not None:
        elector.start()
    try:
        controller.run(args.interval, stop, (lambda: elector.is_leader) if elector is not None else (lambda: True))
    except KeyboardInterrupt:
        pass
    finally:
        if elector is not None:
            elector.stop()
    return 0
