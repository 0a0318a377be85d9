"""Device-plugin mode judged by the real Kubernetes: pods placed by upstream kube-scheduler through our extender
(deploy/'s KubeSchedulerConfiguration), admitted by upstream kubelet through our device plugin, run by containerd
and runc with the limits the plugin answered, and read back through kube-apiserver."""

from __future__ import annotations

import pytest
from realk8s_helpers import create, get_pod, gpu_container, gpu_pod, phase, report, wait_finished

from vgpu import keys
from vgpu.assignment import decode

pytestmark = [pytest.mark.realk8s, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(make_real_cluster):
    return make_real_cluster(nodes=2, gpus="2xA100-40GB")


def test_a_container_past_its_limit_is_refused_while_its_neighbour_runs(cluster):
    """Two shares of one GPU (the policy packs them): the one allocating past its 1000 MiB gets out-of-memory at the
    crossing step, the other gets all it asked; both placed by kube-scheduler through the extender."""
    create(cluster, gpu_pod("over", [gpu_container("main", ["--mib", "1500", "--chunk", "250", "--expect-oom"],
                                                   memory=1000, cores=20)]))
    create(cluster, gpu_pod("neighbour", [gpu_container("main", ["--mib", "2000", "--chunk", "500"],
                                                        memory=3000, cores=20)]))
    over, neighbour = wait_finished(cluster, "over"), wait_finished(cluster, "neighbour")
    assert phase(over) == "Succeeded", cluster.events("default", "over")
    assert phase(neighbour) == "Succeeded", cluster.events("default", "neighbour")
    limited = report(cluster, "over", "main")
    assert limited["result"] == "oom-refused"
    (device,) = limited["devices"]
    assert device["total_mib"] == 1000 and device["allocated_mib"] == 1000 and device["oom_at_mib"] == 1250
    (free,) = report(cluster, "neighbour", "main")["devices"]
    assert free["total_mib"] == 3000 and free["allocated_mib"] == 2000 and free["oom_at_mib"] is None
    # placed by the real kube-scheduler, bound by our extender; the container saw the GPU its grant names
    for pod, seen in ((over, device), (neighbour, free)):
        name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
        (segment,) = decode(pod["metadata"]["annotations"][keys.VGPU_IDS])
        assert [g.uuid for g in segment] == [seen["uuid"]]
        assert any(e.startswith("Scheduled:") and node in e for e in cluster.events("default", name))
    assert get_pod(cluster, "over")["metadata"]["annotations"].get(keys.BIND_PHASE) == "success"
