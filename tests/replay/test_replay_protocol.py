"""The replay protocol on small synthetic traces with hand-checked results: inflation, pairing, tie order,
kube-scheduler CPU/memory fit, exact milli accounting, the metric, and the memoised loop against a plain one."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vgpu.replay.arrivals import arrival_sequence
from vgpu.replay.cluster import ReplayCluster
from vgpu.replay.run import curve, prepare_policy, replay
from vgpu.replay.trace import TraceNode, TracePod, load_nodes, load_pods
from vgpu.scheduler.fit import binpack_order, fit
from vgpu.scheduler.nodestate import gpu_types
from vgpu.scheduler.policies import make_policy

REPO = Path(__file__).resolve().parents[2]


def pod(name, gpus=1, milli=500, cpu=1000, memory=1024):
    return TracePod(name=name, cpu=cpu, memory=memory, num_gpu=gpus, gpu_milli=milli if gpus else 0)


def node(name, gpus=1, cpu=8000, memory=65536, model="T4"):
    return TraceNode(name=name, cpu=cpu, memory=memory, gpus=gpus, model=model)


def test_inflation_appends_resamples_until_the_next_would_pass_130_percent():
    pods = [pod(f"p{i}") for i in range(4)]  # 4 x 500 = 2000 milli on 2 GPUs of capacity
    seq, rank = arrival_sequence(pods, capacity_milli=2000, n_nodes=2, seed=1)
    # target 2600: one clone brings T to 2500, the next would make 3000
    assert len(seq) == 5
    assert sorted(seq[:4]) == [0, 1, 2, 3]
    assert sorted(rank.tolist()) == [0, 1]


def test_inflation_checks_the_per_gpu_milli_as_the_simulator_does():
    pods = [pod("big", gpus=2, milli=1000)]  # T = 2000, capacity 4000, target 5200
    seq, _ = arrival_sequence(pods, capacity_milli=4000, n_nodes=1, seed=3)
    # 2000 + 1000 <= 5200 -> 4000; 4000 + 1000 <= 5200 -> 6000; 6000 + 1000 > 5200 stop (T ends above target)
    assert seq == [0, 0, 0]


def test_inflation_removes_random_pods_above_the_target():
    pods = [pod(f"p{i}", milli=1000) for i in range(10)]  # 10000 milli on 5000 capacity, target 6500
    seq, _ = arrival_sequence(pods, capacity_milli=5000, n_nodes=1, seed=5)
    assert len(seq) == 6 and len(set(seq)) == 6


def test_same_seed_same_sequence_and_ranks_for_every_policy():
    pods = [pod(f"p{i}", milli=100 * (i % 9 + 1)) for i in range(30)]
    a = arrival_sequence(pods, 10_000, 7, seed=42)
    b = arrival_sequence(pods, 10_000, 7, seed=42)
    c = arrival_sequence(pods, 10_000, 7, seed=43)
    assert a[0] == b[0] and a[1].tolist() == b[1].tolist()
    assert a[0] != c[0]


def test_ties_go_to_the_lowest_rank_and_bestfit_packs_hand_checked():
    cluster = ReplayCluster([node("a"), node("b")])
    pods = [pod("x", milli=600), pod("y", milli=400), pod("z", milli=600), pod("w", milli=600)]
    rank = np.array([1, 0])  # node b wins ties
    arrived, allocated, where = replay(cluster, pods, [0, 1, 2, 3], rank, make_policy("bestfit"))
    # x: both empty, tie -> b.  y: b leaves 0 free, a would leave 600 -> b.  z -> a.  w: nowhere.
    assert where.tolist() == [1, 1, 0, -1]
    assert arrived.tolist() == [600, 1000, 1600, 2200]
    assert allocated.tolist() == [600, 1000, 1600, 1600]
    rank = np.array([0, 1])
    _, _, where = replay(cluster, pods, [0, 1, 2, 3], rank, make_policy("bestfit"))
    assert where.tolist() == [0, 0, 1, -1]


def test_kube_scheduler_cpu_and_memory_fit_comes_first():
    cluster = ReplayCluster([node("a", cpu=4000, memory=8192), node("b", gpus=0, cpu=64000)])
    pods = [
        pod("hungry", cpu=5000),  # GPU free on a, but CPU does not fit there; b has no GPU
        pod("fat", memory=9000),  # memory does not fit on a
        pod("cpuonly", gpus=0, cpu=6000),  # only b has the CPU
        pod("ok", cpu=4000),
    ]
    _, _, where = replay(cluster, pods, [0, 1, 2, 3], np.array([0, 1]), make_policy("fgd"))
    assert where.tolist() == [-1, -1, 1, 0]


def test_milli_shares_are_exact_so_333_333_334_fill_one_gpu():
    cluster = ReplayCluster([node("a", model="G2")])
    pods = [pod("p", milli=333), pod("q", milli=333), pod("r", milli=334), pod("s", milli=50)]
    _, allocated, where = replay(cluster, pods, [0, 1, 2, 3], np.array([0]), make_policy("fragaware"))
    assert where.tolist() == [0, 0, 0, -1]
    assert allocated[-1] == 1000


def test_curve_takes_the_mean_of_events_at_each_percent_with_a_window_fallback():
    arrived = np.array([100, 200, 990, 1000, 1300])
    allocated = np.array([100, 200, 900, 940, 1000])
    out = curve(arrived, allocated, capacity_milli=1000, top=130)
    assert out[99] == pytest.approx(100 - 90.0)
    assert out[100] == pytest.approx(100 - 94.0)
    assert out[130] == pytest.approx(0.0)
    assert out[101] == pytest.approx(100 - 94.0)  # no event rounds to 101: window 100..102
    assert out[10] == pytest.approx(90.0)


def _plain_replay(cluster, pods, sequence, rank, policy):
    """Every node through fit and score on its own, no memo, no stale score: the reference for placement's loop."""
    cluster.reset(rank)
    where = []
    for j in sequence:
        p = pods[j]
        reqs, sel, ctxp = p.requests(), p.selectors(), p.context()
        policy.observe(reqs, ctxp)
        best, chosen = None, -1
        for n, state in enumerate(cluster.states):
            if cluster.cpu_free[n] < p.cpu or cluster.mem_free[n] < p.memory:
                continue
            ctx = state.context()
            order = policy.gpu_order(ctx, ctxp) or binpack_order
            res = fit(state.devices, state.usage, reqs, sel, order)
            if not res.ok:
                continue
            s = policy.score(state.devices, state.usage, reqs, res, node=ctx, pod=ctxp)
            if best is None or s > best or (s == best and rank[n] < rank[chosen]):
                best, chosen, chosen_res = s, n, res
        if chosen >= 0:
            cluster.place(chosen, p.cpu, p.memory, chosen_res)
        where.append(chosen)
        policy.relearn(gpu_types(cluster.states))
    return where


