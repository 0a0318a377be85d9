"""Least privilege: the RBAC rules of deploy/ against the API calls the shipped components make.

The extender and the device plugin run from their manifests through one scheduling round (cluster_scenario), each
with a bearer token of its own; the API-server stand-in records every request and translates it into what
kube-apiserver's authorizer is asked. Every call must be allowed by the rules bound to that component's
ServiceAccount, and every grant of those rules must be used by some call. The built-in roles bound to
kube-scheduler are upstream's and out of this comparison; its own Lease role is checked against its configuration.
The consolidation controller, which only the chart makes, is compared the same way with the chart's rules for it,
running from the chart's Deployment through one move.
"""

from dataclasses import dataclass

import pytest
import yaml
from cluster_scenario import CONSOLIDATE
from deploy_helpers import NAMESPACE, find, load_manifests

from vgpu.testbed.apiserver import RequestAttributes, request_attributes

MANIFESTS = [m.doc for m in load_manifests()]
COMPONENTS = ("vgpu-scheduler-extender", "vgpu-device-plugin")
KUBE_SCHEDULER = "vgpu-kube-scheduler"
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
# Built-in roles the upstream kube-scheduler is written against: (binding kind, binding namespace, role kind, role).
BUILTIN_BINDINGS = {
    ("ClusterRoleBinding", None, "ClusterRole", "system:kube-scheduler"),
    ("ClusterRoleBinding", None, "ClusterRole", "system:volume-scheduler"),
    ("RoleBinding", "kube-system", "Role", "extension-apiserver-authentication-reader"),
}


@dataclass(frozen=True)
class Grant:
    """One verb on one resource that a role grants through one binding."""

    role: str
    namespace: str | None  # None: cluster-wide (a ClusterRoleBinding)
    api_group: str
    resource: str
    verb: str
    names: tuple[str, ...]  # resourceNames; empty: any

    def allows(self, call: RequestAttributes) -> bool:
        """Whether RBAC lets this grant authorize `call`."""
        return ((self.namespace is None or call.namespace == self.namespace) and call.api_group == self.api_group
                and call.resource == self.resource and call.verb == self.verb
                and (not self.names or call.name in self.names))


def our_role(kind: str, name: str, namespace: str | None, manifests: list[dict] = MANIFESTS) -> dict | None:
    """The Role or ClusterRole of deploy/ (or of `manifests`) that a binding refers to, or None (a built-in role)."""
    for doc in manifests:
        if (doc["kind"], doc["metadata"]["name"]) == (kind, name) and \
                (kind == "ClusterRole" or doc["metadata"].get("namespace") == namespace):
            return doc
    return None


def bindings_of(service_account: str, manifests: list[dict] = MANIFESTS) -> list[dict]:
    """The RoleBindings and ClusterRoleBindings of deploy/ (or of `manifests`) whose subjects include
    `service_account`."""
    return [d for d in manifests if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
            and {"kind": "ServiceAccount", "name": service_account, "namespace": NAMESPACE} in d["subjects"]]


def grants_of_role(role: dict, namespace: str | None = None) -> list[Grant]:
    """The grants of a role, bound in `namespace` (None: cluster-wide)."""
    label = f"{role['kind']}/{role['metadata']['name']}"
    return [Grant(label, namespace, group, resource, verb, tuple(rule.get("resourceNames", ())))
            for rule in role["rules"] for group in rule["apiGroups"] for resource in rule["resources"]
            for verb in rule["verbs"]]


def grants_of(service_account: str, manifests: list[dict] = MANIFESTS) -> list[Grant]:
    """Every grant of our roles bound to `service_account` (in deploy/, or in `manifests`)."""
    out = []
    for binding in bindings_of(service_account, manifests):
        namespace = binding["metadata"].get("namespace")
        role = our_role(binding["roleRef"]["kind"], binding["roleRef"]["name"], namespace, manifests)
        if role is not None:
            out += grants_of_role(role, namespace)
    return out


