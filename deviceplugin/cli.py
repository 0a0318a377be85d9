"""`vgpu device-plugin`: the kubelet device plugin, node inventory publisher and node monitor in one process.

`register(subparsers)` is discovered by vgpu/cli.py. Flags override the YAML file given with `--config`.
The process runs until SIGTERM / SIGINT and removes its sockets on the way out.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import Any

__all__ = ["register", "run"]

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    """Add the `device-plugin` subcommand."""
    p = subparsers.add_parser(
        "device-plugin",
        help="run the kubelet device plugin and node monitor",
        description="Advertise split GPUs to kubelet, answer Allocate, publish the node inventory, serve metrics.",
    )
    p.add_argument("--config", metavar="FILE", help="YAML configuration (flags override it)")
    p.add_argument("--node-name", help="this node's name (default: $NODE_NAME)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    p.add_argument("--backend", choices=["nvml", "sim", "null"], help="GPU source (default nvml)")
    p.add_argument("--sim-gpus", help="simulated GPUs, e.g. 4xA100-40GB,2xT4 (backend sim)")
    p.add_argument("--sim-control", metavar="FILE", help="fault-injection control file (backend sim)")
    p.add_argument("--kubelet-dir", help="kubelet device-plugin directory (default /var/lib/kubelet/device-plugins)")
    p.add_argument("--hook-path", help="host directory holding vgpu/ (default /usr/local)")
    p.add_argument("--lock-dir", help="host directory mounted at /tmp/vgpulock (default /tmp/vgpulock)")
    p.add_argument("--metrics-listen", help="HOST:PORT for /metrics (default :9394; empty disables)")
    p.add_argument("--split-count", type=int, help="vgpu-number devices per GPU (default 10)")
    p.add_argument("--gpu-memory-factor", help="MiB per memory unit, or auto (default 1)")
    p.add_argument("--register-interval", type=float, help="seconds between inventory re-checks (default 30)")
    p.add_argument("--handshake", action="store_true", default=None, help="write the legacy handshake annotation")
    p.set_defaults(func=run)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    import os

    factor: Any = args.gpu_memory_factor
    if factor is not None and factor != "auto":
        try:
            factor = int(factor)
        except ValueError:
            pass  # validation reports it with the field name
    return {
        "node_name": args.node_name or (None if args.config else os.environ.get("NODE_NAME")),
        "kubeconfig": args.kubeconfig,
        "backend": args.backend,
        "sim_gpus": args.sim_gpus,
        "sim_control": args.sim_control,
        "kubelet_dir": args.kubelet_dir,
        "hook_path": args.hook_path,
        "lock_dir": args.lock_dir,
        "metrics_listen": args.metrics_listen,
        "split_count": args.split_count,
        "gpu_memory_factor": factor,
        "register_interval": args.register_interval,
        "handshake": args.handshake,
    }


def run(args: argparse.Namespace) -> int:
    """Start everything and block until a termination signal."""
    import os

    from deviceplugin.allocator import Allocator
    from deviceplugin.backends import make_backend
    from deviceplugin.config import load_config, resolve_memory_factor
    from deviceplugin.monitor import NodeCollector, serve_metrics
    from deviceplugin.pods import NodePods
    from deviceplugin.registrar import Registrar
    from deviceplugin.server import (
        CORES,
        MEMORY,
        NUMBER,
        DevicePluginManager,
        DeviceState,
    )
    from vgpu.errors import ConfigError
    from vgpu.kube.client import make_api_client

    config = load_config(args.config, _overrides(args))
    if not config.node_name:
        config.node_name = os.environ.get("NODE_NAME", "")
    if not config.node_name:
        raise ConfigError("node_name: required (--node-name or $NODE_NAME)")
    if config.backend == "sim" and not config.sim_gpus:
        raise ConfigError("sim_gpus: required with --backend sim (e.g. 4xA100-40GB)")

    backend = make_backend(config)
    gpus = backend.devices()
    factor = resolve_memory_factor(config, [g.memory_mib for g in gpus])
    log.info("event=start node=%s gpus=%d factor=%d backend=%s", config.node_name, len(gpus), factor, config.backend)

    api = make_api_client(config.kubeconfig, qps=config.kube_qps, burst=config.kube_burst)
    pods = NodePods(api, config.node_name).start()
    state = DeviceState(gpus)
    allocator = Allocator(
        config.node_name, config.sharing(factor), pods, config.hook_path, config.lock_dir, config.core_policy
    )
    registrar = Registrar(
        api, config.node_name, state, config.split_count, factor, config.mode, config.register_interval,
        config.handshake, housekeeping=allocator.collect_garbage,
    )
    names = {NUMBER: config.resources.number, MEMORY: config.resources.memory, CORES: config.resources.cores}
    manager = DevicePluginManager(
        config.kubelet_dir, backend, state, names, config.split_count, factor, allocator,
        on_health_change=registrar.wake,
    )
    metrics_server = None
    if config.metrics_listen:
        collector = NodeCollector(backend, state, allocator.containers_root, pods.by_uid)
        metrics_server, port = serve_metrics(collector, config.metrics_listen)
        log.info("event=metrics_listening port=%d", port)

    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    manager.start()
    registrar.start()
    try:
        done.wait()
    finally:
        manager.stop()
        registrar.stop()
        pods.stop()
        if metrics_server is not None:
            metrics_server.shutdown()
        backend.close()
    return 0
