"""Matching kubelet's Allocate calls to pods when several pods wait on the same GPUs (binpack makes this common).

The real plugin process, the kubelet stand-in and the API-server stand-in; kubelet's call order per container
follows the order of the container's limits (kubelet's own order is Go map order, i.e. any order).
"""

from __future__ import annotations

import random
import time

import pytest
from dp_helpers import NODE, gpu_container

from vgpu.kube.client import read_json
from vgpu.proto.deviceplugin.v1beta1 import api_pb2 as pb
from vgpu.testbed.kubelet import AdmissionError

NUMBER, MEMORY, CORES = "volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores"


def the_response(container) -> pb.ContainerAllocateResponse:
    """The one response of a container that carries its env (exactly one must); the others are empty."""
    full = [r for r in container.responses.values() if r.envs]
    empty = [r for r in container.responses.values() if not r.envs]
    assert len(full) == 1, f"container {container.name}: env returned {len(full)} times"
    assert all(r == pb.ContainerAllocateResponse() for r in empty)
    return full[0]


def memory_first(name: str, memory: int, cores: int) -> dict:
    """A container whose limits list memory and cores before the GPU count (kubelet calls them first)."""
    return {"name": name, "image": "busybox", "resources": {"limits": {
        MEMORY: str(memory), CORES: str(cores), NUMBER: "1"}}}


def admit_all(cluster, pods: list[dict], order: list[int]) -> dict[str, tuple[str, pb.ContainerAllocateResponse]]:
    """Admit pods in `order`; returns pod name -> (uid, the env-carrying response of its only container)."""
    got = {}
    for i in order:
        pod = pods[i]
        (container,) = cluster.kubelet.admit(pod)
        got[pod["metadata"]["name"]] = (pod["metadata"]["uid"], the_response(container))
    return got


def check_distinct_cache_dirs(cluster, got, uids: set[str]) -> None:
    dirs = [{m.container_path: m.host_path for m in r.mounts}["/tmp/vgpu"] for _, r in got.values()]
    caches = [r.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] for _, r in got.values()]
    assert len(set(dirs)) == len(dirs) and len(set(caches)) == len(caches)
    root = cluster.hook / "vgpu" / "containers"
    assert set(dirs) == {str(root / f"{uid}_c") for uid in uids}


def test_two_identical_pods_on_one_gpu_admitted_in_either_order(cluster):
    cluster.start_plugin("1xT4")
    (a,) = cluster.wait_inventory()
    pods = [cluster.create_pod(f"twin-{i}", [gpu_container("c", 1, 1000, 10)], f"{a},NVIDIA,1000,10:")
            for i in (1, 2)]
    got = admit_all(cluster, pods, [1, 0])  # the younger first: kubelet may see it first in another batch
    for _, response in got.values():
        assert response.envs["NVIDIA_VISIBLE_DEVICES"] == a
        assert response.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
        assert response.envs["CUDA_DEVICE_SM_LIMIT"] == "10"
    check_distinct_cache_dirs(cluster, got, {p["metadata"]["uid"] for p in pods})
    for pod in pods:
        assert cluster.pod(pod["metadata"]["name"])["metadata"]["annotations"]["volcano.sh/bind-phase"] == "success"


