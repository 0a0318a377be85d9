"""MiB everywhere: on a node with 8 x A100-80GB (655,360 MiB, ten times kubelet's budget of memory devices), a pod
gets the memory limit it asked for, in both resource modes: the default `mib` (only vgpu-number advertised, the
request is MiB) and Volcano's `devices` layout with the factor such a node needs (the request is in its units).
"""

from __future__ import annotations

import pytest
from e2e_helpers import TERMINAL, WORKLOAD, container, phase, pod, reports, wait_until

NS = "modes"


@pytest.mark.parametrize("mode, factor", [("mib", 1), ("devices", 16)])
def test_a_20000_mib_request_on_eight_80gb_cards(make_cluster, request, mode, factor):
    cluster = make_cluster(nodes=1, gpus="8xA100-80GB", resource_mode=mode, memory_factor=factor)
    request.node._e2e_cluster = cluster
    assert cluster.memory_factor == factor
    node = cluster.node_objects()[0]
    allocatable = node["status"]["allocatable"]
    if mode == "mib":
        assert "volcano.sh/vgpu-memory" not in allocatable and "volcano.sh/vgpu-cores" not in allocatable
    else:
        assert int(allocatable["volcano.sh/vgpu-memory"]) == 8 * 81920 // factor
    cluster.create_pod(pod("big", [container("main", WORKLOAD + ["--mib", "19000"], memory=20000 // factor,
                                             cores=20)], namespace=NS))
    done = wait_until("pod finished", lambda: (p := cluster.api_get(f"/api/v1/namespaces/{NS}/pods/big"))
                      and phase(p) in TERMINAL and p, 120)
    assert phase(done) == "Succeeded", done.get("status")
    report = reports(cluster)[(NS, "big", "main")]
    assert report["limits"] == {"CUDA_DEVICE_MEMORY_LIMIT_0": "20000m"}
    assert report["env"]["CUDA_DEVICE_SM_LIMIT"] == "20"
