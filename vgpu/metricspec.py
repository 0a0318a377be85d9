"""Metric declarations: each component declares its Prometheus metrics once, as `MetricSpec`s, and builds what it
exports from them (vgpu.scheduler.metrics, vgpu.deviceplugin.monitor); deploy/monitoring/METRICS.md is rendered
from the same declarations (`markdown_table`) and tests compare both with what the live endpoints serve.

Units are in the names and are base units: bytes, seconds, percent of one GPU (the unit of `vgpu-cores`).
Legacy names (Volcano's node monitor, kept byte for byte for existing dashboards) are marked `legacy`: they are the
only names that break Prometheus' naming rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

__all__ = ["MetricSpec", "markdown_table"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family: its name (a counter's without `_total`), type, label names and meaning."""

    name: str
    kind: Literal["gauge", "counter", "histogram"]
    labels: tuple[str, ...]
    help: str
    legacy: bool = False

    @property
    def exposed(self) -> str:
        """The name in the exposition format and in queries (`_total` added to a counter)."""
        return f"{self.name}_total" if self.kind == "counter" else self.name

    def family(self) -> GaugeMetricFamily:
        """An empty family of this gauge, for a collector to fill at scrape time."""
        assert self.kind == "gauge", self
        return GaugeMetricFamily(self.name, self.help, labels=list(self.labels))

    def counter(self, registry: CollectorRegistry) -> Counter:
        """This counter, live in `registry`."""
        assert self.kind == "counter", self
        return Counter(self.name, self.help, list(self.labels), registry=registry)

    def gauge(self, registry: CollectorRegistry) -> Gauge:
        """This gauge, live in `registry`."""
        assert self.kind == "gauge", self
        return Gauge(self.name, self.help, list(self.labels), registry=registry)

    def histogram(self, registry: CollectorRegistry, buckets: Sequence[float]) -> Histogram:
        """This histogram with `buckets`, live in `registry`."""
        assert self.kind == "histogram", self
        return Histogram(self.name, self.help, list(self.labels), buckets=list(buckets), registry=registry)


def markdown_table(specs: Iterable[MetricSpec]) -> str:
    """The METRICS.md table of `specs`: metric, type, labels, meaning."""
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for spec in specs:
        labels = ", ".join(f"`{label}`" for label in spec.labels) or "(none)"
        rows.append(f"| `{spec.exposed}` | {spec.kind} | {labels} | {spec.help} |")
    return "\n".join(rows) + "\n"
