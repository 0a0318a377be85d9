"""`vgpu whatif` and `vgpu consolidate` against the API-server stand-in over HTTP: what they print, that a dry run
writes nothing, the export the replay reads back, and an execution that stops on its first surprise."""
from __future__ import annotations

import json

import pytest
from cluster_objects import node, pod, whole
from kubernetes import client as k8s

from vgpu import keys
from vgpu.cli import main
from vgpu.holds import decode_holds
from vgpu.kube.client import read_json
from vgpu.replay.trace import load_nodes, load_pods


def _load(api, nodes, pods):
    core = k8s.CoreV1Api(api)
    for n in nodes:
        core.create_node(n)
    for p in pods:
        p = json.loads(json.dumps(p))
        status = p.pop("status")
        created = read_json(core.create_namespaced_pod(p["metadata"]["namespace"], p, _preload_content=False))
        if status.get("phase") == "Running":
            created["status"] = status
            core.replace_namespaced_pod_status(p["metadata"]["name"], p["metadata"]["namespace"], created)


def _fragmented(api):
    """Two nodes of two GPUs, a 30 % share on each GPU, and a pending pod asking a whole GPU."""
    layout = {"a": ("n1", 0), "b": ("n1", 1), "c": ("n2", 0), "d": ("n2", 1)}
    _load(api, [node("n1", 2), node("n2", 2)],
          [*(pod(name, 10000, 30, on=n, gpu_index=(g,)) for name, (n, g) in layout.items()),
           whole("big", owner=None)])


