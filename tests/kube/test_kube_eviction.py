"""The API-server stand-in's PodDisruptionBudgets, disruption controller and Eviction API (testbed/disruption.py),
held to kube-apiserver's pkg/registry/core/pod/storage/eviction.go and kube-controller-manager's
pkg/controller/disruption/disruption.go, with real clients as the judges: `kubectl drain` (which evicts only where
discovery lists pods/eviction, and retries a 429), `kubectl get pdb` / `describe pdb` (the Table and the status), and
the `kubernetes` client's `create_namespaced_pod_eviction`.

Healthy pods are written as the kubelet would: phase Running and condition Ready True, through pods/status.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from capabilities import tool
from kubernetes import client as k8s
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from vgpu.kube.client import make_api_client, read_json
from vgpu.testbed.admission import POLICY_PLURALS
from vgpu.testbed.apiserver import ApiServerStandIn

CANNOT = "Cannot evict pod as it would violate the pod's disruption budget."


class Cluster:
    """Clients of one stand-in that do not retry (each refusal is the first answer)."""

    def __init__(self, srv: ApiServerStandIn) -> None:
        api = make_api_client(srv.kubeconfig, retries=False)
        self.srv, self.kubeconfig = srv, str(srv.kubeconfig)
        self.core, self.policy, self.apps = k8s.CoreV1Api(api), k8s.PolicyV1Api(api), k8s.AppsV1Api(api)

    def workload(self, kind: str, name: str, replicas: int, owner: dict[str, Any] | None = None) -> dict[str, Any]:
        """A stored ReplicaSet or Deployment (no controller acts on it); its controller reference."""
        body = {"metadata": {"name": name, "ownerReferences": [owner] if owner else []},
                "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                         "template": {"metadata": {"labels": {"app": name}},
                                      "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}
        create = (self.apps.create_namespaced_replica_set if kind == "ReplicaSet"
                  else self.apps.create_namespaced_deployment)
        made = read_json(create("default", body, _preload_content=False))
        return {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": made["metadata"]["uid"],
                "controller": True}

    def pod(self, name: str, labels: dict[str, str], phase: str | None = "Running", ready: bool = True,
            owner: dict[str, Any] | None = None, node: str | None = None) -> None:
        """A pod; with a phase, its status written as the kubelet would (Ready True or False)."""
        spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
        if node:
            spec["nodeName"] = node
        self.core.create_namespaced_pod("default", {
            "metadata": {"name": name, "labels": labels, "ownerReferences": [owner] if owner else []}, "spec": spec})
        if phase is not None:
            self.core.patch_namespaced_pod_status(name, "default", {"status": {
                "phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})

    def budget(self, name: str, labels: dict[str, str], **spec: Any) -> None:
        read_json(self.policy.create_namespaced_pod_disruption_budget("default", {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": labels}, **spec}}, _preload_content=False))

    def status(self, name: str) -> dict[str, Any]:
        return read_json(self.policy.read_namespaced_pod_disruption_budget(name, "default",
                                                                           _preload_content=False))["status"]

    def evict(self, name: str, **body: Any) -> ApiException | None:
        """POST pods/{name}/eviction: None when the pod was evicted (a Success Status), the refusal otherwise."""
        try:
            answer = self.core.create_namespaced_pod_eviction(name, "default", {
                "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}, **body},
                _preload_content=False)
        except ApiException as exc:
            return exc
        assert answer.status == 201
        assert read_json(answer) == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                     "code": 201}
        return None

    def pods(self) -> list[str]:
        return sorted(p.metadata.name for p in self.core.list_namespaced_pod("default").items)

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([tool("kubectl", "https://kubernetes.io/docs/tasks/tools/"), "--kubeconfig",
                               self.kubeconfig, *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def cluster(apiserver: ApiServerStandIn) -> Cluster:
    return Cluster(apiserver)


@pytest.fixture
def manual(tmp_path: Path) -> Iterator[Cluster]:
    """A stand-in without the disruption controller: budgets' status is whatever a client writes."""
    srv = ApiServerStandIn(disruption_controller=False).start()
    srv.write_kubeconfig(tmp_path / "kubeconfig")
    yield Cluster(srv)
    srv.stop()


def _refusal(exc: ApiException | None, code: int) -> dict[str, Any]:
    assert exc is not None, "evicted"
    assert exc.status == code, (exc.status, exc.body)
    return dict(json.loads(exc.body))


