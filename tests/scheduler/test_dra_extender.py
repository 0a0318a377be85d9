"""The extender in DRA mode over HTTP: ResourceSlices and allocated ResourceClaims served by the API-server stand-in
(read through the extender's watch caches), pods that ask our DeviceClass through claims filtered and scored with
the node policy, malformed slices confined to their node, and neutral answers for every other pod."""

import orjson
import pytest
from kubernetes import client as k8s
from sched_helpers import wait_until

from vgpu.dra import DEVICE_CLASS, DRIVER
from vgpu.kube.client import read_json
from vgpu.scheduler.draview import NO_SLICES


def a_slice(node, gpus=2, memory="40960Mi"):
    devices = [{"name": f"gpu-{i}", "allowMultipleAllocations": True,
                "attributes": {"model": {"string": "NVIDIA A100-PCIE-40GB"}, "index": {"int": i},
                               "uuid": {"string": f"GPU-{node}-{i}"}},
                "capacity": {"memory": {"value": memory}, "cores": {"value": "100"}}} for i in range(gpus)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpus"},
            "spec": {"driver": DRIVER, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "nodeName": node, "devices": devices}}


def a_claim(name, memory="30Gi", cores="40", device_class=DEVICE_CLASS, count=1):
    exactly = {"deviceClassName": device_class, "count": count,
               "capacity": {"requests": {"memory": memory, "cores": cores}}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def a_pod(name, claims=(), generated=()):
    """A pod using `claims` by name and, for `generated` ((pod claim name, claim name)), claims made from a
    template, as kube-scheduler sends it (status.resourceClaimStatuses set by the claim controller)."""
    refs = [{"name": c, "resourceClaimName": c} for c in claims]
    refs += [{"name": p, "resourceClaimTemplateName": "gpu-share"} for p, _ in generated]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "resourceVersion": "1"},
            "spec": {"schedulerName": "default-scheduler", "resourceClaims": refs,
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": {"claims": [{"name": r["name"]} for r in refs]}}]},
            "status": {"resourceClaimStatuses": [{"name": p, "resourceClaimName": c} for p, c in generated]}}


def args(pod, names):
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


@pytest.fixture
def resource(kube):
    return k8s.ResourceV1Api(kube.api)


def allocate(resource, name, node, device, memory, cores):
    read_json(resource.create_namespaced_resource_claim("default", a_claim(name, memory, cores),
                                                        _preload_content=False))
    result = {"request": "gpu", "driver": DRIVER, "pool": node, "device": device, "shareID": f"share-{name}",
              "consumedCapacity": {"memory": memory, "cores": cores}}
    status = {"status": {"allocation": {"devices": {"results": [result]}}}}
    read_json(resource.patch_namespaced_resource_claim_status(name, "default", status, _preload_content=False))


def view_shows(ext, expected):
    """Wait until the extender's DRA view has these nodes with these (memory MiB, cores) charged per GPU."""
    def current():
        states = ext.runtime.dra.states()
        return {n: [(u.memory, u.cores) for u in s.usage] for n, s in states.items() if not s.error}
    wait_until(lambda: current() == expected, what=f"DRA view {expected}")


@pytest.fixture
def cluster(kube, resource, served):
    """n1 with 10 GiB / 60 cores of gpu-0 allocated, n2 empty; the extender in score mode, DRA on. The pods ask
    30 GiB / 40 cores: on n1's gpu-0 that fills the GPU, on n2 it leaves a GPU with too few cores for the next."""
    return start(resource, served, "score")


def start(resource, served, mode):
    for node in ("n1", "n2"):
        read_json(resource.create_resource_slice(a_slice(node), _preload_content=False))
    allocate(resource, "held", "n1", "gpu-0", "10Gi", "60")
    ext = served(mode=mode, dra=True)
    view_shows(ext, {"n1": [(10240, 60), (0, 0)], "n2": [(0, 0), (0, 0)]})
    return ext


def test_decide_mode_filters_down_to_the_best_node(resource, served):
    ext = start(resource, served, "decide")
    read_json(resource.create_namespaced_resource_claim("default", a_claim("want"), _preload_content=False))
    pod = a_pod("p", ["want"])
    wait_until(lambda: ext.runtime.dra.pod_requests(pod).requests, what="claim seen")
    ext.post("/filter", args(pod, ["n1", "n2"]))
    assert ext.runtime.extender.wait_learned()
    assert ext.post("/filter", args(pod, ["n2", "n1"])).json()["NodeNames"] == ["n1"]