def _versions(api):
    core = k8s.CoreV1Api(api)
    nodes = read_json(core.list_node(_preload_content=False))
    pods = read_json(core.list_pod_for_all_namespaces(_preload_content=False))
    return sorted((o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in nodes["items"] + pods["items"])


def test_whatif_prints_each_policy_and_writes_nothing(apiserver, api, capsys):
    _fragmented(api)
    before = _versions(api)
    assert main(["whatif", "--kubeconfig", apiserver.kubeconfig, "--json"]) == 0
    rows = {r["policy"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert list(rows) == ["kept", "fragaware", "fgd", "binpack", "spread"]
    assert (rows["kept"]["pending_placed"], rows["kept"]["waiting"]) == (0, ["team/big"])
    assert rows["fragaware"]["pending_placed"] == 1 and rows["fragaware"]["displaced"] == 0
    assert rows["kept"]["gpus"] == 4 and rows["kept"]["unallocated_pct"] == pytest.approx(70.0)
    assert _versions(api) == before
    assert main(["whatif", "--kubeconfig", apiserver.kubeconfig, "--policy", "binpack"]) == 0
    table = capsys.readouterr().out
    assert "2 nodes, 4 running and 1 pending vGPU pods" in table
    assert [line.split()[0] for line in table.splitlines()[2:]] == ["kept", "binpack"]


def test_whatif_adds_hypothetical_pods_from_a_workload(apiserver, api, capsys, tmp_path):
    _fragmented(api)
    extra = tmp_path / "extra.yaml"
    extra.write_text("""
apiVersion: apps/v1
kind: Deployment
metadata: {name: infer, namespace: ml}
spec:
  replicas: 3
  template:
    spec:
      schedulerName: vgpu-scheduler
      containers:
      - name: main
        resources:
          limits: {volcano.sh/vgpu-number: "1", volcano.sh/vgpu-memory: "8000", volcano.sh/vgpu-cores: "20"}
---
apiVersion: v1
kind: Pod
metadata: {name: cpu-only}
spec:
  containers: [{name: main}]
""")
    assert main(["whatif", "--kubeconfig", apiserver.kubeconfig, "--pods", str(extra), "--json"]) == 0
    rows = {r["policy"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["kept"]["extra"] == 3 and rows["kept"]["extra_placed"] == 3


def test_whatif_refuses_a_bad_workload_file_in_one_line(apiserver, api, capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Service\nmetadata: {name: s}\n")
    assert main(["whatif", "--kubeconfig", apiserver.kubeconfig, "--pods", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "kind 'Service' is not a Pod" in err


def test_the_export_is_a_trace_the_replay_reads(apiserver, api, capsys, tmp_path):
    _fragmented(api)
    out = tmp_path / "trace"
    assert main(["whatif", "--kubeconfig", apiserver.kubeconfig, "--export", str(out), "--anonymise",
                 "--policy", "fgd"]) == 0
    nodes, pods = load_nodes(out / "nodes.csv"), load_pods(out / "pods.csv")
    assert [(n.gpus, n.cpu, n.model) for n in nodes] == [(2, 64000, "NVIDIA A100-PCIE-40GB")] * 2
    assert all(n.name.startswith("node-") and n.name not in ("n1", "n2") for n in nodes)
    shares = sorted((p.num_gpu, p.gpu_milli) for p in pods)
    assert shares == [(1, 300)] * 4 + [(1, 1000)]   # 10000 of 40960 MiB is 245 milli, 30 % cores is 300
    assert not any("big" in p.name or "team" in p.name for p in pods)


def test_consolidate_dry_run_prints_the_plan_and_writes_nothing(apiserver, api, capsys):
    _fragmented(api)
    before = _versions(api)
    assert main(["consolidate", "--kubeconfig", apiserver.kubeconfig]) == 0
    text = capsys.readouterr().out
    assert "step 1: free GPU-n1-0 on n1 for team/big (1 move)" in text
    assert "expected: 1 move(s); pending pods placed 0 -> 1 of 1; GPUs wholly free 0 -> 0 of 4" in text
    assert main(["consolidate", "--kubeconfig", apiserver.kubeconfig, "--json", "--free-gpus", "2"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["moves"] == 2 and plan["gpus_free_after"] == 2
    assert _versions(api) == before


def test_an_execution_holds_the_room_evicts_and_stops_when_no_replacement_comes(apiserver, api, capsys):
    """The stand-in runs no ReplicaSet controller: the evicted pod is never re-created, which is the surprise."""
    _fragmented(api)
    code = main(["consolidate", "--kubeconfig", apiserver.kubeconfig, "--execute", "--timeout", "2s", "--json"])
    assert code == 1
    report = json.loads(capsys.readouterr().out)
    assert report["stopped"] == "team/a's replacement was not re-created within 2 s" and report["moves_done"] == 0
    core = k8s.CoreV1Api(api)
    left = read_json(core.list_namespaced_pod("team", _preload_content=False))["items"]
    # evicted through the Eviction API: gone, or ending (graceful deletion of a bound pod)
    assert all(p["metadata"].get("deletionTimestamp") for p in left if p["metadata"]["name"] == "a")
    n1 = read_json(core.read_node("n1", _preload_content=False))
    (hold,) = decode_holds(n1["metadata"]["annotations"][keys.CONSOLIDATION_HOLD])   # kept for the pod, as said
    big = read_json(core.read_namespaced_pod("big", "team", _preload_content=False))
    assert (hold.uid, hold.namespace, hold.name) == (big["metadata"]["uid"], "team", "big")
    assert [g.uuid for segment in hold.assignment for g in segment] == ["GPU-n1-0"]
    events = read_json(core.list_namespaced_event("team", _preload_content=False))["items"]
    assert [(e["reason"], e["involvedObject"]["name"]) for e in events] == [("Consolidating", "a")]
    assert "for team/big" in events[0]["message"]


def test_the_controller_waits_out_the_threshold_then_plans_and_counts_what_it_did(apiserver, api):
    """`--watch`'s controller on the stand-in: nothing before the pod has waited `pending_for`; then one move is
    planned and carried out until the surprise (no ReplicaSet controller here), which its metrics count."""
    from prometheus_client import CollectorRegistry

    from vgpu.planning.controller import ConsolidationController
    from vgpu.planning.execute import execute_plan
    from vgpu.planning.snapshot import read_cluster

    _fragmented(api)
    now = [0.0]
    registry = CollectorRegistry()
    controller = ConsolidationController(
        lambda: read_cluster(api), lambda plan: execute_plan(api, plan, timeout=1, say=lambda line: None),
        pending_for=300, share_per_hour=0.0, registry=registry, clock=lambda: now[0])
    big = read_json(k8s.CoreV1Api(api).read_namespaced_pod("big", "team", _preload_content=False))
    created = read_cluster(api).pending[0].created
    assert big["metadata"]["name"] == "big" and created > 0
    now[0] = created + 299
    assert controller.look() is None and registry.get_sample_value("vgpu_consolidation_moves_planned_total") == 0
    now[0] = created + 301
    report = controller.look()
    assert report is not None and "replacement was not re-created" in report.stopped
    values = {name: registry.get_sample_value(name) for name in (
        "vgpu_consolidation_moves_planned_total", "vgpu_consolidation_moves_total", "vgpu_consolidation_stops_total",
        "vgpu_consolidation_waiting_pods", "vgpu_consolidation_gpus_freed_total")}
    assert values == {"vgpu_consolidation_moves_planned_total": 1.0, "vgpu_consolidation_moves_total": 0.0,
                      "vgpu_consolidation_stops_total": 1.0, "vgpu_consolidation_waiting_pods": 1.0,
                      "vgpu_consolidation_gpus_freed_total": 0.0}
    # the budget: one move an hour at least, spent by the eviction made: a minute later nothing is planned
    now[0] += 60
    assert controller.look() is None and registry.get_sample_value("vgpu_consolidation_moves_planned_total") == 1
