"""The kube-scheduler stand-in's DRA side (DynamicResources plugin + resourceclaim controller) against the API-server
stand-in over HTTP: structured-parameters allocation (first fit, backtracking, selectors, constraints, consumable
capacity with requestPolicy rounding), claims from templates, the extended-resource claim (KEP-5004), PreBind's
writes, FailedScheduling texts, release of claims when pods end, and the allocator release chosen with
`kubernetes_version` / `--kubernetes-version`."""

from __future__ import annotations

from typing import Any

import pytest
from sched_dra_helpers import CONFIG, DRIVER, MEMORY_POLICY, Cluster, cluster, device, exactly, wait

from vgpu.testbed import scheduler_driver
from vgpu.testbed.claim_controller import generate_name
from vgpu.testbed.dra_allocator import parse_kubernetes_version
from vgpu.testbed.scheduler_driver import SchedulerDriver, parse_scheduler_config

__all__ = ["cluster"]  # the fixture, imported from the helpers

# DynamicResources' refusals are UnschedulableAndUnresolvable, so DefaultPreemption (on, as in kube-scheduler's
# default profile) tries no node and says so after the filters' reasons
NOT_HELPFUL = " preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
CANNOT_ALLOCATE = "0/1 nodes are available: 1 cannot allocate all claims." + NOT_HELPFUL


def _results(claim: dict | None) -> list[dict]:
    assert claim is not None
    return claim["status"]["allocation"]["devices"]["results"]


def _allocated(env: Cluster, name: str) -> dict:
    return wait(lambda: (c := env.get_claim(name)) and (c.get("status") or {}).get("allocation") and c,
                what=f"claim {name} allocated")


def test_first_fit_in_slice_order_and_whole_devices(cluster: Cluster) -> None:
    cluster.node("n1")
    cluster.slice("n1", [device(f"gpu-{i}", shared=False) for i in range(2)])
    cluster.device_class("gpu")
    for name in ("c1", "c2", "c3"):
        cluster.claim(name, [exactly("gpu")])
    cluster.start_scheduler()
    for i, name in enumerate(("p1", "p2")):
        cluster.pod(name, [{"name": "gpu", "resourceClaimName": f"c{i + 1}"}])
        assert cluster.bound(name)["spec"]["nodeName"] == "n1"
        result = _results(cluster.get_claim(f"c{i + 1}"))
        assert result == [{"request": "gpu", "driver": DRIVER, "pool": "n1", "device": f"gpu-{i}"}]
    cluster.pod("p3", [{"name": "gpu", "resourceClaimName": "c3"}])
    assert cluster.unschedulable("p3") == CANNOT_ALLOCATE
    assert not (cluster.get_claim("c3") or {}).get("status", {}).get("allocation")
    events = cluster.events("p3")
    assert events and events[0]["reason"] == "FailedScheduling" and events[0]["type"] == "Warning"


def test_prebind_writes_allocation_reservation_and_finalizer(cluster: Cluster) -> None:
    cluster.node("n1")
    cluster.node("n2")
    cluster.slice("n2", [device("gpu-0", memory_policy=MEMORY_POLICY)])
    cluster.device_class("gpu")
    cluster.claim("c", [exactly("gpu", capacity={"requests": {"memory": "4Gi"}})])
    cluster.start_scheduler()
    pod = cluster.pod("p", [{"name": "gpu", "resourceClaimName": "c"}])
    assert cluster.bound("p")["spec"]["nodeName"] == "n2"  # n1 has no slice
    claim = cluster.get_claim("c")
    assert claim is not None
    allocation = claim["status"]["allocation"]
    assert allocation["nodeSelector"] == {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}
    assert allocation["allocationTimestamp"].endswith("Z")
    assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": "p", "uid": pod["metadata"]["uid"]}]
    assert "resource.kubernetes.io/delete-protection" in claim["metadata"]["finalizers"]
    (result,) = allocation["devices"]["results"]
    assert result["shareID"] and result["consumedCapacity"] == {"memory": "4Gi", "cores": "0"}


