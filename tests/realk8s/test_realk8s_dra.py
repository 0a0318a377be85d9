"""DRA mode judged by the real Kubernetes: ResourceClaims from a template made by kube-controller-manager's claim
controller, allocated by upstream kube-scheduler's structured allocator on the ResourceSlices our `vgpu dra-plugin`
publishes (each GPU's memory and cores as consumable capacity), prepared by our plugin through upstream kubelet's
DRA manager, and applied to the container by containerd's CDI support."""

from __future__ import annotations

import pytest
from realk8s_helpers import WORKLOAD, create, gpu_pod, phase, report, wait_finished

from vgpu.dra import DEVICE_CLASS, DRIVER

pytestmark = [pytest.mark.realk8s, pytest.mark.slow]


def _template(name: str, memory: str, cores: str) -> dict:
    request = {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS, "count": 1,
                                          "capacity": {"requests": {"memory": memory, "cores": cores}}}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"spec": {"devices": {"requests": [request]}}}}


def _claim_pod(name: str, template: str, args: list[str]) -> dict:
    container = {"name": "main", "command": [*WORKLOAD, *args],
                 "resources": {"claims": [{"name": "gpu"}], "requests": {"cpu": "10m", "memory": "32Mi"}}}
    body = gpu_pod(name, [container])
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    return body


def _allocated_claim(cluster, pod: str) -> dict | None:
    for claim in cluster.get("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims")["items"]:
        owned = any(o["name"] == pod for o in claim["metadata"].get("ownerReferences", []))
        if owned and (claim.get("status") or {}).get("allocation"):
            return claim
    return None


@pytest.fixture(scope="module")
def cluster(make_real_cluster):
    cluster = make_real_cluster(nodes=1, gpus="2xA100-40GB", dra=True)
    cluster.post("/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates", _template("share", "4Gi", "30"))
    return cluster


def test_our_slices_are_published_with_consumable_capacity(cluster):
    slices = [s for s in cluster.get("/apis/resource.k8s.io/v1/resourceslices")["items"]
              if s["spec"]["driver"] == DRIVER]
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    assert len(devices) == 2
    for device in devices:
        assert device["allowMultipleAllocations"] is True
        assert set(device["capacity"]) >= {"memory", "cores"}


def test_a_claim_allocated_by_kube_scheduler_limits_its_container_through_cdi(cluster):
    """The real allocator takes 4Gi and 30 cores of one GPU for the claim; the plugin's CDI spec, applied by
    containerd, gives the container that much memory: 5 GiB in 1 GiB steps is refused at the fifth."""
    create(cluster, _claim_pod("claimer", "share", ["--mib", "5120", "--chunk", "1024", "--expect-oom",
                                                    "--hold", "6"]))
    # the claim made from the template lives as long as the pod runs (the claim controller deletes it after)
    claim = cluster.wait("the pod's claim allocated", lambda: _allocated_claim(cluster, "claimer"), 150)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == DRIVER
    assert result["consumedCapacity"] == {"memory": "4Gi", "cores": "30"}
    done = wait_finished(cluster, "claimer", timeout=150)
    assert phase(done) == "Succeeded", cluster.events("default", "claimer")
    seen = report(cluster, "claimer", "main")
    assert seen["result"] == "oom-refused"
    (device,) = seen["devices"]
    assert device["total_mib"] == 4096 and device["allocated_mib"] == 4096 and device["oom_at_mib"] == 5120
