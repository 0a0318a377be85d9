"""Device-plugin mode: a 2-GPU container gets two GPUs of one NVLink island, from NVML to the extender's choice.

One node of eight H100 in two NVLink islands and two NUMA nodes (`8xH100-80GB@nvlink4/numa2`: GPUs 0-3 and 4-7),
discovered by `vgpu device-plugin` through the simulated NVML, which publishes the islands in
`vgpu-sharing.io/node-gpu-topology`. Two shares pinned to GPUs 3 and 4 make them the fullest GPUs, one in each
island. A pod asking two GPUs then gets two GPUs of one island; with `--no-topology` the binpack order gives it the
two fullest, GPUs 3 and 4, across the islands.
"""

from __future__ import annotations

import json

import pytest
from e2e_helpers import WORKLOAD, container, inventories, phase, pod, wait_until

from vgpu import keys
from vgpu.assignment import decode

pytestmark = pytest.mark.slow

NS = "e2e"
SPEC = "8xH100-80GB@nvlink4/numa2"


def _run(cluster, name: str, number: int, mib: int, pin: str | None = None) -> list[str]:
    """Create the pod, wait for it to run; the UUIDs of its GPUs."""
    annotations = {keys.USE_GPU_UUID: pin} if pin else {}
    body = pod(name, [container("main", WORKLOAD + ["--mib", "100", "--hold", "600"], number=number, memory=mib)],
               annotations=annotations)
    cluster.create_pod(body)
    running = wait_until(f"{name} running", lambda: (p := cluster.api_get(f"/api/v1/namespaces/{NS}/pods/{name}"))
                         and phase(p) == "Running" and p, 120)
    (segment,) = decode(running["metadata"]["annotations"][keys.VGPU_IDS])
    return [grant.uuid for grant in segment]


def _placed_pair(cluster) -> tuple[list[int], dict[str, int]]:
    """Fill GPUs 3 and 4, place a 2-GPU pod: the indices of its GPUs, and each GPU's island."""
    (node,) = cluster.node_objects()
    topology = json.loads(node["metadata"]["annotations"][keys.NODE_TOPOLOGY])
    (devices,) = inventories(cluster).values()
    index = {d.uuid: position for position, d in enumerate(devices)}
    islands = {uuid: entry["island"] for uuid, entry in topology.items()}
    assert sorted(islands.values()) == [0] * 4 + [4] * 4, topology
    for position in (3, 4):
        _run(cluster, f"fill-{position}", 1, 60000, pin=devices[position].uuid)
    pair = _run(cluster, "pair", 2, 10000)
    return sorted(index[uuid] for uuid in pair), {str(index[u]): island for u, island in islands.items()}


@pytest.fixture(scope="module")
def cluster(make_cluster):
    return make_cluster(nodes=1, gpus=SPEC, scheduler_args=["--node-policy", "binpack"])


@pytest.fixture(scope="module")
def flat_cluster(make_cluster):
    return make_cluster(nodes=1, gpus=SPEC, scheduler_args=["--node-policy", "binpack", "--no-topology"])


def test_a_two_gpu_container_gets_one_island(cluster, request):
    request.node._e2e_cluster = cluster
    pair, islands = _placed_pair(cluster)
    assert len({islands[str(i)] for i in pair}) == 1, (pair, islands)


def test_without_topology_the_two_fullest_gpus_straddle_the_islands(flat_cluster, request):
    request.node._e2e_cluster = flat_cluster
    pair, islands = _placed_pair(flat_cluster)
    assert pair == [3, 4] and islands["3"] != islands["4"], (pair, islands)
