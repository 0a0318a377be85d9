"""The departures replay with consolidation (replay/consolidation.py) on a hand-checked trace: a whole-GPU pod that
waits because two shares sit on two GPUs gets a GPU once one share is moved, within the budget, and never without."""

import numpy as np

from vgpu.replay.cluster import ReplayCluster
from vgpu.replay.consolidation import Consolidation
from vgpu.replay.events import replay_departures
from vgpu.replay.run import prepare_policy
from vgpu.replay.trace import TraceNode, TracePod


def pod(name, created, milli, gpus=1):
    return TracePod(name, cpu=1000, memory=1024, num_gpu=gpus if milli else 0, gpu_milli=milli, created=created,
                    deleted=created + 100_000)


# CPU-only pods put the time origin at 0; `spread` gives the two shares a node each; the whole-GPU pod then waits
PODS = [pod("origin0", 0, 0), pod("origin1", 0, 0), pod("share-a", 1, 300), pod("share-b", 2, 300),
        pod("whole", 100, 1000), pod("later", 400, 0)]


def run(consolidation):
    cluster = ReplayCluster([TraceNode("n0", 64000, 262144, 1, "T4"), TraceNode("n1", 64000, 262144, 1, "T4")])
    policy = prepare_policy("spread", PODS, 0)
    placed_at, where, _, _ = replay_departures(cluster, PODS, list(range(len(PODS))), np.zeros(2), policy,
                                               time_scale=1.0, consolidator=consolidation)
    return placed_at, where


def test_without_moves_the_whole_gpu_pod_never_gets_a_gpu():
    placed_at, where = run(None)
    assert where[2] != where[3] and np.isnan(placed_at[4])
    placed_at, _ = run(Consolidation("spread", share_per_hour=0.0, period=1.0, min_age=0.0))
    assert np.isnan(placed_at[4])


def test_one_move_gives_it_a_gpu_at_the_next_look():
    consolidation = Consolidation("spread", share_per_hour=100.0, period=1.0, min_age=0.0)
    placed_at, where = run(consolidation)
    assert placed_at[4] == 400   # the first look after it arrived: before the next arrival
    assert consolidation.moves == 1 and consolidation.placed == 1
    assert where[2] == where[3] != where[4]   # the two shares now on one GPU, the whole pod on the other


def test_the_budget_and_the_minimum_age_hold_moves_back():
    # 2 running pods x 0.001 an hour: no whole move is ever allowed within the run
    assert np.isnan(run(Consolidation("spread", share_per_hour=0.001, period=1.0, min_age=0.0))[0][4])
    # the shares have run 398 s by the look at 400: a minimum age of 1000 s keeps them where they are
    assert np.isnan(run(Consolidation("spread", share_per_hour=100.0, period=1.0, min_age=1000.0))[0][4])