@pytest.mark.parametrize("policy,request_memory,consumed", [
    (MEMORY_POLICY, "1500Mi", "2Gi"),  # validRange: min + k * step, rounded up
    (MEMORY_POLICY, "100Mi", "1Gi"),  # below min: min
    ({"default": "8Gi", "validValues": ["8Gi", "16Gi", "40Gi"]}, "9Gi", "16Gi"),  # the next valid value
    ({"default": "8Gi", "validValues": ["8Gi", "16Gi", "40Gi"]}, None, "8Gi"),  # no amount asked: the default
    (None, None, "40Gi"),  # no policy, no amount: the whole capacity
])
def test_consumed_capacity_is_rounded_per_request_policy(cluster: Cluster, policy: dict | None,
                                                          request_memory: str | None, consumed: str) -> None:
    cluster.node("n1")
    cluster.slice("n1", [device("gpu-0", memory_policy=policy)])
    cluster.device_class("gpu")
    capacity = {"capacity": {"requests": {"memory": request_memory, "cores": "30"}}} if request_memory else {}
    cluster.claim("c", [exactly("gpu", **capacity)])
    cluster.start_scheduler()
    cluster.pod("p", [{"name": "gpu", "resourceClaimName": "c"}])
    cluster.bound("p")
    (result,) = _results(cluster.get_claim("c"))
    assert result["consumedCapacity"]["memory"] == consumed
    assert result["consumedCapacity"]["cores"] == ("30" if request_memory else "0")


def test_claims_share_a_device_within_its_capacity_then_wait(cluster: Cluster) -> None:
    cluster.node("n1")
    cluster.slice("n1", [device("gpu-0", memory="10Gi", memory_policy=MEMORY_POLICY)])
    cluster.device_class("gpu")
    for name in ("a", "b", "c"):
        cluster.claim(name, [exactly("gpu", capacity={"requests": {"memory": "4Gi", "cores": "40"}})])
    cluster.start_scheduler()
    for name in ("a", "b"):
        cluster.pod(f"p-{name}", [{"name": "gpu", "resourceClaimName": name}])
        cluster.bound(f"p-{name}")
    first, second = (_results(cluster.get_claim(n))[0] for n in ("a", "b"))
    assert first["device"] == second["device"] == "gpu-0"
    assert first["shareID"] != second["shareID"]
    cluster.pod("p-c", [{"name": "gpu", "resourceClaimName": "c"}])  # 12Gi > 10Gi
    assert cluster.unschedulable("p-c") == CANNOT_ALLOCATE
    assert cluster.drivers[0].pending_reasons()["default/p-c"] == \
        CANNOT_ALLOCATE


def test_shared_claim_pins_its_node_and_reserves_for_each_pod(cluster: Cluster) -> None:
    for node in ("n1", "n2"):
        cluster.node(node)
        cluster.slice(node, [device("gpu-0")])
    cluster.device_class("gpu")
    cluster.claim("shared", [exactly("gpu", capacity={"requests": {"memory": "1Gi"}})])
    cluster.start_scheduler()
    cluster.pod("p1", [{"name": "gpu", "resourceClaimName": "shared"}])
    node = cluster.bound("p1")["spec"]["nodeName"]
    cluster.pod("p2", [{"name": "gpu", "resourceClaimName": "shared"}])
    assert cluster.bound("p2")["spec"]["nodeName"] == node
    claim = cluster.get_claim("shared")
    assert claim is not None
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["p1", "p2"]
    assert len(_results(claim)) == 1  # allocated once
    other = "n2" if node == "n1" else "n1"
    cluster.pod("p3", [{"name": "gpu", "resourceClaimName": "shared"}], node_selector={"name": other})
    message = cluster.unschedulable("p3")
    assert message.startswith("0/2 nodes are available: ")
    assert "1 node(s) didn't match Pod's node affinity/selector" in message
    assert "1 resourceclaim not available on the node" in message


