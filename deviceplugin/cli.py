"""`vgpu device-plugin`: the kubelet device plugin, node inventory publisher and node monitor in one process.

`register(subparsers)` is discovered by vgpu/cli.py. Options (flags, environment variables, the two files and their
precedence) are defined in vgpu.deviceplugin.config.OPTIONS; `--help` lists each with its default and environment name.
With --fail-on-init-error=false a backend that cannot start leaves the process up, advertising nothing and
exporting `vgpu_device_plugin_backend_up 0`.
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
    """Add the `device-plugin` subcommand; its options come from vgpu.deviceplugin.config.OPTIONS."""
    from vgpu.deviceplugin.config import CONFIG_FILE_ENV, CONFIG_FILE_FLAG, OPTIONS

    p = subparsers.add_parser(
        "device-plugin",
        help="run the kubelet device plugin and node monitor",
        description="Advertise split GPUs to kubelet, answer Allocate, publish the node inventory, serve metrics.",
        epilog="Precedence: flag > environment > --config-file > --config > default. Booleans take true/false "
        "(a bare boolean flag means true). Every option: docs/deviceplugin-options.md.",
    )
    p.add_argument("--config", metavar="FILE",
                   help="component YAML file with the sharing section shared with the scheduler "
                        "(deploy/: device-plugin.yaml) (default none)")
    p.add_argument(CONFIG_FILE_FLAG, dest="config_file", metavar="FILE",
                   help=f"options file in the NVIDIA device plugin's layout (version: v1, flags: ...) "
                        f"(default none; env {CONFIG_FILE_ENV})")
    for option in OPTIONS:
        where = [f"default {option.default}"]
        if option.env:
            where.append(f"env {option.env}")
        if option.file_key:
            where.append(f"file {option.file_key}")
        text = f"{option.help}" + (f" [{', '.join(option.choices)}]" if option.choices else "")
        text += f" ({'; '.join(where)})"
        kwargs: dict[str, Any] = {"dest": option.field.replace(".", "__"), "help": text.replace("%", "%%")}
        if option.kind == "bool":
            kwargs.update(nargs="?", const="true", metavar="BOOL")
        else:
            kwargs["metavar"] = option.flag.lstrip("-").replace("-", "_").upper()
        p.add_argument(option.flag, **kwargs)
    p.set_defaults(func=run)


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    from vgpu.deviceplugin.config import OPTIONS

    return {o.field: getattr(args, o.field.replace(".", "__"), None) for o in OPTIONS}


def _health_filter(config: Any) -> Any:
    off_all, off_xids, _ = config.healthchecks()
    if not off_all and not off_xids:
        return None

    def keep(event: Any) -> bool:
        if off_all:
            return False
        return event.xid is None

    return keep


def run(args: argparse.Namespace) -> int:
    """Start everything and block until a termination signal."""
    import os
    import sys

    from vgpu.deviceplugin.allocator import CORES as KIND_CORES
    from vgpu.deviceplugin.allocator import GPUS, Allocator, ResponseOptions
    from vgpu.deviceplugin.allocator import MEMORY as KIND_MEMORY
    from vgpu.deviceplugin.backends import make_backend
    from vgpu.deviceplugin.config import (
        WHOLE_GPU_RESOURCE,
        resolve_config,
        resolve_memory_factor,
    )
    from vgpu.deviceplugin.monitor import NodeCollector, serve_metrics
    from vgpu.deviceplugin.podresources import KubeletPods, default_socket
    from vgpu.deviceplugin.pods import NodePods
    from vgpu.deviceplugin.registrar import Registrar
    from vgpu.deviceplugin.server import (
        CORES,
        MEMORY,
        NUMBER,
        WHOLE,
        DevicePluginManager,
        DeviceState,
    )
    from vgpu.errors import ConfigError
    from vgpu.isolation import build as isolation_build
    from vgpu.kube.client import make_api_client
    from vgpu.kube.events import EventRecorder

    config = resolve_config(args.config, _flags(args), os.environ, args.config_file)

    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())

    backend = make_backend(config)
    if backend.init_error:
        if config.fail_on_init_error:
            print(f"vgpu device-plugin: GPU backend {config.backend} failed to start: {backend.init_error} "
                  "(set --fail-on-init-error=false to stay up without GPUs)", file=sys.stderr)
            return 1
        log.error("event=backend_init_failed backend=%s error=%s: staying up and advertising nothing "
                  "(--fail-on-init-error=false)", config.backend, backend.init_error)
        metrics_server = None
        if config.metrics_listen:
            collector = NodeCollector(backend, DeviceState([]), config.hook_path + "/vgpu/containers",
                                      backend_up=False)
            metrics_server, port = serve_metrics(collector, config.metrics_listen)
            log.info("event=metrics_listening port=%d", port)
        done.wait()
        if metrics_server is not None:
            metrics_server.shutdown()
        return 0

    gpus = backend.devices()
    for gpu in gpus:
        if gpu.mig_enabled:
            backend.close()
            raise ConfigError(
                f"--mig-strategy: none: GPU {gpu.uuid} (index {gpu.nvml_index}) has MIG mode enabled, which this "
                f"plugin does not support; disable it (nvidia-smi -i {gpu.nvml_index} -mig 0) or keep the node off "
                "the vgpu-sharing device plugin"
            )
    factor = resolve_memory_factor(config, [g.memory_mib for g in gpus])
    sharing = config.sharing_for(factor)
    log.info("event=start node=%s gpus=%d factor=%d backend=%s", config.node_name, len(gpus), factor, config.backend)

    api = make_api_client(config.kubeconfig, qps=config.kube_qps, burst=config.kube_burst)
    recorder = EventRecorder(api, "vgpu-device-plugin", host=config.node_name)
    pods = NodePods(api, config.node_name).start()
    state = DeviceState(gpus)
    names = {NUMBER: sharing.resources.number, MEMORY: sharing.resources.memory, CORES: sharing.resources.cores}
    kinds = {sharing.resources.number: GPUS, sharing.resources.memory: KIND_MEMORY,
             sharing.resources.cores: KIND_CORES}
    if config.advertise_nvidia_gpu:
        names[WHOLE] = WHOLE_GPU_RESOURCE
        kinds[WHOLE_GPU_RESOURCE] = GPUS
    options = ResponseOptions(
        device_list_strategy=tuple(config.device_list_strategy),
        device_id_strategy=config.device_id_strategy,
        pass_device_specs=config.pass_device_specs,
        driver_root=config.nvidia_driver_root,
        gpu_numbers={g.uuid: (g.nvml_index, g.minor) for g in gpus},
    )
    kubelet_pods = KubeletPods(config.pod_resources_socket or default_socket(config.kubelet_dir))
    allocator = Allocator(
        config.node_name, sharing, pods, config.hook_path, config.lock_dir, config.core_policy,
        resource_kinds=kinds, options=options, recorder=recorder, kubelet=kubelet_pods,
    )
    library = isolation_build.paths().libvgpu
    try:
        if allocator.install_library(library):
            log.info("event=libvgpu_installed source=%s target=%s", library, allocator.vgpu_root / "libvgpu.so")
    except OSError as exc:
        log.error("event=libvgpu_not_installed source=%s target=%s error=%s: containers will not find the isolation "
                  "library", library, allocator.vgpu_root / "libvgpu.so", exc)
    registrar = Registrar(
        api, config.node_name, state, sharing.split_count, factor, config.mode, config.register_interval,
        config.handshake, housekeeping=allocator.collect_garbage, labels=config.node_labels,
    )
    manager = DevicePluginManager(
        config.kubelet_dir, backend, state, names, sharing.split_count, factor, allocator,
        on_health_change=registrar.wake, health_filter=_health_filter(config),
    )
    metrics_server = None
    if config.metrics_listen:
        collector = NodeCollector(backend, state, allocator.containers_root, pods.by_uid)
        metrics_server, port = serve_metrics(collector, config.metrics_listen)
        log.info("event=metrics_listening port=%d", port)

    manager.start()
    registrar.start()
    try:
        done.wait()
    finally:
        manager.stop()
        registrar.stop()
        pods.stop()
        kubelet_pods.close()
        recorder.close(1.0)
        if metrics_server is not None:
            metrics_server.shutdown()
        backend.close()
    return 0
