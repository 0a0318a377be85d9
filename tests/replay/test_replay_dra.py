"""DRA mode in the replay: the GPUs inside the chosen node are kube-scheduler's allocator's first fit (slice order),
hand-checked on small traces where that differs from our fit's GPU choice, and `vgpu replay --mode` end to end."""

import json
import subprocess
import sys

import numpy as np
import pytest

from vgpu.replay.cluster import ReplayCluster
from vgpu.replay.run import MODES, replay
from vgpu.replay.trace import TraceNode, TracePod
from vgpu.scheduler.policies import make_policy


def pod(name, milli, gpus=1):
    return TracePod(name=name, cpu=1000, memory=1024, num_gpu=gpus, gpu_milli=milli)


def node(name, gpus=2):
    return TraceNode(name=name, cpu=64000, memory=262144, gpus=gpus, model="T4")


def shares(cluster, n):
    """Per GPU of node n: milli-GPU taken (cores are gpu_milli // 10)."""
    return [u.cores * 10 for u in cluster.states[n].usage]


# a: 500 on gpu0.  b: 700 on gpu1.  c (200): our bestfit order takes the fuller gpu1, first fit takes gpu0.
# d (500): after bestfit gpu0 still has 500 free; after first fit neither GPU has.
PODS = [pod("a", 500), pod("b", 700), pod("c", 200), pod("d", 500)]


def test_device_plugin_mode_takes_the_policy_gpu_and_dra_mode_the_first_that_fits():
    cluster = ReplayCluster([node("n")])
    _, allocated, where = replay(cluster, PODS, [0, 1, 2, 3], np.array([0]), make_policy("bestfit"))
    assert shares(cluster, 0) == [1000, 900]
    assert where.tolist() == [0, 0, 0, 0] and allocated[-1] == 1900
    for mode in ("dra", "dra-naive"):
        cluster = ReplayCluster([node("n")])
        _, allocated, where = replay(cluster, PODS, [0, 1, 2, 3], np.array([0]), make_policy("bestfit"), mode=mode)
        assert shares(cluster, 0) == [700, 700], mode
        assert where.tolist() == [0, 0, 0, -1] and allocated[-1] == 1400, mode


def test_multi_gpu_pods_take_the_first_gpus_that_fit_in_device_order():
    cluster = ReplayCluster([node("n", gpus=4)])
    pods = [pod("half", 500), pod("full", 1000), pod("pair", 400, gpus=2)]
    replay(cluster, pods, [0, 1, 2], np.array([0]), make_policy("fragaware"), mode="dra")
    # half -> gpu0; full -> gpu1 (gpu0 has only 500 left); pair (400 each) -> gpu0 (500 left) and gpu2
    assert shares(cluster, 0) == [900, 1000, 400, 0]


class Precharged(ReplayCluster):
    """A cluster whose nodes start with given milli-GPU taken on given GPUs (node index -> per-GPU milli)."""

    def __init__(self, nodes, taken):
        self.taken = taken
        super().__init__(nodes)

    def reset(self, rank):
        super().reset(rank)
        for n, per_gpu in self.taken.items():
            card = self.devices[n][0].memory
            self.states[n].charge(tuple((self.devices[n][g].uuid, card * m // 1000, m // 10)
                                        for g, m in enumerate(per_gpu) if m))


def test_dra_scores_nodes_on_the_allocators_choice_and_dra_naive_on_its_own():
    # binpack scores the chosen GPU's memory after placement. Node a: gpu0 100, gpu1 700; node b: gpu0 400.
    # A 200 pod: binpack's own order takes a's gpu1 (score 90, b's gpu0 60), so device-plugin and dra-naive choose a;
    # on the allocator's first fit a's gpu0 scores 30 and b's gpu0 60, so dra chooses b.
    x = [pod("x", 200)]
    cases = (("deviceplugin", 0, [100, 900]), ("dra-naive", 0, [300, 700]), ("dra", 1, [600, 0]))
    for mode, chosen, expected in cases:
        cluster = Precharged([node("a"), node("b")], {0: [100, 700], 1: [400, 0]})
        _, _, where = replay(cluster, x, [0], np.array([0, 1]), make_policy("binpack"), mode=mode)
        assert where.tolist() == [chosen], mode
        assert shares(cluster, chosen) == expected, mode


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown mode"):
        replay(ReplayCluster([node("n")]), PODS, [0], np.array([0]), make_policy("bestfit"), mode="kube")
    assert MODES == ("deviceplugin", "dra", "dra-naive")


def test_cli_mode_runs_and_is_reported(tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,2,T4\nn2,64000,262144,2,T4\n")
    pods_csv = tmp_path / "pods.csv"
    rows = [f"p{i},1000,1024,1,{m},,,," for i, m in enumerate([500, 700, 200, 500, 300, 600, 400, 250])]
    pods_csv.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,creation_time,deletion_time\n"
                        + "\n".join(rows) + "\n")
    cmd = [sys.executable, "-m", "vgpu.cli", "replay", "--nodes", str(nodes), "--pods", str(pods_csv),
           "--policy", "bestfit", "--seeds", "2", "--no-progress", "--json"]
    dra = json.loads(subprocess.run([*cmd, "--mode", "dra"], check=True, capture_output=True, text=True).stdout)
    assert [r["mode"] for r in dra["results"]] == ["dra", "dra"]
    plain = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    assert all("mode" not in r for r in plain["results"])
    refused = subprocess.run([*cmd, "--mode", "dra", "--departures"], capture_output=True, text=True)
    assert refused.returncode != 0 and "--mode" in refused.stderr