@pytest.mark.parametrize("service_account", COMPONENTS)
def test_every_call_is_allowed(cluster_round, service_account):
    calls = [r.attributes for r in cluster_round.requests(service_account)]
    assert calls, f"{service_account} made no API call"
    grants = grants_of(service_account)
    refused = sorted({c for c in calls if not any(g.allows(c) for g in grants)}, key=repr)
    assert not refused, f"{service_account} calls what its RBAC does not allow: {refused}"


@pytest.mark.parametrize("service_account", COMPONENTS)
def test_every_grant_is_used(cluster_round, service_account):
    calls = {r.attributes for r in cluster_round.requests(service_account)}
    unused = [g for g in grants_of(service_account) if not any(g.allows(c) for c in calls)]
    assert not unused, f"{service_account} is granted what its code never calls: {unused}"


def test_every_call_of_the_consolidation_controller_is_allowed(consolidation_round):
    calls = [r.attributes for r in consolidation_round.requests()]
    assert calls, "the consolidation controller made no API call"
    grants = grants_of(CONSOLIDATE, consolidation_round.manifests)
    refused = sorted({c for c in calls if not any(g.allows(c) for g in grants)}, key=repr)
    assert not refused, f"the consolidation controller calls what its RBAC does not allow: {refused}"


def test_every_grant_of_the_consolidation_controller_is_used(consolidation_round):
    calls = {r.attributes for r in consolidation_round.requests()}
    grants = grants_of(CONSOLIDATE, consolidation_round.manifests)
    assert {g.role for g in grants} == {"ClusterRole/vgpu-consolidate", "Role/vgpu-consolidate-lease"}
    unused = [g for g in grants if not any(g.allows(c) for c in calls)]
    assert not unused, f"the consolidation controller is granted what its code never calls: {unused}"


@pytest.mark.parametrize("method, target, expected", [
    ("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1", ("list", "", "pods", "", "")),
    ("GET", "/api/v1/pods?watch=true&resourceVersion=5", ("watch", "", "pods", "", "")),
    ("GET", "/api/v1/watch/namespaces/ns/pods", ("watch", "", "pods", "ns", "")),
    ("GET", "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Dp", ("list", "", "pods", "ns", "p")),
    ("GET", "/api/v1/namespaces/ns/pods/p", ("get", "", "pods", "ns", "p")),
    ("PATCH", "/api/v1/nodes/n1", ("patch", "", "nodes", "", "n1")),
    ("POST", "/api/v1/namespaces/ns/pods/p/binding", ("create", "", "pods/binding", "ns", "p")),
    ("PUT", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l",
     ("update", "coordination.k8s.io", "leases", "ns", "l")),
    ("POST", "/apis/events.k8s.io/v1/namespaces/ns/events", ("create", "events.k8s.io", "events", "ns", "")),
    ("DELETE", "/api/v1/namespaces/ns/pods", ("deletecollection", "", "pods", "ns", "")),
    ("GET", "/api/v1/namespaces/ns", ("get", "", "namespaces", "ns", "ns")),
    ("GET", "/version", ("get", "", "", "", "")),
])
def test_requests_are_authorized_as_kube_apiserver_does(method, target, expected):
    a = request_attributes(method, target)
    assert (a.verb, a.api_group, a.resource, a.namespace, a.name) == expected


def test_no_wildcards_and_no_non_resource_urls():
    for d in MANIFESTS:
        for rule in d.get("rules", []):
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], (d["metadata"]["name"], rule)
            assert "nonResourceURLs" not in rule


def test_leases_only_in_our_namespace():
    for d in MANIFESTS:
        if d["kind"] == "ClusterRole":
            assert not any(r.resource == "leases" for r in grants_of_role(d)), d["metadata"]["name"]
        if d["kind"] == "Role" and any(r.resource == "leases" for r in grants_of_role(d)):
            assert d["metadata"]["namespace"] == NAMESPACE


