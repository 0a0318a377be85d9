"""The departures replay (replay/events.py) on hand-checked traces: pods leave, waiting pods are retried in arrival
order without blocking smaller ones, the run ends at the last arrival, and `vgpu replay --departures` reports it."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vgpu.replay.cluster import ReplayCluster
from vgpu.replay.events import replay_departures
from vgpu.replay.run import prepare_policy
from vgpu.replay.trace import TraceNode, TracePod

REPO = Path(__file__).resolve().parents[2]


def pod(name, created, deleted, milli=1000, gpus=1):
    return TracePod(name, cpu=1000, memory=1024, num_gpu=gpus if milli else 0, gpu_milli=milli, created=created,
                    deleted=deleted)


def run(pods, gpus=1):
    cluster = ReplayCluster([TraceNode("n0", 64000, 262144, gpus, "T4")])
    policy = prepare_policy("bestfit", pods, 0)
    placed_at, where, timeline, horizon = replay_departures(cluster, pods, list(range(len(pods))), np.zeros(1),
                                                            policy, time_scale=1.0)
    return placed_at, where, timeline, horizon


def test_waiting_pods_are_placed_when_a_pod_leaves_and_the_run_ends_at_the_last_arrival():
    pods = [pod("origin", 0, 1000, milli=0),  # CPU-only: puts the time origin (10th percentile) at 0
            pod("a", 0, 25), pod("b", 10, 30, milli=500), pod("c", 20, 60, milli=500), pod("d", 40, 100)]
    placed_at, where, timeline, horizon = run(pods)
    assert horizon == 40
    # a holds the GPU until 25; b (arrived 10) and c (arrived 20) then take it together; d finds it full
    assert placed_at[1:4].tolist() == [0, 25, 25] and np.isnan(placed_at[4]) and where[4] == -1
    assert timeline.mean(timeline.allocated, horizon) == pytest.approx(1000)
    # b waits 500 milli over [10, 20), b and c 1000 over [20, 25)
    assert timeline.mean(timeline.waiting, horizon) == pytest.approx((500 * 10 + 1000 * 5) / 40)


def test_a_waiting_pod_that_does_not_fit_does_not_hold_up_a_later_one():
    pods = [pod("origin", 0, 1000, milli=0), pod("a", 0, 20, milli=500), pod("b", 0, 50, milli=500),
            pod("big", 5, 100), pod("small", 10, 100, milli=300), pod("last", 30, 40, milli=0)]
    placed_at, _, _, horizon = run(pods)
    # a leaves at 20: 500 free, too little for big (waiting since 5), enough for small (waiting since 10)
    assert horizon == 30 and placed_at[4] == 20 and np.isnan(placed_at[3])


def test_cli_departures_json(tmp_path):
    (tmp_path / "n.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
        f"n{i},32000,131072,2,T4\n" for i in range(3)))
    rows = [f"p{i},1000,1024,1,{(i % 4 + 1) * 250},,LS,Running,{10 * i},{10 * i + 35 + i % 3 * 20},{10 * i}"
            for i in range(40)]
    (tmp_path / "p.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
        "scheduled_time\n" + "\n".join(rows) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "vgpu.cli", "replay", "--nodes", str(tmp_path / "n.csv"), "--pods",
         str(tmp_path / "p.csv"), "--departures", "--time-scale", "2", "--policy", "fgd", "--policy", "ours",
         "--seeds", "2", "--json", "--plot", str(tmp_path / "d.png"), "--no-progress"],
        capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)["results"]
    assert [(r["policy"], r["seed"]) for r in results] == [("fgd", 42), ("fragaware", 42), ("fgd", 43),
                                                           ("fragaware", 43)]
    assert {"allocated_pct_mean", "allocated_pct_end", "never_placed", "delay_p95_s"} <= set(results[0])
    assert all(0 < r["allocated_pct_mean"] <= 100 and r["placed"] > 0 for r in results)
    assert (tmp_path / "d.png").stat().st_size > 0
