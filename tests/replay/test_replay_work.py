"""`replay(work=...)`: placement's counts of its work, which bench/bench_replay.py reports beside the time."""

import numpy as np

from vgpu.replay.cluster import ReplayCluster
from vgpu.replay.run import WORK, replay
from vgpu.replay.trace import TraceNode, TracePod
from vgpu.scheduler.policies import make_policy


def test_nodes_in_one_state_are_evaluated_once_and_a_changed_node_again():
    nodes = [TraceNode(name=f"n{i}", cpu=64000, memory=262144, gpus=2, model="T4") for i in range(4)]
    pods = [TracePod(name=f"p{i}", cpu=1000, memory=1024, num_gpu=1, gpu_milli=300) for i in range(3)]
    work: dict[str, int] = {}
    _, _, where = replay(ReplayCluster(nodes), pods, [0, 1, 2], np.arange(4), make_policy("binpack"), work=work)
    assert set(work) == set(WORK)
    # the four empty nodes share one state: one evaluation for the first pod; each later pod of the same shape
    # evaluates only the node the one before it changed (binpack keeps filling it)
    assert where.tolist() == [0, 0, 0]
    assert work == {"evaluated": 3, "evaluations": 3, "scorings": 3}
