"""Tenants against the whole placement path: forged assignments and forged charges, in a cluster in a box (the
API-server stand-in, kubelet stand-ins running pods as processes, our device plugins and extender, kube-scheduler's
stand-in), with the scheduler signing grants and the plugins checking them, as deploy/ ships it.

A tenant may create pods (with any spec and annotations, `nodeName` included) and patch its own pods; it cannot
sign. Each attack ends refused or harmless while well-behaved pods run.  The module runs twice: without deploy/'s
admission policies, and with them in force (every component with its own identity, the tenant a plain user), where
the API server refuses the forged pods and edits themselves.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from admission_roles import MODES, policy_documents
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e_helpers import TERMINAL, WORKLOAD, container, inventories, phase, pod, reports, scheduled_condition, wait_until
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from vgpu import grants, keys
from vgpu.kube.client import make_api_client
from vgpu.testbed.cluster import LocalCluster, isolation_paths

NS = "tenant"


@pytest.fixture(scope="module", params=MODES)
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    isolation_paths()  # a failed C build fails the module
    workdir = tmp_path_factory.mktemp("hostile-cluster")
    # the deployed key layout: the extender holds the Ed25519 private key, the plugins only its public key
    private = Ed25519PrivateKey.generate()
    (workdir / "grant.key").write_bytes(private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (workdir / "grant.pub").write_bytes(private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    c = LocalCluster(workdir, nodes=2, gpus="2xA100-40GB", metrics_port=0, scheduler_metrics_port=0,
                     scheduler_args=["--grant-key-file", str(workdir / "grant.key")],
                     plugin_args=["--grant-key-file", str(workdir / "grant.pub")],
                     admission_policies=policy_documents() if request.param == "with-policies" else None)
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def tenant(cluster: LocalCluster) -> k8s.CoreV1Api:
    """The tenant's client: a plain user where the policies are in force, else (as every client) an admin."""
    return k8s.CoreV1Api(make_api_client(cluster.tenant_kubeconfig))


def _enforced(cluster: LocalCluster) -> bool:
    return cluster.admission_policies is not None


def _create(tenant: k8s.CoreV1Api, body: dict[str, Any]) -> None:
    tenant.create_namespaced_pod(NS, body, _preload_content=False)


def _annotate(tenant: k8s.CoreV1Api, name: str, annotations: dict[str, str]) -> None:
    tenant.patch_namespaced_pod(name, NS, {"metadata": {"annotations": annotations}})


def _refused_by_policy(call: Any, *args: Any) -> None:
    with pytest.raises(ApiException) as caught:
        call(*args)
    assert caught.value.status == 403 and "ValidatingAdmissionPolicy" in str(caught.value.body), caught.value.body


