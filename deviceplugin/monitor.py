"""Node monitor: `/metrics` on the device plugin's metrics port (default :9394), declared once in `NODE_METRICS`
(deploy/monitoring/METRICS.md is rendered from it; tests compare both with the live endpoint).

Collected at scrape time: whether the GPU backend started; per GPU (from the backend) memory, use, utilisation
and health; per container the plugin answered (its allocation records, node.records) the pod, the GPUs and
the limits granted, and the memory used, SM utilisation and last-kernel age its accounting file says (read without
trusting the file: node.accounting), within a time budget per scrape. Allocate calls are counted and timed
as kubelet makes them (`NodeMetrics.observe_allocate`, called by deviceplugin.server). The `vgpu_` names carry the
node. The legacy names of volcano-vgpu-device-plugin (with their labels and `zone="vGPU"`) are exported only with
`--legacy-metrics`, for dashboards built on them: they are not Prometheus-style names (promtool flags each).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, disable_created_metrics, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from vgpu.deviceplugin.server import DeviceState
from vgpu.isolation.region import RegionSnapshot
from vgpu.metricspec import MetricSpec
from vgpu.node.accounting import read_snapshot
from vgpu.node.backends import GPUBackend
from vgpu.node.records import AllocationRecord, RecordStore
from vgpu.units import bytes_of_mib

__all__ = ["NODE_METRICS", "NodeCollector", "NodeMetrics", "parse_listen", "serve_metrics"]

log = logging.getLogger(__name__)

_LEGACY_GPU = ("deviceidx", "deviceuuid", "zone")
_LEGACY_CTR = ("podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid", "zone")
_GPU = ("node", "device_uuid", "device_index", "device_type")
_CTR = ("node", "namespace", "pod", "container", "device_uuid", "device_index")

HOST_MEMORY = MetricSpec("HostGPUMemoryUsage", "gauge", _LEGACY_GPU,
                         "device memory in use on the GPU, bytes (with --legacy-metrics)", legacy=True)
HOST_UTIL = MetricSpec("HostCoreUtilization", "gauge", _LEGACY_GPU, "GPU utilisation, percent (with --legacy-metrics)",
                       legacy=True)
LEGACY_USED = MetricSpec("vGPU_device_memory_usage_in_bytes", "gauge", _LEGACY_CTR,
                         "memory used by the container on the GPU, bytes (with --legacy-metrics)", legacy=True)
LEGACY_LIMIT = MetricSpec("vGPU_device_memory_limit_in_bytes", "gauge", _LEGACY_CTR,
                          "the container's memory limit on the GPU, bytes (with --legacy-metrics)", legacy=True)
LEGACY_UTIL = MetricSpec("Device_utilization_desc_of_container", "gauge", _LEGACY_CTR,
                         "SM utilisation of the container on the GPU, percent (with --legacy-metrics)", legacy=True)
BACKEND_UP = MetricSpec("vgpu_device_plugin_backend_up", "gauge", ("node", "backend"),
                        "1 when the GPU backend started, 0 when it failed and --fail-on-init-error=false kept the "
                        "plugin up")
DEVICE_MEMORY_TOTAL = MetricSpec("vgpu_device_memory_total_bytes", "gauge", _GPU, "memory of the GPU, bytes")
DEVICE_MEMORY_USED = MetricSpec("vgpu_device_memory_used_bytes", "gauge", _GPU,
                                "memory in use on the GPU (NVML or simulated), bytes")
DEVICE_UTIL = MetricSpec("vgpu_device_core_utilization_percent", "gauge", _GPU, "GPU utilisation, percent")
DEVICE_HEALTHY = MetricSpec("vgpu_device_healthy", "gauge", _GPU, "1 healthy, 0 unhealthy (an Xid, or lost)")
CTR_MEMORY_USED = MetricSpec("vgpu_container_memory_used_bytes", "gauge", _CTR,
                             "memory the container uses on the GPU (its accounting file), bytes")
CTR_MEMORY_LIMIT = MetricSpec("vgpu_container_memory_limit_bytes", "gauge", _CTR,
                              "memory granted to the container on the GPU, bytes")
CTR_CORE_UTIL = MetricSpec("vgpu_container_core_utilization_percent", "gauge", _CTR,
                           "SM utilisation of the container on the GPU (its accounting file), percent")
CTR_CORE_LIMIT = MetricSpec("vgpu_container_core_limit_percent", "gauge", _CTR,
                            "compute granted to the container (CUDA_DEVICE_SM_LIMIT), percent; 0 = no limit")
CTR_KERNEL_AGE = MetricSpec("vgpu_container_last_kernel_age_seconds", "gauge", _CTR,
                            "seconds since the container last launched a kernel")
ALLOCATE = MetricSpec("vgpu_device_plugin_allocate", "counter", ("node", "resource", "result"),
                      "Allocate calls by `result`: answered (the container's limits returned), pending (the call "
                      "is kept until the container's next call) or refused")
ALLOCATE_SECONDS = MetricSpec("vgpu_device_plugin_allocate_duration_seconds", "histogram", ("node",),
                              "time to answer one Allocate call, seconds")

GUARD_KILLS = MetricSpec("vgpu_memory_guard_kills", "counter", ("node", "device_uuid"),
                         "pods the memory guard found holding more of the GPU than granted (NVML's running processes), "
                         "whose processes there it killed")

PACE_FACTOR = MetricSpec("vgpu_pace_factor", "gauge", ("node", "namespace", "pod", "device_uuid"),
                         "what the pacer has the library multiply the pod's kernel timings by on the GPU: below 1 "
                         "where the GPU's time slicing made its events read other pods' slices too; 1 uncorrected")

NODE_METRICS = (HOST_MEMORY, HOST_UTIL, LEGACY_USED, LEGACY_LIMIT, LEGACY_UTIL, BACKEND_UP, DEVICE_MEMORY_TOTAL,
                DEVICE_MEMORY_USED, DEVICE_UTIL, DEVICE_HEALTHY, CTR_MEMORY_USED, CTR_MEMORY_LIMIT, CTR_CORE_UTIL,
                CTR_CORE_LIMIT, CTR_KERNEL_AGE, ALLOCATE, ALLOCATE_SECONDS, GUARD_KILLS, PACE_FACTOR)
_LEGACY_NAMES = frozenset(spec.name for spec in NODE_METRICS if spec.legacy)
_ALLOCATE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def parse_listen(text: str) -> tuple[str, int]:
    """`:9394` -> ("0.0.0.0", 9394); `127.0.0.1:0` -> ("127.0.0.1", 0)."""
    host, _, port = text.rpartition(":")
    return host or "0.0.0.0", int(port)


class NodeCollector(Collector):
    """Builds the GPU and container families on each scrape."""

    def __init__(
        self,
        node: str,
        backend_name: str,
        backend: GPUBackend,
        state: DeviceState,
        containers_root: Path,
        records: RecordStore,
        *,
        now: Callable[[], float] = time.time,
        backend_up: bool = True,
        scrape_budget: float = 2.0,
        legacy: bool = False,
    ) -> None:
        self.node = node
        self.legacy = legacy
        self.backend_name = backend_name
        self.backend_up = backend_up
        self.backend = backend
        self.state = state
        self.root = Path(containers_root)
        self.records = records
        self.now = now
        self.scrape_budget = scrape_budget

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Yield GPU and container metrics."""
        up = BACKEND_UP.family()
        up.add_metric([self.node, self.backend_name], 1 if self.backend_up else 0)
        yield up
        yield from self._gpu_metrics()
        yield from self._container_metrics()

    def _gpu_metrics(self) -> Iterator[GaugeMetricFamily]:
        families = {spec.name: spec.family() for spec in (HOST_MEMORY, HOST_UTIL, DEVICE_MEMORY_TOTAL,
                                                          DEVICE_MEMORY_USED, DEVICE_UTIL, DEVICE_HEALTHY)}
        try:
            usage = self.backend.usage()
        except Exception as exc:
            log.warning("event=usage_failed error=%s", exc)
            usage = {}
        _, gpus, health = self.state.snapshot()
        for index, gpu in enumerate(sorted(gpus, key=lambda g: g.minor)):
            labels = [self.node, gpu.uuid, str(index), gpu.name]
            families[DEVICE_MEMORY_TOTAL.name].add_metric(labels, bytes_of_mib(gpu.memory_mib))
            families[DEVICE_HEALTHY.name].add_metric(labels, 1 if health.get(gpu.uuid) else 0)
            if gpu.uuid in usage:
                u = usage[gpu.uuid]
                legacy = [str(index), gpu.uuid, "vGPU"]
                families[HOST_MEMORY.name].add_metric(legacy, u.memory_used_bytes)
                families[HOST_UTIL.name].add_metric(legacy, u.utilization_percent)
                families[DEVICE_MEMORY_USED.name].add_metric(labels, u.memory_used_bytes)
                families[DEVICE_UTIL.name].add_metric(labels, u.utilization_percent)
        yield from self._exported(families)

    def _exported(self, families: dict[str, GaugeMetricFamily]) -> Iterator[GaugeMetricFamily]:
        """The families to export: the legacy ones only with `legacy`."""
        return (family for name, family in families.items() if self.legacy or name not in _LEGACY_NAMES)

    def _records(self) -> Iterator[tuple[AllocationRecord, RegionSnapshot | None]]:
        """Each answered container's record and accounting snapshot (None: none readable), within the scrape's
        time budget."""
        deadline = time.monotonic() + self.scrape_budget
        records = self.records.current()  # one per container name: a series per label set
        for position, record in enumerate(records):
            if time.monotonic() > deadline:
                log.warning("event=scrape_budget_exceeded read=%d skipped=%d budget_s=%.1f", position,
                            len(records) - position, self.scrape_budget)
                return
            yield record, read_snapshot(self.root, record)

    def _container_metrics(self) -> Iterator[GaugeMetricFamily]:
        families = {spec.name: spec.family() for spec in (LEGACY_USED, LEGACY_LIMIT, LEGACY_UTIL, CTR_MEMORY_USED,
                                                          CTR_MEMORY_LIMIT, CTR_CORE_UTIL, CTR_CORE_LIMIT,
                                                          CTR_KERNEL_AGE)}

        def add(spec: MetricSpec, labels: list[str], value: float) -> None:
            families[spec.name].add_metric(labels, value)

        now = self.now()
        # identity, GPUs and limits come from the plugin's own record; usage is what the container's file says
        for record, snap in self._records():
            by_index = {dev.index: dev for dev in snap.devices} if snap is not None else {}
            for index, uuid in enumerate(record.gpus):
                labels = [self.node, record.namespace, record.pod, record.container, uuid, str(index)]
                legacy = [record.namespace, record.pod, record.container, str(index), uuid, "vGPU"]
                granted = record.memory_bytes[index] if index < len(record.memory_bytes) else 0
                add(LEGACY_LIMIT, legacy, granted)
                add(CTR_MEMORY_LIMIT, labels, granted)
                add(CTR_CORE_LIMIT, labels, record.cores)
                dev = by_index.get(index)
                if snap is None or dev is None:
                    continue
                add(LEGACY_USED, legacy, dev.used)
                add(LEGACY_UTIL, legacy, dev.sm_util)
                add(CTR_MEMORY_USED, labels, dev.used)
                add(CTR_CORE_UTIL, labels, dev.sm_util)
                if snap.last_kernel_time > 0 and now - snap.last_kernel_time >= 0:
                    add(CTR_KERNEL_AGE, labels, now - snap.last_kernel_time)
        yield from self._exported(families)


