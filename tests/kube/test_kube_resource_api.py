"""The API-server stand-in serves `resource.k8s.io/v1` (DRA) through the real `kubernetes` client's ResourceV1Api
and kubectl: ResourceSlices by node and driver, claims whose allocation is written through the status
subresource, templates and device classes, each refused with 422 naming the field where kube-apiserver would."""

from __future__ import annotations

import subprocess

import httpx
import pytest
from capabilities import tool
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from vgpu.kube.client import read_json

DRIVER = "gpu.vgpu-sharing.io"


def a_slice(node: str, gpus: int = 2, **spec: object) -> dict:
    devices = [{"name": f"gpu-{i}", "attributes": {"model": {"string": "A100"}, "index": {"int": i}},
                "capacity": {"memory": {"value": "40960", "requestPolicy": {"default": "1024",
                                                                           "validRange": {"min": "1", "step": "1"}}},
                             "cores": {"value": "100"}},
                "allowMultipleAllocations": True} for i in range(gpus)]
    body = {"driver": DRIVER, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "nodeName": node,
            "devices": devices}
    body.update(spec)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpus"},
            "spec": body}


def a_claim(name: str, **request: object) -> dict:
    exactly = {"deviceClassName": "vgpu.vgpu-sharing.io", "capacity": {"requests": {"memory": "10Gi"}}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly, **request}]}}}


@pytest.fixture
def resource(api) -> k8s.ResourceV1Api:
    return k8s.ResourceV1Api(api)


def _invalid(call, field: str) -> None:
    """A typed client call answered 422 naming `field`."""
    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status == 422, err.value.body
    assert field in err.value.body, err.value.body


def test_slices_are_listed_by_node_and_driver(resource):
    for node in ("n1", "n2"):
        read_json(resource.create_resource_slice(a_slice(node), _preload_content=False))
    mine = read_json(resource.list_resource_slice(field_selector="spec.nodeName=n2", _preload_content=False))
    assert [s["metadata"]["name"] for s in mine["items"]] == ["n2-gpus"]
    ours = read_json(resource.list_resource_slice(field_selector=f"spec.driver={DRIVER}", _preload_content=False))
    assert len(ours["items"]) == 2
    # the typed client reads it back (its models accept what we serve)
    typed = resource.read_resource_slice("n1-gpus")
    assert typed.spec.devices[1].capacity["memory"].value == "40960" and typed.spec.pool.generation == 1


@pytest.mark.parametrize("change,field", [
    ({"driver": ""}, "spec.driver"),
    ({"pool": {"name": "n1", "generation": 1, "resourceSliceCount": 0}}, "spec.pool.resourceSliceCount"),
    ({"allNodes": True}, "exactly one of nodeName"),
    ({"devices": [{"name": "a"}, {"name": "a"}]}, "spec.devices[1].name"),
    ({"devices": [{"name": "a", "capacity": {"memory": {}}}]}, "spec.devices[0].capacity[memory].value"),
])
def test_a_malformed_slice_is_refused_naming_the_field(apiserver, resource, change, field):
    _refused(apiserver, "resourceslices", a_slice("n1", **change), field)
    assert read_json(resource.list_resource_slice(_preload_content=False))["items"] == []


def test_a_claim_is_allocated_through_its_status_only(resource):
    body = a_claim("share")
    body["status"] = {"allocation": {"devices": {"results": []}}}  # a client cannot create it allocated
    created = read_json(resource.create_namespaced_resource_claim("default", body, _preload_content=False))
    assert "status" not in created or not created["status"].get("allocation")
    result = {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0", "shareID": "0b6c5f2e",
              "consumedCapacity": {"memory": "10Gi", "cores": "30"}}
    status = {"status": {"allocation": {"devices": {"results": [result]}}}}
    read_json(resource.patch_namespaced_resource_claim_status("share", "default", status, _preload_content=False))
    claim = resource.read_namespaced_resource_claim("share", "default")
    assert claim.status.allocation.devices.results[0].consumed_capacity == {"memory": "10Gi", "cores": "30"}
    assert claim.status.allocation.devices.results[0].share_id == "0b6c5f2e"
    # the spec is immutable
    _invalid(lambda: resource.patch_namespaced_resource_claim(
        "share", "default", {"spec": {"devices": {"requests": [{"name": "other", "exactly": {
            "deviceClassName": "x"}}]}}}, _preload_content=False), "immutable")


