"""Prometheus metrics of the scheduler extender (served on :9395/metrics by `vgpu scheduler`).

Allocation metrics are computed at scrape time from a ledger snapshot (a custom collector), so pod events and
/filter calls never touch a metric object; request latencies are histograms observed by `vgpu.scheduler.server`.
Every metric lives in the registry of one `SchedulerMetrics`, so tests can build several side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from vgpu.scheduler.ledger import Ledger

__all__ = ["LATENCY_BUCKETS", "LedgerCollector", "SchedulerMetrics"]

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LedgerCollector(Collector):
    """Per-GPU allocated/total memory, cores and shares, and per-pod allocations, read from the ledger."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gpu_labels = ["node", "uuid", "index", "type"]
        mem = GaugeMetricFamily("vgpu_scheduler_gpu_memory_allocated_mebibytes",
                                "Device memory allocated on the GPU (memory units)", labels=gpu_labels)
        mem_total = GaugeMetricFamily("vgpu_scheduler_gpu_memory_total_mebibytes",
                                      "Device memory of the GPU (memory units)", labels=gpu_labels)
        cores = GaugeMetricFamily("vgpu_scheduler_gpu_cores_allocated_percent",
                                  "Compute allocated on the GPU, percent", labels=gpu_labels)
        shares = GaugeMetricFamily("vgpu_scheduler_gpu_shares_allocated",
                                   "Containers sharing the GPU", labels=gpu_labels)
        shares_total = GaugeMetricFamily("vgpu_scheduler_gpu_shares_total",
                                         "Split count of the GPU", labels=gpu_labels)
        healthy = GaugeMetricFamily("vgpu_scheduler_gpu_healthy", "1 when the GPU is published healthy",
                                    labels=gpu_labels)
        pod_labels = ["namespace", "pod", "node", "uuid", "state"]
        pod_mem = GaugeMetricFamily("vgpu_scheduler_pod_memory_allocated_mebibytes",
                                    "Device memory granted to the pod on the GPU", labels=pod_labels)
        pod_cores = GaugeMetricFamily("vgpu_scheduler_pod_cores_allocated_percent",
                                      "Compute granted to the pod on the GPU, percent", labels=pod_labels)
        node_ok = GaugeMetricFamily("vgpu_scheduler_node_schedulable",
                                    "1 when the node's inventory parses and it has allocatable vGPUs",
                                    labels=["node"])
        for state, usage, charges in self.ledger.snapshot():
            node_ok.add_metric([state.name], 0.0 if state.error else 1.0)
            for device, used in zip(state.devices, usage):
                labels = [state.name, device.uuid, str(device.index), device.type]
                mem.add_metric(labels, used.memory)
                mem_total.add_metric(labels, device.memory)
                cores.add_metric(labels, used.cores)
                shares.add_metric(labels, used.shares)
                shares_total.add_metric(labels, device.split)
                healthy.add_metric(labels, 1.0 if device.healthy else 0.0)
            for charge in charges:
                per_gpu: dict[str, list[int]] = {}
                for uuid, memory, core in charge.grants:
                    acc = per_gpu.setdefault(uuid, [0, 0])
                    acc[0] += memory
                    acc[1] += core
                for uuid, (memory, core) in per_gpu.items():
                    labels = [charge.namespace, charge.name, charge.node, uuid, charge.state]
                    pod_mem.add_metric(labels, memory)
                    pod_cores.add_metric(labels, core)
        yield from (mem, mem_total, cores, shares, shares_total, healthy, pod_mem, pod_cores, node_ok)


class SchedulerMetrics:
    """The extender's metrics in their own registry."""

    def __init__(self, ledger: Ledger | None = None, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.latency = Histogram(
            "vgpu_scheduler_request_duration_seconds",
            "Extender request latency by verb",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "vgpu_scheduler_requests", "Extender requests by verb and outcome", ["verb", "outcome"],
            registry=self.registry,
        )
        self.cache_synced = Gauge(
            "vgpu_scheduler_cache_synced", "1 once the watch cache has listed everything", ["cache"],
            registry=self.registry,
        )
        self.leader = Gauge("vgpu_scheduler_leader", "1 while this replica holds the lease", registry=self.registry)
        self.ready = Gauge("vgpu_scheduler_ready", "1 while /readyz answers 200", registry=self.registry)
        self.inconsistent_grants = Counter(
            "vgpu_scheduler_inconsistent_grants",
            "Bound pods whose GPU assignment differs from their spec (charged at the larger of the two)",
            registry=self.registry,
        )
        if ledger is not None:
            self.registry.register(LedgerCollector(ledger))

    def track_cache(self, name: str, synced: Callable[[], bool]) -> None:
        """Report a cache's sync state at every scrape."""
        self.cache_synced.labels(name).set_function(lambda: 1.0 if synced() else 0.0)