def _units(cluster: LocalCluster, mib: int) -> int:
    return -(-mib // cluster.memory_factor)


def _get(cluster: LocalCluster, name: str) -> dict[str, Any]:
    return cluster.api_get(f"/api/v1/namespaces/{NS}/pods/{name}") or {}


def _finished(cluster: LocalCluster, name: str, timeout: float = 120) -> dict[str, Any]:
    return wait_until(f"pod {name} finished", lambda: (p := _get(cluster, name)) and phase(p) in TERMINAL and p,
                      timeout)


def _forged(name: str, node: str, uuid: str, card_units: int, scheduler: str | None,
            signature: str | None = None) -> dict[str, Any]:
    """A pod written to land on `node` and take the whole of `uuid` while its spec asks 1 unit and 1 %."""
    value = f"{uuid},NVIDIA,{card_units},100:"
    annotations = {keys.VGPU_IDS: value, keys.DEVICES_TO_ALLOCATE: value, keys.VGPU_NODE: node,
                   keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING, keys.BIND_TIME: "1784884863"}
    if signature is not None:
        annotations[grants.SIGNATURE] = signature
    body = pod(name, [container("main", WORKLOAD + ["--mib", "30000"], memory=1, cores=1)], namespace=NS,
               annotations=annotations)
    body["spec"]["nodeName"] = node
    if scheduler is None:
        del body["spec"]["schedulerName"]
    else:
        body["spec"]["schedulerName"] = scheduler
    return body


def test_a_well_behaved_pod_runs_with_a_signed_grant(cluster, tenant):
    """The positive control: a pod of our scheduler is signed at bind, admitted and runs within its limit."""
    _create(tenant, pod("honest", [container("main", WORKLOAD + ["--mib", "1000"],
                                             memory=_units(cluster, 2000), cores=10)], namespace=NS))
    done = _finished(cluster, "honest")
    assert phase(done) == "Succeeded", done.get("status")
    annotations = done["metadata"]["annotations"]
    assert annotations[grants.SIGNATURE].startswith("v2:")  # Ed25519


@pytest.mark.parametrize("scheduler, signed", [(None, False), ("vgpu-scheduler", False),
                                               ("vgpu-scheduler", True)],
                         ids=["no-scheduler", "unsigned", "signature-of-another-pod"])
def test_a_forged_assignment_never_reaches_a_container(cluster, tenant, scheduler, signed):
    """A pod created with nodeName and a self-written assignment of a whole GPU (spec: 1 unit, 1 %) is refused at
    kubelet's admission (with the policies: by the API server); no process of it ever runs with a limit (before:
    Allocate handed it the whole card)."""
    name = f"forged-{scheduler or 'none'}-{'signed' if signed else 'unsigned'}"
    node = "node-0"
    gpu = inventories(cluster)[node][0]
    signature = None
    if signed:
        honest = _get(cluster, "honest")
        signature = honest["metadata"]["annotations"][grants.SIGNATURE]
    forged = _forged(name, node, gpu.uuid, gpu.memory, scheduler, signature)
    if _enforced(cluster):
        _refused_by_policy(_create, tenant, forged)
        return
    _create(tenant, forged)
    done = _finished(cluster, name)
    assert phase(done) == "Failed", done.get("status")
    assert "refuses" in (done["status"].get("message") or ""), done["status"]
    assert not [r for (ns, p, _), r in reports(cluster).items() if (ns, p) == (NS, name)]
    wait_until("the refusal recorded", lambda: any(
        e.get("reason") == "VGPUGrantRefused" and e["involvedObject"]["name"] == name for e in cluster.events()), 30)


def test_a_forged_charge_of_a_pod_nobody_schedules_fills_nothing(cluster, tenant):
    """A never-scheduled pod of another scheduler carries an assignment claiming a whole GPU: the extender does not
    charge it, and a pod pinned to that GPU runs (before: the claim filled the GPU for good)."""
    node = "node-1"
    gpu = inventories(cluster)[node][0]
    value = f"{gpu.uuid},NVIDIA,{gpu.memory},100:"
    squatter = pod("squatter", [container("main", ["sleep", "3600"], memory=1, cores=1)], namespace=NS,
                   annotations={keys.VGPU_IDS: value, keys.VGPU_NODE: node})
    squatter["spec"]["schedulerName"] = "nobody"
    if _enforced(cluster):
        _refused_by_policy(_create, tenant, squatter)
    else:
        _create(tenant, squatter)
    _create(tenant, pod("pinned", [container("main", WORKLOAD + ["--mib", "1000"],
                                                memory=_units(cluster, 20000), cores=50)],
                           namespace=NS, annotations={keys.USE_GPU_UUID: gpu.uuid}))
    done = _finished(cluster, "pinned")
    assert phase(done) == "Succeeded", done.get("status")
    if not _enforced(cluster):
        assert phase(_get(cluster, "squatter")) == "Pending"


def test_a_running_pod_that_shrinks_its_own_claim_keeps_its_charge(cluster, tenant, tmp_path):
    """A running pod patches its assignment down to 1 unit: the extender keeps charging what its spec asks, so a
    pod that only fits by over-committing the GPU is not placed there, and the tenant is reported (event); once
    the first pod ends the second runs (before: the charge fell to 1 unit and the GPU was over-committed)."""
    node = "node-1"
    gpu = inventories(cluster)[node][1]
    release = tmp_path / "release"
    _create(tenant, pod("big", [container("main", WORKLOAD + ["--mib", "1000", "--hold", "300",
                                                                 "--release-file", str(release)],
                                             memory=_units(cluster, 30000), cores=50)],
                        namespace=NS, annotations={keys.USE_GPU_UUID: gpu.uuid}))
    wait_until("big running", lambda: phase(_get(cluster, "big")) == "Running", 120)
    shrunk = {keys.VGPU_IDS: f"{gpu.uuid},NVIDIA,1,1:"}
    if _enforced(cluster):
        _refused_by_policy(_annotate, tenant, "big", shrunk)
    else:
        _annotate(tenant, "big", shrunk)
        wait_until("the claim seen", lambda: _get(cluster, "big")["metadata"]["annotations"][keys.VGPU_IDS].endswith(
            ",1,1:"), 10)
    _create(tenant, pod("second", [container("main", WORKLOAD + ["--mib", "1000"],
                                             memory=_units(cluster, 20000), cores=10)],
                        namespace=NS, annotations={keys.USE_GPU_UUID: gpu.uuid}))
    unschedulable = wait_until("second refused by the scheduler", lambda: (
        (c := scheduled_condition(_get(cluster, "second"))) and c.get("status") == "False" and c), 60)
    assert not _get(cluster, "second")["spec"].get("nodeName"), unschedulable
    if not _enforced(cluster):
        wait_until("the inconsistency reported", lambda: any(
            e.get("reason") == "VGPUGrantInconsistent" and e["involvedObject"]["name"] == "big"
            for e in cluster.events()), 30)
    release.touch()
    assert phase(_finished(cluster, "big")) == "Succeeded"
    assert phase(_finished(cluster, "second", timeout=180)) == "Succeeded"


def test_a_pod_that_inflates_its_own_claim_blocks_nothing_beyond_its_spec(cluster, tenant):
    """A CPU-only pod of our scheduler, placed normally, patches its own assignment to claim both GPUs of its node in
    full: the extender charges what its spec asks (nothing), reports the claim (event), and another tenant's pod
    pinned to one of those GPUs runs (before: both GPUs showed full and that pod stayed Pending)."""
    _create(tenant, pod("cpu-only", [container("main", ["sleep", "3600"], number=None)], namespace=NS))
    running = wait_until("cpu-only running", lambda: (p := _get(cluster, "cpu-only")) and phase(p) == "Running" and p,
                         120)
    node = running["spec"]["nodeName"]
    gpus = inventories(cluster)[node]
    claim = "".join(f"{g.uuid},NVIDIA,{g.memory},100:" for g in gpus)
    inflated = {keys.VGPU_IDS: claim, keys.VGPU_NODE: node}
    if _enforced(cluster):
        _refused_by_policy(_annotate, tenant, "cpu-only", inflated)
    else:
        _annotate(tenant, "cpu-only", inflated)
        wait_until("the inconsistency reported", lambda: any(
            e.get("reason") == "VGPUGrantInconsistent" and e["involvedObject"]["name"] == "cpu-only"
            for e in cluster.events()), 30)
    _create(tenant, pod("neighbour", [container("main", WORKLOAD + ["--mib", "500"],
                                                memory=_units(cluster, 1000), cores=10)],
                        namespace=NS, annotations={keys.USE_GPU_UUID: gpus[0].uuid}))
    done = _finished(cluster, "neighbour")
    assert phase(done) == "Succeeded", done.get("status")
    assert done["spec"]["nodeName"] == node
    cluster.delete_pod(NS, "cpu-only")



def test_a_pod_of_another_scheduler_asking_our_resources_never_runs_with_a_grant(cluster, tenant):
    """A plain pod asking volcano.sh/vgpu-* under another scheduler's name (no nodeName, no annotations: what a
    tenant may write when the webhook that would move it to vgpu-scheduler is down). With the policies the API
    server refuses it at creation; without them, bound by that other scheduler, its admission is refused by the
    device plugin and nothing of it runs."""
    body = pod("other-scheduler", [container("main", WORKLOAD + ["--mib", "100"], memory=1000, cores=10)],
               namespace=NS)
    body["spec"]["schedulerName"] = "default-scheduler"
    if _enforced(cluster):
        _refused_by_policy(_create, tenant, body)
        return
    _create(tenant, body)
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "other-scheduler", "namespace": NS},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "node-0"}}
    k8s.CoreV1Api(make_api_client(cluster.kubeconfig)).create_namespaced_pod_binding(
        "other-scheduler", NS, binding, _preload_content=False)  # as the other scheduler would
    done = _finished(cluster, "other-scheduler")
    assert phase(done) == "Failed", done.get("status")
    assert "refuses" in (done["status"].get("message") or "") or "no pod with bind-phase" in (
        done["status"].get("message") or ""), done["status"]
    assert not [r for (ns, p, _), r in reports(cluster).items() if (ns, p) == (NS, "other-scheduler")]
