"""End to end with a real container runtime: the kubelet stand-in runs each container through podman and runc
(`LocalCluster(container_runtime="podman")`), so the pods the extender placed and the device plugin admitted get
exactly the envs and mounts the plugin answered, in their own PID and mount namespaces, and the isolation library
is loaded by the container's own dynamic loader from the mounted /etc/ld.so.preload."""

from __future__ import annotations

import json

import pytest
from capabilities import missing
from e2e_helpers import WORKLOAD, container, phase, pod, reports, wait_until

from vgpu.testbed.container_runtime import unavailable

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(make_cluster):
    reason = unavailable()
    if reason:
        missing("podman", reason)
    return make_cluster(nodes=1, gpus="1xT4,1xA100-40GB", container_runtime="podman")


def _run(cluster, name: str, ctr: dict) -> dict:
    cluster.create_pod(pod(name, [ctr], namespace="boxed"))
    path = f"/api/v1/namespaces/boxed/pods/{name}"
    return wait_until(f"{name} finished", lambda: (p := cluster.api_get(path)) and phase(p) in ("Succeeded", "Failed")
                      and p, 120)


def test_a_pod_in_a_real_container_is_held_to_its_grant(cluster, request):
    request.node._e2e_cluster = cluster
    done = _run(cluster, "limited", container("main", [*WORKLOAD, "--mib", "1500", "--chunk", "250", "--expect-oom"],
                                              memory=1000, cores=20))
    assert phase(done) == "Succeeded", done.get("status")
    report = reports(cluster)[("boxed", "limited", "main")]
    assert report["result"] == "oom-refused"
    (device,) = report["devices"]
    assert device["total_mib"] == 1000 and device["allocated_mib"] == 1000 and device["oom_at_mib"] == 1250
    assert "LD_PRELOAD" not in report["env"]  # the container's loader read /etc/ld.so.preload itself
    # what the kubelet stand-in ran: podman, with the plugin's /etc/ld.so.preload bind mount as answered
    started = json.loads((cluster.nodes[0].dir / "logs" / "boxed_limited_main.launch.json").read_text())
    assert started["argv"][:2] == ["podman", "run"]
    assert any(arg.endswith(":/etc/ld.so.preload:ro") for arg in started["argv"])


def test_two_gpus_in_a_real_container_each_get_their_own_limit(cluster, request):
    """A T4 and an A100 in one container: NVML inside lists them by bus, CUDA the A100 first, each with half its
    card, as the plugin granted."""
    request.node._e2e_cluster = cluster
    done = _run(cluster, "pair", container("main", [*WORKLOAD, "--mib", "1000"], number=2, percent=50, cores=10))
    assert phase(done) == "Succeeded", done.get("status")
    report = reports(cluster)[("boxed", "pair", "main")]
    assert [d["total_mib"] for d in report["devices"]] == [40960 // 2, 15360 // 2]
    assert len(report["nvml_uuids"]) == 2
