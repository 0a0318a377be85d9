"""Trace variants (replay/variants.py) on a small synthetic trace: each one changes what its name says, the same
way every time, and `vgpu replay --variant` runs one."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vgpu.errors import ConfigError
from vgpu.replay.trace import Trace, TraceNode, TracePod
from vgpu.replay.variants import VARIANTS, derive

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


def test_cli_replays_a_variant(tmp_path):
    trace = _trace()
    (tmp_path / "n.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
        f"{n.name},{n.cpu},{n.memory},{n.gpus},{n.model}\n" for n in trace.nodes))
    (tmp_path / "p.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" + "".join(
        f"{p.name},{p.cpu},{p.memory},{p.num_gpu},{p.gpu_milli},\n" for p in trace.pods))
    out = subprocess.run(
        [sys.executable, "-m", "vgpu.cli", "replay", "--nodes", str(tmp_path / "n.csv"), "--pods",
         str(tmp_path / "p.csv"), "--variant", "gpuspec25", "--policy", "ours", "--seeds", "1", "--json",
         "--no-progress"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert [r["policy"] for r in json.loads(out.stdout)["results"]] == ["fragaware"]
