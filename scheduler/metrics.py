"""Prometheus metrics of the scheduler extender (served on :9395/metrics by `vgpu scheduler`), declared once in
`SCHEDULER_METRICS` (deploy/monitoring/METRICS.md is rendered from it; tests compare both with the live endpoint).

Allocation metrics are computed at scrape time from a ledger snapshot (a custom collector), so pod events and
/filter calls never touch a metric object; request latencies, outcomes and decisions are observed by
`vgpu.scheduler.server`. Memory is exported in bytes (memory units x the sharing factor x 2^20). Every metric lives
in the registry of one `SchedulerMetrics`, so tests can build several side by side.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from vgpu.metricspec import MetricSpec
from vgpu.scheduler.ledger import ChargeState, Ledger

__all__ = ["LATENCY_BUCKETS", "SCHEDULER_METRICS", "LedgerCollector", "SchedulerMetrics"]

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_GPU = ("node", "device_uuid", "device_index", "device_type")
_POD = ("namespace", "pod", "node", "device_uuid", "state")


DEVICE_MEMORY_TOTAL = MetricSpec("vgpu_scheduler_device_memory_total_bytes", "gauge", _GPU,
                            "memory of the GPU as its node publishes it, bytes")
DEVICE_MEMORY_ALLOCATED = MetricSpec("vgpu_scheduler_device_memory_allocated_bytes", "gauge", _GPU,
                                "memory granted to pods on the GPU, bytes")
DEVICE_CORES_ALLOCATED = MetricSpec("vgpu_scheduler_device_cores_allocated_percent", "gauge", _GPU,
                               "compute granted to pods on the GPU, percent of the GPU")
DEVICE_SHARES_ALLOCATED = MetricSpec("vgpu_scheduler_device_shares_allocated", "gauge", _GPU,
                                "containers holding the GPU")
DEVICE_SPLIT = MetricSpec("vgpu_scheduler_device_shares_capacity", "gauge", _GPU,
                     "containers the GPU may hold (its split count)")
DEVICE_HEALTHY = MetricSpec("vgpu_scheduler_device_healthy", "gauge", _GPU,
                       "1 when the node publishes the GPU healthy, else 0")
POD_MEMORY = MetricSpec("vgpu_scheduler_pod_memory_allocated_bytes", "gauge", _POD,
                   "memory granted to the pod on the GPU, bytes; `state` is assumed (reserved, not bound yet), "
                   "bound (bound, not yet seen by the pod watch), observed, or nominated (room held for the pod "
                   "while the pods preempted for it end)")
POD_CORES = MetricSpec("vgpu_scheduler_pod_cores_allocated_percent", "gauge", _POD,
                  "compute granted to the pod on the GPU, percent")
NODES = MetricSpec("vgpu_scheduler_nodes", "gauge", ("state",),
              "nodes with a GPU inventory by `state`: schedulable, or invalid (the annotation does not parse)")
RESERVATIONS = MetricSpec("vgpu_scheduler_reservations", "gauge", ("state",),
                     "pods charged in the ledger by `state` (assumed, bound, observed, nominated)")
REQUESTS = MetricSpec("vgpu_scheduler_requests", "counter", ("verb", "outcome"),
                 "extender calls by `verb` (filter, prioritize, bind, preempt) and `outcome` (ok, error: an "
                 "answer with Error, invalid, bad_json, too_large, internal)")
DURATION = MetricSpec("vgpu_scheduler_request_duration_seconds", "histogram", ("verb",),
                 "time to answer one extender call, seconds")
DECISIONS = MetricSpec("vgpu_scheduler_decisions", "counter", ("verb", "decision"),
                  "what the extender decided: filter placed (some node fits) or unschedulable; bind bound or "
                  "refused")
INCONSISTENT = MetricSpec("vgpu_scheduler_inconsistent_grants", "counter", (),
                     "bound pods whose GPU assignment annotation differs from their spec (charged at the larger "
                     "of the two, reported with a VGPUGrantInconsistent event)")
CACHE_SYNCED = MetricSpec("vgpu_scheduler_cache_synced", "gauge", ("cache",),
                     "1 once the watch cache (nodes, pods) has listed everything")
PREEMPTION_EVICTIONS = MetricSpec("vgpu_scheduler_preemption_evictions", "counter", ("outcome",),
                                  "pods of lower priority evicted to make room for a pod (outcome evicted), or "
                                  "whose eviction the API server refused, which stops that preemption (refused)")
LEADER = MetricSpec("vgpu_scheduler_leader", "gauge", (), "1 while this replica holds the extender's Lease")
READY = MetricSpec("vgpu_scheduler_ready", "gauge", (), "1 while /readyz answers 200")

SCHEDULER_METRICS = (DEVICE_MEMORY_TOTAL, DEVICE_MEMORY_ALLOCATED, DEVICE_CORES_ALLOCATED, DEVICE_SHARES_ALLOCATED,
                     DEVICE_SPLIT, DEVICE_HEALTHY, POD_MEMORY, POD_CORES, NODES, RESERVATIONS, REQUESTS, DURATION,
                     DECISIONS, INCONSISTENT, PREEMPTION_EVICTIONS, CACHE_SYNCED, LEADER, READY)


class LedgerCollector(Collector):
    """Per-GPU allocated/total memory, cores and shares, per-pod allocations and node and charge counts, read from
    the ledger at scrape time."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.bytes_per_unit = ledger.config.memory_unit.bytes(1)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gpu = {spec.name: spec.family() for spec in (DEVICE_MEMORY_TOTAL, DEVICE_MEMORY_ALLOCATED,
                                                     DEVICE_CORES_ALLOCATED, DEVICE_SHARES_ALLOCATED, DEVICE_SPLIT,
                                                     DEVICE_HEALTHY)}
        pod_mem, pod_cores = POD_MEMORY.family(), POD_CORES.family()
        nodes, reservations = NODES.family(), RESERVATIONS.family()
        unit = self.bytes_per_unit
        node_states: Tally[str] = Tally(schedulable=0, invalid=0)
        charge_states: Tally[str] = Tally({ChargeState.ASSUMED: 0, ChargeState.BOUND: 0, ChargeState.OBSERVED: 0,
                                           ChargeState.NOMINATED: 0})
        for state, usage, charges in self.ledger.snapshot():
            node_states["invalid" if state.error else "schedulable"] += 1
            for device, used in zip(state.devices, usage):
                labels = [state.name, device.uuid, str(device.index), device.type]
                for spec, value in ((DEVICE_MEMORY_TOTAL, device.memory * unit),
                                    (DEVICE_MEMORY_ALLOCATED, used.memory * unit),
                                    (DEVICE_CORES_ALLOCATED, used.cores), (DEVICE_SHARES_ALLOCATED, used.shares),
                                    (DEVICE_SPLIT, device.split), (DEVICE_HEALTHY, 1.0 if device.healthy else 0.0)):
                    gpu[spec.name].add_metric(labels, value)
            for charge in charges:
                charge_states[charge.state] += 1
                per_gpu: dict[str, list[int]] = {}
                for uuid, memory, core in charge.grants:
                    acc = per_gpu.setdefault(uuid, [0, 0])
                    acc[0] += memory
                    acc[1] += core
                for uuid, (memory, core) in per_gpu.items():
                    labels = [charge.namespace, charge.name, charge.node, uuid, charge.state]
                    pod_mem.add_metric(labels, memory * unit)
                    pod_cores.add_metric(labels, core)
        for name, count in sorted(node_states.items()):
            nodes.add_metric([name], count)
        for name, count in sorted(charge_states.items()):
            reservations.add_metric([name], count)
        yield from (*gpu.values(), pod_mem, pod_cores, nodes, reservations)


class SchedulerMetrics:
    """The extender's metrics in their own registry."""

    def __init__(self, ledger: Ledger | None = None, registry: CollectorRegistry | None = None) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no `_created` series: not in the declarations
        self.registry = registry or CollectorRegistry()
        self.latency = DURATION.histogram(self.registry, LATENCY_BUCKETS)
        self.requests = REQUESTS.counter(self.registry)
        self.decisions = DECISIONS.counter(self.registry)
        self.inconsistent_grants = INCONSISTENT.counter(self.registry)
        self.preemption_evictions = PREEMPTION_EVICTIONS.counter(self.registry)
        self.cache_synced = CACHE_SYNCED.gauge(self.registry)
        self.leader = LEADER.gauge(self.registry)
        self.ready = READY.gauge(self.registry)
        if ledger is not None:
            self.registry.register(LedgerCollector(ledger))

    def track_cache(self, name: str, synced: Callable[[], bool]) -> None:
        """Report a cache's sync state at every scrape."""
        self.cache_synced.labels(name).set_function(lambda: 1.0 if synced() else 0.0)