@pytest.mark.parametrize("layout", ["number-first", "memory-first"])
def test_five_pods_with_different_limits_on_one_gpu(cluster, layout):
    """Limits differ: the memory / cores ID counts tell the pods apart, whichever resource kubelet calls first."""
    cluster.start_plugin("1xT4")
    (a,) = cluster.wait_inventory()
    limits = [(1000, 10), (2000, 10), (1000, 20), (1500, 15), (3000, 5)]
    pods = []
    for i, (memory, cores) in enumerate(limits):
        container = (gpu_container("c", 1, memory, cores) if layout == "number-first"
                     else memory_first("c", memory, cores))
        pods.append(cluster.create_pod(f"p{i}", [container], f"{a},NVIDIA,{memory},{cores}:"))
    order = list(range(5))
    random.Random(7).shuffle(order)
    got = admit_all(cluster, pods, order)
    for i, (memory, cores) in enumerate(limits):
        uid, response = got[f"p{i}"]
        assert response.envs["NVIDIA_VISIBLE_DEVICES"] == a
        assert response.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{memory}m"
        assert response.envs["CUDA_DEVICE_SM_LIMIT"] == str(cores)
        mounts = {m.container_path: m.host_path for m in response.mounts}
        assert mounts["/tmp/vgpu"] == str(cluster.hook / "vgpu" / "containers" / f"{uid}_c")
        assert cluster.pod(f"p{i}")["metadata"]["annotations"]["volcano.sh/bind-phase"] == "success"


def test_five_identical_pods_and_mixed_call_orders(cluster):
    """Interchangeable pods: the oldest is matched, every container gets the same limits and its own directory."""
    cluster.start_plugin("2xT4")
    a, b = cluster.wait_inventory()
    pods = []
    for i in range(5):
        container = gpu_container("c", 1, 2000, 10) if i % 2 else memory_first("c", 2000, 10)
        pods.append(cluster.create_pod(f"same-{i}", [container], f"{a},NVIDIA,2000,10:"))
    # a pod on the other GPU with the same limits: only the GPU set tells it apart
    other = cluster.create_pod("other", [memory_first("c", 2000, 10)], f"{b},NVIDIA,2000,10:")
    got = admit_all(cluster, [*pods, other], [5, 3, 0, 4, 1, 2])
    for name, (_, response) in got.items():
        assert response.envs["NVIDIA_VISIBLE_DEVICES"] == (b if name == "other" else a)
        assert response.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
        assert response.envs["CUDA_DEVICE_SM_LIMIT"] == "10"
    check_distinct_cache_dirs(cluster, got, {p["metadata"]["uid"] for p in [*pods, other]})
    assert {m.container_path: m.host_path for m in got["other"][1].mounts}["/tmp/vgpu"].endswith(
        f"{other['metadata']['uid']}_c")
    for name in [*(p["metadata"]["name"] for p in pods), "other"]:
        assert cluster.pod(name)["metadata"]["annotations"]["volcano.sh/bind-phase"] == "success"


@pytest.mark.parametrize("layout", ["number-first", "memory-first"])
def test_a_pod_the_lagging_cache_has_not_seen_does_not_take_the_grant_of_a_pod_on_its_gpu(cluster, layout):
    """The plugin's pod watch lags behind a bind: kubelet admits a pod the cache does not hold yet, while the cache
    holds an older pod waiting on the same GPU with other limits. Each pod gets its own limits."""
    cluster.start_plugin("1xT4")
    (a,) = cluster.wait_inventory()
    make = gpu_container if layout == "number-first" else memory_first
    cluster.create_pod("seen", [make("c", 1000, 10) if make is memory_first else make("c", 1, 1000, 10)],
                       f"{a},NVIDIA,1000,10:")
    cluster.restart_plugin()  # its first list holds "seen"
    with cluster.apiserver.hold_watches():
        unseen = cluster.create_pod("unseen", [make("c", 3000, 30) if make is memory_first
                                               else make("c", 1, 3000, 30)], f"{a},NVIDIA,3000,30:")
        got = admit_all(cluster, [unseen], [0])
    assert [got["unseen"][1].envs[k] for k in ("CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_SM_LIMIT")] == [
        "3000m", "30"]
    assert cluster.pod("seen")["metadata"]["annotations"]["volcano.sh/bind-phase"] == "allocating"
    got.update(admit_all(cluster, [cluster.pod("seen")], [0]))
    assert [got["seen"][1].envs[k] for k in ("CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_SM_LIMIT")] == [
        "1000m", "10"]
    check_distinct_cache_dirs(cluster, got, {cluster.pod(n)["metadata"]["uid"] for n in ("seen", "unseen")})
    for name in ("seen", "unseen"):
        assert cluster.pod(name)["metadata"]["annotations"]["volcano.sh/bind-phase"] == "success"