def test_scores_prefer_the_node_that_keeps_gpus_whole(cluster, resource):
    read_json(resource.create_namespaced_resource_claim("default", a_claim("want"), _preload_content=False))
    wait_until(lambda: cluster.runtime.dra.pod_requests(a_pod("p", ["want"])).requests, what="claim seen")
    pod = a_pod("p", ["want"])
    filtered = cluster.post("/filter", args(pod, ["n1", "n2"])).json()
    assert sorted(filtered["NodeNames"]) == ["n1", "n2"] and not filtered["Error"]
    assert cluster.runtime.extender.wait_learned()  # the policy learned the workload from the pod
    scores = {h["Host"]: h["Score"] for h in cluster.post("/prioritize", args(pod, ["n2", "n1"])).json()}
    assert scores == {"n1": 10, "n2": 0}


def test_a_claim_from_a_template_is_read_through_the_pod_status(cluster, resource):
    read_json(resource.create_namespaced_resource_claim("default", a_claim("p-gpu-x1"), _preload_content=False))
    pod = a_pod("p", generated=[("gpu", "p-gpu-x1")])
    wait_until(lambda: cluster.runtime.dra.pod_requests(pod).requests, what="claim seen")
    cluster.post("/filter", args(pod, ["n1", "n2"]))
    assert cluster.runtime.extender.wait_learned()
    scores = {h["Host"]: h["Score"] for h in cluster.post("/prioritize", args(pod, ["n1", "n2"])).json()}
    assert scores == {"n1": 10, "n2": 0}
    # a pod claim whose claim is not created yet: nothing to decide, every node passes
    early = a_pod("q", generated=[("gpu", "")])
    early["status"] = {}
    assert sorted(cluster.post("/filter", args(early, ["n1", "n2"])).json()["NodeNames"]) == ["n1", "n2"]


def test_nodes_that_cannot_hold_the_claim_are_filtered_with_the_reason(cluster, resource):
    allocate(resource, "big", "n2", "gpu-0", "40Gi", "10")
    allocate(resource, "big2", "n2", "gpu-1", "35Gi", "10")
    view_shows(cluster, {"n1": [(10240, 60), (0, 0)], "n2": [(40960, 10), (35840, 10)]})
    read_json(resource.create_namespaced_resource_claim("default", a_claim("want"), _preload_content=False))
    pod = a_pod("p", ["want"])
    wait_until(lambda: cluster.runtime.dra.pod_requests(pod).requests, what="claim seen")
    result = cluster.post("/filter", args(pod, ["n1", "n2", "n9"])).json()
    assert result["NodeNames"] == ["n1"]
    assert "insufficient memory" in result["FailedNodes"]["n2"]
    assert result["FailedAndUnresolvableNodes"] == {"n9": NO_SLICES}


def test_a_malformed_slice_skips_its_node_only(cluster, resource):
    read_json(resource.create_resource_slice(a_slice("n3", memory="lots"), _preload_content=False))
    read_json(resource.create_namespaced_resource_claim("default", a_claim("want"), _preload_content=False))
    pod = a_pod("p", ["want"])
    wait_until(lambda: "n3" in cluster.runtime.dra.states(), what="n3 seen")
    wait_until(lambda: cluster.runtime.dra.pod_requests(pod).requests, what="claim seen")
    result = cluster.post("/filter", args(pod, ["n1", "n2", "n3"])).json()
    assert cluster.runtime.extender.wait_learned()
    assert sorted(result["NodeNames"]) == ["n1", "n2"]
    reason = result["FailedAndUnresolvableNodes"]["n3"]
    assert "malformed" in reason and "n3" in reason and "memory" in reason
    scores = {h["Host"]: h["Score"] for h in cluster.post("/prioritize", args(pod, ["n1", "n2", "n3"])).json()}
    assert scores == {"n1": 10, "n2": 0, "n3": 0}


