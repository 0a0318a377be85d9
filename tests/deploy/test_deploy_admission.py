"""The ValidatingAdmissionPolicies of deploy/admission/, evaluated with a real CEL implementation (admission_helpers).

The writes the shipped components made in a scheduling round (cluster_scenario) are replayed through the policies:
admitted under their own identities, refused under a tenant's. Crafted requests cover the rest: pods created
with assignment annotations or with spec.nodeName, tenants changing annotations, the device plugin outside its
node or outside its keys.
"""

import orjson
import pytest
from admission_helpers import TENANT, Review, User, denials, policies, service_account
from cluster_scenario import ADMIN, NODE
from deploy_helpers import load_manifests

from vgpu import grants, keys
from vgpu.resources import HAMI_NAMES, ResourceNames
from vgpu.testbed.apiserver import merge_patch

ASSIGNMENT = "vgpu-sharing-assignment-annotations"
PLACEMENT = "vgpu-sharing-scheduled-placement"
OWN_NODE = "vgpu-sharing-device-plugin-own-node"
KEYS = (keys.VGPU_IDS, keys.DEVICES_TO_ALLOCATE, keys.VGPU_NODE, keys.BIND_PHASE, keys.BIND_TIME, keys.VGPU_TIME,
        grants.SIGNATURE)
PLUGIN_KEYS = (keys.BIND_PHASE, keys.DEVICES_TO_ALLOCATE, keys.VGPU_TIME)  # deviceplugin/allocator.py
EXTENDER = service_account("vgpu-scheduler-extender")
KUBE_SCHEDULER = service_account("vgpu-kube-scheduler")
KUBELET = User(f"system:node:{NODE}", ("system:nodes", "system:authenticated"))


def plugin(node: str | None = NODE):
    """The device plugin with a pod-bound token of a pod on `node` (None: a token without the node claim)."""
    return service_account("vgpu-device-plugin", node)


