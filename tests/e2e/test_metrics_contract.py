"""The metrics contract, checked on what a running cluster serves: every family on the device plugin's :9394 and
the extender's :9395 is declared (vgpu.metricspec declarations, rendered into deploy/monitoring/METRICS.md) with
the declared type and labels, every declared family is served (the legacy names only come with --legacy-metrics,
which the cluster's plugins do not set: tests/deviceplugin checks them), every query of the Grafana dashboard finds
series with the labels it selects on, and `promtool check metrics` (Prometheus' own linter, the judge) finds
nothing on either endpoint. A real Prometheus server then scrapes both endpoints: it evaluates every dashboard query
through its HTTP API (each parses and returns series), and stores what the plugin measured, one series per label
set.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from capabilities import tool
from e2e_helpers import TERMINAL, WORKLOAD, container, phase, pod, wait_until
from prometheus_client.parser import text_string_to_metric_families

from vgpu.deviceplugin.monitor import NODE_METRICS
from vgpu.metricspec import MetricSpec
from vgpu.scheduler.metrics import SCHEDULER_METRICS
from vgpu.testbed.cluster import LocalCluster, free_port

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
    # a garbled call: the extender refuses it with a reason (400, never a 500), which the dashboard's error panel shows
    garbled = httpx.post(f"http://127.0.0.1:{c.extender_port}/filter", content=b"{not json", timeout=10)
    assert garbled.status_code == 400 and garbled.json().get("Error"), garbled.text

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


@pytest.fixture(scope="module")
def prometheus(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A real Prometheus server (Debian's prometheus package) scraping both endpoints every second; its HTTP API's
    base URL once it has scraped each target a few times."""
    binary = tool("prometheus", "Debian's prometheus package; .ci/run installs it")
    work = tmp_path_factory.mktemp("prometheus")
    port = free_port()
    targets = {"vgpu-device-plugin": cluster.nodes[0].metrics_port, "vgpu-scheduler": cluster.scheduler_metrics_port}
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{p}"]}]}
                                 for job, p in targets.items()]}
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    with open(work / "prometheus.log", "wb") as log:
        proc = subprocess.Popen([binary, f"--config.file={work / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                                 "--log.level=warn"], stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        def scraped_enough() -> bool:
            assert proc.poll() is None, (work / "prometheus.log").read_text()[-3000:]
            try:
                # Prometheus answers 503 in plain text until its storage is ready (slow on a loaded machine)
                if httpx.get(f"{base}/-/ready", timeout=5).status_code != 200:
                    return False
                up = _query(base, "count_over_time(up[1m]) >= 5 and up == 1")
            except httpx.HTTPError:
                return False
            return {r["metric"]["job"] for r in up} == set(targets)

        wait_until("Prometheus scraped both endpoints five times", scraped_enough, 90)
        yield base
    finally:
        proc.terminate()
        proc.wait(20)


def _query(base: str, expr: str) -> list[dict[str, Any]]:
    """An instant query through Prometheus' HTTP API; its result vector (an error status fails the test)."""
    answer = httpx.get(f"{base}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", (expr, answer)
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


# what Grafana puts in the dashboard's variables before the query reaches Prometheus
GRAFANA = {"$__rate_interval": "1m", "$node": ".*"}


@pytest.mark.parametrize("title, expr, legend", queries(), ids=lambda v: v if len(v) < 60 else None)
def test_prometheus_evaluates_every_dashboard_query(prometheus, title, expr, legend):
    for variable, value in GRAFANA.items():
        expr = expr.replace(variable, value)
    template = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", expr.strip())
    if template:  # Grafana's templating function: Prometheus' label-values API
        answer = httpx.get(f"{prometheus}/api/v1/label/{template.group(2)}/values",
                           params={"match[]": template.group(1)}, timeout=10).json()
        assert answer["status"] == "success" and answer["data"], (title, answer)
        return
    result = _query(prometheus, expr)
    assert result, f"{title}: {expr} returned no series"


def test_prometheus_stores_what_the_plugin_measured_once_per_label_set(prometheus, cluster):
    """The busy container's memory as Prometheus stored it equals the plugin's own exposition, and each family has
    as many series in Prometheus as the plugin exposes (Prometheus keeps the first of two samples with the same
    labels and says nothing, so a duplicate would show as fewer)."""
    exposed = [(family.name, sample) for family in text_string_to_metric_families(_text(cluster.nodes[0].metrics_port))
               for sample in family.samples]
    busy = [s for name, s in exposed if s.name == "vgpu_container_memory_used_bytes" and s.labels["pod"] == "busy"]
    assert busy and busy[0].value > 0
    stored = _query(prometheus, 'vgpu_container_memory_used_bytes{pod="busy"}')
    assert [float(r["value"][1]) for r in stored] == [s.value for s in busy]
    for series_name in ("vgpu_container_memory_limit_bytes", "vgpu_device_memory_total_bytes"):
        count = sum(1 for _, s in exposed if s.name == series_name)
        assert len(_query(prometheus, series_name)) == count, series_name
