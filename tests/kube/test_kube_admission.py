"""The API-server stand-in's authentication and ValidatingAdmissionPolicy admission (testbed/admission.py), held to
what kube-apiserver does (staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating), with kubectl as the
judge of the wire format: deploy/admission's policies applied by kubectl refuse a forged pod with kube-apiserver's
message (kubectl sends no bearer token over plain HTTP, so it talks to a stand-in that authenticates nobody and
takes every client for an admin, whom that policy refuses too), and each rule of the evaluation (messages, reasons
and codes, failurePolicy, actions, matching) has a case here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from capabilities import tool
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from vgpu.kube.client import make_api_client, read_json
from vgpu.testbed.admission import POLICY_PLURALS, UserInfo
from vgpu.testbed.apiserver import ApiServerStandIn

ROOT = Path(__file__).resolve().parents[2]
ADMIN = UserInfo("kubernetes-admin", groups=("system:masters", "system:authenticated"))
TENANT = UserInfo("alice@example.com", groups=("tenants", "system:authenticated"))


@pytest.fixture
def guarded(tmp_path: Path) -> Any:
    """A stand-in that authenticates: `admin-token` and `tenant-token`; kubeconfigs `admin` and `tenant`."""
    srv = ApiServerStandIn(users={"admin-token": ADMIN, "tenant-token": TENANT}).start()
    srv.tenant = srv.write_kubeconfig(tmp_path / "tenant", "tenant-token")
    srv.admin = srv.write_kubeconfig(tmp_path / "admin", "admin-token")
    yield srv
    srv.stop()


def _pod(name: str, labels: dict[str, str] | None = None, **annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}, "annotations": annotations},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def _policy(name: str, validations: list[dict[str, Any]], failure: str = "Fail", actions: tuple[str, ...] = ("Deny",),
            rules: list[dict[str, Any]] | None = None, **spec: Any) -> list[dict[str, Any]]:
    """A policy on pods and its binding."""
    policy = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
              "metadata": {"name": name},
              "spec": {"failurePolicy": failure, "validations": validations,
                       "matchConstraints": {"resourceRules": rules or [
                           {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["*"], "resources": ["pods"]}]},
                       **spec}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": f"{name}-binding"},
               "spec": {"policyName": name, "validationActions": list(actions)}}
    return [policy, binding]


def _install(srv: Any, docs: list[dict[str, Any]]) -> None:
    objects = k8s.CustomObjectsApi(make_api_client(srv.admin))
    for doc in docs:
        objects.create_cluster_custom_object("admissionregistration.k8s.io", "v1", POLICY_PLURALS[doc["kind"]], doc)


def _create(srv: Any, body: dict[str, Any]) -> ApiException | None:
    """Create a pod as the tenant: None when admitted, the refusal otherwise."""
    try:
        read_json(k8s.CoreV1Api(make_api_client(srv.tenant)).create_namespaced_pod("default", body,
                                                                                   _preload_content=False))
    except ApiException as exc:
        return exc
    return None


def _kubectl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("kubectl", "https://kubernetes.io/docs/tasks/tools/"), "--kubeconfig", kubeconfig,
                           *args], capture_output=True, text=True, timeout=60)


def test_kubectl_applies_the_shipped_policies_and_prints_the_refusal_kube_apiserver_would(apiserver, tmp_path):
    # --validate=false: the stand-in serves no OpenAPI documents for kubectl's client-side schema check
    applied = _kubectl(apiserver.kubeconfig, "apply", "--validate=false", "-f", str(ROOT / "deploy" / "admission"))
    assert applied.returncode == 0, applied.stderr
    assert "validatingadmissionpolicy.admissionregistration.k8s.io/vgpu-sharing-assignment-annotations created" \
        in applied.stdout
    forged = tmp_path / "forged.yaml"
    forged.write_text("apiVersion: v1\nkind: Pod\nmetadata:\n  name: forged\n  annotations:\n"
                      "    volcano.sh/vgpu-ids-new: 'GPU-0,NVIDIA,40960,100:'\n"
                      "spec:\n  containers: [{name: c, image: busybox}]\n")
    refused = _kubectl(apiserver.kubeconfig, "apply", "--validate=false", "-f", str(forged))
    assert refused.returncode != 0
    assert 'Error from server (Forbidden): error when creating "' in refused.stderr, refused.stderr
    assert ('pods "forged" is forbidden: ValidatingAdmissionPolicy \'vgpu-sharing-assignment-annotations\' with '
            "binding 'vgpu-sharing-assignment-annotations' denied request: a pod may not be created with GPU "
            "assignment annotations") in refused.stderr, refused.stderr
    assert apiserver.store.list("v1/pods")[0] == []  # nothing stored
    assert _kubectl(apiserver.kubeconfig, "run", "plain", "--image=busybox").returncode == 0


def test_an_unknown_token_is_unauthorized(guarded, tmp_path):
    stranger = k8s.CoreV1Api(make_api_client(guarded.write_kubeconfig(tmp_path / "stranger", "not-a-token")))
    with pytest.raises(ApiException) as caught:
        stranger.list_namespaced_pod("default")
    assert caught.value.status == 401 and '"reason":"Unauthorized"' in caught.value.body


def test_message_reason_and_code(guarded):
    """No message: "failed expression: ..." with reason Invalid (422); reason Forbidden: 403; a messageExpression
    wins over the message unless it is empty or spans lines."""
    _install(guarded, _policy("plain", [{"expression": "object.metadata.name != 'a'"}])
             + _policy("forbidden", [{"expression": "object.metadata.name != 'b'", "reason": "Forbidden",
                                      "message": "static", "messageExpression": "'dynamic ' + object.metadata.name"}])
             + _policy("multiline", [{"expression": "object.metadata.name != 'c'", "message": "fallback",
                                      "messageExpression": "'two\\nlines'"}]))
    a, b, c = _create(guarded, _pod("a")), _create(guarded, _pod("b")), _create(guarded, _pod("c"))
    assert a is not None and a.status == 422 and '"reason":"Invalid"' in a.body
    assert "ValidatingAdmissionPolicy 'plain' with binding 'plain-binding' denied request: failed expression: " \
           "object.metadata.name != 'a'" in a.body
    assert b is not None and b.status == 403 and "denied request: dynamic b" in b.body
    assert c is not None and "denied request: fallback" in c.body
    assert _create(guarded, _pod("d")) is None


@pytest.mark.parametrize("failure, admitted", [("Fail", False), ("Ignore", True)])
def test_an_expression_that_fails_follows_the_failure_policy(guarded, failure, admitted):
    _install(guarded, _policy("lookup", [{"expression": "object.metadata.annotations['missing'] == 'x'"}], failure))
    refused = _create(guarded, _pod("p", team="a"))
    assert (refused is None) is admitted
    if refused is not None:
        assert "expression 'object.metadata.annotations['missing'] == 'x'' resulted in error" in refused.body


def test_warn_and_audit_record_without_refusing(guarded):
    _install(guarded, _policy("warned", [{"expression": "false", "message": "looked at"}], actions=("Warn", "Audit")))
    assert _create(guarded, _pod("p")) is None
    assert guarded.store.admission.warnings == [
        "Validation failed for ValidatingAdmissionPolicy 'warned' with binding 'warned-binding': looked at"]


def test_a_policy_without_a_binding_does_nothing(guarded):
    _install(guarded, _policy("unbound", [{"expression": "false"}])[:1])
    assert _create(guarded, _pod("p")) is None


def test_match_conditions_object_selector_and_excluded_resources(guarded):
    _install(guarded, _policy("gpu-team", [{"expression": "false", "message": "no"}],
                              matchConditions=[{"name": "tenant", "expression":
                                                "request.userInfo.username == 'alice@example.com'"}],
                              rules=[{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                      "resources": ["pods"]}]))
    _install(guarded, _policy("labelled", [{"expression": "false", "message": "labelled"}],
                              rules=[{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                                      "resources": ["pods", "pods/status"]}],
                              ))
    objects = k8s.CustomObjectsApi(make_api_client(guarded.admin))
    objects.patch_cluster_custom_object(
        "admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "labelled",
        {"spec": {"matchConstraints": {"objectSelector": {"matchLabels": {"guarded": "yes"}},
                                       "excludeResourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                                 "operations": ["*"],
                                                                 "resources": ["pods/status"]}]}}})
    assert "denied request: no" in (_create(guarded, _pod("p")) or ApiException()).body  # the tenant: matched
    admin = k8s.CoreV1Api(make_api_client(guarded.admin))
    for name, labels in (("free", {}), ("held", {"guarded": "yes"})):
        read_json(admin.create_namespaced_pod("default", _pod(name, labels), _preload_content=False))
    admin.patch_namespaced_pod("free", "default", {"metadata": {"annotations": {"x": "1"}}})
    with pytest.raises(ApiException, match="denied request: labelled"):
        admin.patch_namespaced_pod("held", "default", {"metadata": {"annotations": {"x": "1"}}})
    admin.patch_namespaced_pod_status("held", "default", {"status": {"phase": "Running"}})  # excluded
    assert admin.read_namespaced_pod("held", "default").metadata.annotations.get("x") is None


def test_delete_sees_the_old_object_and_no_object(guarded):
    _install(guarded, _policy("keep", [{"expression": "object == null && oldObject.metadata.name != 'kept'",
                                        "message": "kept pods stay"}],
                              rules=[{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"],
                                      "resources": ["pods"]}]))
    admin = k8s.CoreV1Api(make_api_client(guarded.admin))
    for name in ("kept", "gone"):
        read_json(admin.create_namespaced_pod("default", _pod(name), _preload_content=False))
    with pytest.raises(ApiException, match="kept pods stay"):
        admin.delete_namespaced_pod("kept", "default")
    admin.delete_namespaced_pod("gone", "default")
    assert [p.metadata.name for p in admin.list_namespaced_pod("default").items] == ["kept"]


OTHER_SCHEDULER_REFUSAL = (
    'pods "elsewhere" is forbidden: ValidatingAdmissionPolicy \'vgpu-sharing-scheduled-placement\' with binding '
    "'vgpu-sharing-scheduled-placement' denied request: a pod that asks for volcano.sh/vgpu-number or the other vGPU "
    "resources must be placed by vgpu-scheduler: set schedulerName: vgpu-scheduler (the admission webhook that "
    "moves such pods there did not see this one)")


def test_a_pod_asking_our_resources_under_another_scheduler_is_refused_and_hamis_are_left_to_hami(apiserver,
                                                                                                tmp_path):
    """deploy/'s policy refuses a pod asking volcano.sh/vgpu-* whose schedulerName is not ours (a scheduler that
    binds it would have kubelet admit it beside our waiting pods); a pod with HAMi's names under HAMi's scheduler
    is not ours to refuse. tests/realk8s has the real kube-apiserver's words for the chart's copy."""
    applied = _kubectl(apiserver.kubeconfig, "apply", "--validate=false", "-f", str(ROOT / "deploy" / "admission"))
    assert applied.returncode == 0, applied.stderr
    manifest = tmp_path / "pods.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: elsewhere}\nspec:\n  schedulerName: my-scheduler\n"
        "  containers: [{name: c, image: busybox, resources: {limits: {volcano.sh/vgpu-number: '1'}}}]\n")
    refused = _kubectl(apiserver.kubeconfig, "create", "--validate=false", "-f", str(manifest))
    assert refused.returncode != 0 and OTHER_SCHEDULER_REFUSAL in refused.stderr, refused.stderr
    manifest.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: hami}\nspec:\n  schedulerName: hami-scheduler\n"
        "  containers: [{name: c, image: busybox, resources: {limits: {nvidia.com/gpu: '1', "
        "nvidia.com/gpumem: '3000'}}}]\n")
    assert _kubectl(apiserver.kubeconfig, "create", "--validate=false", "-f", str(manifest)).returncode == 0
