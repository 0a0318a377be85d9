"""The API-server stand-in's PriorityClasses and Priority admission plugin (testbed/priority.py), held to
kube-apiserver's (plugin/pkg/admission/priority/admission.go, pkg/apis/scheduling/validation/validation.go,
pkg/registry/scheduling/...), with the real `kubernetes` client and kubectl as the judges: `kubectl create
priorityclass`, `kubectl get priorityclasses` (discovery and the Table) and the words kubectl prints for each refusal.
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
from vgpu.testbed.admission import POLICY_PLURALS
from vgpu.testbed.apiserver import ApiServerStandIn, Store

SYSTEM = {"system-node-critical": 2000001000, "system-cluster-critical": 2000000000}


class Cluster:
    """Clients of one stand-in that do not retry (each refusal is the first answer)."""

    def __init__(self, srv: ApiServerStandIn) -> None:
        api = make_api_client(srv.kubeconfig, retries=False)
        self.kubeconfig = str(srv.kubeconfig)
        self.core, self.scheduling = k8s.CoreV1Api(api), k8s.SchedulingV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([tool("kubectl", "https://kubernetes.io/docs/tasks/tools/"), "--kubeconfig",
                               self.kubeconfig, *args], capture_output=True, text=True, timeout=60)

    def priority_class(self, name: str, value: int, **fields: Any) -> dict[str, Any]:
        return read_json(self.scheduling.create_priority_class(
            {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
             "value": value, **fields}, _preload_content=False))

    def pod(self, name: str, **spec: Any) -> dict[str, Any]:
        return read_json(self.core.create_namespaced_pod("default", {
            "metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec}},
            _preload_content=False))


@pytest.fixture
def cluster(apiserver: ApiServerStandIn) -> Cluster:
    return Cluster(apiserver)


def _refusal(call: Any) -> tuple[int, str]:
    with pytest.raises(ApiException) as caught:
        call()
    return caught.value.status, json.loads(caught.value.body)["message"]


def _resolved(pod: dict[str, Any]) -> tuple[str | None, int, str]:
    spec = pod["spec"]
    return spec.get("priorityClassName"), spec["priority"], spec["preemptionPolicy"]


def test_kubectl_lists_the_system_classes_and_creates_one(cluster):
    listed = cluster.kubectl("get", "priorityclasses")
    assert listed.returncode == 0, listed.stderr
    header, *rows = [line.split() for line in listed.stdout.splitlines()]
    assert header == ["NAME", "VALUE", "GLOBAL-DEFAULT", "AGE", "PREEMPTIONPOLICY"]
    assert {(r[0], r[1], r[2], r[4]) for r in rows} == {(name, str(value), "false", "PreemptLowerPriority")
                                                        for name, value in SYSTEM.items()}
    made = cluster.kubectl("create", "priorityclass", "batch", "--value=1000", "--preemption-policy=Never",
                           "--description=for batch jobs")
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == "priorityclass.scheduling.k8s.io/batch created"
    shown = cluster.kubectl("get", "pc", "batch", "--no-headers")  # the short name, from discovery
    assert shown.returncode == 0, shown.stderr
    name, value, default, _, policy = shown.stdout.split()
    assert (name, value, default, policy) == ("batch", "1000", "false", "Never")
    stored = cluster.scheduling.read_priority_class("batch")
    assert (stored.value, stored.description, stored.preemption_policy, stored.global_default) == \
        (1000, "for batch jobs", "Never", None)
    assert stored.metadata.generation == 1


def test_a_pod_gets_its_class_value_and_preemption_policy(cluster):
    cluster.priority_class("polite", 500, preemptionPolicy="Never")
    assert _resolved(cluster.pod("a", priorityClassName="polite")) == ("polite", 500, "Never")
    critical = cluster.core.read_namespaced_pod("a", "default")
    assert (critical.spec.priority, critical.spec.preemption_policy) == (500, "Never")
    assert _resolved(cluster.pod("b", priorityClassName="system-node-critical")) == \
        ("system-node-critical", 2000001000, "PreemptLowerPriority")
    # a pod that sets the value its class gives is admitted
    assert _resolved(cluster.pod("c", priorityClassName="polite", priority=500, preemptionPolicy="Never")) == \
        ("polite", 500, "Never")


def test_without_a_class_name_a_pod_gets_the_global_default_else_zero(cluster):
    assert _resolved(cluster.pod("before")) == (None, 0, "PreemptLowerPriority")
    cluster.priority_class("low", 10)
    cluster.priority_class("standard", 100, globalDefault=True, preemptionPolicy="Never")
    assert _resolved(cluster.pod("after")) == ("standard", 100, "Never")
    cluster.scheduling.delete_priority_class("standard")
    assert _resolved(cluster.pod("again")) == (None, 0, "PreemptLowerPriority")


def test_kubectl_prints_the_plugins_refusals(cluster, tmp_path: Path):
    cluster.priority_class("high", 1000)
    cases = [
        ("unknown", {"priorityClassName": "missing"}, "no PriorityClass with name missing was found"),
        ("set", {"priority": 5}, "the integer value of priority (5) must not be provided in pod spec; priority "
                                 "admission controller computed 0 from the given PriorityClass name"),
        ("other", {"priorityClassName": "high", "priority": 10},
         "the integer value of priority (10) must not be provided in pod spec; priority admission controller "
         "computed 1000 from the given PriorityClass name"),
        ("never", {"priorityClassName": "high", "preemptionPolicy": "Never"},
         "the string value of PreemptionPolicy (Never) must not be provided in pod spec; priority admission "
         "controller computed PreemptLowerPriority from the given PriorityClass name"),
    ]
    for name, spec, why in cases:
        manifest = tmp_path / f"{name}.json"
        manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
            "containers": [{"name": "c", "image": "busybox"}], **spec}}))
        refused = cluster.kubectl("create", "--validate=false", "-f", str(manifest))
        assert refused.returncode != 0, name
        assert refused.stderr.strip() == f'Error from server (Forbidden): error when creating "{manifest}": pods ' \
                                         f'"{name}" is forbidden: {why}', refused.stderr
    assert cluster.core.list_namespaced_pod("default").items == []
    # generateName: the refusal names the prefix, as admission.NewForbidden does
    assert _refusal(lambda: cluster.core.create_namespaced_pod("default", {
        "metadata": {"generateName": "gen-"}, "spec": {"containers": [{"name": "c"}], "priorityClassName": "x"}})) \
        == (403, 'pods "gen-" is forbidden: no PriorityClass with name x was found')


def test_only_one_class_is_the_global_default(cluster):
    cluster.priority_class("first", 1, globalDefault=True)
    refused = cluster.kubectl("create", "priorityclass", "second", "--value=2", "--global-default")
    assert refused.returncode != 0
    assert refused.stderr.strip() == ('error: failed to create priorityclass: priorityclasses.scheduling.k8s.io '
                                      '"second" is forbidden: PriorityClass first is already marked as default. '
                                      'Only one default can exist'), refused.stderr
    cluster.priority_class("third", 3)
    assert _refusal(lambda: cluster.scheduling.patch_priority_class("third", {"globalDefault": True})) == (
        403, 'priorityclasses.scheduling.k8s.io "third" is forbidden: PriorityClass first is already marked as '
             "default. Only one default can exist")
    # the default itself may be updated; once it is not the default, another may become it
    cluster.scheduling.patch_priority_class("first", {"description": "still the default"})
    cluster.scheduling.patch_priority_class("first", {"globalDefault": False})
    assert cluster.scheduling.patch_priority_class("third", {"globalDefault": True}).global_default is True


@pytest.mark.parametrize("args, why", [
    (["toolarge", "--value=1000000001"],
     "value: Forbidden: maximum allowed value of a user defined priority is 1000000000"),
    (["system-mine", "--value=1"], "metadata.name: Forbidden: priority class names with 'system-' prefix are "
                                   "reserved for system use only. error: system-mine is not a known system priority "
                                   "class"),
    (["Upper", "--value=1"], 'metadata.name: Invalid value: "Upper": a lowercase RFC 1123 subdomain must consist of '
                             "lower case alphanumeric characters, '-' or '.', and must start and end with an "
                             "alphanumeric character (e.g. 'example.com', regex used for validation is "
                             r"'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"),
    (["sometimes", "--value=1", "--preemption-policy=Sometimes"],
     'preemptionPolicy: Unsupported value: "Sometimes": supported values: "PreemptLowerPriority", "Never"'),
], ids=["value", "system-prefix", "name", "policy"])
def test_kubectl_prints_the_validation_errors(cluster, args, why):
    refused = cluster.kubectl("create", "priorityclass", *args)
    assert refused.returncode != 0
    assert refused.stderr.strip() == ("error: failed to create priorityclass: PriorityClass.scheduling.k8s.io "
                                      f'"{args[0]}" is invalid: {why}'), refused.stderr
    assert {pc.metadata.name for pc in cluster.scheduling.list_priority_class().items} == set(SYSTEM)


def test_value_and_preemption_policy_are_immutable(cluster):
    cluster.priority_class("fixed", 7)
    code, message = _refusal(lambda: cluster.scheduling.patch_priority_class(
        "fixed", {"value": 8, "preemptionPolicy": "Never"}))
    assert (code, message) == (422, 'PriorityClass.scheduling.k8s.io "fixed" is invalid: [value: Forbidden: may not '
                                    'be changed in an update., preemptionPolicy: Invalid value: "Never": field is '
                                    "immutable]")
    assert cluster.scheduling.patch_priority_class("fixed", {"description": "d"}).description == "d"
    # a value beyond int32 is refused by the decoder, before validation
    assert _refusal(lambda: cluster.priority_class("huge", 2**31)) == (
        400, 'PriorityClass in version "v1" cannot be handled as a PriorityClass: json: cannot unmarshal number '
             "2147483648 into Go struct field PriorityClass.value of type int32")


def test_the_system_classes_cannot_be_deleted_and_are_created_once(cluster, tmp_path: Path):
    refused = cluster.kubectl("delete", "priorityclass", "system-node-critical")
    assert refused.returncode != 0
    assert refused.stderr.strip() == ('Error from server (Forbidden): priorityclasses.scheduling.k8s.io '
                                      '"system-node-critical" is forbidden: this is a system priority class and '
                                      "cannot be deleted"), refused.stderr
    cluster.priority_class("mine", 1)
    assert cluster.kubectl("delete", "priorityclass", "mine").returncode == 0
    store = Store(tmp_path / "state.json")
    uids = {pc["metadata"]["name"]: pc["metadata"]["uid"]
            for pc in store.list("scheduling.k8s.io/v1/priorityclasses")[0]}
    store.close()
    again = Store(tmp_path / "state.json")  # a restart finds them stored and creates nothing
    assert {pc["metadata"]["name"]: pc["metadata"]["uid"]
            for pc in again.list("scheduling.k8s.io/v1/priorityclasses")[0]} == uids
    assert set(uids) == set(SYSTEM)
    again.close()


def test_an_update_keeps_the_priority_it_leaves_out(cluster):
    cluster.priority_class("kept", 42, preemptionPolicy="Never")
    pod = cluster.pod("p", priorityClassName="kept")
    del pod["spec"]["priority"], pod["spec"]["preemptionPolicy"]
    pod["metadata"]["labels"] = {"updated": "yes"}
    cluster.core.replace_namespaced_pod("p", "default", pod)
    stored = cluster.core.read_namespaced_pod("p", "default")
    assert (stored.metadata.labels, stored.spec.priority, stored.spec.preemption_policy) == \
        ({"updated": "yes"}, 42, "Never")


def test_validating_admission_policies_see_the_resolved_priority(cluster):
    """Priority mutates before the validating plugins (AllOrderedPlugins): a policy reads spec.priority."""
    cluster.priority_class("low", 1)
    cluster.custom.create_cluster_custom_object("admissionregistration.k8s.io", "v1",
                                                POLICY_PLURALS["ValidatingAdmissionPolicy"], {
        "metadata": {"name": "no-low"},
        "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                         "operations": ["CREATE"], "resources": ["pods"]}]},
                 "validations": [{"expression": "object.spec.priority >= 10", "message": "priority too low"}]}})
    cluster.custom.create_cluster_custom_object("admissionregistration.k8s.io", "v1",
                                                POLICY_PLURALS["ValidatingAdmissionPolicyBinding"], {
        "metadata": {"name": "no-low"}, "spec": {"policyName": "no-low", "validationActions": ["Deny"]}})
    code, message = _refusal(lambda: cluster.pod("low", priorityClassName="low"))
    assert code == 422 and message.endswith("denied request: priority too low"), message
    assert _resolved(cluster.pod("critical", priorityClassName="system-cluster-critical"))[1] == 2000000000