def test_two_container_twins_keep_each_pod_consistent(cluster):
    """Twins with two GPU containers: the match follows one pod through all its containers."""
    cluster.start_plugin("2xT4")
    a, b = cluster.wait_inventory()
    spec = [gpu_container("x", 1, 1000, 10), gpu_container("y", 1, 3000, 30)]
    assignment = f"{a},NVIDIA,1000,10:;{b},NVIDIA,3000,30:"
    pods = [cluster.create_pod(f"pair-{i}", spec, assignment) for i in (1, 2)]
    for pod in reversed(pods):
        x, y = cluster.kubelet.admit(pod)
        rx, ry = the_response(x), the_response(y)
        assert (rx.envs["NVIDIA_VISIBLE_DEVICES"], rx.envs["CUDA_DEVICE_MEMORY_LIMIT_0"]) == (a, "1000m")
        assert (ry.envs["NVIDIA_VISIBLE_DEVICES"], ry.envs["CUDA_DEVICE_MEMORY_LIMIT_0"]) == (b, "3000m")
        dir_x = {m.container_path: m.host_path for m in rx.mounts}["/tmp/vgpu"]
        dir_y = {m.container_path: m.host_path for m in ry.mounts}["/tmp/vgpu"]
        assert dir_x.rsplit("_", 1)[0] == dir_y.rsplit("_", 1)[0]  # both containers of one pod's record
    for pod in pods:
        assert cluster.pod(pod["metadata"]["name"])["metadata"]["annotations"]["volcano.sh/bind-phase"] == "success"


def percent_container(percent: int) -> dict:
    """Memory as a percentage of the card: no Allocate call carries it."""
    return {"name": "c", "image": "busybox", "resources": {"limits": {
        NUMBER: "1", "volcano.sh/vgpu-memory-percentage": str(percent)}}}


def test_pods_the_calls_cannot_tell_apart_are_told_by_kubelet(cluster):
    """Two pods asking 25% and 50% of one GPU: kubelet's pod-resources API names the pod it admits."""
    cluster.start_plugin("1xT4")
    (a,) = cluster.wait_inventory()
    pods = [cluster.create_pod("quarter", [percent_container(25)], f"{a},NVIDIA,3840,0:"),
            cluster.create_pod("half", [percent_container(50)], f"{a},NVIDIA,7680,0:")]
    got = admit_all(cluster, pods, [1, 0])  # the younger first
    assert got["quarter"][1].envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3840m"
    assert got["half"][1].envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "7680m"
    check_distinct_cache_dirs(cluster, got, {p["metadata"]["uid"] for p in pods})
    for name in ("quarter", "half"):
        assert cluster.pod(name)["metadata"]["annotations"]["volcano.sh/bind-phase"] == "success"


@pytest.mark.parametrize("order", [[0, 1], [1, 0]], ids=["without-cores-first", "with-cores-first"])
def test_container_without_cores_and_its_twin_with_cores(cluster, order):
    """Same GPU and memory, one without vgpu-cores: after the GPU and memory calls the first container's calls are
    over while the twin's cores call is still to come; kubelet's view tells which one is being admitted."""
    cluster.start_plugin("1xT4")
    (a,) = cluster.wait_inventory()
    pods = [cluster.create_pod("plain", [gpu_container("c", 1, 2000)], f"{a},NVIDIA,2000,0:"),
            cluster.create_pod("cored", [gpu_container("c", 1, 2000, 5)], f"{a},NVIDIA,2000,5:")]
    got = admit_all(cluster, pods, order)
    assert got["plain"][1].envs["CUDA_DEVICE_SM_LIMIT"] == "0"
    assert got["cored"][1].envs["CUDA_DEVICE_SM_LIMIT"] == "5"
    check_distinct_cache_dirs(cluster, got, {p["metadata"]["uid"] for p in pods})


