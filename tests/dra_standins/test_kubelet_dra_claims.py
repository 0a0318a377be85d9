"""How the kubelet stand-in finds a pod's ResourceClaims: claims generated from templates (named in the pod's
status.resourceClaimStatuses, owned by the pod), the scheduler's claim for DRA-backed extended resources
(status.extendedResourceClaimStatus, its requests mapped to containers), and a claim shared by two pods (prepared
once, unprepared after the last one ends)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubelet_dra_helpers import NodeBed, env_container, env_name

from vgpu.kube.client import read_json


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[NodeBed]:
    b = NodeBed(tmp_path)
    b.plugin().start()
    assert b.wait_driver()
    try:
        yield b
    finally:
        b.close()


def _set_status(bed: NodeBed, name: str, status: dict) -> None:
    bed.core.patch_namespaced_pod_status(name, "default", {"status": status}, _preload_content=False)


def _owner(pod: dict, controller: bool = True) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"],
            "controller": controller}


def test_a_template_claim_is_found_through_the_pod_status_and_must_be_owned_by_the_pod(bed):
    plugin = bed.plugins[0]
    pod = bed.create_pod("t1", [env_container("main", [{"name": "gpu"}])],
                         [{"name": "gpu", "resourceClaimTemplateName": "gpu-template"},
                          {"name": "unused", "resourceClaimTemplateName": "other-template"}])
    uid = pod["metadata"]["uid"]
    stranger = bed.create_claim("t1-gpu-abcde", owner=_owner(pod, controller=False))
    bed.allocate(stranger, pod)
    # no claim generated for "unused": nothing to prepare for it
    _set_status(bed, "t1", {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "t1-gpu-abcde"},
                                                      {"name": "unused"}]})
    bed.bind("t1")
    assert bed.agent.dra.manager.wait_for(lambda: "not its owner" in bed.agent.dra_errors.get(uid, ""))
    assert plugin.prepares == []
    # the claim controller's claim: owned (controller) by the pod
    owned = bed.create_claim("t1-gpu-fghij", owner=_owner(pod))
    bed.allocate(owned, pod)
    _set_status(bed, "t1", {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "t1-gpu-fghij"},
                                                      {"name": "unused"}]})
    bed.wait_phase("t1", ("Succeeded",))
    assert plugin.prepares == [[("default", owned["metadata"]["uid"], "t1-gpu-fghij")]]
    assert bed.container_env("t1", "main")["DRA_TEST_CLAIM"] == "default/t1-gpu-fghij"


def test_a_template_claim_not_generated_yet_keeps_the_pod_waiting(bed):
    pod = bed.create_pod("t2", [env_container("main", [{"name": "gpu"}])],
                         [{"name": "gpu", "resourceClaimTemplateName": "gpu-template"}])
    bed.bind("t2")
    uid = pod["metadata"]["uid"]
    assert bed.agent.dra.manager.wait_for(lambda: "no ResourceClaim generated" in bed.agent.dra_errors.get(uid, ""))
    assert bed.pod("t2")["status"]["phase"] == "Pending"


def test_the_extended_resource_claim_serves_the_containers_its_requests_are_mapped_to(bed):
    gpu = {"limits": {"example.com/gpu": "1"}}
    containers = [dict(env_container("a", []), resources=gpu), dict(env_container("b", []), resources=gpu),
                  env_container("plain", [])]
    pod = bed.create_pod("x1", containers, [])
    claim = bed.create_claim("x1-extended-resources-xyz", ("container-0-request-0", "container-1-request-0"))
    bed.allocate(claim, pod, devices={"container-0-request-0": "gpu-0", "container-1-request-0": "gpu-1"})
    _set_status(bed, "x1", {"extendedResourceClaimStatus": {
        "resourceClaimName": "x1-extended-resources-xyz",
        "requestMappings": [
            {"containerName": "a", "resourceName": "example.com/gpu", "requestName": "container-0-request-0"},
            {"containerName": "b", "resourceName": "example.com/gpu", "requestName": "container-1-request-0"}]}})
    bed.bind("x1")
    bed.wait_phase("x1", ("Succeeded",))
    a, b, plain = (bed.container_env("x1", c) for c in ("a", "b", "plain"))
    assert a[env_name("container-0-request-0")].endswith("/gpu-0") and env_name("container-1-request-0") not in a
    assert b[env_name("container-1-request-0")].endswith("/gpu-1") and env_name("container-0-request-0") not in b
    assert "DRA_TEST_CLAIM" not in plain


def test_a_shared_claim_is_prepared_once_and_unprepared_after_its_last_pod(bed):
    plugin = bed.plugins[0]
    claim = bed.create_claim("shared")
    first = bed.create_pod("s1", [env_container("main", [{"name": "gpu"}], script="sleep 30")],
                           [{"name": "gpu", "resourceClaimName": "shared"}])
    second = bed.create_pod("s2", [env_container("main", [{"name": "gpu"}])],
                            [{"name": "gpu", "resourceClaimName": "shared"}])
    current = read_json(bed.resource.read_namespaced_resource_claim("shared", "default", _preload_content=False))
    bed.allocate(current, first)
    current = read_json(bed.resource.read_namespaced_resource_claim("shared", "default", _preload_content=False))
    current["status"]["reservedFor"].append({"resource": "pods", "name": "s2", "uid": second["metadata"]["uid"]})
    bed.resource.replace_namespaced_resource_claim_status("shared", "default", current, _preload_content=False)
    bed.bind("s1")
    bed.wait_phase("s1", ("Running",))
    bed.bind("s2")
    bed.wait_phase("s2", ("Succeeded",))
    assert plugin.prepares == [[("default", claim["metadata"]["uid"], "shared")]]
    assert plugin.unprepares == []  # s1 still uses it
    bed.core.delete_namespaced_pod("s1", "default", _preload_content=False)
    assert plugin.wait(lambda: plugin.unprepares == [[("default", claim["metadata"]["uid"], "shared")]])


def test_request_names_are_matched_exactly(bed):
    # kubelet hands a container the CDI devices whose request names contain its `request` exactly
    # (pkg/kubelet/cm/dra/claiminfo.go cdiDevicesAsList): a driver answering the subrequest `gpu/big` of a
    # firstAvailable result serves the containers that name the whole claim, not those that name `gpu`
    claim = bed.create_claim("alt")
    pod = bed.create_pod("alt", [env_container("named", [{"name": "c", "request": "gpu"}]),
                                 env_container("whole", [{"name": "c"}])],
                         [{"name": "c", "resourceClaimName": "alt"}])
    bed.allocate(claim, pod, devices={"gpu/big": "gpu-0"})
    bed.bind("alt")
    bed.wait_phase("alt", ("Succeeded",))
    named, whole = bed.container_env("alt", "named"), bed.container_env("alt", "whole")
    assert whole[env_name("gpu/big")].endswith("/gpu-0")
    assert env_name("gpu/big") not in named and "DRA_TEST_CLAIM" not in named
