"""Our device plugin and upstream kubelet restarted under load, judged by the real kubelet: when the plugin's
ListAndWatch ends kubelet marks every device of it unhealthy and fails any Allocate at once
(`pkg/kubelet/cm/devicemanager/manager.go` `PluginDisconnected`), and it publishes the node's allocatable devices
every 10 s. Pods that wait meanwhile must wait (not be bound to fail admission), and run once the plugin is back;
pods already running keep running."""

from __future__ import annotations

import time

import pytest
from realk8s_helpers import create, get_pod, gpu_container, gpu_pod, phase, report, wait_finished

pytestmark = [pytest.mark.realk8s, pytest.mark.slow]

RESOURCE = "volcano.sh/vgpu-number"


@pytest.fixture(scope="module")
def cluster(make_real_cluster):
    return make_real_cluster(nodes=1, gpus="2xA100-40GB")


def _allocatable(cluster) -> int:
    return int(cluster.get("/api/v1/nodes/node-0")["status"]["allocatable"].get(RESOURCE, "0"))


def test_a_pod_created_while_the_plugin_is_down_waits_and_runs_once_it_is_back(cluster):
    node = cluster.nodes[0]
    running = "survivor"
    create(cluster, gpu_pod(running, [gpu_container("main", ["--mib", "500", "--hold", "25"], memory=1000)]))
    cluster.wait("the survivor running", lambda: phase(get_pod(cluster, running)) == "Running", 90)
    node.plugin.kill()
    cluster.wait("kubelet reporting no allocatable devices", lambda: _allocatable(cluster) == 0, 30)
    create(cluster, gpu_pod("waiter", [gpu_container("main", ["--mib", "500"], memory=1000)]))
    time.sleep(5)
    waiting = get_pod(cluster, "waiter")
    assert phase(waiting) == "Pending" and not waiting["spec"].get("nodeName"), waiting["status"]
    node.plugin.start()
    done = wait_finished(cluster, "waiter", timeout=120)
    assert phase(done) == "Succeeded", cluster.events("default", "waiter")
    assert report(cluster, "waiter", "main")["devices"][0]["total_mib"] == 1000
    kept = wait_finished(cluster, running, timeout=120)
    assert phase(kept) == "Succeeded", cluster.events("default", running)


def test_a_pod_bound_while_kubelet_is_down_is_admitted_after_its_restart(cluster):
    node = cluster.nodes[0]
    create(cluster, gpu_pod("steady", [gpu_container("main", ["--mib", "500", "--hold", "20"], memory=1000)]))
    cluster.wait("steady running", lambda: phase(get_pod(cluster, "steady")) == "Running", 90)
    node.kubelet.stop()
    create(cluster, gpu_pod("arrival", [gpu_container("main", ["--mib", "500"], memory=1000)]))
    time.sleep(3)
    node.kubelet.start()
    for name in ("arrival", "steady"):
        done = wait_finished(cluster, name, timeout=150)
        assert phase(done) == "Succeeded", (name, cluster.events("default", name))