def test_steering_follows_the_pod_kubelet_admits(cluster):
    """An older pod waits on GPU a while kubelet admits a younger one assigned GPU b: GetPreferredAllocation steers
    kubelet to b, so neither pod gets the other's grant."""
    cluster.start_plugin("2xT4")
    a, b = cluster.wait_inventory()
    pods = [cluster.create_pod("older", [gpu_container("c", 1, 1000, 10)], f"{a},NVIDIA,1000,10:"),
            cluster.create_pod("younger", [gpu_container("c", 1, 3000, 30)], f"{b},NVIDIA,3000,30:")]
    got = admit_all(cluster, pods, [1, 0])
    assert [got["younger"][1].envs[k] for k in ("NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_MEMORY_LIMIT_0")] == [
        b, "3000m"]
    assert [got["older"][1].envs[k] for k in ("NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_MEMORY_LIMIT_0")] == [
        a, "1000m"]
    check_distinct_cache_dirs(cluster, got, {p["metadata"]["uid"] for p in pods})


def test_differing_limits_with_nothing_to_tell_them_apart_is_refused(cluster):
    """Without kubelet's pod-resources API, pods asking 25% and 50% of one GPU cannot be told apart: refused."""
    cluster.start_plugin("1xT4", "--pod-resources-socket", str(cluster.tmp / "absent" / "kubelet.sock"))
    (a,) = cluster.wait_inventory()
    quarter = cluster.create_pod("quarter", [percent_container(25)], f"{a},NVIDIA,3840,0:")
    cluster.create_pod("half", [percent_container(50)], f"{a},NVIDIA,7680,0:")
    with pytest.raises(AdmissionError, match=r"match the next container of several pods whose limits differ, "
                                             r"and no call is left to tell them apart") as refused:
        cluster.kubelet.admit(quarter)
    assert "default/quarter" in str(refused.value) and "default/half" in str(refused.value)
    assert "pod-resources API could not be read" in str(refused.value)
    for name in ("quarter", "half"):  # neither is marked failed: the plugin cannot tell which one kubelet admitted
        assert cluster.pod(name)["metadata"]["annotations"]["volcano.sh/bind-phase"] == "allocating"
    # both pods carry a Warning event saying why
    deadline = time.monotonic() + 30
    while True:
        events = read_json(cluster.core.list_namespaced_event("default", _preload_content=False))["items"]
        warned = {e["involvedObject"]["name"] for e in events if e.get("reason") == "VGPUAllocationAmbiguous"}
        if warned == {"quarter", "half"}:
            break
        assert time.monotonic() < deadline, events
        time.sleep(0.1)


def test_a_refusal_among_many_waiting_pods_reaches_kubelet_readable(cluster):
    """With 150 pods waiting, a container no pod waits for is refused with a message that names a few of them and
    fits a gRPC status (a longer one reached kubelet as `Stream removed`)."""
    cluster.start_plugin("1xT4")
    (a,) = cluster.wait_inventory()
    for i in range(150):
        cluster.create_pod(f"w{i:03d}", [gpu_container("c", 1, 1000, 10)], f"{a},NVIDIA,1000,10:")
    stray = cluster.create_pod("stray", [memory_first("c", 777, 10)], f"{a},NVIDIA,777,10:")
    stray["spec"]["containers"][0]["resources"]["limits"][MEMORY] = "555"  # kubelet asks for what nobody waits for
    with pytest.raises(AdmissionError) as refused:
        cluster.kubelet.admit(stray)
    message = str(refused.value)
    assert f"no pod with bind-phase=allocating waits for a container with {MEMORY}=555" in message
    assert "and 143 more" in message and len(message) < 4000
    assert cluster.pod("w000")["metadata"]["annotations"]["volcano.sh/bind-phase"] == "allocating"


