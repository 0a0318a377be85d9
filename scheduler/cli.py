"""Subcommands `vgpu scheduler` (run the extender) and `vgpu inspect` (table of GPU allocations).

Discovered by vgpu/cli.py; heavy imports happen inside the command functions.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from vgpu.keys import DEVICE_TYPE

__all__ = ["flag_overrides", "inspect_table", "register"]


def register(subparsers: Any) -> None:
    """Add the `scheduler` and `inspect` subcommands."""
    p = subparsers.add_parser("scheduler", help="run the kube-scheduler extender",
                              description="Run the vGPU kube-scheduler extender (filter/prioritize/bind).")
    p.add_argument("--config", help="YAML configuration file (flags override it)")
    p.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster, else ~/.kube/config)")
    p.add_argument("--listen", help="extender address HOST:PORT (default 127.0.0.1:8888; any other address needs "
                                    "mutual TLS)")
    p.add_argument("--tls-cert-file", help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--tls-key-file", help="the certificate's private key (PEM)")
    p.add_argument("--tls-client-ca-file", help="require client certificates signed by this CA (PEM)")
    p.add_argument("--grant-key-file", help="sign assignments with the Ed25519 private key in this PEM file (the "
                                            "device plugins hold its public key); public keys after it are "
                                            "accepted too (a rotation)")
    p.add_argument("--scheduler-names", type=lambda s: [n.strip() for n in s.split(",") if n.strip()],
                   help="comma list of the spec.schedulerName values of the pods placed and charged "
                        "(default vgpu-scheduler)")
    p.add_argument("--metrics-listen", help="metrics address HOST:PORT (default :9395; '' disables)")
    p.add_argument("--node-policy", help="node scoring policy: fragaware (default), binpack, spread, fgd, bestfit, ...")
    p.add_argument("--gpu-policy", choices=("binpack", "spread"), help="GPU order inside a node (default binpack)")
    p.add_argument("--topology", action=argparse.BooleanOptionalAction, default=None,
                   help="topology-aware placement of multi-GPU containers: one NVLink island, else one NUMA node, "
                        "and nodes that offer it preferred (default on)")
    p.add_argument("--mode", choices=("decide", "score"),
                   help="decide: /filter returns the best node; score: all feasible nodes + /prioritize")
    p.add_argument("--scheduler-name", help="component name on events (default vgpu-scheduler)")
    p.add_argument("--qps", type=float, help="API client QPS (default 50)")
    p.add_argument("--burst", type=int, help="API client burst (default 100)")
    p.add_argument("--dra", action="store_true", default=None,
                   help="DRA mode: also filter and score pods that ask our DeviceClass through ResourceClaims")
    p.add_argument("--preemption", action=argparse.BooleanOptionalAction, default=None,
                   help="evict GPU shares of lower-priority pods for a pod that fits nowhere (default on)")
    p.add_argument("--leader-elect", action="store_true", default=None, help="run Lease leader election")
    p.add_argument("--lease-namespace", help="namespace of the leader-election Lease (default kube-system)")
    p.add_argument("--follow-lease", metavar="NAMESPACE/NAME",
                   help="lead while kube-scheduler of this pod holds its Lease NAMESPACE/NAME (instead of "
                        "--leader-elect)")
    p.add_argument("--leader-identity", metavar="HOSTNAME",
                   help="with --follow-lease: the hostname kube-scheduler's identity starts with (default this host's)")
    p.add_argument("--assume-ttl", type=float, dest="assume_ttl_seconds",
                   help="seconds a /filter reservation waits for /bind (default 30)")
    p.set_defaults(func=_run_scheduler)

    q = subparsers.add_parser("inspect", help="show GPU allocations per node",
                              description="Print nodes and GPUs with allocated/total memory, cores, shares, pods.")
    q.add_argument("--kubeconfig", help="kubeconfig path")
    q.add_argument("--config", help="the scheduler's YAML configuration (its sharing section: resource names, and the "
                                    "memory factor of resource_mode devices); default: MiB, Volcano's names")
    q.set_defaults(func=_run_inspect)


def flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The `vgpu scheduler` flags as configuration keys (every flag whose destination is a SchedulerConfig field;
    None where the flag was not given)."""
    from vgpu.scheduler.config import SchedulerConfig

    return {key: value for key, value in vars(args).items() if key in SchedulerConfig.model_fields}