@pytest.mark.parametrize("name", ["fgd", "fragaware", "bestfit", "dotprod", "packing"])
def test_memoised_replay_matches_plain_loop(name):
    rng = np.random.default_rng(9)
    nodes = [node(f"n{i:02d}", gpus=int(rng.choice([1, 2, 4])), cpu=int(rng.choice([8000, 16000])),
                  model=str(rng.choice(["T4", "G2"]))) for i in range(12)]
    pods = []
    for i in range(120):
        kind = rng.random()
        if kind < 0.15:
            pods.append(pod(f"c{i}", gpus=0, cpu=int(rng.choice([1000, 4000]))))
        elif kind < 0.3:
            pods.append(pod(f"m{i}", gpus=int(rng.choice([1, 2])), milli=1000, cpu=2000))
        else:
            pods.append(pod(f"s{i}", milli=int(rng.choice([100, 250, 500, 730])), cpu=int(rng.choice([500, 2000]))))
    cluster = ReplayCluster(nodes)
    seq, rank = arrival_sequence(pods, cluster.capacity_milli, len(nodes), seed=4)
    # with no budget on stale scores, placement's memo must agree with evaluating every node on its own
    _, _, where = replay(cluster, pods, seq, rank, prepare_policy(name, pods, 4), refresh_budget=10**9)
    assert where.tolist() == _plain_replay(cluster, pods, seq, rank, prepare_policy(name, pods, 4))


def test_loaders_sort_by_name_and_map_cpu_only_rows(tmp_path):
    (tmp_path / "n.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\nz,1000,100,2,T4\na,2000,200,1,G2\n")
    (tmp_path / "p.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\nq,100,10,0,500,\np,200,20,1,250,T4|G2\n"
    )
    assert [n.name for n in load_nodes(tmp_path / "n.csv")] == ["a", "z"]
    pods = load_pods(tmp_path / "p.csv")
    assert [(p.name, p.gpu_milli, p.gpu_spec) for p in pods] == [("p", 250, ("T4", "G2")), ("q", 0, ())]
    req = pods[0].requests()[0]
    assert (req.count, req.cores, req.memory_on(16_384_000)) == (1, 25, 4_096_000)


def test_cli_json_on_a_synthetic_trace(tmp_path):
    rows = ["sn,cpu_milli,memory_mib,gpu,model"] + [f"n{i},16000,65536,2,T4" for i in range(4)]
    (tmp_path / "n.csv").write_text("\n".join(rows) + "\n")
    prows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"]
    prows += [f"p{i},1000,1024,1,{(i % 7 + 1) * 120},," for i in range(20)] + ["c0,2000,1024,0,0,"]
    (tmp_path / "p.csv").write_text("\n".join(prows) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "vgpu.cli", "replay", "--nodes", str(tmp_path / "n.csv"), "--pods",
         str(tmp_path / "p.csv"), "--policy", "fgd", "--policy", "ours", "--seeds", "2", "--json",
         "--plot", str(tmp_path / "c.png")],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)["results"]
    assert [(r["policy"], r["seed"]) for r in results] == [("fgd", 42), ("fragaware", 42), ("fgd", 43),
                                                           ("fragaware", 43)]
    assert set(results[0]) == {"policy", "seed", "unallocated_pct_at_100", "unallocated_pct_at_130", "failed_pods",
                               "seconds"}
    assert (tmp_path / "c.png").stat().st_size > 0
    assert "[" in out.stderr  # progress bar


def test_cli_rejects_an_unknown_policy(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "vgpu.cli", "replay", "--nodes", "x", "--pods", "y", "--policy", "nope"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )
    assert out.returncode == 2 and "nope" in out.stderr and out.stderr.count("\n") == 1
