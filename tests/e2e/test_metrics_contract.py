"""The metrics contract, checked on what a running cluster serves: every family on the device plugin's :9394 and
the extender's :9395 is declared (vgpu.metricspec declarations, rendered into deploy/monitoring/METRICS.md) with
the declared type and labels, every declared family is served (the legacy names only come with --legacy-metrics,
which the cluster's plugins do not set: tests/deviceplugin checks them), every query of the Grafana dashboard finds
series with the labels it selects on, and `promtool check metrics` (Prometheus' own linter, the judge) finds
nothing on either endpoint.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from capabilities import tool
from e2e_helpers import TERMINAL, WORKLOAD, container, phase, pod, wait_until
from prometheus_client.parser import text_string_to_metric_families

from vgpu.deviceplugin.monitor import NODE_METRICS
from vgpu.metricspec import MetricSpec
from vgpu.scheduler.metrics import SCHEDULER_METRICS
from vgpu.testbed.cluster import LocalCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deploy"))
from test_deploy_monitoring import queries, scan

NS = "metrics"


@pytest.fixture(scope="module")
def cluster(make_cluster: Any) -> LocalCluster:
    c = make_cluster(nodes=1, gpus="2xA100-40GB")
    release = c.workdir / "release-metrics"
    c.create_pod(pod("done", [container("main", WORKLOAD + ["--mib", "500"], memory=1000, cores=10)], namespace=NS))
    c.create_pod(pod("busy", [container("main", WORKLOAD + ["--mib", "700", "--hold", "300", "--release-file",
                                                            str(release)], memory=2000, cores=20)], namespace=NS))
    c.create_pod(pod("too-big", [container("main", ["true"], number=3, memory=1000)], namespace=NS))

    def settled() -> bool:
        done = phase(c.api_get(f"/api/v1/namespaces/{NS}/pods/done") or {})
        busy = c.api_get(f"/api/v1/namespaces/{NS}/pods/busy") or {}
        return done in TERMINAL and phase(busy) == "Running"

    wait_until("pods placed", settled, 120)
    wait_until("the busy pod's usage on :9394", lambda: 'vgpu_container_memory_used_bytes{' in _text(
        c.nodes[0].metrics_port) and 'pod="busy"' in _text(c.nodes[0].metrics_port), 60)
    wait_until("the unschedulable pod refused", lambda: 'decision="unschedulable"' in _text(
        c.scheduler_metrics_port), 60)
    return c


def _text(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text


def _served(text: str) -> dict[str, tuple[str, list[set[str]]]]:
    """family name -> (type, label sets of its samples, `le` left out)."""
    out = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = (family.type, [set(s.labels) - {"le"} for s in family.samples])
    return out


def _endpoints(cluster: LocalCluster) -> list[tuple[str, int, tuple[MetricSpec, ...]]]:
    return [("device plugin", cluster.nodes[0].metrics_port, NODE_METRICS),
            ("extender", cluster.scheduler_metrics_port, SCHEDULER_METRICS)]


def test_every_served_family_is_declared_with_its_type_and_labels(cluster):
    for where, port, specs in _endpoints(cluster):
        declared = {spec.name: spec for spec in specs}
        for name, (kind, label_sets) in _served(_text(port)).items():
            if name.startswith(("python_", "process_")):
                continue  # the client library's own collectors
            assert name in declared, f"{where} serves {name}, which is not declared"
            assert kind == declared[name].kind, (where, name, kind)
            for labels in label_sets:
                assert labels == set(declared[name].labels), (where, name, labels)


def test_every_declared_family_is_served(cluster):
    for where, port, specs in _endpoints(cluster):
        served = _served(_text(port))
        missing = [spec.name for spec in specs if spec.name not in served and not spec.legacy]
        assert not missing, f"{where} does not serve {missing}"


@pytest.mark.parametrize("title, expr, legend", queries(), ids=lambda v: v if len(v) < 60 else None)
def test_every_dashboard_query_finds_series(cluster, title, expr, legend):
    samples: dict[str, list[set[str]]] = {}
    for _, port, _ in _endpoints(cluster):
        for family in text_string_to_metric_families(_text(port)):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append(set(sample.labels))
    names, labels = scan(expr)
    for name in names:
        assert samples.get(name), f"{title}: {name} has no series on the cluster's endpoints"
    have = set().union(*(labels_of for name in names for labels_of in samples[name])) | {"job", "instance"}
    assert labels <= have, f"{title}: no series of {sorted(names)} has the labels {sorted(labels - have)}"


def test_promtool_finds_nothing(cluster):
    """Before: promtool exited 3 on :9394 for the legacy names, which are now opt-in (--legacy-metrics)."""
    promtool = tool("promtool", "Debian's prometheus package; .ci/run installs it")
    for where, port, _ in _endpoints(cluster):
        res = subprocess.run([promtool, "check", "metrics"], input=_text(port), capture_output=True, text=True,
                             timeout=60)
        problems = [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]
        assert res.returncode == 0 and not problems, f"{where}: {problems}"
