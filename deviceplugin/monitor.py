"""Node monitor: `/metrics` on the device plugin's metrics port (default :9394), collected at scrape time.

`vgpu_device_plugin_backend_up` says whether the GPU backend started. Per GPU (from the backend): memory used and
utilisation. Per container the plugin answered (its allocation records, deviceplugin.records): the pod, the GPUs and
the limits granted, and the memory used, SM utilisation and last-kernel age the container's accounting file says
(read without trusting the file: deviceplugin.accounting), within a time budget per scrape. Both the legacy names
of volcano-vgpu-device-plugin (with their labels and the `zone="vGPU"` label) and `vgpu_`-prefixed snake_case
names with units are exported.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from vgpu.deviceplugin.accounting import read_snapshot
from vgpu.deviceplugin.backends import GPUBackend
from vgpu.deviceplugin.records import AllocationRecord, RecordStore
from vgpu.deviceplugin.server import DeviceState
from vgpu.isolation.region import RegionSnapshot

__all__ = ["NodeCollector", "parse_listen", "serve_metrics"]

log = logging.getLogger(__name__)

_LEGACY_CTR = ["podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid", "zone"]
_NEW_CTR = ["namespace", "pod", "container", "device_index", "gpu_uuid"]


def parse_listen(text: str) -> tuple[str, int]:
    """`:9394` -> ("0.0.0.0", 9394); `127.0.0.1:0` -> ("127.0.0.1", 0)."""
    host, _, port = text.rpartition(":")
    return host or "0.0.0.0", int(port)


class NodeCollector(Collector):
    """Builds every metric family on each scrape."""

    def __init__(
        self,
        backend: GPUBackend,
        state: DeviceState,
        containers_root: Path,
        records: RecordStore,
        *,
        now: Callable[[], float] = time.time,
        backend_up: bool = True,
        scrape_budget: float = 2.0,
    ) -> None:
        self.backend_up = backend_up
        self.backend = backend
        self.state = state
        self.root = Path(containers_root)
        self.records = records
        self.now = now
        self.scrape_budget = scrape_budget

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Yield GPU and container metrics."""
        up = GaugeMetricFamily("vgpu_device_plugin_backend_up",
                               "1 if the GPU backend started; 0 when it failed and --fail-on-init-error=false")
        up.add_metric([], 1 if self.backend_up else 0)
        yield up
        yield from self._gpu_metrics()
        yield from self._container_metrics()

    def _gpu_metrics(self) -> Iterator[GaugeMetricFamily]:
        host_mem = GaugeMetricFamily("HostGPUMemoryUsage", "GPU device memory used (bytes)",
                                     labels=["deviceidx", "deviceuuid", "zone"])
        host_util = GaugeMetricFamily("HostCoreUtilization", "GPU core utilisation (percent)",
                                      labels=["deviceidx", "deviceuuid", "zone"])
        gpu_labels = ["gpu_index", "gpu_uuid"]
        mem = GaugeMetricFamily("vgpu_gpu_memory_used_bytes", "GPU device memory used", labels=gpu_labels)
        util = GaugeMetricFamily("vgpu_gpu_utilization_percent", "GPU core utilisation", labels=gpu_labels)
        total = GaugeMetricFamily("vgpu_gpu_memory_total_bytes", "GPU device memory", labels=gpu_labels)
        healthy = GaugeMetricFamily("vgpu_gpu_healthy", "1 if the GPU is healthy", labels=gpu_labels)
        try:
            usage = self.backend.usage()
        except Exception as exc:
            log.warning("event=usage_failed error=%s", exc)
            usage = {}
        _, gpus, health = self.state.snapshot()
        for index, gpu in enumerate(sorted(gpus, key=lambda g: g.minor)):
            labels = [str(index), gpu.uuid]
            total.add_metric(labels, gpu.memory_mib * 1024 * 1024)
            healthy.add_metric(labels, 1 if health.get(gpu.uuid) else 0)
            if gpu.uuid in usage:
                u = usage[gpu.uuid]
                host_mem.add_metric(labels + ["vGPU"], u.memory_used_bytes)
                host_util.add_metric(labels + ["vGPU"], u.utilization_percent)
                mem.add_metric(labels, u.memory_used_bytes)
                util.add_metric(labels, u.utilization_percent)
        yield from (host_mem, host_util, mem, util, total, healthy)

    def _snapshots(self) -> Iterator[tuple[AllocationRecord, RegionSnapshot]]:
        """Each answered container's record and accounting snapshot, within the scrape's time budget."""
        deadline = time.monotonic() + self.scrape_budget
        records = self.records.all()
        for position, record in enumerate(records):
            if time.monotonic() > deadline:
                log.warning("event=scrape_budget_exceeded read=%d skipped=%d budget_s=%.1f", position,
                            len(records) - position, self.scrape_budget)
                return
            snapshot = read_snapshot(self.root, record)
            if snapshot is not None:
                yield record, snapshot

    def _container_metrics(self) -> Iterator[GaugeMetricFamily]:
        legacy_used = GaugeMetricFamily("vGPU_device_memory_usage_in_bytes", "vGPU device usage", labels=_LEGACY_CTR)
        legacy_limit = GaugeMetricFamily("vGPU_device_memory_limit_in_bytes", "vGPU device limit", labels=_LEGACY_CTR)
        legacy_util = GaugeMetricFamily("Device_utilization_desc_of_container", "Container device utilization",
                                        labels=_LEGACY_CTR)
        used = GaugeMetricFamily("vgpu_container_memory_used_bytes", "device memory used by a container",
                                 labels=_NEW_CTR)
        limit = GaugeMetricFamily("vgpu_container_memory_limit_bytes", "device memory limit of a container",
                                  labels=_NEW_CTR)
        sm = GaugeMetricFamily("vgpu_container_sm_utilization_percent", "SM utilisation of a container",
                               labels=_NEW_CTR)
        sm_limit = GaugeMetricFamily("vgpu_container_sm_limit_percent", "SM limit of a container (0 = none)",
                                     labels=_NEW_CTR)
        age = GaugeMetricFamily("vgpu_container_last_kernel_age_seconds", "seconds since the last kernel launch",
                                labels=_NEW_CTR)
        now = self.now()
        # identity, GPUs and limits come from the plugin's own record; usage is what the container's file says
        for record, snap in self._snapshots():
            by_index = {dev.index: dev for dev in snap.devices}
            for index, uuid in enumerate(record.gpus):
                dev = by_index.get(index)
                base = [record.namespace, record.pod, record.container, str(index), uuid]
                legacy = [*base, "vGPU"]
                granted = record.memory_bytes[index] if index < len(record.memory_bytes) else 0
                legacy_limit.add_metric(legacy, granted)
                limit.add_metric(base, granted)
                sm_limit.add_metric(base, record.cores)
                if dev is None:
                    continue
                legacy_used.add_metric(legacy, dev.used)
                legacy_util.add_metric(legacy, dev.sm_util)
                used.add_metric(base, dev.used)
                sm.add_metric(base, dev.sm_util)
                if snap.last_kernel_time > 0 and now - snap.last_kernel_time >= 0:
                    age.add_metric(base, now - snap.last_kernel_time)
        yield from (legacy_used, legacy_limit, legacy_util, used, limit, sm, sm_limit, age)


def serve_metrics(collector: NodeCollector, listen: str) -> tuple[Any, int]:
    """Serve `collector` on HOST:PORT; returns (server, bound port)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    host, port = parse_listen(listen)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server, server.server_address[1]
