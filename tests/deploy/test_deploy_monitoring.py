"""The metrics are declared once in code (vgpu.deviceplugin.monitor.NODE_METRICS,
vgpu.scheduler.metrics.SCHEDULER_METRICS, vgpu.planning.controller.SPECS): deploy/monitoring/METRICS.md is their
rendering, one section per component, the declarations keep the contract's legacy names, and the Grafana dashboard
uses only declared names and labels. What the device plugin's and the extender's live endpoints serve is compared
with the same declarations in tests/e2e/test_metrics_contract.py."""

import json
import re

import pytest
from deploy_helpers import DEPLOY

from vgpu.deviceplugin.monitor import NODE_METRICS
from vgpu.metricspec import markdown_table
from vgpu.planning.controller import SPECS as CONSOLIDATION_METRICS
from vgpu.scheduler.metrics import SCHEDULER_METRICS

METRICS_MD = DEPLOY / "monitoring" / "METRICS.md"
DASHBOARD = DEPLOY / "monitoring" / "grafana-dashboard.json"
# The heading of each component's section of METRICS.md -> its declarations.
SECTIONS = {
    "## Device plugin, `:9394/metrics`": NODE_METRICS,
    "## Scheduler extender, `:9395/metrics`": SCHEDULER_METRICS,
    "## Consolidation controller, `:9396/metrics`": CONSOLIDATION_METRICS,
}
# CONTRACT.md, "Node metrics at :9394/metrics": the legacy names with their labels.
CONTRACT_LEGACY = {
    "HostGPUMemoryUsage": {"deviceidx", "deviceuuid", "zone"},
    "HostCoreUtilization": {"deviceidx", "deviceuuid", "zone"},
    "vGPU_device_memory_usage_in_bytes": {"podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid", "zone"},
    "vGPU_device_memory_limit_in_bytes": {"podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid", "zone"},
    "Device_utilization_desc_of_container": {
        "podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid", "zone",
    },
}
PROMQL_WORDS = {
    "sum", "count", "max", "min", "avg", "rate", "irate", "increase", "histogram_quantile", "by", "without",
    "or", "and", "unless", "on", "ignoring", "group_left", "group_right", "vector", "bool", "topk", "bottomk",
    "offset", "clamp_min", "clamp_max", "abs", "label_values", "time", "scalar", "sort", "sort_desc",
}
SCRAPE_LABELS = {"job", "instance"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def metrics_table() -> dict[str, tuple[str, set[str]]]:
    """metric name as queried -> (type, label names), from the declarations."""
    out = {}
    for spec in (spec for specs in SECTIONS.values() for spec in specs):
        assert spec.exposed not in out, f"{spec.exposed} declared twice"
        out[spec.exposed] = (spec.kind, set(spec.labels))
    return out


def series_names() -> dict[str, set[str]]:
    """Every series name a selector may use -> its labels (histograms add _bucket with `le`, _sum, _count)."""
    out = {}
    for name, (kind, labels) in metrics_table().items():
        if kind == "histogram":
            out[name + "_bucket"] = labels | {"le"}
            out[name + "_sum"] = labels
            out[name + "_count"] = labels
        else:
            out[name] = labels
    return out


def dashboard() -> dict:
    """The parsed dashboard."""
    return json.loads(DASHBOARD.read_text())


def queries() -> list[tuple[str, str, str]]:
    """(panel title, PromQL, legend) of every target, plus the templating queries."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((p["title"], t["expr"], t.get("legendFormat", "")))
            walk(p.get("panels", []))

    walk(dashboard()["panels"])
    for var in dashboard()["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            out.append((f"variable {var['name']}", q, ""))
    return out


def scan(expr: str) -> tuple[set[str], set[str]]:
    """(series names, label names) an expression refers to."""
    text = re.sub(r'"[^"]*"', '""', expr)  # label values
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana variables
    labels = set()
    for matchers in re.findall(r"\{([^}]*)\}", text):
        labels |= set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers))
    for grouping in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", text):
        labels |= {w.strip() for w in grouping.split(",") if w.strip()}
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", "", text)
    words = set(re.findall(r"[A-Za-z_:][\w:]*", text)) - PROMQL_WORDS
    if expr.startswith("label_values("):
        # label_values(metric, label): the last argument is a label name
        label = expr.rstrip(")").rsplit(",", 1)[1].strip()
        words.discard(label)
        labels.add(label)
    return words, labels


def test_metrics_md_is_the_rendering_of_the_declarations():
    text = METRICS_MD.read_text()
    for heading, specs in SECTIONS.items():
        assert heading in text, f"METRICS.md has no section {heading!r}"
        section = text[text.index(heading):]
        section = section[:section.find("\n## ")]
        assert markdown_table(specs) in section, f"{heading} of METRICS.md is stale: paste\n{markdown_table(specs)}"


def test_declarations_keep_the_contracts_legacy_names_and_labels():
    table = metrics_table()
    for name, labels in CONTRACT_LEGACY.items():
        assert name in table, name
        assert table[name][1] == labels, name


def test_vgpu_names_are_snake_case_with_units():
    for name, (kind, labels) in metrics_table().items():
        assert kind in ("gauge", "counter", "histogram"), name
        if name in CONTRACT_LEGACY:
            continue
        assert re.fullmatch(r"vgpu_[a-z0-9_]+", name), name
        if kind == "counter":
            assert name.endswith("_total"), name
        if kind == "histogram":
            assert name.endswith("_seconds"), name
        for label in labels:
            assert re.fullmatch(r"[a-z][a-z0-9_]*", label), (name, label)


def test_the_names_the_components_were_asked_for_are_declared():
    table = metrics_table()
    for name in ("vgpu_device_memory_used_bytes", "vgpu_container_memory_limit_bytes"):
        assert name in table


def test_dashboard_parses_and_has_unique_panel_ids():
    d = dashboard()
    assert d["uid"] == "vgpu-sharing" and d["title"]
    ids = []

    def walk(panels):
        for p in panels:
            ids.append(p["id"])
            pos = p["gridPos"]
            assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, p["title"]
            walk(p.get("panels", []))

    walk(d["panels"])
    assert len(ids) == len(set(ids))
    assert queries()


@pytest.mark.parametrize("title, expr, legend", queries(), ids=lambda v: v if len(v) < 60 else None)
def test_dashboard_query_uses_only_listed_names(title, expr, legend):
    known = series_names()
    words, labels = scan(expr)
    assert words, f"{title}: no metric in {expr!r}"
    unknown = words - set(known)
    assert not unknown, f"{title}: names not declared: {sorted(unknown)}"
    allowed_labels = set().union(*(known[w] for w in words)) | SCRAPE_LABELS
    assert labels <= allowed_labels, f"{title}: labels {sorted(labels - allowed_labels)} not on {sorted(words)}"
    legend_labels = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
    assert legend_labels <= allowed_labels, f"{title}: legend uses {sorted(legend_labels - allowed_labels)}"


def test_dashboard_uses_only_names_the_plugin_exports_by_default():
    """The legacy names come only with --legacy-metrics: the shipped dashboard shows the vgpu_ names."""
    used = set()
    for _, expr, _ in queries():
        used |= scan(expr)[0]
    assert not used & set(CONTRACT_LEGACY)
    assert {"vgpu_device_memory_used_bytes", "vgpu_container_memory_limit_bytes"} <= used


def test_scanner_catches_an_unlisted_name():
    words, labels = scan('sum by (node) (rate(vgpu_made_up_total{result="error", node=~"$node"}[5m]))')
    assert words == {"vgpu_made_up_total"} and labels == {"node", "result"}
    assert "vgpu_made_up_total" not in series_names()