def test_count_two_with_match_attribute_backtracks(cluster: Cluster) -> None:
    cluster.node("n1")
    cluster.slice("n1", [device("gpu-0", model="A100", shared=False), device("gpu-1", model="H100", shared=False),
                         device("gpu-2", model="H100", shared=False)])
    cluster.device_class("gpu")
    cluster.claim("pair", [exactly("gpu", allocationMode="ExactCount", count=2)],
                  constraints=[{"requests": ["gpu"], "matchAttribute": f"{DRIVER}/model"}])
    cluster.start_scheduler()
    cluster.pod("p", [{"name": "gpu", "resourceClaimName": "pair"}])
    cluster.bound("p")
    assert [r["device"] for r in _results(cluster.get_claim("pair"))] == ["gpu-1", "gpu-2"]


@pytest.mark.parametrize("version", ["1.35", "1.36"])
def test_count_two_on_one_shared_device_follows_the_chosen_release(cluster: Cluster, version: str) -> None:
    """SchedulerDriver(kubernetes_version=...) reaches the allocator: one request with count 2 and a single shared
    device binds on 1.35 (the device twice: k8s.io/dynamic-resource-allocation v0.35.0
    structured/internal/experimental/allocator_experimental.go `allocateDevice`) and stays pending on 1.36 (distinct
    devices per request: v0.36.0 structured/internal/incubating/allocator_incubating.go `allocateOne`,
    `startLocation`)."""
    cluster.node("n1")
    cluster.slice("n1", [device("gpu-0", memory_policy=MEMORY_POLICY)])
    cluster.device_class("gpu")
    cluster.claim("pair", [exactly("gpu", count=2, capacity={"requests": {"memory": "4Gi"}})])
    driver = SchedulerDriver(parse_scheduler_config(CONFIG), cluster.kubeconfig, seed=1, unschedulable_flush=30.0,
                             kubernetes_version=parse_kubernetes_version(version))
    cluster.drivers.append(driver.start())
    cluster.pod("p", [{"name": "gpu", "resourceClaimName": "pair"}])
    if version == "1.35":
        cluster.bound("p")
        results = _results(cluster.get_claim("pair"))
        assert [(r["device"], r["consumedCapacity"]["memory"]) for r in results] == [("gpu-0", "4Gi")] * 2
        assert results[0]["shareID"] != results[1]["shareID"]
    else:
        assert cluster.unschedulable("p") == CANNOT_ALLOCATE


