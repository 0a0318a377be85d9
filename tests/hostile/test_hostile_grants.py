"""A tenant writes its own assignment: the device plugin (a real process, answering the kubelet stand-in over
gRPC) serves only grants within the container's own spec, of its own scheduler, signed when a key is configured,
and never lets the spec switch the isolation library off or override the limits it hands out.

Each attack runs twice (admission_roles.py).  Without deploy/'s admission policies the tenant creates its pods
directly on the node (`nodeName` set), annotated as if a scheduler had bound them, and the plugin's refusal ends
kubelet's admission with its reason.  With them, the API server already refuses the tenant's pod (or its edit);
pods the tests need placed are then created by the tenant and bound by our scheduler with their assignment, as a
real placement is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pytest
from admission_roles import MODES, Roles, enforce_policies
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from dp_helpers import NODE, PluginBed, gpu_container
from kubernetes import client as k8s

from vgpu import grants, keys
from vgpu.kube.client import make_api_client, read_json
from vgpu.testbed.kubelet import AdmissionError

T4_UNITS = 15360  # memory units of a simulated T4 at factor 1


@pytest.fixture(params=MODES)
def node(request: pytest.FixtureRequest, tmp_path: Path):
    """One node (API-server stand-in, kubelet stand-in, the real plugin), with or without the admission policies."""
    bed = PluginBed(tmp_path)
    try:
        if request.param == "with-policies":
            paths = enforce_policies(bed.apiserver, tmp_path, "standin", NODE)
            bed.kubeconfig = paths["plugin"]  # the plugin runs as its ServiceAccount, bound to a pod on NODE
            bed.roles = Roles(True, k8s.CoreV1Api(make_api_client(paths["tenant"])),
                              make_api_client(paths["scheduler"]))
        else:
            bed.roles = Roles(False, bed.core, bed.api)
        yield bed
    finally:
        bed.close()


def _assignment(assignment: str, annotations: dict[str, str] | None) -> dict[str, str]:
    return {keys.VGPU_NODE: NODE, keys.VGPU_IDS: assignment, keys.DEVICES_TO_ALLOCATE: assignment,
            keys.BIND_TIME: "1784884863", keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING, **(annotations or {})}


def _make(node: PluginBed, name: str, containers: list[dict[str, Any]], assignment: str,
          scheduler: str | None = "vgpu-scheduler", namespace: str = "default",
          annotations: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The tenant creates a pod on the node with an assignment it wrote itself: the pod, or None where the
    admission policies refused it (which they must)."""
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace, "annotations": _assignment(assignment, annotations)},
        "spec": {"nodeName": NODE, "containers": containers},
    }
    if scheduler is not None:
        body["spec"]["schedulerName"] = scheduler
    if node.roles.enforced:
        node.roles.refused(node.roles.tenant.create_namespaced_pod, namespace, body)
        return None
    return read_json(node.roles.tenant.create_namespaced_pod(namespace, body, _preload_content=False))