def test_bindings_reference_our_roles_or_kube_schedulers_builtins():
    builtin = set()
    for d in MANIFESTS:
        if d["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ref = d["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        (subject,) = d["subjects"]
        assert subject["kind"] == "ServiceAccount" and subject["namespace"] == NAMESPACE
        assert subject["name"] in (*COMPONENTS, KUBE_SCHEDULER)
        if our_role(ref["kind"], ref["name"], d["metadata"].get("namespace")) is None:
            builtin.add((d["kind"], d["metadata"].get("namespace"), ref["kind"], ref["name"]))
            assert subject["name"] == KUBE_SCHEDULER, d["metadata"]["name"]
    assert builtin == BUILTIN_BINDINGS


def test_every_role_is_bound_to_exactly_one_service_account():
    for role in (d for d in MANIFESTS if d["kind"] in ("Role", "ClusterRole")):
        refs = [d for d in MANIFESTS if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
                and (d["roleRef"]["kind"], d["roleRef"]["name"]) == (role["kind"], role["metadata"]["name"])]
        assert len(refs) == 1 and len(refs[0]["subjects"]) == 1, role["metadata"]["name"]


def test_kube_schedulers_lease_role_names_its_configured_lease():
    config = yaml.safe_load(find("ConfigMap", "vgpu-scheduler-config")["data"]["config.yaml"])["leaderElection"]
    granted = grants_of(KUBE_SCHEDULER)  # our roles only; everything else comes from the built-in ones
    assert {(g.namespace, g.api_group, g.resource, g.verb, g.names) for g in granted} == {
        (config["resourceNamespace"], "coordination.k8s.io", "leases", verb, (config["resourceName"],))
        for verb in ("get", "update")
    }


def test_service_accounts_and_workloads():
    accounts = {d["metadata"]["name"]: d for d in MANIFESTS if d["kind"] == "ServiceAccount"}
    assert set(accounts) == {*COMPONENTS, KUBE_SCHEDULER}
    pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in MANIFESTS
            if d["kind"] in ("Deployment", "DaemonSet")}
    assert {name: pod["serviceAccountName"] for name, pod in pods.items()} == {
        "vgpu-scheduler": "vgpu-scheduler-extender",
        "vgpu-device-plugin": "vgpu-device-plugin",
        "vgpu-device-plugin-sim": "vgpu-device-plugin",
    }


def token_volumes() -> dict[str, dict]:
    """Container name -> the volume it mounts at the ServiceAccount token path, in the scheduler pod."""
    pod = find("Deployment", "vgpu-scheduler")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {c["name"]: volumes[m["name"]] for c in pod["containers"] for m in c["volumeMounts"]
            if m["mountPath"] == TOKEN_PATH and m.get("readOnly")}


def test_each_scheduler_container_has_its_own_identity():
    pod = find("Deployment", "vgpu-scheduler")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False  # no container gets the pod's token by default
    volumes = token_volumes()
    assert set(volumes) == {"kube-scheduler", "extender"}
    # the extender: what the ServiceAccount admission plugin would mount, a pod-bound token of the pod's account
    sources = volumes["extender"]["projected"]["sources"]
    assert [next(iter(s)) for s in sources] == ["serviceAccountToken", "configMap", "downwardAPI"]
    assert sources[0]["serviceAccountToken"]["path"] == "token"
    assert sources[0]["serviceAccountToken"]["expirationSeconds"] <= 3600
    assert sources[1]["configMap"] == {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert sources[2]["downwardAPI"]["items"] == [
        {"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]
    # kube-scheduler: the token Secret of its own account (the token controller fills token, ca.crt, namespace)
    secret = find("Secret", volumes["kube-scheduler"]["secret"]["secretName"])
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"] == {"kubernetes.io/service-account.name": KUBE_SCHEDULER}
    assert "items" not in volumes["kube-scheduler"]["secret"]
