"""Trace variants (replay/variants.py) on a small synthetic trace: each one changes what its name says, the same
way every time, and `vgpu replay --variant` runs one."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vgpu.errors import ConfigError
from vgpu.replay.cluster import ReplayCluster
from vgpu.replay.run import replay
from vgpu.replay.trace import Trace, TraceNode, TracePod
from vgpu.replay.variants import VARIANTS, derive
from vgpu.scheduler.policies import make_policy

REPO = Path(__file__).resolve().parents[2]


def _trace() -> Trace:
    nodes = [TraceNode(f"g{i}", 96000, 393216, 8, "G2") for i in range(6)]
    nodes += [TraceNode(f"t{i}", 104000, 524288, 2, "T4") for i in range(6)]
    nodes += [TraceNode(f"v{i}", 64000, 262144, 4, "V100M16") for i in range(3)]
    pods = [TracePod(f"s{i}", 4000, 8192, 1, 250 + 50 * (i % 10)) for i in range(60)]
    pods += [TracePod(f"w{i}", 8000, 16384, 1, 1000) for i in range(30)]
    pods += [TracePod(f"m{i}", 32000, 65536, 4, 1000) for i in range(4)]
    pods += [TracePod(f"c{i}", 2000, 4096, 0, 0) for i in range(10)]
    return Trace(nodes, pods)


def _share(trace: Trace, kind) -> float:
    return sum(p.gpu_total for p in trace.pods if kind(p)) / sum(p.gpu_total for p in trace.pods)


def test_every_variant_is_the_same_each_time():
    for name in VARIANTS:
        assert derive(_trace(), name) == derive(_trace(), name), name


def test_gpu_request_shares_reach_their_target():
    base = _trace()
    multi = derive(base, "multigpu50")
    assert _share(multi, lambda p: p.num_gpu > 1) >= 0.5 > _share(base, lambda p: p.num_gpu > 1)
    assert len(multi.pods) > len(base.pods) and all(p.name.startswith("m") for p in multi.pods[len(base.pods):])
    share = derive(base, "share10")
    assert _share(share, lambda p: p.num_gpu == 1 and p.gpu_milli < 1000) <= 0.10
    assert {p.name for p in share.pods} < {p.name for p in base.pods}  # removed, not changed


def test_pinned_variants_pin_to_models_that_can_hold_the_pod():
    pinned = derive(_trace(), "gpuspec33")
    assert _share(pinned, lambda p: bool(p.gpu_spec)) >= 0.33
    models = {"G2": 8, "T4": 2, "V100M16": 4}
    for p in pinned.pods:
        if p.gpu_spec:
            assert any(models.get(m, 0) >= p.num_gpu for m in p.gpu_spec), p  # a 4-GPU pod is never pinned to T4
    assert not any(p.gpu_spec for p in pinned.pods if p.num_gpu == 0)


def test_cpu_node_and_card_type_variants():
    base = _trace()
    cpu = derive(base, "cpu200")
    assert [(p.cpu, p.memory) for p in cpu.pods if p.num_gpu] == [(2 * p.cpu, 2 * p.memory) for p in base.pods
                                                                   if p.num_gpu]
    assert [p.cpu for p in cpu.pods if not p.num_gpu] == [p.cpu for p in base.pods if not p.num_gpu]
    assert _share(derive(base, "cpuonly25"), lambda p: True) == 1.0
    assert sum(not p.num_gpu for p in derive(base, "cpuonly25").pods) >= 0.25 * len(derive(base, "cpuonly25").pods)
    split = derive(base, "nodes4")
    assert sum(n.gpus for n in split.nodes) == sum(n.gpus for n in base.nodes)
    assert [(n.name, n.gpus, n.cpu) for n in split.nodes if n.name.startswith("g0")] == [("g0-a", 4, 48000),
                                                                                         ("g0-b", 4, 48000)]
    two = derive(base, "types2")
    assert {n.model for n in two.nodes} == {"GA", "GB"} and {p.gpu_spec for p in two.pods} == {(), ("GA",), ("GB",)}
    twelve = derive(base, "types12")
    assert {n.model[:-1] for n in twelve.nodes} == {"G2", "T4", "V100M16"} and len({n.model for n in twelve.nodes}) > 3


def test_unknown_variant_is_a_config_error():
    with pytest.raises(ConfigError, match="nosuch"):
        derive(_trace(), "nosuch")


def _write_csv(where, trace):
    """The trace as the openb CSV files n.csv and p.csv."""
    (where / "n.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
        f"{n.name},{n.cpu},{n.memory},{n.gpus},{n.model}\n" for n in trace.nodes))
    (where / "p.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" + "".join(
        f"{p.name},{p.cpu},{p.memory},{p.num_gpu},{p.gpu_milli},\n" for p in trace.pods))


def test_cli_replays_a_variant(tmp_path):
    trace = _trace()
    _write_csv(tmp_path, trace)
    out = subprocess.run(
        [sys.executable, "-m", "vgpu.cli", "replay", "--nodes", str(tmp_path / "n.csv"), "--pods",
         str(tmp_path / "p.csv"), "--variant", "gpuspec25", "--policy", "ours", "--seeds", "1", "--json",
         "--no-progress"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert [r["policy"] for r in json.loads(out.stdout)["results"]] == ["fragaware"]


def test_nvlink_variants_give_nodes_islands_and_keep_the_workload():
    base = _trace()
    nvlink = derive(base, "nvlink")
    assert nvlink.pods == base.pods
    assert {(n.gpus, n.islands) for n in nvlink.nodes} == {(8, 2), (2, 1), (4, 1)}
    assert derive(base, "nvlink30").pods == derive(base, "multigpu30").pods
    assert all(n.islands == 0 for n in base.nodes)
    cluster = ReplayCluster(nvlink.nodes)
    assert [(d.island, d.numa) for d in cluster.devices[0]] == [(0, 0)] * 4 + [(1, 1)] * 4
    assert {d.island for d in cluster.devices[-1]} == {0}
    assert all(d.island == -1 for d in ReplayCluster(base.nodes).devices[0])


def test_a_multi_gpu_pod_gets_one_island_with_topology_and_straddles_without():
    # bestfit puts three whole-GPU pods on GPUs 0-2; a 2-GPU pod then takes 3 and 4 without topology, 4 and 5 with it
    cluster = ReplayCluster([TraceNode("g", 96000, 393216, 8, "G2", islands=2)])
    pods = [TracePod(f"w{i}", 1000, 1024, 1, 1000) for i in range(3)] + [TracePod("m", 1000, 1024, 2, 1000)]
    for topology, tier in ((True, 0), (False, 2)):
        tiers: dict[int, int] = {}
        _, _, where = replay(cluster, pods, [0, 1, 2, 3], np.array([0]), make_policy("bestfit"), topology=topology,
                             tiers=tiers)
        assert where.tolist() == [0, 0, 0, 0] and tiers == {3: tier}
        assert [u.shares for u in cluster.states[0].usage] == ([1, 1, 1, 0, 1, 1, 0, 0] if topology
                                                                else [1, 1, 1, 1, 1, 0, 0, 0])


def test_cli_replays_a_topology_variant_with_and_without_topology(tmp_path):
    trace = _trace()
    _write_csv(tmp_path, trace)
    out = subprocess.run(
        [sys.executable, "-m", "vgpu.cli", "replay", "--nodes", str(tmp_path / "n.csv"), "--pods",
         str(tmp_path / "p.csv"), "--variant", "nvlink30", "--policy", "ours", "--policy", "ours@flat", "--seeds",
         "1", "--json", "--no-progress"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["results"]
    assert [r["policy"] for r in rows] == ["fragaware", "fragaware@flat"]
    assert all(0 <= r["island_local"] <= r["island_pods"] > 0 for r in rows)
    assert rows[0]["island_local"] == rows[0]["island_pods"]