def _placed(node: PluginBed, name: str, containers: list[dict[str, Any]], assignment: str,
            namespace: str = "default", signer: grants.GrantKey | None = None) -> dict[str, Any]:
    """A pod of our scheduler with this assignment (signed by `signer` for its UID), as the plugin sees it after
    placement.  Without the policies the tenant writes the assignment (as `_make`) and the signature is added
    afterwards; with them the tenant creates the pod and our scheduler binds it with the signed assignment, as the
    extender's /bind does."""
    if not node.roles.enforced:
        pod = _make(node, name, containers, assignment, namespace=namespace)
        assert pod is not None
        if signer is None:
            return pod
        signature = signer.sign(pod["metadata"]["uid"], NODE, assignment)
        k8s.CoreV1Api(node.roles.scheduler).patch_namespaced_pod(
            name, namespace, {"metadata": {"annotations": {grants.SIGNATURE: signature}}})
        return node.pod(name, namespace)
    body = {"metadata": {"name": name, "namespace": namespace},
            "spec": {"schedulerName": "vgpu-scheduler", "containers": containers}}
    created = read_json(node.roles.tenant.create_namespaced_pod(namespace, body, _preload_content=False))
    uid = created["metadata"]["uid"]
    extra = {grants.SIGNATURE: signer.sign(uid, NODE, assignment)} if signer is not None else None
    binding = {"apiVersion": "v1", "kind": "Binding",
               "metadata": {"name": name, "namespace": namespace, "uid": uid,
                            "annotations": _assignment(assignment, extra)},
               "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}}
    k8s.CoreV1Api(node.roles.scheduler).create_namespaced_pod_binding(name, namespace, binding,
                                                                    _preload_content=False)
    return node.pod(name, namespace)


def _refused(node: PluginBed, pod: dict[str, Any] | None, why: str) -> None:
    """Refused: at the API server (`pod` None, with the policies) or by the plugin at kubelet's admission."""
    if pod is None:
        return
    with pytest.raises(AdmissionError, match="refuses") as caught:
        node.kubelet.admit(pod)
    assert why in str(caught.value), str(caught.value)


def _limits(admitted: Any) -> dict[str, str]:
    envs = admitted.responses["volcano.sh/vgpu-number"].envs
    return {k: v for k, v in envs.items() if k.startswith(("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT"))}


def test_a_grant_larger_than_the_spec_is_refused(node):
    """Spec: 1 unit and 1 %; self-written grant: the whole T4 at 100 %. Refused (before: Allocate returned
    CUDA_DEVICE_MEMORY_LIMIT_0=15360m and CUDA_DEVICE_SM_LIMIT=100)."""
    node.start_plugin("2xT4")
    a, _ = node.wait_inventory()
    pod = _make(node, "greedy", [gpu_container("main", 1, 1, 1)], f"{a},NVIDIA,{T4_UNITS},100:")
    _refused(node, pod, "the spec allows 1")


def test_more_gpus_than_vgpu_number_are_refused(node):
    """Spec: one GPU; grant: both GPUs of the node."""
    node.start_plugin("2xT4")
    a, b = node.wait_inventory()
    pod = _make(node, "hoarder", [gpu_container("main", 1, 1000, 10)], f"{a},NVIDIA,1000,10:{b},NVIDIA,1000,10:")
    _refused(node, pod, "2 GPUs granted, vgpu-number is 1")


@pytest.mark.parametrize("grant, why", [("0,0", "no memory granted"), ("0,1", "no memory granted"),
                                        ("100,0", "no cores limit granted")],
                         ids=["memory-and-cores-0", "memory-0", "cores-0"])
def test_a_zero_grant_never_turns_a_limit_off(node, grant, why):
    """Spec: 100 MiB and 1 %; self-written grant of 0 memory or 0 cores, which the library reads as "not limited":
    refused (before: admitted with CUDA_DEVICE_MEMORY_LIMIT_0=0m and CUDA_DEVICE_SM_LIMIT=0, and the container
    allocated the whole GPU)."""
    node.start_plugin("1xT4")
    (a,) = node.wait_inventory()
    pod = _make(node, "zero", [gpu_container("main", 1, 100, 1)], f"{a},NVIDIA,{grant}:")
    _refused(node, pod, why)


def test_a_zero_cores_grant_is_no_limit_only_for_a_spec_asking_no_cores(node):
    """Spec: 100 MiB, no cores: the grant's 0 cores is what the spec asks (no SM limit); the memory limit stays."""
    node.start_plugin("1xT4")
    (a,) = node.wait_inventory()
    pod = _placed(node, "nocores", [gpu_container("main", 1, 100)], f"{a},NVIDIA,100,0:")
    (admitted,) = node.kubelet.admit(pod)
    assert _limits(admitted)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "100m"


@pytest.mark.parametrize("scheduler", [None, "default-scheduler", "someone-else"])
def test_a_pod_of_another_scheduler_is_refused(node, scheduler):
    """Within its spec, but not placed by our scheduler: refused (before: served like any other)."""
    node.start_plugin("1xT4")
    (a,) = node.wait_inventory()
    pod = _make(node, "stranger", [gpu_container("main", 1, 1000, 10)], f"{a},NVIDIA,1000,10:", scheduler=scheduler)
    _refused(node, pod, "schedulerName")


def test_the_spec_cannot_override_the_limits_it_is_handed(node):
    """A container sets CUDA_DEVICE_MEMORY_LIMIT_0 and NVIDIA_VISIBLE_DEVICES in its own env, which kubelet would
    put after the plugin's (and the runtime would keep): refused."""
    node.start_plugin("1xT4")
    (a,) = node.wait_inventory()
    env = [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "15360m"},
           {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    pod = _placed(node, "overrider", [gpu_container("main", 1, 1000, 10, env=env)], f"{a},NVIDIA,1000,10:")
    _refused(node, pod, "CUDA_DEVICE_MEMORY_LIMIT_0, NVIDIA_VISIBLE_DEVICES")


@pytest.mark.parametrize("value", ["true", "false", "1", ""])
def test_cuda_disable_control_outside_the_allowed_namespaces_keeps_the_library(node, value):
    """CUDA_DISABLE_CONTROL, whatever its value, in a namespace the administrator did not allow: the preload mount
    stays (before: any value dropped it)."""
    node.start_plugin("1xT4", "--disable-control-namespaces", "trusted")
    (a,) = node.wait_inventory()
    env = [{"name": "CUDA_DISABLE_CONTROL", "value": value}]
    pod = _placed(node, "escaper", [gpu_container("main", 1, 1000, 10, env=env)], f"{a},NVIDIA,1000,10:")
    (admitted,) = node.kubelet.admit(pod)
    mounts = {m.container_path for m in admitted.responses["volcano.sh/vgpu-number"].mounts}
    assert "/etc/ld.so.preload" in mounts


@pytest.mark.parametrize("value, preloaded", [("true", False), ("false", True), ("yes", True)])
def test_cuda_disable_control_in_an_allowed_namespace_is_parsed_strictly(node, value, preloaded):
    """In a namespace the administrator allowed, only the exact value "true" drops the preload mount."""
    node.start_plugin("1xT4", "--disable-control-namespaces", "trusted")
    (a,) = node.wait_inventory()
    env = [{"name": "CUDA_DISABLE_CONTROL", "value": value}]
    pod = _placed(node, "admin-job", [gpu_container("main", 1, 1000, 10, env=env)], f"{a},NVIDIA,1000,10:",
                  namespace="trusted")
    (admitted,) = node.kubelet.admit(pod)
    mounts = {m.container_path for m in admitted.responses["volcano.sh/vgpu-number"].mounts}
    assert ("/etc/ld.so.preload" in mounts) is preloaded


class TestSignedGrants:
    """The scheduler signs each assignment with its Ed25519 private key (the vgpu-grant-key Secret); the plugins
    hold only the public key (the vgpu-grant-public-keys ConfigMap)."""

    @pytest.fixture
    def key(self, tmp_path):
        return _pair(tmp_path)

    def _signed(self, node: PluginBed, name: str, uuid: str, key: grants.GrantKey) -> dict[str, Any]:
        """A pod as our scheduler leaves it: its assignment signed for its UID (what /bind does)."""
        return _placed(node, name, [gpu_container("main", 1, 1000, 10)], f"{uuid},NVIDIA,1000,10:", signer=key)

    def test_an_unsigned_assignment_is_refused(self, node, key):
        """Within its spec and of our scheduler, but not signed: refused."""
        node.start_plugin("1xT4", "--grant-key-file", str(key.public))
        (a,) = node.wait_inventory()
        pod = _make(node, "unsigned", [gpu_container("main", 1, 1000, 10)], f"{a},NVIDIA,1000,10:")
        _refused(node, pod, "no scheduler signature")

    def test_a_signature_copied_from_another_pod_is_refused(self, node, key):
        """A placed pod's signature, copied onto a pod with the same assignment: refused, since it signs the pod's
        UID too; the signed original is served (the positive control)."""
        node.start_plugin("1xT4", "--grant-key-file", str(key.public))
        (a,) = node.wait_inventory()
        original = self._signed(node, "original", a, key.signer)
        (admitted,) = node.kubelet.admit(original)
        assert _limits(admitted) == {"CUDA_DEVICE_MEMORY_LIMIT_0": "1000m", "CUDA_DEVICE_SM_LIMIT_0": "10",
                                    "CUDA_DEVICE_SM_LIMIT": "10"}
        copy = _make(node, "copy", [gpu_container("main", 1, 1000, 10)], f"{a},NVIDIA,1000,10:",
                     annotations={grants.SIGNATURE: original["metadata"]["annotations"][grants.SIGNATURE]})
        _refused(node, copy, "signature does not match")

    def test_a_signed_assignment_edited_afterwards_is_refused(self, node, key):
        """The tenant raises devices-to-allocate of a signed pod: refused (with the policies, the edit itself)."""
        node.start_plugin("1xT4", "--grant-key-file", str(key.public))
        (a,) = node.wait_inventory()
        self._signed(node, "edited", a, key.signer)
        raised = {"metadata": {"annotations": {keys.DEVICES_TO_ALLOCATE: f"{a},NVIDIA,1000,90:"}}}
        if node.roles.enforced:  # the edit never lands: the pod runs with what was signed
            node.roles.refused(node.roles.tenant.patch_namespaced_pod, "edited", "default", raised)
            (admitted,) = node.kubelet.admit(node.pod("edited"))
            assert _limits(admitted)["CUDA_DEVICE_SM_LIMIT"] == "10"
        else:
            node.roles.tenant.patch_namespaced_pod("edited", "default", raised)
            _refused(node, node.pod("edited"), "not the signed assignment")

    def test_unsigned_grants_within_the_spec_pass_only_when_allowed(self, node, key):
        """--accept-unsigned-grants (clusters that mix in a scheduler that does not sign) serves an unsigned grant
        within the spec, and still refuses one beyond it."""
        node.start_plugin("1xT4", "--grant-key-file", str(key.public), "--accept-unsigned-grants")
        (a,) = node.wait_inventory()
        fair = _placed(node, "fair", [gpu_container("main", 1, 1000, 10)], f"{a},NVIDIA,1000,10:")
        (admitted,) = node.kubelet.admit(fair)
        assert _limits(admitted) == {"CUDA_DEVICE_MEMORY_LIMIT_0": "1000m", "CUDA_DEVICE_SM_LIMIT_0": "10",
                                    "CUDA_DEVICE_SM_LIMIT": "10"}
        greedy = _make(node, "greedy", [gpu_container("main", 1, 1, 1)], f"{a},NVIDIA,{T4_UNITS},100:")
        _refused(node, greedy, "the spec allows 1")

    def test_a_key_of_a_node_cannot_sign(self, node, key, tmp_path):
        """What a compromised node holds is the public key, which signs nothing; a key pair of its own (or any key
        but the scheduler's) makes signatures the plugin refuses, on its node as on any other."""
        node.start_plugin("1xT4", "--grant-key-file", str(key.public))
        (a,) = node.wait_inventory()
        node_key = grants.read_key(key.public, "--grant-key-file", private_allowed=False)
        with pytest.raises(ValueError, match="cannot sign"):
            node_key.sign("uid", NODE, f"{a},NVIDIA,1000,10:")
        value = f"{a},NVIDIA,1000,10:"
        forged = _make(node, "forged", [gpu_container("main", 1, 1000, 10)], value)
        if forged is not None:  # signed with the tenant's own key
            signature = _pair(tmp_path / "attacker").signer.sign(forged["metadata"]["uid"], NODE, value)
            node.roles.tenant.patch_namespaced_pod("forged", "default",
                                                   {"metadata": {"annotations": {grants.SIGNATURE: signature}}})
            forged = node.pod("forged")
        _refused(node, forged, "signature does not match")

    def test_a_plugin_given_the_private_key_refuses_to_start(self, node, key):
        """A node must hold only the public key: a plugin pointed at the signing key stops with one clear line."""
        node.start_plugin("1xT4", "--grant-key-file", str(key.private), wait=False)
        assert node.proc is not None and node.proc.wait(30) != 0
        assert "holds a private key; a node needs only the scheduler's public key" in node.log()


class _KeyPair(NamedTuple):
    signer: grants.GrantKey  # the scheduler's
    private: Path  # its PEM file (the Secret vgpu-grant-key)
    public: Path  # the public key's PEM file (the ConfigMap vgpu-grant-public-keys)


def _pair(directory: Path) -> _KeyPair:
    """A fresh Ed25519 pair written as PEM files, as `openssl genpkey` / `openssl pkey -pubout` write them."""
    directory.mkdir(parents=True, exist_ok=True)
    private_key = Ed25519PrivateKey.generate()
    private = directory / "grant.key"
    private.write_bytes(private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    public = directory / "grant.pub"
    public.write_bytes(private_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                             serialization.PublicFormat.SubjectPublicKeyInfo))
    return _KeyPair(grants.read_key(private, "--grant-key-file"), private, public)