def _run_scheduler(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from vgpu.httpserve import make_uvicorn_server, parse_listen
    from vgpu.scheduler.config import load_config
    from vgpu.scheduler.runtime import SchedulerRuntime

    config = load_config(args.config, flag_overrides(args))
    host, port = parse_listen(config.listen, 8888)
    runtime = SchedulerRuntime(config)
    # built before anything starts: unusable TLS files are one line and exit 2, not a traceback after the caches
    server = make_uvicorn_server(runtime.app, host, port, tls_cert_file=config.tls_cert_file,
                                 tls_key_file=config.tls_key_file, tls_client_ca_file=config.tls_client_ca_file)
    runtime.start()
    log = logging.getLogger("scheduler")
    log.info("vgpu scheduler listening listen=%s:%s mode=%s node_policy=%s gpu_policy=%s", host, port,
             config.mode, config.node_policy, config.gpu_policy)
    # uvicorn re-raises the SIGTERM it caught once serving ends: make that an exit that runs the clean-up below
    # (leader Lease released, queued events sent) instead of the default action, which kills the process
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        asyncio.run(server.serve())
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        runtime.stop()
    return 0


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def inspect_table(ledger: Any) -> str:
    """Render the ledger as the `vgpu inspect` table (one row per GPU, pods listed on their GPU); memory in MiB."""
    mib = ledger.config.memory_unit.mib  # the annotations count memory units
    header = ("NODE", "GPU", "UUID", "TYPE", "MEMORY MiB(alloc/total)", "CORES(alloc/100)", "SHARES(alloc/split)",
              "HEALTH", "PODS")
    rows: list[tuple[str, ...]] = []
    total_mem = total_alloc = 0
    for state, usage, charges in ledger.snapshot():
        if state.error:
            rows.append((state.name, "-", "-", "-", "-", "-", "-", "-", f"unschedulable: {state.error}"))
            continue
        for device, used in zip(state.devices, usage):
            pods: list[str] = []
            for charge in charges:
                grants = [g for g in charge.grants if g[0] == device.uuid]
                if grants:
                    mem = mib(sum(g[1] for g in grants))
                    cores = sum(g[2] for g in grants)
                    tag = "" if charge.state == "observed" else f",{charge.state}"
                    pods.append(f"{charge.namespace}/{charge.name}({mem},{cores}%{tag})")
            total_mem += mib(device.memory)
            total_alloc += mib(used.memory)
            rows.append((
                # the inventory's type is vendor-name (Volcano's wire format: NVIDIA-NVIDIA A100-...); the name says it
                state.name, str(device.index), device.uuid, device.type.removeprefix(f"{DEVICE_TYPE}-"),
                f"{mib(used.memory)}/{mib(device.memory)}", f"{used.cores}/100", f"{used.shares}/{device.split}",
                "ok" if device.healthy else "unhealthy", " ".join(pods) or "-",
            ))
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) if rows else len(header[i])
              for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in (header, *rows)]
    pct = 100.0 * total_alloc / total_mem if total_mem else 0.0
    lines.append(f"allocated memory: {total_alloc}/{total_mem} MiB ({pct:.1f}%)")
    return "\n".join(lines) + "\n"


def _run_inspect(args: argparse.Namespace) -> int:
    from kubernetes import client as k8s

    from vgpu.kube import make_api_client
    from vgpu.kube.client import read_json
    from vgpu.kube.errors import translate
    from vgpu.scheduler.ledger import Ledger

    api = make_api_client(args.kubeconfig)
    core = k8s.CoreV1Api(api)
    try:
        nodes = read_json(core.list_node(_preload_content=False, _request_timeout=30)) or {}
        pods = read_json(core.list_pod_for_all_namespaces(_preload_content=False, _request_timeout=60)) or {}
    except Exception as exc:
        raise translate(exc, "list nodes and pods") from exc
    from vgpu.scheduler.config import load_config

    ledger = Ledger(load_config(args.config, {}).sharing if args.config else None)
    for node in nodes.get("items") or ():
        ledger.on_node(node)
    for pod in pods.get("items") or ():
        ledger.on_pod(pod)
    sys.stdout.write(inspect_table(ledger))
    return 0