def test_kubelet_names_the_pod_it_admits_even_beside_a_pod_half_way_through_admission(cluster):
    """Pod `half` had its first container answered (kubelet gave up on it); its second waits on the same GPU as `p`.
    Kubelet admits `p` and lists only `p`: `p` gets its own limits, `half` keeps waiting."""
    cluster.start_plugin("1xT4")
    (a,) = cluster.wait_inventory()
    cluster.create_pod("half", [gpu_container("x", 1, 500, 5), gpu_container("y", 1, 1000, 10)],
                       f"{a},NVIDIA,500,5:;{a},NVIDIA,1000,10:")
    cluster.core.patch_namespaced_pod("half", "default", {"metadata": {"annotations": {
        "volcano.sh/devices-to-allocate": f";{a},NVIDIA,1000,10:"}}})  # as the plugin leaves it after container x
    p = cluster.create_pod("p", [gpu_container("c", 1, 3000, 30)], f"{a},NVIDIA,3000,30:")
    got = admit_all(cluster, [p], [0])
    assert [got["p"][1].envs[k] for k in ("CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_SM_LIMIT")] == ["3000m", "30"]
    assert cluster.pod("p")["metadata"]["annotations"]["volcano.sh/bind-phase"] == "success"
    annotations = cluster.pod("half")["metadata"]["annotations"]
    assert annotations["volcano.sh/bind-phase"] == "allocating"
    assert annotations["volcano.sh/devices-to-allocate"] == f";{a},NVIDIA,1000,10:"


def test_a_pod_of_another_scheduler_never_takes_the_grant_of_a_waiting_pod(cluster):
    """A pod of ours waits, bound and allocating. A tenant's pod with the same ask and another schedulerName (bound
    to the node by that scheduler, no annotations) is admitted first: kubelet's pod-resources API lists it, not
    ours, as being admitted, so its Allocate is refused naming it; the waiting pod then gets its own grant."""
    cluster.start_plugin("1xT4")
    (a,) = cluster.wait_inventory()
    victim = cluster.create_pod("victim", [gpu_container("c", number=1, memory=3000, cores=30)], f"{a},NVIDIA,3000,30:")
    thief = read_json(cluster.core.create_namespaced_pod("default", {
        "metadata": {"name": "thief", "namespace": "default"},
        "spec": {"nodeName": NODE, "schedulerName": "default-scheduler",
                 "containers": [gpu_container("c", number=1, memory=3000, cores=30)]}}, _preload_content=False))
    with pytest.raises(AdmissionError) as refused:
        cluster.kubelet.admit(thief)
    message = str(refused.value)
    assert "lists none of the pods waiting for these calls (default/victim) as being admitted" in message, message
    assert "it admits default/thief (schedulerName 'default-scheduler'), which holds no grant" in message, message
    assert cluster.pod("victim")["metadata"]["annotations"]["volcano.sh/bind-phase"] == "allocating"
    (container,) = cluster.kubelet.admit(victim)
    assert the_response(container).envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert cluster.pod("victim")["metadata"]["annotations"]["volcano.sh/bind-phase"] == "success"


def test_a_container_name_that_would_leave_the_plugins_directories_is_an_invalid_argument(cluster):
    """kube-apiserver allows only DNS labels as container names; a name that reaches the plugin otherwise (`..` and
    slashes, from an API server that does not check) would name host files outside the container's own. Kubelet is
    answered INVALID_ARGUMENT with the reason, not a failed call of the application, and nothing is made."""
    cluster.start_plugin("1xT4")
    (a,) = cluster.wait_inventory()
    pod = cluster.create_pod("escape", [gpu_container("../../etc", number=1, memory=1000)], f"{a},NVIDIA,1000,0:")
    with pytest.raises(AdmissionError) as refused:
        cluster.kubelet.admit(pod)
    message = str(refused.value)
    assert "container name '../../etc' or pod UID" in message and "is not what kube-apiserver allows" in message
    assert "Exception calling application" not in message
    containers = cluster.hook / "vgpu" / "containers"
    assert not (containers.exists() and any(containers.iterdir())) and not (cluster.hook / "etc").exists()