def test_a_malformed_claim_skips_the_node_it_is_allocated_on_only(cluster, resource):
    allocate(resource, "odd", "n2", "gpu-1", "a lot", "10")
    read_json(resource.create_namespaced_resource_claim("default", a_claim("want"), _preload_content=False))
    pod = a_pod("p", ["want"])
    wait_until(lambda: cluster.runtime.dra.states()["n2"].error, what="n2 skipped")
    wait_until(lambda: cluster.runtime.dra.pod_requests(pod).requests, what="claim seen")
    result = cluster.post("/filter", args(pod, ["n1", "n2"])).json()
    assert result["NodeNames"] == ["n1"]
    reason = result["FailedAndUnresolvableNodes"]["n2"]
    assert reason.startswith("malformed DRA object: claim ") and "n2/gpu-1 consumed memory" in reason, reason


def test_pods_without_our_claims_get_neutral_answers(cluster, resource):
    read_json(resource.create_namespaced_resource_claim("default", a_claim("nic", device_class="nic.example.com"),
                                                        _preload_content=False))
    wait_until(lambda: "default/nic" in cluster.runtime.dra._claims, what="claim seen")
    for pod in (a_pod("plain"), a_pod("other", ["nic"])):
        filtered = cluster.post("/filter", args(pod, ["n1", "n2", "n9"])).json()
        assert filtered["NodeNames"] == ["n1", "n2", "n9"]
        assert not filtered["FailedNodes"] and not filtered["FailedAndUnresolvableNodes"] and not filtered["Error"]
        prio = cluster.post("/prioritize", orjson.dumps(args(pod, ["n1", "n2"]))).json()
        assert prio == [{"Host": "n1", "Score": 0}, {"Host": "n2", "Score": 0}]


def test_a_deleted_slice_takes_its_node_out_and_a_deleted_claim_frees_its_share(cluster, resource):
    resource.delete_resource_slice("n2-gpus", _preload_content=False)
    resource.delete_namespaced_resource_claim("held", "default", _preload_content=False)

    def gone():
        states = cluster.runtime.dra.states()
        return states["n2"].error == NO_SLICES and states["n1"].usage[0].memory == 0

    wait_until(gone, what="slice and claim gone")
    read_json(resource.create_namespaced_resource_claim("default", a_claim("want"), _preload_content=False))
    pod = a_pod("p", ["want"])
    wait_until(lambda: cluster.runtime.dra.pod_requests(pod).requests, what="claim seen")
    result = cluster.post("/filter", args(pod, ["n1", "n2"])).json()
    assert result["NodeNames"] == ["n1"] and result["FailedAndUnresolvableNodes"] == {"n2": NO_SLICES}


def test_a_request_without_capacities_takes_the_plugins_defaults_a_whole_card_and_no_cores(cluster, resource):
    body = a_claim("whole")
    del body["spec"]["devices"]["requests"][0]["exactly"]["capacity"]
    read_json(resource.create_namespaced_resource_claim("default", body, _preload_content=False))
    pod = a_pod("p", ["whole"])
    (request,) = wait_until(lambda: cluster.runtime.dra.pod_requests(pod).requests, what="claim seen")
    assert (request.memory, request.memory_percent, request.cores, request.count) == (0, 100, 0, 1)
    allocate(resource, "small", "n1", "gpu-1", "1Gi", "5")  # now no GPU of n1 has a whole card free
    view_shows(cluster, {"n1": [(10240, 60), (1024, 5)], "n2": [(0, 0), (0, 0)]})
    result = cluster.post("/filter", args(pod, ["n1", "n2"])).json()
    assert result["NodeNames"] == ["n2"] and "insufficient memory" in result["FailedNodes"]["n1"]


