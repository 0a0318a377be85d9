"""Multi-GPU shares on a node whose GPUs sit on two NUMA nodes, admitted by upstream kubelet with Topology Manager
`single-numa-node` (kubelet reads a two-node NUMA layout in its mount namespace: testbed/realcluster.py
`numa_sysfs`). The extender keeps each container's GPUs on one NUMA node; kubelet must hand Allocate the devices of
the grant's GPUs whichever NUMA node it would have preferred (before the fix the second pod, placed on NUMA node 1,
failed admission: kubelet offered only NUMA node 0's devices)."""

from __future__ import annotations

import pytest
from realk8s_helpers import create, gpu_container, gpu_pod, phase, report, wait_finished

from vgpu import keys
from vgpu.assignment import decode
from vgpu.inventory import decode_topology

pytestmark = [pytest.mark.realk8s, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(make_real_cluster):
    return make_real_cluster(nodes=1, gpus="4xA100-40GB/numa2", topology_policy="single-numa-node", numa_nodes=2)


def test_two_gpu_shares_on_either_numa_node_are_admitted(cluster):
    for name in ("first", "second"):  # 2 x 30,000 MiB each: the two pairs of one NUMA node each
        create(cluster, gpu_pod(name, [gpu_container("main", ["--mib", "500", "--hold", "12"], number=2,
                                                     memory=30000)]))
    node = cluster.get("/api/v1/nodes/node-0")
    numa_of = {uuid: t.numa for uuid, t in decode_topology(node["metadata"]["annotations"][keys.NODE_TOPOLOGY]).items()}
    used = []
    for name in ("first", "second"):
        done = wait_finished(cluster, name, timeout=150)
        assert phase(done) == "Succeeded", (name, done["status"].get("message"), cluster.events("default", name))
        (segment,) = decode(done["metadata"]["annotations"][keys.VGPU_IDS])
        granted = [g.uuid for g in segment]
        assert len({numa_of[u] for u in granted}) == 1, granted  # one NUMA node per container
        assert sorted(d["uuid"] for d in report(cluster, name, "main")["devices"]) == sorted(granted)
        used.append(numa_of[granted[0]])
    assert sorted(used) == [0, 1]
