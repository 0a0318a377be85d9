"""The device plugin (a real process) while the API server misbehaves, with faults injected by the stand-in."""

from __future__ import annotations

import time

from dp_helpers import gpu_container


def test_admission_survives_an_api_server_that_cannot_take_the_annotation(cluster):
    """Every PATCH of the pod fails with 503 for a while: the container is still admitted with its limits (the
    annotation is bookkeeping), and bind-phase=success is written once the API server takes patches again.
    Before: the failed patch failed Allocate and so the pod's admission."""
    cluster.start_plugin("1xT4")
    (a,) = cluster.wait_inventory()
    pod = cluster.create_pod("patient", [gpu_container("main", 1, 2000, 20)], f"{a},NVIDIA,2000,20:")
    cluster.apiserver.faults.set([{"action": "error", "method": "PATCH", "path": "/pods/patient", "status": 503,
                                   "retry_after": 0, "for_seconds": 8}])
    (main,) = cluster.kubelet.admit(pod)
    envs = main.responses["volcano.sh/vgpu-number"].envs
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m" and envs["CUDA_DEVICE_SM_LIMIT"] == "20"
    assert cluster.apiserver.faults.view()[0]["hits"] >= 1
    deadline = time.monotonic() + 40
    while cluster.pod("patient")["metadata"]["annotations"].get("volcano.sh/bind-phase") != "success":
        assert time.monotonic() < deadline, cluster.log()
        time.sleep(0.2)
    assert "event=annotation_deferred" in cluster.log() and "event=deferred_patch_written" in cluster.log()


def test_a_second_pod_on_the_same_gpu_is_admitted_while_the_first_ones_record_waits(cluster):
    """While the first pod's annotation cannot be written, a second pod on the same GPU is matched to its own
    grant: the plugin's memory of what it answered, not the stale annotation, decides."""
    cluster.start_plugin("1xT4")
    (a,) = cluster.wait_inventory()
    first = cluster.create_pod("first", [gpu_container("main", 1, 2000, 20)], f"{a},NVIDIA,2000,20:")
    second = cluster.create_pod("second", [gpu_container("main", 1, 3000, 30)], f"{a},NVIDIA,3000,30:")
    cluster.apiserver.faults.set([{"action": "error", "method": "PATCH", "path": "/pods/first", "status": 503,
                                   "retry_after": 0, "for_seconds": 6}])
    (one,) = cluster.kubelet.admit(first)
    (two,) = cluster.kubelet.admit(second)
    assert one.responses["volcano.sh/vgpu-number"].envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
    assert two.responses["volcano.sh/vgpu-number"].envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"


def test_two_grants_that_together_overfill_a_gpu_are_not_both_served(cluster):
    """Two pods placed on one GPU by two extenders acting at once (a leader hand-over): each grant is within its
    own spec, together they need more memory than the card has. The first is admitted, the second refused with
    the GPU named; what was handed out never exceeds the card."""
    import pytest

    from vgpu.testbed.kubelet import AdmissionError

    cluster.start_plugin("1xT4")  # 15360 MiB, memory units of 1 MiB
    (a,) = cluster.wait_inventory()
    first = cluster.create_pod("first", [gpu_container("main", 1, 10000, 40)], f"{a},NVIDIA,10000,40:")
    second = cluster.create_pod("second", [gpu_container("main", 1, 10000, 40)], f"{a},NVIDIA,10000,40:")
    (one,) = cluster.kubelet.admit(first)
    assert one.responses["volcano.sh/vgpu-number"].envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "10000m"
    with pytest.raises(AdmissionError, match=f"GPU {a} would hold 20000 of its 15360 memory units"):
        cluster.kubelet.admit(second)


def test_a_gpu_lost_under_a_running_container_is_reported_on_its_pod(cluster):
    """The GPU a container holds falls off the bus: kubelet hears it is unhealthy, the node's inventory says so
    (the extender places nothing new on it), and the pod gets a Warning event naming the GPU; when the GPU comes
    back, a Normal event says so."""
    from vgpu.kube.client import read_json

    cluster.start_plugin("1xT4")
    (a,) = cluster.wait_inventory()
    pod = cluster.create_pod("holder", [gpu_container("main", 1, 2000, 20)], f"{a},NVIDIA,2000,20:")
    cluster.kubelet.admit(pod)
    with cluster.control.open("a") as control:
        control.write("lost 0\n")

    def reasons() -> set[str]:
        events = read_json(cluster.core.list_namespaced_event("default", _preload_content=False))["items"]
        return {e["reason"] for e in events if e["involvedObject"]["name"] == "holder"}

    deadline = time.monotonic() + 15
    while "VGPUDeviceUnhealthy" not in reasons():
        assert time.monotonic() < deadline, cluster.log()
        time.sleep(0.1)
    # the registrar republishes the inventory on its own thread, woken by the same health change as the event
    while ",false," not in cluster.node_annotations()["volcano.sh/node-vgpu-register"]:
        assert time.monotonic() < deadline, cluster.log()
        time.sleep(0.1)
    with cluster.control.open("a") as control:
        control.write("recover 0\n")
    deadline = time.monotonic() + 15
    while "VGPUDeviceRecovered" not in reasons():
        assert time.monotonic() < deadline, cluster.log()
        time.sleep(0.1)


def test_a_gpu_gone_after_a_plugin_restart_is_reported_and_not_published(cluster):
    """The plugin restarts on a node whose GPU set changed (a card was removed): the container that held the
    vanished GPU gets a Warning event, and the new inventory does not list it."""
    from vgpu.kube.client import read_json

    cluster.start_plugin("2xT4")
    a, b = cluster.wait_inventory()
    pod = cluster.create_pod("orphan", [gpu_container("main", 1, 2000, 20)], f"{b},NVIDIA,2000,20:")
    cluster.kubelet.admit(pod)
    cluster.proc.terminate()
    cluster.proc.wait(10)
    cluster.start_plugin("1xT4")  # the simulated node keeps the first card's UUID only
    deadline = time.monotonic() + 15
    while cluster.wait_inventory() != [a]:  # the old annotation until the new plugin publishes
        assert time.monotonic() < deadline, cluster.log()
        time.sleep(0.1)
    while True:
        events = read_json(cluster.core.list_namespaced_event("default", _preload_content=False))["items"]
        gone = [e for e in events if e["reason"] == "VGPUDeviceGone" and e["involvedObject"]["name"] == "orphan"]
        if gone:
            break
        assert time.monotonic() < deadline, cluster.log()
        time.sleep(0.1)
    assert b in gone[0]["message"]
