"""DRA mode: a claim keeps its GPUs on one NVLink island with a `matchAttribute` constraint on the attribute our
plugin publishes.

One node of four A100-80GB in two NVLink islands (`4xA100-80GB@nvlink2`: GPUs 0-1 and 2-3), discovered through the
simulated NVML by `vgpu dra-plugin`, which publishes `nvlinkIsland` on each device of its ResourceSlice; the
kube-scheduler stand-in allocates claims as upstream's structured allocator does (first fit, constraints). A first
pod takes 60Gi of GPU 0. A pod asking two GPUs of 40Gi each then gets GPUs 2 and 3 when its claim says
`matchAttribute: gpu.vgpu-sharing.io/nvlinkIsland`; without the constraint the allocator's first fit gives it GPUs 1
and 2, across the islands.
"""

from __future__ import annotations

import pytest
from e2e_helpers import phase, wait_until

from vgpu.dra import DEVICE_CLASS, DRIVER

pytestmark = pytest.mark.slow
NS = "e2e"
WORKLOAD = ["python3", "-m", "vgpu.testbed.workload"]
ISLAND = f"{DRIVER}/nvlinkIsland"


def _template(name: str, count: int, memory: str, constrained: bool = False) -> dict:
    spec: dict = {"requests": [{"name": "gpus", "exactly": {
        "deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount", "count": count,
        "capacity": {"requests": {"memory": memory}}}}]}
    if constrained:
        spec["constraints"] = [{"requests": ["gpus"], "matchAttribute": ISLAND}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NS}, "spec": {"spec": {"devices": spec}}}


def _pod(name: str, template: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"schedulerName": "vgpu-scheduler", "restartPolicy": "Never",
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "main", "image": "sample",
                                     "command": WORKLOAD + ["--mib", "100", "--hold", "600"],
                                     "resources": {"claims": [{"name": "gpu"}],
                                                   "requests": {"cpu": "100m", "memory": "64Mi"}}}]}}


@pytest.fixture(scope="module")
def cluster(make_cluster):
    from vgpu.testbed.demo_dra import device_classes

    cluster = make_cluster(nodes=1, gpus="4xA100-80GB@nvlink2", dra=True)
    for body in device_classes():
        cluster.api_post("/apis/resource.k8s.io/v1/deviceclasses", body)
    for body in (_template("first", 1, "60Gi"), _template("pair", 2, "40Gi"),
                 _template("island-pair", 2, "40Gi", constrained=True)):
        cluster.api_post(f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates", body)
    return cluster


def _devices(cluster, pod_name: str) -> list[str]:
    """The devices allocated to the pod's claim, once it runs."""
    wait_until(f"{pod_name} running", lambda: any(
        p["metadata"]["name"] == pod_name and phase(p) == "Running" for p in cluster.pods()), 120)
    for claim in cluster.resource_get("resourceclaims", NS):
        if pod_name in {o.get("name") for o in claim["metadata"].get("ownerReferences") or ()}:
            return sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"])
    raise AssertionError(f"no claim of {pod_name}")


def _islands(cluster) -> dict[str, int]:
    (ours,) = [s for s in cluster.resource_get("resourceslices") if s["spec"]["driver"] == DRIVER]
    return {d["name"]: d["attributes"]["nvlinkIsland"]["int"] for d in ours["spec"]["devices"]}


def test_a_match_attribute_constraint_keeps_a_claim_on_one_island(cluster, request):
    request.node._e2e_cluster = cluster
    islands = _islands(cluster)
    assert sorted(islands.values()) == [0, 0, 2, 2], islands
    cluster.create_pod(_pod("first", "first"))
    (first,) = _devices(cluster, "first")
    assert islands[first] == 0
    cluster.create_pod(_pod("linked", "island-pair"))
    linked = _devices(cluster, "linked")
    assert {islands[d] for d in linked} == {2}, (linked, islands)
    cluster.create_pod(_pod("unconstrained", "pair"))
    loose = _devices(cluster, "unconstrained")
    assert len({islands[d] for d in loose}) == 2, (loose, islands)  # first fit: one GPU of each island