def pod(annotations=None, node_name=None, limits=None, requests=None, init=False):
    """A pod with one container (an init container with `init`) asking for these resources."""
    container = {"name": "c", "image": "cuda", "resources": {}}
    if limits:
        container["resources"]["limits"] = limits
    if requests:
        container["resources"]["requests"] = requests
    spec = {"schedulerName": "vgpu-scheduler", "containers": [{"name": "main", "image": "cuda"}]}
    if init:
        spec["initContainers"] = [container]
    else:
        spec["containers"].append(container)
    if node_name:
        spec["nodeName"] = node_name
    meta = {"name": "p", "namespace": "default", "uid": "0b6c2d9e-7f5b-4c5e-9a43-3c1e0e6b8d11"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


# a pod's annotations right after the extender bound it
GRANT = "GPU-a,NVIDIA,2000,30:"
BOUND = {keys.VGPU_NODE: NODE, keys.VGPU_IDS: GRANT, keys.DEVICES_TO_ALLOCATE: GRANT,
         keys.VGPU_TIME: "1784884863", keys.BIND_TIME: "1784884863", keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING,
         grants.SIGNATURE: "v1:00"}


# ------------------------------------------------------------------------------------------- the manifests

def test_every_policy_is_bound_to_deny_and_fails_closed():
    docs = [m.doc for m in load_manifests() if m.doc["apiVersion"] == "admissionregistration.k8s.io/v1"]
    shipped = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert set(shipped) == {ASSIGNMENT, PLACEMENT, OWN_NODE} == set(policies())
    assert sorted(b["spec"]["policyName"] for b in bindings) == sorted(shipped)
    for binding in bindings:
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert "paramRef" not in binding["spec"] and "matchResources" not in binding["spec"]
    for policy in shipped.values():
        assert policy["spec"]["failurePolicy"] == "Fail"


def test_the_policies_name_the_codes_keys_resources_and_service_accounts():
    accounts = {m.doc["metadata"]["name"] for m in load_manifests() if m.doc["kind"] == "ServiceAccount"}
    assignment = policies()[ASSIGNMENT]
    assert assignment.constant("keys") == list(KEYS)
    assert assignment.constant("pluginKeys") == list(PLUGIN_KEYS)
    assert assignment.constant("schedulers") == [EXTENDER.username]
    assert assignment.constant("devicePlugin") == plugin().username
    assert {u.rsplit(":", 1)[1] for u in (EXTENDER.username, plugin().username)} <= accounts
    assert policies()[PLACEMENT].constant("resources") == [
        *ResourceNames().all(), HAMI_NAMES.memory, HAMI_NAMES.memory_percentage, HAMI_NAMES.cores]


# ------------------------------------------------------------------------------ the round's writes, replayed

def writes(cluster_round, token_or_account, method, resource):
    """(target name, body) of the requests of one component (or of the test's token) by method and resource."""
    requests = (cluster_round.apiserver.requests(token_or_account) if token_or_account == ADMIN
                else cluster_round.requests(token_or_account))
    found = [(r.attributes.name, orjson.loads(r.body)) for r in requests
             if r.method == method and r.attributes.resource == resource]
    assert found, (token_or_account, method, resource)
    return found


def test_the_extenders_bindings_are_admitted_and_nobody_elses(cluster_round):
    for _, binding in writes(cluster_round, "vgpu-scheduler-extender", "POST", "pods/binding"):
        annotations = binding["metadata"]["annotations"]
        assert set(annotations) == set(KEYS)
        # signed with the key the Deployment mounts from the Secret vgpu-grant-key
        assert cluster_round.key.verify(annotations[grants.SIGNATURE], binding["metadata"]["uid"],
                             binding["target"]["name"], annotations[keys.VGPU_IDS])
        review = Review("CREATE", "pods/binding", binding, EXTENDER)
        assert denials(review) == {}
        for other in (TENANT, KUBE_SCHEDULER, plugin()):
            assert set(denials(Review("CREATE", "pods/binding", binding, other))) == {ASSIGNMENT}


def test_the_device_plugins_pod_patch_is_admitted_on_its_own_node_only(cluster_round):
    ((name, patch),) = writes(cluster_round, "vgpu-device-plugin", "PATCH", "pods")
    assert name == cluster_round.bound["metadata"]["name"] == cluster_round.admitted["metadata"]["name"]
    assert set(patch["metadata"]["annotations"]) <= set(PLUGIN_KEYS)
    before, after = cluster_round.bound, cluster_round.admitted
    assert before["metadata"]["annotations"] != after["metadata"]["annotations"]
    assert denials(Review("UPDATE", "pods", after, plugin(), before)) == {}
    assert set(denials(Review("UPDATE", "pods", after, plugin("gpu-node-2"), before))) == {OWN_NODE}
    assert set(denials(Review("UPDATE", "pods", after, plugin(None), before))) == {OWN_NODE}
    assert set(denials(Review("UPDATE", "pods", after, TENANT, before))) == {ASSIGNMENT}


def test_the_device_plugins_node_patches_are_admitted_on_its_own_node_only(cluster_round):
    for name, patch in writes(cluster_round, "vgpu-device-plugin", "PATCH", "nodes"):
        before = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        after = merge_patch(before, patch)
        assert denials(Review("UPDATE", "nodes", after, plugin(name), before)) == {}
        assert set(denials(Review("UPDATE", "nodes", after, plugin("gpu-node-2"), before))) == {OWN_NODE}
        assert set(denials(Review("UPDATE", "nodes", after, plugin(None), before))) == {OWN_NODE}


def test_the_forged_pod_of_the_round_is_refused_at_creation(cluster_round):
    created = {body["metadata"]["name"]: body for _, body in writes(cluster_round, ADMIN, "POST", "pods")}
    forged = created["forged"]
    assert set(denials(Review("CREATE", "pods", forged, TENANT))) == {ASSIGNMENT, PLACEMENT}
    assert denials(Review("CREATE", "pods", created["placed"], TENANT)) == {}


# -------------------------------------------------------------------------------------------- crafted requests

@pytest.mark.parametrize("key", KEYS)
def test_nobody_creates_a_pod_with_an_assignment_annotation(key):
    for user in (TENANT, EXTENDER, plugin()):
        assert set(denials(Review("CREATE", "pods", pod({key: BOUND[key]}), user))) == {ASSIGNMENT}


def test_pods_without_assignment_annotations_are_created_as_before():
    assert denials(Review("CREATE", "pods", pod(), TENANT)) == {}  # no metadata.annotations at all
    assert denials(Review("CREATE", "pods", pod({"team": "a"}, limits={"cpu": "1"}), TENANT)) == {}
    assert denials(Review("CREATE", "pods/binding", {"metadata": {"name": "p"}, "target": {"name": NODE}},
                          KUBE_SCHEDULER)) == {}


@pytest.mark.parametrize("resource", ResourceNames().all())
@pytest.mark.parametrize("where", ["limits", "requests", "init limits"])
def test_a_vgpu_pod_cannot_skip_the_scheduler(resource, where):
    asks = {resource: "1"}
    kwargs = {"requests": asks} if where == "requests" else {"limits": asks}
    placed = pod(node_name=NODE, init=where.startswith("init"), **kwargs)
    assert set(denials(Review("CREATE", "pods", placed, TENANT))) == {PLACEMENT}
    assert denials(Review("CREATE", "pods", pod(init=where.startswith("init"), **kwargs), TENANT)) == {}


def test_other_pods_may_still_name_their_node():
    assert denials(Review("CREATE", "pods", pod(node_name=NODE, limits={"nvidia.com/gpu": "1"}), TENANT)) == {}


@pytest.mark.parametrize("key", KEYS)
def test_a_tenant_cannot_set_change_or_remove_an_assignment_annotation(key):
    before = pod(dict(BOUND), node_name=NODE)
    changed = {**BOUND, key: BOUND[key] + "0"}
    removed = {k: v for k, v in BOUND.items() if k != key}
    for annotations in (changed, removed):
        for resource in ("pods", "pods/status"):
            after = pod(annotations, node_name=NODE)
            assert set(denials(Review("UPDATE", resource, after, TENANT, before))) == {ASSIGNMENT}
    unassigned = pod({}, node_name=NODE)
    set_now = pod({key: BOUND[key]}, node_name=NODE)
    assert set(denials(Review("UPDATE", "pods", set_now, TENANT, unassigned))) == {ASSIGNMENT}


def test_updates_that_leave_the_assignment_alone_are_admitted():
    before = pod(dict(BOUND), node_name=NODE)
    relabelled = pod({**BOUND, "team": "b"}, node_name=NODE)
    assert denials(Review("UPDATE", "pods", relabelled, TENANT, before)) == {}
    status = merge_patch(before, {"status": {"phase": "Running"}})
    assert denials(Review("UPDATE", "pods/status", status, KUBELET, before)) == {}
    assert denials(Review("UPDATE", "pods", pod(), TENANT, pod())) == {}


@pytest.mark.parametrize("key", sorted(set(KEYS) - set(PLUGIN_KEYS)))
def test_the_device_plugin_changes_only_its_own_keys(key):
    before = pod(dict(BOUND), node_name=NODE)
    after = pod({**BOUND, key: BOUND[key] + "0"}, node_name=NODE)
    assert set(denials(Review("UPDATE", "pods", after, plugin(), before))) == {ASSIGNMENT}


def test_the_device_plugin_cannot_touch_pods_of_another_node():
    before = pod(dict(BOUND), node_name="gpu-node-2")
    after = pod({**BOUND, keys.BIND_PHASE: keys.BIND_PHASE_SUCCESS}, node_name="gpu-node-2")
    assert set(denials(Review("UPDATE", "pods", after, plugin(), before))) == {OWN_NODE}
    assert denials(Review("UPDATE", "pods", after, plugin("gpu-node-2"), before)) == {}
