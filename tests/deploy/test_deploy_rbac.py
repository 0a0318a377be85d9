"""Least privilege: each component's roles grant exactly the calls its code makes (the tables below) and
nothing more; bindings point at existing roles and at the ServiceAccounts the workloads run as."""

import pytest
from deploy_helpers import NAMESPACE, find, load_manifests

# (apiGroup, resource, verb) each component needs, and why.
EXTENDER = {
    ("", "nodes", "get"), ("", "nodes", "list"), ("", "nodes", "watch"),  # inventory annotations, allocatable
    ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"),  # the usage ledger
    ("", "pods", "patch"),  # bind-phase / assignment annotations
    ("", "pods/binding", "create"),  # bindVerb
    ("", "events", "create"), ("events.k8s.io", "events", "create"),  # reasons for refused pods
}
EXTENDER_LEASES = {  # namespaced Role: the extender's and kube-scheduler's leader election
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "update"),
}
DEVICE_PLUGIN = {
    ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"),  # its node's pods (fieldSelector)
    ("", "pods", "patch"),  # bind-phase success / failed
    ("", "nodes", "get"), ("", "nodes", "patch"),  # register annotation, GPU labels
    ("", "events", "create"), ("events.k8s.io", "events", "create"),  # allocation failures, unhealthy GPUs
}
EXPECTED_ROLES = {
    ("ClusterRole", "vgpu-scheduler-extender"): EXTENDER,
    ("Role", "vgpu-scheduler-leases"): EXTENDER_LEASES,
    ("ClusterRole", "vgpu-device-plugin"): DEVICE_PLUGIN,
}
# Built-in roles the upstream kube-scheduler is written against, bound to the scheduler's ServiceAccount.
EXPECTED_BUILTIN_BINDINGS = {
    ("ClusterRoleBinding", None, "ClusterRole", "system:kube-scheduler"),
    ("ClusterRoleBinding", None, "ClusterRole", "system:volume-scheduler"),
    ("RoleBinding", "kube-system", "Role", "extension-apiserver-authentication-reader"),
}
SERVICE_ACCOUNTS = {"vgpu-scheduler", "vgpu-device-plugin"}

MANIFESTS = [m.doc for m in load_manifests()]


def grants(role: dict) -> set[tuple[str, str, str]]:
    """The (apiGroup, resource, verb) triples a Role or ClusterRole grants."""
    out = set()
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return out


@pytest.mark.parametrize("kind, name", sorted(EXPECTED_ROLES))
def test_role_grants_exactly_the_table(kind, name):
    granted = grants(find(kind, name))
    expected = EXPECTED_ROLES[(kind, name)]
    assert granted - expected == set(), f"{kind}/{name} grants more than needed"
    assert expected - granted == set(), f"{kind}/{name} misses calls the code makes"


def test_no_other_roles_and_no_wildcards():
    roles = {(d["kind"], d["metadata"]["name"]) for d in MANIFESTS if d["kind"] in ("Role", "ClusterRole")}
    assert roles == set(EXPECTED_ROLES)
    for d in MANIFESTS:
        for rule in d.get("rules", []):
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], (d["metadata"]["name"], rule)
            assert "nonResourceURLs" not in rule


def test_leases_only_in_our_namespace():
    for d in MANIFESTS:
        if d["kind"] == "ClusterRole":
            assert not any(r[1] == "leases" for r in grants(d)), d["metadata"]["name"]
    assert find("Role", "vgpu-scheduler-leases")["metadata"]["namespace"] == NAMESPACE


def test_bindings_reference_our_roles_or_the_expected_builtins():
    ours = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in MANIFESTS}
    builtin = set()
    for d in MANIFESTS:
        if d["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ref = d["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        namespace = d["metadata"].get("namespace") if ref["kind"] == "Role" else None
        if (ref["kind"], namespace, ref["name"]) not in ours:
            builtin.add((d["kind"], d["metadata"].get("namespace"), ref["kind"], ref["name"]))
            for subject in d["subjects"]:
                assert subject["name"] == "vgpu-scheduler", d["metadata"]["name"]
        for subject in d["subjects"]:
            assert subject["kind"] == "ServiceAccount"
            assert (subject["namespace"], subject["name"]) in {(NAMESPACE, sa) for sa in SERVICE_ACCOUNTS}
    assert builtin == EXPECTED_BUILTIN_BINDINGS


@pytest.mark.parametrize(
    "role, service_account",
    [
        (("ClusterRole", "vgpu-scheduler-extender"), "vgpu-scheduler"),
        (("Role", "vgpu-scheduler-leases"), "vgpu-scheduler"),
        (("ClusterRole", "vgpu-device-plugin"), "vgpu-device-plugin"),
    ],
)
def test_each_role_is_bound_to_its_component_only(role, service_account):
    subjects = [
        s["name"]
        for d in MANIFESTS
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding") and (d["roleRef"]["kind"], d["roleRef"]["name"]) == role
        for s in d["subjects"]
    ]
    assert subjects == [service_account]


def test_workloads_run_as_their_service_accounts():
    expected = {
        "vgpu-scheduler": "vgpu-scheduler",
        "vgpu-device-plugin": "vgpu-device-plugin",
        "vgpu-device-plugin-sim": "vgpu-device-plugin",
    }
    actual = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]["serviceAccountName"]
        for d in MANIFESTS
        if d["kind"] in ("Deployment", "DaemonSet")
    }
    assert actual == expected
    assert {d["metadata"]["name"] for d in MANIFESTS if d["kind"] == "ServiceAccount"} == SERVICE_ACCOUNTS
