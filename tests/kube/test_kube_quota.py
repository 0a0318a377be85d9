"""The API-server stand-in's ResourceQuota (testbed/quota.py), held to kube-apiserver's admission plugin
(staging/src/k8s.io/apiserver/pkg/admission/plugin/resourcequota/controller.go), the pod evaluator
(pkg/quota/v1/evaluator/core/pods.go) and the quota controller (pkg/controller/resourcequota), with kubectl as the
judge of the refusal's wire format, and apimachinery's quantity printing (testbed/kubemath.py) against upstream's
own test table.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from capabilities import tool
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from vgpu.kube.client import make_api_client, read_json
from vgpu.testbed.kubemath import Quantity


def _api(srv: Any) -> k8s.ApiClient:
    """A client that does not retry: each refusal is the first answer."""
    return make_api_client(srv.kubeconfig, retries=False)


@pytest.fixture
def core(apiserver) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(_api(apiserver))


def _quota(core: k8s.CoreV1Api, name: str, hard: dict[str, str], **spec: Any) -> None:
    read_json(core.create_namespaced_resource_quota("default", {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name}, "spec": {"hard": hard, **spec}},
        _preload_content=False))


def _status(core: k8s.CoreV1Api, name: str) -> dict[str, Any]:
    return read_json(core.read_namespaced_resource_quota(name, "default", _preload_content=False))["status"]


def _pod(name: str, *containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (), **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": list(containers) or [_container("c")], "initContainers": list(init), **spec}}


def _container(name: str, requests: dict[str, str] | None = None, limits: dict[str, str] | None = None,
               **fields: Any) -> dict[str, Any]:
    resources = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    return {"name": name, "image": "busybox", "resources": resources, **fields}


def _create(core: k8s.CoreV1Api, body: dict[str, Any], **kw: Any) -> ApiException | None:
    try:
        read_json(core.create_namespaced_pod("default", body, _preload_content=False, **kw))
    except ApiException as exc:
        return exc
    return None


def _message(refusal: ApiException | None) -> str:
    assert refusal is not None, "admitted"
    assert refusal.status == 403 and json.loads(refusal.body)["reason"] == "Forbidden"
    return str(json.loads(refusal.body)["message"])


def _kubectl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("kubectl", "https://kubernetes.io/docs/tasks/tools/"), "--kubeconfig", kubeconfig,
                           *args], capture_output=True, text=True, timeout=60)


def test_kubectl_prints_the_exceeded_quota_as_kube_apiserver_words_it(apiserver, core, tmp_path: Path):
    _quota(core, "compute", {"pods": "3", "requests.cpu": "1", "requests.memory": "1Gi"})
    assert _status(core, "compute") == {"hard": {"pods": "3", "requests.cpu": "1", "requests.memory": "1Gi"},
                                        "used": {"pods": "0", "requests.cpu": "0", "requests.memory": "0"}}
    assert _create(core, _pod("a", _container("c", {"cpu": "600m", "memory": "256Mi"}))) is None
    assert _status(core, "compute")["used"] == {"pods": "1", "requests.cpu": "600m", "requests.memory": "256Mi"}
    manifest = tmp_path / "b.yaml"
    manifest.write_text(json.dumps(_pod("b", _container("c", {"cpu": "600m", "memory": "512Mi"}))))
    refused = _kubectl(apiserver.kubeconfig, "apply", "--validate=false", "-f", str(manifest))
    assert refused.returncode != 0
    assert (f'Error from server (Forbidden): error when creating "{manifest}": pods "b" is forbidden: exceeded quota: '
            "compute, requested: requests.cpu=600m, used: requests.cpu=600m, limited: requests.cpu=1") \
        in refused.stderr, refused.stderr
    # two resources over: names sorted, `name=quantity` joined by commas
    assert _message(_create(core, _pod("c", _container("c", {"cpu": "0.6", "memory": "1Gi"})))) == (
        'pods "c" is forbidden: exceeded quota: compute, requested: requests.cpu=600m,requests.memory=1Gi, used: '
        "requests.cpu=600m,requests.memory=256Mi, limited: requests.cpu=1,requests.memory=1Gi")
    assert _status(core, "compute")["used"] == {"pods": "1", "requests.cpu": "600m", "requests.memory": "256Mi"}
    made = _kubectl(apiserver.kubeconfig, "run", "small", "--image=busybox", "--overrides", json.dumps(
        {"spec": {"containers": [_container("small", {"cpu": "100m", "memory": "1Mi"})]}}))
    assert made.returncode == 0, made.stderr


def test_a_deleted_pod_releases_its_usage(core):
    _quota(core, "compute", {"pods": "1", "requests.cpu": "1", "count/pods": "5"})
    assert _create(core, _pod("a", _container("c", {"cpu": "1"}))) is None
    assert "exceeded quota: compute, requested: pods=1,requests.cpu=1, used: pods=1,requests.cpu=1, limited: " \
           "pods=1,requests.cpu=1" in _message(_create(core, _pod("b", _container("c", {"cpu": "1"}))))
    core.delete_namespaced_pod("a", "default")
    assert _status(core, "compute")["used"] == {"pods": "0", "requests.cpu": "0", "count/pods": "0"}
    assert _create(core, _pod("b", _container("c", {"cpu": "1"}))) is None
    assert _status(core, "compute")["used"] == {"pods": "1", "requests.cpu": "1", "count/pods": "1"}


def test_a_terminal_pod_stops_counting_but_for_count_pods(core):
    _quota(core, "compute", {"pods": "1", "count/pods": "5", "limits.memory": "1Gi"})
    assert _create(core, _pod("done", _container("c", limits={"memory": "1Gi"}))) is None
    core.patch_namespaced_pod_status("done", "default", {"status": {"phase": "Succeeded"}})
    assert _status(core, "compute")["used"] == {"pods": "0", "count/pods": "1", "limits.memory": "0"}
    assert _create(core, _pod("next", _container("c", limits={"memory": "1Gi"}))) is None


def test_extended_resources_count_only_under_requests(core):
    """pods.go: "only quota objects in format of requests.resourceName is allowed" for an extended resource; a quota
    naming limits.<name> or the bare <name> is stored but matches nothing, so it limits nothing."""
    _quota(core, "gpus", {"requests.nvidia.com/gpu": "2", "limits.nvidia.com/gpu": "1", "nvidia.com/gpu": "1"})
    assert _status(core, "gpus")["used"] == {"requests.nvidia.com/gpu": "0"}
    assert _create(core, _pod("g1", _container("c", limits={"nvidia.com/gpu": "2"}))) is None  # requests defaulted
    assert _status(core, "gpus")["used"] == {"requests.nvidia.com/gpu": "2"}
    assert _message(_create(core, _pod("g2", _container("c", limits={"nvidia.com/gpu": "1"})))) == (
        'pods "g2" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1, used: '
        "requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2")


def test_a_cpu_or_memory_quota_requires_every_container_to_say_it(core):
    _quota(core, "compute", {"requests.cpu": "4", "limits.memory": "4Gi"})
    body = _pod("p", _container("app"), _container("side", {"cpu": "100m"}),
                init=(_container("init", limits={"memory": "64Mi"}),))
    assert _message(_create(core, body)) == ('pods "p" is forbidden: failed quota: compute: must specify limits.memory '
                                             "for: app,side; requests.cpu for: app,init")
    # an extended resource quota does not require it (pods.go: "do not add more resources to this list")
    _quota(core, "gpus", {"requests.nvidia.com/gpu": "1"})
    assert _create(core, _pod("q", _container("c", {"cpu": "1"}, {"memory": "1Gi"}))) is None


def test_init_containers_and_sidecars_count_as_pod_requests_computes_them(core):
    _quota(core, "compute", {"requests.cpu": "10", "limits.cpu": "10", "cpu": "10"})
    sidecar = _container("log", {"cpu": "100m"}, {"cpu": "200m"}, restartPolicy="Always")
    setup = _container("setup", {"cpu": "2"}, {"cpu": "2"})
    assert _create(core, _pod("p", _container("app", {"cpu": "500m"}, {"cpu": "500m"}), init=(sidecar, setup))) is None
    # the sidecar runs beside the app and was started before setup: max(500m + 100m, 2 + 100m) requested,
    # max(500m + 200m, 2 + 200m) limited
    assert _status(core, "compute")["used"] == {"requests.cpu": "2100m", "cpu": "2100m", "limits.cpu": "2200m"}


def test_scopes_select_the_pods_a_quota_counts(core):
    _quota(core, "besteffort", {"pods": "1"}, scopes=["BestEffort"])
    _quota(core, "high", {"pods": "1"}, scopeSelector={"matchExpressions": [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]})
    _quota(core, "terminating", {"pods": "5"}, scopes=["Terminating"])
    k8s.SchedulingV1Api(core.api_client).create_priority_class({"metadata": {"name": "high"}, "value": 1000})
    assert _create(core, _pod("be")) is None
    assert _message(_create(core, _pod("be2"))) == ('pods "be2" is forbidden: exceeded quota: besteffort, requested: '
                                                   "pods=1, used: pods=1, limited: pods=1")
    assert _create(core, _pod("hi", _container("c", {"cpu": "1"}), priorityClassName="high")) is None
    assert "exceeded quota: high" in _message(_create(core, _pod("hi2", _container("c", {"cpu": "1"}),
                                                                 priorityClassName="high")))
    assert _create(core, _pod("job", _container("c", {"cpu": "1"}), activeDeadlineSeconds=60)) is None
    used = {name: _status(core, name)["used"]["pods"] for name in ("besteffort", "high", "terminating")}
    assert used == {"besteffort": "1", "high": "1", "terminating": "1"}


def test_an_update_into_the_terminating_scope_is_charged(core):
    """pods.go Handles: an UPDATE that sets activeDeadlineSeconds moves the pod into the Terminating scope."""
    _quota(core, "terminating", {"pods": "1"}, scopes=["Terminating"])
    assert _create(core, _pod("job", activeDeadlineSeconds=60)) is None
    assert _create(core, _pod("svc")) is None
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("svc", "default", {"spec": {"activeDeadlineSeconds": 30}})
    assert _message(caught.value) == ('pods "svc" is forbidden: exceeded quota: terminating, requested: pods=1, '
                                      "used: pods=1, limited: pods=1")
    core.delete_namespaced_pod("job", "default")
    core.patch_namespaced_pod("svc", "default", {"spec": {"activeDeadlineSeconds": 30}})
    assert _status(core, "terminating")["used"] == {"pods": "1"}


def test_pod_level_resources_and_device_class_names(core):
    """Pod-level requests replace the containers' (and lift the per-container constraint); a DeviceClass's implicit
    extended resource counts under requests.deviceclass.resource.kubernetes.io/<class>; events are never counted."""
    gpu = "deviceclass.resource.kubernetes.io/gpu.example.com"
    _quota(core, "compute", {"requests.cpu": "2", f"requests.{gpu}": "1", "count/events": "0"})
    assert _create(core, _pod("p", _container("a"), _container("b", limits={gpu: "1"}),
                              resources={"requests": {"cpu": "1500m"}})) is None
    assert _status(core, "compute")["used"] == {"requests.cpu": "1500m", f"requests.{gpu}": "1"}
    core.create_namespaced_event("default", {"metadata": {"name": "e"}, "involvedObject": {"name": "p"},
                                             "reason": "R", "message": "m"})
    assert "count/events" not in _status(core, "compute")["used"]


def test_a_dry_run_is_checked_but_not_charged(core):
    _quota(core, "compute", {"requests.cpu": "1"})
    assert _create(core, _pod("p", _container("c", {"cpu": "1"})), dry_run="All") is None
    assert _status(core, "compute")["used"] == {"requests.cpu": "0"}
    assert "exceeded quota" in _message(_create(core, _pod("p", _container("c", {"cpu": "2"})), dry_run="All"))
    assert core.list_namespaced_pod("default").items == []


def test_a_quota_with_an_unreadable_quantity_is_invalid(core):
    with pytest.raises(ApiException) as caught:
        _quota(core, "bad", {"requests.cpu": "lots"})
    assert caught.value.status == 422
    assert json.loads(caught.value.body)["message"].startswith(
        'ResourceQuota "bad" is invalid: spec.hard[requests.cpu]: Invalid value: "lots": quantities must match')


@pytest.mark.parametrize("text, canonical", [
    # apimachinery pkg/api/resource/quantity_test.go TestQuantityParseEmit
    ("1Ki", "1Ki"), ("1Mi", "1Mi"), ("1Gi", "1Gi"), ("1024Mi", "1Gi"), ("1000M", "1G"), (".001Ki", "1024m"),
    (".000001Ki", "1024u"), (".000000001Ki", "1024n"), (".000000000001Ki", "2n"),
    # and the Quantity comment's examples, DecimalSI's multiples of 3 and DecimalExponent
    ("1.5", "1500m"), ("1.5Gi", "1536Mi"), ("2000", "2k"), ("1500000", "1500k"), ("0.5Ki", "512"), ("1e3", "1e3"),
    ("100m", "100m"), ("1000m", "1"), ("0", "0"), ("-1.5", "-1500m"), ("-.000000000001Ki", "-2n"),
])
def test_quantities_print_in_apimachinerys_canonical_form(text, canonical):
    assert str(Quantity.parse(text)) == canonical