def test_the_driver_takes_the_kubernetes_version_flag(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`--kubernetes-version` reaches SchedulerDriver (default 1.36); a release the stand-in does not model is a
    usage error."""
    seen: list[Any] = []

    class Stub:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            seen.append(kwargs["kubernetes_version"])

        def start(self) -> None:
            raise RuntimeError("not started in this test")

    monkeypatch.setattr(scheduler_driver, "SchedulerDriver", Stub)
    monkeypatch.setattr(scheduler_driver.signal, "signal", lambda *args: None)
    base = ["--builtin-config", "--kubeconfig", "unused"]
    assert scheduler_driver.main([*base, "--kubernetes-version", "1.35"]) == 1
    assert scheduler_driver.main(base) == 1
    assert seen == [(1, 35), (1, 36)]
    with pytest.raises(SystemExit) as exit_info:
        scheduler_driver.main([*base, "--kubernetes-version", "1.33"])
    assert exit_info.value.code == 2
    assert "the allocator stand-in models 1.34, 1.35, 1.36" in capsys.readouterr().err


def test_all_mode_takes_every_matching_device(cluster: Cluster) -> None:
    cluster.node("n1")
    cluster.slice("n1", [device(f"gpu-{i}", shared=False) for i in range(3)])
    cluster.device_class("gpu")
    cluster.claim("all", [exactly("gpu", allocationMode="All")])
    cluster.claim("one", [exactly("gpu")])
    cluster.start_scheduler()
    cluster.pod("p", [{"name": "gpu", "resourceClaimName": "all"}])
    cluster.bound("p")
    assert [r["device"] for r in _results(cluster.get_claim("all"))] == ["gpu-0", "gpu-1", "gpu-2"]
    cluster.pod("q", [{"name": "gpu", "resourceClaimName": "one"}])
    assert cluster.unschedulable("q") == CANNOT_ALLOCATE


def test_device_class_and_request_selectors_exclude_devices(cluster: Cluster) -> None:
    cluster.node("n1")
    cluster.slice("n1", [device("gpu-0", model="A100", memory="40Gi"), device("gpu-1", model="H100", memory="40Gi"),
                         device("gpu-2", model="H100", memory="80Gi")])
    cluster.device_class("h100", [f'device.driver == "{DRIVER}"', f'device.attributes["{DRIVER}"].model == "H100"'])
    cluster.claim("big", [exactly("h100", selectors=[
        {"cel": {"expression": f'device.capacity["{DRIVER}"].memory.compareTo(quantity("64Gi")) >= 0'}}])])
    cluster.claim("any", [exactly("h100")])
    cluster.start_scheduler()
    cluster.pod("p-big", [{"name": "gpu", "resourceClaimName": "big"}])
    cluster.bound("p-big")
    assert _results(cluster.get_claim("big"))[0]["device"] == "gpu-2"
    cluster.pod("p-any", [{"name": "gpu", "resourceClaimName": "any"}])
    cluster.bound("p-any")
    assert _results(cluster.get_claim("any"))[0]["device"] == "gpu-1"  # gpu-0 is not an H100


def test_a_broken_selector_fails_the_cycle_and_allocates_nothing(cluster: Cluster) -> None:
    cluster.node("n1")
    cluster.slice("n1", [device("gpu-0")])
    cluster.device_class("broken", ["device.attributes[ == 1"])
    cluster.claim("c", [exactly("broken")])
    cluster.start_scheduler()
    cluster.pod("p", [{"name": "gpu", "resourceClaimName": "c"}])
    message = cluster.unschedulable("p")
    assert "class broken: selector #0: CEL compile error" in message
    assert not (cluster.get_claim("c") or {}).get("status", {}).get("allocation")


def test_missing_device_class_keeps_the_pod_pending(cluster: Cluster) -> None:
    cluster.node("n1")
    cluster.slice("n1", [device("gpu-0")])
    cluster.claim("c", [exactly("nope")])
    cluster.start_scheduler()
    cluster.pod("p", [{"name": "gpu", "resourceClaimName": "c"}])
    assert cluster.unschedulable("p") == (
        "0/1 nodes are available: request gpu: device class nope does not exist." + NOT_HELPFUL)
    cluster.device_class("nope")  # a class event retries the pod
    cluster.bound("p")


def test_template_claim_is_created_allocated_and_the_pod_bound(cluster: Cluster) -> None:
    cluster.node("n1")
    cluster.slice("n1", [device("gpu-0", memory_policy=MEMORY_POLICY)])
    cluster.device_class("gpu")
    cluster.template("half", [exactly("gpu", capacity={"requests": {"memory": "20Gi"}})])
    cluster.start_scheduler()
    pod = cluster.pod("trainer", [{"name": "gpus", "resourceClaimTemplateName": "half"}])
    bound = cluster.bound("trainer")
    (status,) = bound["status"]["resourceClaimStatuses"]
    assert status["name"] == "gpus" and status["resourceClaimName"].startswith("trainer-gpus-")
    claim = cluster.get_claim(status["resourceClaimName"])
    assert claim is not None
    assert claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpus"
    assert claim["metadata"]["labels"] == {"made-from": "half"}
    assert claim["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "trainer",
                                                     "uid": pod["metadata"]["uid"], "controller": True,
                                                     "blockOwnerDeletion": True}]
    assert _results(claim)[0]["consumedCapacity"]["memory"] == "20Gi"
    assert claim["status"]["reservedFor"][0]["uid"] == pod["metadata"]["uid"]


def test_template_pod_waits_for_its_template(cluster: Cluster) -> None:
    cluster.node("n1")
    cluster.slice("n1", [device("gpu-0")])
    cluster.device_class("gpu")
    driver = cluster.start_scheduler(flush=1.0)
    cluster.pod("early", [{"name": "gpus", "resourceClaimTemplateName": "later"}])
    wait(lambda: driver.pending_reasons().get("default/early") ==
         'pod "default/early": ResourceClaim not created yet', what="the pod waiting for its claim")
    assert cluster.claims() == [] and cluster.events("early") == []  # PreEnqueue: no event
    cluster.template("later", [exactly("gpu")])  # the controller retries with backoff and finds it
    cluster.bound("early")


def test_generated_claim_names_shorten_both_parts() -> None:
    assert generate_name("web", "gpu") == "web-gpu-"
    long = generate_name("p" * 60, "c" * 20)  # 81 characters: both cut to 57 * len / 81
    assert long == "p" * 42 + "-" + "c" * 14 + "-"


def test_extended_resource_is_served_by_a_special_claim(cluster: Cluster) -> None:
    cluster.node("n1")
    cluster.slice("n1", [device("gpu-0", shared=False), device("gpu-1", shared=False)])
    cluster.device_class("gpu", extendedResourceName="example.com/gpu")
    cluster.start_scheduler()
    pod = cluster.pod("legacy", limits={"example.com/gpu": "2"})
    assert cluster.bound("legacy")["spec"]["nodeName"] == "n1"
    status = wait(lambda: cluster.get_pod("legacy")["status"].get("extendedResourceClaimStatus"))
    claim = cluster.get_claim(status["resourceClaimName"])
    assert claim is not None and claim["metadata"]["name"].startswith("legacy-extended-resources-")
    assert claim["metadata"]["annotations"] == {"resource.kubernetes.io/extended-resource-claim": "true"}
    assert claim["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    # requests of the container: cpu, example.com/gpu -> the resource is request 1 of container 0
    assert claim["spec"]["devices"]["requests"] == [{"name": "container-0-request-1", "exactly": {
        "deviceClassName": "gpu", "allocationMode": "ExactCount", "count": 2}}]
    assert status["requestMappings"] == [{"containerName": "main", "resourceName": "example.com/gpu",
                                          "requestName": "container-0-request-1"}]
    assert [r["device"] for r in _results(claim)] == ["gpu-0", "gpu-1"]
    assert claim["status"]["reservedFor"][0]["name"] == "legacy"


def test_extended_resource_on_an_advertising_node_keeps_the_device_plugin_path(cluster: Cluster) -> None:
    cluster.node("dp", allocatable={"example.com/gpu": "4"})
    cluster.node("dra")
    cluster.slice("dra", [device("gpu-0", shared=False)])
    cluster.device_class("gpu", extendedResourceName="example.com/gpu")
    cluster.start_scheduler()
    cluster.pod("on-dp", limits={"example.com/gpu": "3"}, node_selector={"name": "dp"})
    cluster.bound("on-dp")
    assert "extendedResourceClaimStatus" not in cluster.get_pod("on-dp")["status"]
    assert cluster.claims() == []
    cluster.pod("too-many", limits={"example.com/gpu": "2"}, node_selector={"name": "dp"})
    assert "1 Insufficient example.com/gpu" in cluster.unschedulable("too-many")


def test_release_frees_capacity_and_a_pending_pod_schedules(cluster: Cluster) -> None:
    cluster.node("n1")
    cluster.slice("n1", [device("gpu-0", memory="10Gi", memory_policy=MEMORY_POLICY)])
    cluster.device_class("gpu")
    cluster.template("six", [exactly("gpu", capacity={"requests": {"memory": "6Gi"}})])
    cluster.start_scheduler()
    cluster.pod("first", [{"name": "gpu", "resourceClaimTemplateName": "six"}])
    first_claim = cluster.bound("first")["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    cluster.pod("second", [{"name": "gpu", "resourceClaimTemplateName": "six"}])
    assert cluster.unschedulable("second") == CANNOT_ALLOCATE
    resp = cluster.http.delete("/api/v1/namespaces/default/pods/first")
    assert resp.status_code == 200, resp.text
    wait(lambda: cluster.get_claim(first_claim) is None, what="the generated claim deleted")
    second = cluster.bound("second")
    claim = _allocated(cluster, second["status"]["resourceClaimStatuses"][0]["resourceClaimName"])
    assert _results(claim)[0]["consumedCapacity"]["memory"] == "6Gi"


def test_a_finished_pod_releases_a_named_claim_which_is_deallocated(cluster: Cluster) -> None:
    cluster.node("n1")
    cluster.slice("n1", [device("gpu-0", shared=False)])
    cluster.device_class("gpu")
    cluster.claim("keep", [exactly("gpu")])
    cluster.claim("next", [exactly("gpu")])
    cluster.start_scheduler()
    cluster.pod("job", [{"name": "gpu", "resourceClaimName": "keep"}])
    cluster.bound("job")
    cluster.pod("after", [{"name": "gpu", "resourceClaimName": "next"}])
    cluster.unschedulable("after")
    resp = cluster.http.patch("/api/v1/namespaces/default/pods/job/status", json={"status": {"phase": "Succeeded"}},
                              headers={"Content-Type": "application/merge-patch+json"})
    assert resp.status_code == 200, resp.text
    # the allocation goes with a status write and the finalizer with a write of the object (two subresources, so two
    # writes, as kube-controller-manager's resourceclaim controller makes them): wait for both
    claim = wait(lambda: (c := cluster.get_claim("keep")) and not (c.get("status") or {}).get("allocation")
                 and "resource.kubernetes.io/delete-protection" not in (c["metadata"].get("finalizers") or []) and c,
                 what="the named claim deallocated and its finalizer removed")
    assert not claim["status"].get("reservedFor")
    cluster.bound("after")
    assert _results(cluster.get_claim("next"))[0]["device"] == "gpu-0"


def test_a_new_slice_retries_a_pending_pod(cluster: Cluster) -> None:
    cluster.node("n1")
    cluster.device_class("gpu")
    cluster.claim("c", [exactly("gpu")])
    cluster.start_scheduler()
    cluster.pod("p", [{"name": "gpu", "resourceClaimName": "c"}])
    assert cluster.unschedulable("p") == CANNOT_ALLOCATE
    cluster.slice("n1", [device("gpu-0", shared=False)])
    cluster.bound("p")


def test_first_available_takes_the_first_alternative_that_fits_on_an_all_nodes_pool(cluster: Cluster) -> None:
    cluster.node("n1")
    cluster.slice("fabric", [device("gpu-0", model="A100", shared=False)], allNodes=True)
    cluster.device_class("gpu")
    cluster.claim("c", [{"name": "gpu", "firstAvailable": [
        {"name": "h100", "deviceClassName": "gpu",
         "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].model == "H100"'}}]},
        {"name": "any", "deviceClassName": "gpu"},
    ]}])
    cluster.start_scheduler()
    cluster.pod("p", [{"name": "gpu", "resourceClaimName": "c"}])
    cluster.bound("p")
    claim = cluster.get_claim("c")
    assert _results(claim) == [{"request": "gpu/any", "driver": DRIVER, "pool": "fabric", "device": "gpu-0"}]
    assert claim is not None and "nodeSelector" not in claim["status"]["allocation"]  # usable on all nodes


def test_the_extended_resource_claim_goes_with_its_pod(cluster: Cluster) -> None:
    cluster.node("n1")
    cluster.slice("n1", [device("gpu-0", shared=False)])
    cluster.device_class("gpu", extendedResourceName="example.com/gpu")
    cluster.start_scheduler()
    cluster.pod("first", limits={"example.com/gpu": "1"})
    cluster.bound("first")
    name = wait(lambda: cluster.get_pod("first")["status"].get("extendedResourceClaimStatus"))["resourceClaimName"]
    cluster.pod("second", limits={"example.com/gpu": "1"})
    assert cluster.unschedulable("second") == CANNOT_ALLOCATE
    assert cluster.http.delete("/api/v1/namespaces/default/pods/first").status_code == 200
    wait(lambda: cluster.get_claim(name) is None, what="the extended resource claim deleted")
    cluster.bound("second")
