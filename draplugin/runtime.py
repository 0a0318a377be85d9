"""Wiring of a running DRA kubelet plugin: GPU backend, health, isolation library, slice publisher, gRPC servers.

Built from a `DRAConfig` by `vgpu dra-plugin` (draplugin.cli). `start()` installs libvgpu.so, loads the checkpoint,
serves the DRA (with the device-health stream) and registration sockets, publishes the slice and follows the
backend's health events (an unhealthy GPU leaves the slice, a recovered one comes back); `stop()` undoes it in
reverse. The slice is left in place on stop: kubelet deletes the slices of a driver that stays unregistered, and a
restart must not make devices vanish from the scheduler's view.
"""

from __future__ import annotations

import logging
import threading

from vgpu.draplugin.cdi import CDISpecs
from vgpu.draplugin.checkpoint import Checkpoint
from vgpu.draplugin.config import DRAConfig
from vgpu.draplugin.health import GPUHealth
from vgpu.draplugin.prepare import ClaimPreparer, pacing_records
from vgpu.draplugin.server import DRAServers, HealthService
from vgpu.draplugin.slices import SlicePublisher
from vgpu.errors import ConfigError
from vgpu.isolation.build import paths as isolation_paths
from vgpu.kube.client import make_api_client
from vgpu.kube.events import EventRecorder
from vgpu.node.accounting import read_snapshot
from vgpu.node.backends import BackendUnavailable, GPUBackend, make_backend
from vgpu.node.host import HostFiles
from vgpu.node.pacing import NodePacer, UtilizationBackend
from vgpu.node.periodic import Periodic

__all__ = ["DRAPluginRuntime"]

log = logging.getLogger(__name__)
_POLL_SECONDS = 0.5


class DRAPluginRuntime:
    """Everything `vgpu dra-plugin` runs, built from a DRAConfig."""

    def __init__(self, config: DRAConfig, backend: GPUBackend | None = None) -> None:
        self.config = config
        self.backend = backend or make_backend(config.backend_settings())
        self.servers: DRAServers | None = None
        self.publisher: SlicePublisher | None = None
        self.events: EventRecorder | None = None
        self._stopping = threading.Event()
        self._health_thread: threading.Thread | None = None
        self._pacer: Periodic | None = None

    def start(self) -> DRAPluginRuntime:
        """Start serving; raises BackendUnavailable or ConfigError when the node cannot be served."""
        config, backend = self.config, self.backend
        if backend.init_error:
            raise BackendUnavailable(f"GPU backend {config.backend} failed to start: {backend.init_error}")
        gpus = []
        for gpu in backend.devices():
            if gpu.mig_enabled:
                log.error("event=gpu_skipped uuid=%s index=%d reason=mig_enabled: MIG-enabled cards are not "
                          "published", gpu.uuid, gpu.nvml_index)
                continue
            gpus.append(gpu)
        health = GPUHealth(gpus)
        api = make_api_client(config.kubeconfig)  # an unusable kubeconfig fails before anything on the host changes
        host = HostFiles(config.hook_path, config.lock_dir, config.container_storage)
        try:
            host.check_storage()
        except OSError as exc:
            raise ConfigError(f"--container-storage tmpfs: {exc.strerror}") from None
        host.install_library_logged(isolation_paths().libvgpu)
        preparer = ClaimPreparer(api, config.node_name, gpus, health.is_healthy, host, CDISpecs(config.cdi_dir),
                                 Checkpoint(config.checkpoint_path), config.isolation_fail_open)
        log.info("event=start node=%s gpus=%d backend=%s prepared_claims=%d", config.node_name, len(gpus),
                 config.backend, len(preparer.prepared))
        self.events = EventRecorder(api, "vgpu-dra-plugin", host=config.node_name)
        self.publisher = SlicePublisher(api, config.node_name, health.healthy, self.events).start()
        # kubelet deletes the slices of a driver it does not know (at its start, or once the plugin was gone for a
        # while): each registration republishes
        self.servers = DRAServers(preparer, config.dra_socket, config.registration_socket, self.publisher.wake,
                                  HealthService(config.node_name, health))
        self.servers.start()
        self._health_thread = threading.Thread(target=self._follow_health, args=(health, self.publisher),
                                               name="dra-health", daemon=True)
        self._health_thread.start()
        if config.pace_seconds and isinstance(backend, UtilizationBackend):
            self._pacer = Periodic("vgpu-pacer", config.pace_seconds, self._pacer_of(preparer, host, backend).step)
            self._pacer.start()
        return self

    @staticmethod
    def _pacer_of(preparer: ClaimPreparer, host: HostFiles, backend: UtilizationBackend) -> NodePacer:
        """The pacer over the prepared claims: a claim is a tenant, its pods' processes are its own."""
        def claim_of(pod_uid: str) -> str | None:
            return next((c.uid for c in list(preparer.prepared.values()) if pod_uid in c.consumers), None)

        return NodePacer(lambda: pacing_records(preparer.prepared), backend.process_utilization,
                         lambda record: read_snapshot(host.containers_root, record),
                         lambda record: host.pace_file(record.pod_uid, record.container), tenant_of_pod=claim_of)

    def _follow_health(self, health: GPUHealth, publisher: SlicePublisher) -> None:
        while not self._stopping.is_set():
            for event in self.backend.poll_health(_POLL_SECONDS):
                if health.apply(event):
                    log.warning("event=gpu_health_changed uuid=%s healthy=%s reason=%s xid=%s", event.uuid,
                                event.healthy, event.reason, event.xid)
                    publisher.wake()

    def stop(self) -> None:
        """Stop serving (sockets removed), stop the publisher and the health thread, release the backend."""
        self._stopping.set()
        if self._pacer is not None:
            self._pacer.stop()
        if self.servers is not None:
            self.servers.stop()
        if self.publisher is not None:
            self.publisher.stop()
        if self.events is not None:
            self.events.close()
        if self._health_thread is not None:
            self._health_thread.join(5)
        self.backend.close()