def a_limits_pod(name, limits):
    """A pod asking our extended resources in resources.limits (no claims)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulerName": "vgpu-scheduler",
                     "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}]}}


def test_whole_gpus_in_limits_pass_dra_nodes_and_shares_are_told_to_use_a_claim(cluster):
    whole = a_limits_pod("whole", {"volcano.sh/vgpu-number": "1"})
    result = cluster.post("/filter", args(whole, ["n1", "n2"])).json()
    assert sorted(result["NodeNames"]) == ["n1", "n2"] and not result["Error"], result
    two = a_limits_pod("two", {"volcano.sh/vgpu-number": "2"})  # n1 has one whole GPU left
    result = cluster.post("/filter", args(two, ["n1", "n2"])).json()
    assert result["NodeNames"] == ["n2"] and "n1" in result["FailedNodes"], result
    share = a_limits_pod("share", {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "1024"})
    result = cluster.post("/filter", args(share, ["n1", "n2", "n9"])).json()
    assert result["NodeNames"] == []
    assert set(result["FailedNodes"]) == {"n1", "n2"}
    assert all("ResourceClaim" in reason for reason in result["FailedNodes"].values())
    assert "n9" in result["FailedAndUnresolvableNodes"]  # neither inventory nor slices


def test_bind_on_a_dra_node_carries_no_assignment(cluster, kube):
    core = k8s.CoreV1Api(kube.api)
    created = read_json(core.create_namespaced_pod("default", a_limits_pod("whole", {"volcano.sh/vgpu-number": "1"}),
                                                   _preload_content=False))
    uid = created["metadata"]["uid"]
    wait_until(lambda: cluster.runtime.extender.lookup("default", "whole"), what="pod seen")
    body = {"PodName": "whole", "PodNamespace": "default", "PodUID": uid, "Node": "n2"}
    assert cluster.post("/bind", body).json() == {"Error": ""}
    pod = read_json(core.read_namespaced_pod("whole", "default", _preload_content=False))
    assert pod["spec"]["nodeName"] == "n2"
    assert not any(k.startswith("volcano.sh/") for k in (pod["metadata"].get("annotations") or {}))
    assert uid not in cluster.runtime.extender.ledger.charges  # the claim holds the GPU, not the ledger
    share = read_json(core.create_namespaced_pod(
        "default", a_limits_pod("share", {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "1024"}),
        _preload_content=False))
    wait_until(lambda: cluster.runtime.extender.lookup("default", "share"), what="pod seen")
    body = {"PodName": "share", "PodNamespace": "default", "PodUID": share["metadata"]["uid"], "Node": "n2"}
    assert "ResourceClaim" in cluster.post("/bind", body).json()["Error"]


def test_a_claim_the_allocator_places_only_by_moving_an_earlier_request_passes(cluster, resource):
    # n2: gpu-0 empty, gpu-1 with 15 GiB held. Request a (20 GiB) taking gpu-0 first leaves b (40 GiB) nowhere;
    # Kubernetes' allocator backtracks (a on gpu-1, b on gpu-0), so the extender must not refuse n2
    allocate(resource, "held2", "n2", "gpu-1", "15Gi", "0")
    view_shows(cluster, {"n1": [(10240, 60), (0, 0)], "n2": [(0, 0), (15360, 0)]})
    requests = [{"name": name, "exactly": {"deviceClassName": DEVICE_CLASS,
                                           "capacity": {"requests": {"memory": memory, "cores": "0"}}}}
                for name, memory in (("a", "20Gi"), ("b", "40Gi"))]
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "two"},
             "spec": {"devices": {"requests": requests}}}
    read_json(resource.create_namespaced_resource_claim("default", claim, _preload_content=False))
    pod = a_pod("p2", ["two"])
    wait_until(lambda: cluster.runtime.dra.pod_requests(pod).requests, what="claim seen")
    result = cluster.post("/filter", args(pod, ["n2"])).json()
    assert result["NodeNames"] == ["n2"], result


def test_what_the_view_kept_of_a_pod_goes_with_the_pod(cluster, resource, kube):
    """The DRA view marks a pod it has learned from; the pod's deletion event takes the mark away, so nothing is kept
    per pod once it is gone (before: marks stayed for up to 100,000 pods)."""
    read_json(resource.create_namespaced_resource_claim("default", a_claim("want"), _preload_content=False))
    created = kube.create_pod(a_pod("p", ["want"]))
    pod = {**a_pod("p", ["want"]), "metadata": created["metadata"]}
    wait_until(lambda: cluster.runtime.dra.pod_requests(pod).requests, what="claim seen")
    cluster.post("/filter", args(pod, ["n1", "n2"]))
    seen = cluster.runtime.dra._seen
    assert created["metadata"]["uid"] in seen
    kube.core.delete_namespaced_pod("p", "default")
    wait_until(lambda: created["metadata"]["uid"] not in seen, what="the pod's mark gone")