def test_kubectl_drain_evicts_what_the_budget_allows_and_retries_the_rest(cluster: Cluster, tmp_path: Path):
    cluster.core.create_node({"metadata": {"name": "n1"}})
    web = cluster.workload("ReplicaSet", "web", 3)
    for name in ("web-a", "web-b", "web-c"):
        cluster.pod(name, {"app": "web"}, owner=web, node="n1")
    manifest = tmp_path / "pdb.yaml"
    manifest.write_text(json.dumps({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                    "metadata": {"name": "web"},
                                    "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}}))
    made = cluster.kubectl("create", "--validate=false", "-f", str(manifest))
    assert made.returncode == 0 and "poddisruptionbudget.policy/web created" in made.stdout, made.stderr
    listed = cluster.kubectl("get", "pdb")
    assert listed.returncode == 0, listed.stderr
    assert re.split(r"\s{2,}", listed.stdout.splitlines()[0].strip()) == [
        "NAME", "MIN AVAILABLE", "MAX UNAVAILABLE", "ALLOWED DISRUPTIONS", "AGE"]
    assert listed.stdout.splitlines()[1].split()[:4] == ["web", "2", "N/A", "1"]

    drain = ("drain", "n1", "--ignore-daemonsets", "--delete-emptydir-data", "--pod-selector=app=web")
    stuck = cluster.kubectl(*drain, "--timeout=2s")  # one eviction allowed, the other two refused until the timeout
    assert stuck.returncode != 0
    assert stuck.stderr.count(f"(will retry after 5s): {CANNOT}") == 2, stuck.stderr
    assert len(cluster.pods()) == 2 and len(re.findall(r"pod/web-\w evicted", stuck.stdout)) == 1, stuck.stdout
    assert cluster.core.read_node("n1").spec.unschedulable is True
    described = cluster.kubectl("describe", "pdb", "web").stdout
    for line in ("Min available:  2", "Allowed disruptions:  0", "Current:              2",
                 "Desired:              2", "Total:                2"):
        assert line in described, described

    # a spec change is a new generation, which the controller observes at once: now both may go
    cluster.policy.patch_namespaced_pod_disruption_budget("web", "default", {"spec": {"minAvailable": 0}})
    assert cluster.status("web")["observedGeneration"] == 2
    assert cluster.kubectl("get", "pdb", "web").stdout.splitlines()[1].split()[:4] == ["web", "0", "N/A", "2"]
    done = cluster.kubectl(*drain, "--timeout=20s")
    assert done.returncode == 0 and "node/n1 drained" in done.stdout, done.stderr
    assert cluster.pods() == []


def test_at_zero_disruptions_the_eviction_is_refused_with_upstreams_status_and_cause(cluster: Cluster):
    for name in ("a", "b"):
        cluster.pod(name, {"app": "web"})
    cluster.budget("web", {"app": "web"}, minAvailable=2)
    assert cluster.status("web")["disruptionsAllowed"] == 0
    refused = cluster.evict("a")
    assert refused is not None and "Retry-After" not in refused.headers
    assert _refusal(refused, 429) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": CANNOT,
        "reason": "TooManyRequests", "code": 429, "details": {"causes": [
            {"reason": "DisruptionBudget", "message": "The disruption budget web needs 2 healthy pods and has 2 "
                                                      "currently"}]}}
    assert cluster.pods() == ["a", "b"]
    assert _refusal(cluster.evict("nobody"), 404)["message"] == 'pods "nobody" not found'


def test_an_allowed_eviction_takes_one_disruption_and_marks_the_pod_before_deleting_it(manual: Cluster):
    for name in ("a", "b", "c"):
        manual.pod(name, {"app": "web"})
    manual.budget("web", {"app": "web"}, minAvailable=2)
    # no controller has observed the budget's generation yet: 429 with Retry-After, upstream's other cause
    early = manual.evict("a")
    assert early is not None and early.headers.get("Retry-After") == "10"
    assert _refusal(early, 429)["details"] == {"retryAfterSeconds": 10, "causes": [
        {"reason": "DisruptionBudget", "message": "The disruption budget web is still being processed by the server."}]}
    manual.policy.patch_namespaced_pod_disruption_budget_status("web", "default", {"status": {
        "observedGeneration": 1, "disruptionsAllowed": 1, "currentHealthy": 3, "desiredHealthy": 2,
        "expectedPods": 3}})
    since = manual.core.list_namespaced_pod("default").metadata.resource_version
    assert manual.evict("a") is None
    status = manual.status("web")
    assert status["disruptionsAllowed"] == 0 and list(status["disruptedPods"]) == ["a"]
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("DisruptionAllowed", "False", "InsufficientPods")]
    seen = [(e["type"], [c.type for c in e["object"].status.conditions or ()])
            for e in watch.Watch().stream(manual.core.list_namespaced_pod, "default", resource_version=since,
                                          timeout_seconds=1)]
    assert seen == [("MODIFIED", ["Ready", "DisruptionTarget"]), ("DELETED", ["Ready", "DisruptionTarget"])]
    assert "Cannot evict" in _refusal(manual.evict("b"), 429)["message"]
    with pytest.raises(ApiException) as negative:  # policy/v1 refuses a negative count
        manual.policy.patch_namespaced_pod_disruption_budget_status("web", "default",
                                                                    {"status": {"disruptionsAllowed": -1}})
    assert negative.value.status == 422


def test_a_pod_under_two_budgets_is_refused_with_a_500(cluster: Cluster):
    cluster.pod("a", {"app": "web", "tier": "front"})
    cluster.budget("by-app", {"app": "web"}, maxUnavailable=1)
    cluster.budget("by-tier", {"tier": "front"}, minAvailable=0)
    assert _refusal(cluster.evict("a"), 500) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "", "details": {},
        "message": "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        "code": 500}
    assert cluster.pods() == ["a"]


def test_pending_and_terminal_pods_are_evicted_whatever_the_budget(cluster: Cluster):
    cluster.pod("running", {"app": "web"})
    cluster.pod("pending", {"app": "web"}, phase=None)  # as created: Pending
    cluster.pod("failed", {"app": "web"}, phase="Failed", ready=False)
    cluster.pod("done", {"app": "web"}, phase="Succeeded", ready=False)
    cluster.budget("web", {"app": "web"}, minAvailable=3)
    before = cluster.status("web")
    assert before["disruptionsAllowed"] == 0
    for name in ("pending", "failed", "done"):
        assert cluster.evict(name) is None, name
    assert _refusal(cluster.evict("running"), 429)["message"] == CANNOT
    assert cluster.pods() == ["running"]
    after = cluster.status("web")
    assert after["disruptionsAllowed"] == 0 and "disruptedPods" not in after
    assert after["expectedPods"] == 1 and after["currentHealthy"] == 1


def test_an_unready_pod_goes_under_always_allow_or_a_healthy_budget_only(cluster: Cluster):
    cluster.pod("a", {"app": "web"})
    cluster.pod("b", {"app": "web"})
    cluster.pod("sick", {"app": "web"}, ready=False)
    cluster.budget("web", {"app": "web"}, minAvailable=3)
    # IfHealthyBudget (the default): 2 healthy of the 3 desired, so the budget decides, and allows nothing
    cause = _refusal(cluster.evict("sick"), 429)["details"]["causes"][0]["message"]
    assert cause == "The disruption budget web needs 3 healthy pods and has 2 currently"
    cluster.policy.patch_namespaced_pod_disruption_budget("web", "default",
                                                          {"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}})
    assert cluster.evict("sick") is None
    assert cluster.pods() == ["a", "b"] and cluster.status("web")["disruptionsAllowed"] == 0
    # IfHealthyBudget with the healthy pods at what is desired: the unready pod goes, the budget untouched
    cluster.pod("sick-too", {"app": "web"}, ready=False)
    cluster.policy.patch_namespaced_pod_disruption_budget("web", "default", {"spec": {
        "minAvailable": 2, "unhealthyPodEvictionPolicy": "IfHealthyBudget"}})
    assert cluster.status("web")["disruptionsAllowed"] == 0
    assert cluster.evict("sick-too") is None
    assert cluster.pods() == ["a", "b"]
    with pytest.raises(ApiException) as bad:
        cluster.policy.patch_namespaced_pod_disruption_budget("web", "default", {"spec": {
            "unhealthyPodEvictionPolicy": "Sometimes"}})
    assert bad.value.status == 422 and 'Unsupported value: "Sometimes"' in json.loads(bad.value.body)["message"]


def test_percentages_and_max_unavailable_count_the_controllers_scale(cluster: Cluster):
    web = cluster.workload("ReplicaSet", "web", 4)  # four wanted, three running
    for name in ("web-a", "web-b", "web-c"):
        cluster.pod(name, {"app": "web"}, owner=web)
    cluster.budget("web", {"app": "web"}, minAvailable="50%")
    assert {k: cluster.status("web")[k] for k in ("expectedPods", "desiredHealthy", "currentHealthy",
                                                  "disruptionsAllowed")} == {
        "expectedPods": 4, "desiredHealthy": 2, "currentHealthy": 3, "disruptionsAllowed": 1}
    assert cluster.kubectl("get", "pdb", "web").stdout.splitlines()[1].split()[:4] == ["web", "50%", "N/A", "1"]

    # a ReplicaSet a Deployment controls: the Deployment's scale; maxUnavailable rounds up
    api = cluster.workload("Deployment", "api", 3)
    rs = cluster.workload("ReplicaSet", "api-1", 5, owner=api)
    for name in ("api-a", "api-b", "api-c"):
        cluster.pod(name, {"app": "api"}, owner=rs)
    cluster.budget("api", {"app": "api"}, maxUnavailable="34%")
    status = cluster.status("api")
    assert (status["expectedPods"], status["desiredHealthy"], status["disruptionsAllowed"]) == (3, 1, 2)
    assert cluster.evict("api-a") is None and cluster.status("api")["disruptionsAllowed"] == 1


def test_pods_without_a_controller_or_with_a_lost_one_allow_no_disruption(cluster: Cluster):
    for name in ("solo-a", "solo-b"):
        cluster.pod(name, {"app": "solo"})
    cluster.budget("solo", {"app": "solo"}, minAvailable="50%")
    status = cluster.status("solo")
    assert (status["expectedPods"], status["currentHealthy"], status["disruptionsAllowed"]) == (0, 2, 0)
    assert _refusal(cluster.evict("solo-a"), 429)["message"] == CANNOT
    events = cluster.core.list_namespaced_event("default", field_selector="involvedObject.name=solo").items
    assert [(e.type, e.reason) for e in events] == [("Warning", "UnmanagedPods")]
    assert "were found to be unmanaged" in events[0].message

    lost = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "gone", "uid": "0000", "controller": True}
    cluster.pod("orphan", {"app": "orphan"}, owner=lost)
    cluster.budget("orphan", {"app": "orphan"}, maxUnavailable=1)
    status = cluster.status("orphan")  # failSafe: nothing allowed, and the generation never observed
    assert status["disruptionsAllowed"] == 0 and "observedGeneration" not in status
    assert [(c["status"], c["reason"], c["message"]) for c in status["conditions"]] == [
        ("False", "SyncFailed", 'found no controllers for pod "orphan"')]
    assert "still being processed" in _refusal(cluster.evict("orphan"), 429)["details"]["causes"][0]["message"]
    described = cluster.kubectl("describe", "pdb", "orphan").stdout
    assert "CalculateExpectedPodCountFailed" in described, described


def test_the_eviction_is_admitted_as_a_create_of_pods_eviction_whose_object_is_the_eviction(cluster: Cluster):
    policy = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
              "metadata": {"name": "keep"},
              "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [
                  {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                   "resources": ["pods/eviction"]}]},
                  "validations": [{"expression": "!(request.kind.group == 'policy' && object.kind == 'Eviction' "
                                                 "&& object.metadata.name == 'keep')", "message": "keep stays"}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": "keep-binding"}, "spec": {"policyName": "keep", "validationActions": ["Deny"]}}
    objects = k8s.CustomObjectsApi(make_api_client(cluster.kubeconfig, retries=False))
    for doc in (policy, binding):
        objects.create_cluster_custom_object("admissionregistration.k8s.io", "v1", POLICY_PLURALS[doc["kind"]], doc)
    cluster.pod("keep", {"app": "web"})
    cluster.pod("other", {"app": "web"})
    refused = _refusal(cluster.evict("keep"), 422)  # a validation without a reason: Invalid
    assert refused["message"] == ('pods "keep" is forbidden: ValidatingAdmissionPolicy \'keep\' with binding '
                                  "'keep-binding' denied request: keep stays"), refused
    assert cluster.evict("other") is None
    assert cluster.pods() == ["keep"]
    # the name in the URL must be the Eviction's
    assert _refusal(cluster.evict("keep", metadata={"name": "other"}), 400)["message"] == (
        "name in URL does not match name in Eviction object")