def _refused(apiserver, path: str, body: dict, field: str) -> None:
    """POST over raw HTTP (the typed client refuses some of these shapes itself before sending): 422 naming `field`."""
    r = httpx.post(f"{apiserver.url}/apis/resource.k8s.io/v1/{path}", json=body)
    assert r.status_code == 422 and field in r.text, r.text


@pytest.mark.parametrize("request_fields,field", [
    ({"name": ""}, "spec.devices.requests[0].name"),
    ({"firstAvailable": [{"name": "a", "deviceClassName": "a"}]}, "exactly one of exactly, firstAvailable"),
    ({"exactly": {"count": 1}}, "spec.devices.requests[0].exactly.deviceClassName"),
])
def test_a_malformed_claim_or_template_is_refused(apiserver, request_fields, field):
    claim = {**a_claim("bad"), "spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "c"}, **request_fields}]}}}
    _refused(apiserver, "namespaces/default/resourceclaims", claim, field)
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "bad"},
                "spec": {"spec": claim["spec"]}}
    _refused(apiserver, "namespaces/default/resourceclaimtemplates", template,
             "spec." + field if field.startswith("spec.") else field)


def test_first_available_alternatives_are_named(apiserver, resource):
    claim = {**a_claim("alt"), "spec": {"devices": {"requests": [
        {"name": "gpu", "firstAvailable": [{"name": "big", "deviceClassName": "c"}, {"deviceClassName": "c"}]}]}}}
    _refused(apiserver, "namespaces/default/resourceclaims", claim, "spec.devices.requests[0].firstAvailable[1].name")
    claim["spec"]["devices"]["requests"][0]["firstAvailable"][1]["name"] = "small"
    created = read_json(resource.create_namespaced_resource_claim("default", claim, _preload_content=False))
    assert [a["name"] for a in created["spec"]["devices"]["requests"][0]["firstAvailable"]] == ["big", "small"]


def test_device_classes_need_cel_expressions(apiserver, resource):
    good = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "vgpu.vgpu-sharing.io"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
                     "extendedResourceName": "volcano.sh/vgpu-number"}}
    read_json(resource.create_device_class(good, _preload_content=False))
    assert resource.read_device_class("vgpu.vgpu-sharing.io").spec.extended_resource_name == "volcano.sh/vgpu-number"
    bad = {**good, "metadata": {"name": "bad"}, "spec": {"selectors": [{"cel": {}}]}}
    _refused(apiserver, "deviceclasses", bad, "spec.selectors[0].cel.expression")


def test_kubectl_discovers_and_lists_the_resource_api(apiserver, resource):
    kubectl_path = tool("kubectl", "https://kubernetes.io/docs/tasks/tools/")
    read_json(resource.create_resource_slice(a_slice("n1"), _preload_content=False))

    def kubectl(*args: str) -> str:
        res = subprocess.run([kubectl_path, "--kubeconfig", apiserver.kubeconfig, *args], capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return res.stdout

    names = kubectl("api-resources", "--api-group", "resource.k8s.io", "-o", "name").split()
    assert set(names) == {"deviceclasses.resource.k8s.io", "resourceclaims.resource.k8s.io",
                          "resourceclaimtemplates.resource.k8s.io", "resourceslices.resource.k8s.io"}
    assert "n1-gpus" in kubectl("get", "resourceslices")
    assert kubectl("get", "resourceslice", "n1-gpus", "-o", "jsonpath={.spec.devices[0].capacity.cores.value}") \
        == "100"
