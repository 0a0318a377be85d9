"""Wiring of a running device plugin: GPU backend, pod cache, allocator, gRPC services, node registrar and monitor.

Built from a resolved `PluginConfig` by `vgpu device-plugin` (deviceplugin.cli, which only parses and dispatches).
`DevicePluginRuntime.start()` starts everything, `stop()` stops it; with `--fail-on-init-error=false` a backend
that cannot start leaves only the metrics endpoint up, exporting `vgpu_device_plugin_backend_up 0`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from vgpu.deviceplugin.allocator import Allocator
from vgpu.deviceplugin.config import WHOLE_GPU_RESOURCE, PluginConfig, resolve_memory_factor
from vgpu.deviceplugin.matching import CORES as KIND_CORES
from vgpu.deviceplugin.matching import GPUS, GrantRules
from vgpu.deviceplugin.matching import MEMORY as KIND_MEMORY
from vgpu.deviceplugin.monitor import NodeCollector, NodeMetrics, serve_metrics
from vgpu.deviceplugin.nodeconfig import excluded
from vgpu.deviceplugin.podresources import KubeletPods, default_socket
from vgpu.deviceplugin.pods import NodePods
from vgpu.deviceplugin.registrar import Registrar
from vgpu.deviceplugin.server import CORES, MEMORY, NUMBER, WHOLE, DevicePluginManager, DeviceState
from vgpu.errors import ConfigError
from vgpu.grants import read_key
from vgpu.isolation.build import paths as isolation_paths
from vgpu.kube.client import make_api_client
from vgpu.kube.events import EventRecorder
from vgpu.node.accounting import read_snapshot
from vgpu.node.backends import BackendUnavailable, GPUBackend, GPUInfo, HealthEvent, make_backend
from vgpu.node.driverlimits import start_driver_limits
from vgpu.node.guard import MemoryGuard, ProcessBackend
from vgpu.node.host import HostFiles
from vgpu.node.pacing import NodePacer, PodCeilings, UtilizationBackend
from vgpu.node.periodic import Periodic
from vgpu.node.response import ResponseOptions
from vgpu.units import MemoryUnit, mib_floor

__all__ = ["DevicePluginRuntime", "health_filter"]

log = logging.getLogger(__name__)


def health_filter(config: PluginConfig) -> Callable[[HealthEvent], bool] | None:
    """Which health events count, per --disable-healthchecks (None: all of them)."""
    off_all, off_xids, _ = config.healthchecks()
    if not off_all and not off_xids:
        return None

    def keep(event: HealthEvent) -> bool:
        return not off_all and event.xid is None

    return keep


class DevicePluginRuntime:
    """Everything `vgpu device-plugin` runs, built from a PluginConfig."""

    def __init__(self, config: PluginConfig, backend: GPUBackend | None = None) -> None:
        self.config = config
        self.backend = backend or make_backend(config.backend_settings())
        self.started: list[Any] = []  # objects with stop()/close()/shutdown(), in start order
        self.metrics_server: Any = None
        self.metrics = NodeMetrics(config.node_name)

    def start(self) -> DevicePluginRuntime:
        """Start serving; raises BackendUnavailable or ConfigError when the node cannot be served."""
        config, backend = self.config, self.backend
        if backend.init_error:
            if config.fail_on_init_error:
                raise BackendUnavailable(
                    f"GPU backend {config.backend} failed to start: {backend.init_error} "
                    "(set --fail-on-init-error=false to stay up without GPUs)")
            log.error("event=backend_init_failed backend=%s error=%s: staying up and advertising nothing "
                      "(--fail-on-init-error=false)", config.backend, backend.init_error)
            if config.metrics_listen:
                host = HostFiles(config.hook_path, config.lock_dir)
                self._serve_metrics(NodeCollector(config.node_name, config.backend, backend, DeviceState([]),
                                                  host.containers_root, host.records, backend_up=False,
                                                  legacy=config.legacy_metrics))
            return self
        gpus = self._usable(backend.devices())
        for gpu in gpus:
            if gpu.mig_enabled:
                raise ConfigError(
                    f"--mig-strategy: none: GPU {gpu.uuid} (index {gpu.nvml_index}) has MIG mode enabled, which "
                    f"this plugin does not support; disable it (nvidia-smi -i {gpu.nvml_index} -mig 0) or keep the "
                    "node off the vgpu-sharing device plugin"
                )
        factor = resolve_memory_factor(config, [g.memory_mib for g in gpus]) if config.resource_mode == "devices" \
            else 1
        key = read_key(config.grant_key_file, "--grant-key-file", private_allowed=False) \
            if config.grant_key_file else None
        sharing = config.sharing_for(factor)
        log.info("event=start node=%s gpus=%d resource_mode=%s factor=%d backend=%s", config.node_name, len(gpus),
                 config.resource_mode, factor, config.backend)

        api = make_api_client(config.kubeconfig, qps=config.kube_qps, burst=config.kube_burst)
        recorder = EventRecorder(api, "vgpu-device-plugin", host=config.node_name)
        pods = NodePods(api, config.node_name).start()
        self.started += [recorder, pods]
        state = DeviceState(gpus)
        resources = sharing.resources
        names = {NUMBER: resources.number}
        kinds = {resources.number: GPUS}
        if config.resource_mode == "devices":  # Volcano's layout: memory and cores as devices too
            names.update({MEMORY: resources.memory, CORES: resources.cores})
            kinds.update({resources.memory: KIND_MEMORY, resources.cores: KIND_CORES})
        if config.advertise_nvidia_gpu:
            names[WHOLE] = WHOLE_GPU_RESOURCE
            kinds[WHOLE_GPU_RESOURCE] = GPUS
        options = ResponseOptions(
            device_list_strategy=tuple(config.device_list_strategy),
            device_id_strategy=config.device_id_strategy,
            pass_device_specs=config.pass_device_specs,
            driver_root=config.nvidia_driver_root,
            gpu_numbers={g.uuid: (g.nvml_index, g.minor) for g in gpus},
            isolation_fail_open=config.isolation_fail_open,
        )
        kubelet_pods = KubeletPods(config.pod_resources_socket or default_socket(config.kubelet_dir))
        self.started.append(kubelet_pods)
        host = HostFiles(config.hook_path, config.lock_dir, config.container_storage)
        try:
            host.check_storage()
        except OSError as exc:
            raise ConfigError(f"--container-storage tmpfs: {exc.strerror}") from None
        self._report_vanished(host, {g.uuid for g in gpus}, recorder)
        rules = GrantRules(
            scheduler_names=frozenset(config.scheduler_names),
            card_memory={g.uuid: MemoryUnit(factor).units(g.memory_mib) for g in gpus},
            key=key,
            accept_unsigned=config.accept_unsigned_grants,
            disable_control_namespaces=frozenset(config.disable_control_namespaces),
        )
        allocator = Allocator(
            config.node_name, sharing, pods, host, rules=rules, core_policy=config.core_policy, resource_kinds=kinds,
            options=options, recorder=recorder, kubelet=kubelet_pods,
        )
        host.install_library_logged(isolation_paths().libvgpu)
        registrar = Registrar(
            api, config.node_name, state, split=sharing.split_count, factor=factor, mode=config.mode,
            interval=config.register_interval, handshake=config.handshake, housekeeping=allocator.collect_garbage,
            labels=config.node_labels,
        )
        limits = start_driver_limits(config.driver_memory_limits, backend, [g.uuid for g in gpus], host.records,
                                     pods.pods, config.cgroup_root)
        if limits is not None:
            self.started.append(limits)
        manager = DevicePluginManager(
            config.kubelet_dir, backend, state, names, split_count=sharing.split_count, memory_factor=factor,
            allocator=allocator, on_allocate=self.metrics.observe_allocate,
            on_health_change=lambda event: self._health_changed(event, registrar, recorder, host),
            health_filter=health_filter(config),
        )
        if config.metrics_listen:
            self._serve_metrics(NodeCollector(config.node_name, config.backend, backend, state, host.containers_root,
                                              host.records, legacy=config.legacy_metrics))
        if config.memory_guard_seconds and isinstance(backend, ProcessBackend):
            guard = MemoryGuard(backend, host.records.all, config.memory_guard_allowance_mib)
            self.started.append(Periodic("vgpu-memory-guard", config.memory_guard_seconds,
                                         lambda: self._guard(guard, recorder)).start())
        if config.pace_seconds and isinstance(backend, UtilizationBackend):
            pacer = NodePacer(host.records.all, backend.process_utilization,
                              lambda record: read_snapshot(host.containers_root, record),
                              lambda record: host.pace_file(record.pod_uid, record.container),
                              ceiling_of=PodCeilings(pods.pods) if config.idle_share else None)
            self.started.append(Periodic("vgpu-pacer", config.pace_seconds,
                                         lambda: self._pace(pacer, host)).start())
        manager.start()
        registrar.start()
        self.started += [manager, registrar]
        return self

    def _usable(self, gpus: list[GPUInfo]) -> list[GPUInfo]:
        """The GPUs this plugin serves: all but those of exclude_devices (the node's entry of --node-config), which
        are never advertised, granted, published or watched."""
        kept, dropped, unmatched = excluded(gpus, self.config.exclude_devices)
        for gpu in dropped:
            log.info("event=gpu_excluded uuid=%s index=%d: left alone (exclude_devices)", gpu.uuid, gpu.nvml_index)
        for entry in unmatched:
            log.warning("event=gpu_exclude_unmatched device=%s: no GPU of this node has that UUID or index", entry)
        return kept

    @staticmethod
    def _report_vanished(host: HostFiles, present: set[str], recorder: EventRecorder) -> None:
        """At start: containers answered before with a GPU this node no longer has (a changed GPU set) are told so;
        the GPU is not published, so nothing is ever placed on it again."""
        for record in host.records.all():
            gone = sorted(set(record.gpus) - present)
            if gone:
                log.warning("event=granted_gpu_vanished pod=%s/%s container=%s gpus=%s", record.namespace,
                            record.pod, record.container, ",".join(gone))
                pod = {"metadata": {"namespace": record.namespace, "name": record.pod, "uid": record.pod_uid}}
                recorder.warning(pod, "VGPUDeviceGone", f"GPU {', '.join(gone)} of container {record.container} "
                                                        "is no longer on this node")

    @staticmethod
    def _health_changed(event: HealthEvent, registrar: Registrar, recorder: EventRecorder, host: HostFiles) -> None:
        """A GPU went unhealthy or recovered: republish the inventory now, and tell each pod holding it."""
        registrar.wake()
        for record in host.records.all():
            if event.uuid not in record.gpus:
                continue
            pod = {"metadata": {"namespace": record.namespace, "name": record.pod, "uid": record.pod_uid}}
            if event.healthy:
                recorder.normal(pod, "VGPUDeviceRecovered", f"GPU {event.uuid} of container {record.container} is "
                                                             "healthy again")
            else:
                recorder.warning(pod, "VGPUDeviceUnhealthy", f"GPU {event.uuid} of container {record.container} is "
                                                             f"unhealthy ({event.reason}); no new pod is placed on it")

    def _guard(self, guard: MemoryGuard, recorder: EventRecorder) -> None:
        """One round of the memory guard: each pod it stopped is logged, told and counted."""
        for stopped in guard.check():
            log.warning("event=memory_guard_kill pod=%s/%s gpu=%s held_mib=%d allowed_mib=%d pids=%s",
                        stopped.namespace, stopped.pod, stopped.uuid, mib_floor(stopped.held),
                        mib_floor(stopped.allowed), ",".join(map(str, stopped.pids)))
            pod = {"metadata": {"namespace": stopped.namespace, "name": stopped.pod, "uid": stopped.pod_uid}}
            recorder.warning(pod, "VGPUMemoryExceeded", stopped.describe())
            self.metrics.guard_kills.labels(self.config.node_name, stopped.uuid).inc()

    def _pace(self, pacer: NodePacer, host: HostFiles) -> None:
        """One round of the pacer: its factors, per pod and GPU, become the gauge's series (gone pods drop out)."""
        factors = pacer.step()
        names = {r.pod_uid: (r.namespace, r.pod) for r in host.records.all()}
        gauge = self.metrics.pace_factors
        gauge.clear()
        for (uid, uuid), factor in factors.items():
            namespace, pod = names.get(uid, ("", uid))
            gauge.labels(self.config.node_name, namespace, pod, uuid).set(round(factor, 4))

    def _serve_metrics(self, collector: NodeCollector) -> None:
        self.metrics_server, port = serve_metrics(self.metrics, collector, self.config.metrics_listen)
        log.info("event=metrics_listening port=%d", port)

    def stop(self) -> None:
        """Stop everything `start` started, the last started first, then release the backend."""
        for part in reversed(self.started):
            if isinstance(part, EventRecorder):
                part.close(1.0)
            elif isinstance(part, KubeletPods):
                part.close()
            else:
                part.stop()
        self.started = []
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
        self.backend.close()