class NodeMetrics:
    """The node's registry: the collector's families plus the Allocate counter and histogram, the memory guard's
    counter and the pacer's factors."""

    def __init__(self, node: str) -> None:
        disable_created_metrics()  # no `_created` series beside counters and histograms: not in the declarations
        self.node = node
        self.registry = CollectorRegistry(auto_describe=False)
        self.allocations = ALLOCATE.counter(self.registry)
        self.allocate_seconds = ALLOCATE_SECONDS.histogram(self.registry, _ALLOCATE_BUCKETS)
        self.guard_kills = GUARD_KILLS.counter(self.registry)
        self.pace_factors = PACE_FACTOR.gauge(self.registry)

    def observe_allocate(self, resource: str, result: str, seconds: float) -> None:
        """Count one Allocate call of `resource` and its duration."""
        self.allocations.labels(self.node, resource, result).inc()
        self.allocate_seconds.labels(self.node).observe(seconds)


def serve_metrics(metrics: NodeMetrics, collector: NodeCollector, listen: str) -> tuple[Any, int]:
    """Serve the node's metrics on HOST:PORT; returns (server, bound port)."""
    metrics.registry.register(collector)
    host, port = parse_listen(listen)
    server, _thread = start_http_server(port, addr=host, registry=metrics.registry)
    return server, server.server_address[1]
