"""DRA mode end to end, as real processes: our `vgpu dra-plugin` registered with the kubelet stand-in over its
plugin registry, the kube-scheduler stand-in allocating claims, `vgpu scheduler --dra` choosing nodes, containers
run with the CDI edits and `libvgpu.so`. What is checked here and nowhere else: a plugin killed while a claim is
prepared still unprepares it after its restart (checkpoint); an Xid on a GPU takes it out of the slice so that the
next claim goes to another GPU, until it recovers; a pod that writes the library's variables into its own env runs
with its claim's limits all the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_helpers import phase, reports, wait_until

from vgpu.dra import DEVICE_CLASS, DRIVER
from vgpu.testbed.demo_dra import device_classes

pytestmark = pytest.mark.slow
NAMESPACE = "e2e"
WORKLOAD = ["python3", "-m", "vgpu.testbed.workload"]


def template(name: str, memory: str, cores: str) -> dict:
    request = {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS, "count": 1,
                                          "capacity": {"requests": {"memory": memory, "cores": cores}}}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [request]}}}}


def claim_pod(name: str, template_name: str, args: list[str]) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"schedulerName": "vgpu-scheduler", "restartPolicy": "Never",
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name}],
                     "containers": [{"name": "main", "image": "sample", "command": WORKLOAD + args,
                                     "resources": {"claims": [{"name": "gpu"}],
                                                   "requests": {"cpu": "100m", "memory": "64Mi"}}}]}}


@pytest.fixture(scope="module")
def cluster(make_cluster):
    cluster = make_cluster(nodes=1, gpus="2xA100-40GB", dra=True)
    for body in device_classes():
        cluster.api_post("/apis/resource.k8s.io/v1/deviceclasses", body)
    cluster.api_post(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates",
                     template("share", "10Gi", "30"))
    cluster.api_post(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates",
                     template("big", "30Gi", "50"))
    return cluster


def pod_named(cluster, name: str) -> dict | None:
    return next((p for p in cluster.pods() if p["metadata"]["name"] == name
                 and p["metadata"].get("namespace") == NAMESPACE), None)


def claim_of(cluster, pod_name: str) -> dict | None:
    for claim in cluster.resource_get("resourceclaims", NAMESPACE):
        owners = {o.get("name") for o in claim["metadata"].get("ownerReferences") or ()}
        if pod_name in owners and (claim.get("status") or {}).get("allocation"):
            return claim
    return None


def cdi_specs(cluster) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in Path(cluster.nodes[0].cdi_dir).glob("*.json")}


def our_slice(cluster) -> dict:
    return next(s for s in cluster.resource_get("resourceslices") if s["spec"]["driver"] == DRIVER)


def test_a_plugin_killed_while_a_claim_is_prepared_unprepares_it_after_its_restart(cluster, request, tmp_path):
    request.node._e2e_cluster = cluster
    release = tmp_path / "release"
    cluster.create_pod(claim_pod("holder", "share", ["--mib", "1000", "--kernels", "5",
                                                     "--release-file", str(release), "--hold", "120"]))
    wait_until("holder running", lambda: phase(pod_named(cluster, "holder") or {}) == "Running", 90)
    claim = claim_of(cluster, "holder")
    assert claim is not None
    uid = claim["metadata"]["uid"]
    specs = cdi_specs(cluster)
    [spec] = [s for s in specs.values() if any(uid in d["name"] for d in s["devices"])]
    env = [e for d in spec["devices"] for e in d["containerEdits"]["env"]]
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=10240m" in env and "CUDA_DEVICE_SM_LIMIT=30" in env

    node = cluster.nodes[0]
    node.plugin.kill()  # SIGKILL: no clean-up of any kind
    node.plugin.start()

    def registrations() -> int:
        return node.plugin.log_path.read_text(errors="replace").count("event=registered_with_kubelet")

    wait_until("the restarted plugin registered", lambda: registrations() >= 2, 60)
    release.touch()
    wait_until("holder succeeded", lambda: phase(pod_named(cluster, "holder") or {}) == "Succeeded", 60)
    containers = Path(node.hook_path) / "vgpu" / "containers"

    def unprepared() -> bool:
        spec_left = any(uid in d["name"] for s in cdi_specs(cluster).values() for d in s["devices"])
        return not spec_left and not list(containers.glob(f"{uid}*"))

    wait_until("its CDI spec and accounting directory removed by the restarted plugin", unprepared, 60)


def test_an_xid_takes_the_gpu_out_of_the_slice_and_the_next_claim_goes_elsewhere(cluster, request, tmp_path):
    request.node._e2e_cluster = cluster
    before = our_slice(cluster)
    assert [d["name"] for d in before["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    generation = before["spec"]["pool"]["generation"]
    node = cluster.nodes[0]
    cluster.inject_gpu_fault(node, 0, "xid", 79)
    wait_until("gpu-0 out of the slice",
               lambda: [d["name"] for d in our_slice(cluster)["spec"]["devices"]] == ["gpu-1"], 60)
    assert our_slice(cluster)["spec"]["pool"]["generation"] > generation
    release = tmp_path / "release"
    cluster.create_pod(claim_pod("after-xid", "big", ["--mib", "2000", "--kernels", "5",
                                                      "--release-file", str(release), "--hold", "120"]))
    wait_until("after-xid running", lambda: phase(pod_named(cluster, "after-xid") or {}) == "Running", 90)
    claim = claim_of(cluster, "after-xid")
    assert claim is not None
    assert [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]] == ["gpu-1"]
    release.touch()
    wait_until("after-xid succeeded", lambda: phase(pod_named(cluster, "after-xid") or {}) == "Succeeded", 60)
    cluster.inject_gpu_fault(node, 0, "recover")
    wait_until("gpu-0 back in the slice",
               lambda: [d["name"] for d in our_slice(cluster)["spec"]["devices"]] == ["gpu-0", "gpu-1"], 90)


def test_a_pod_that_writes_the_limits_into_its_own_env_runs_with_its_claims(cluster, request):
    request.node._e2e_cluster = cluster
    forged = {"CUDA_DEVICE_MEMORY_LIMIT_0": "40960m", "CUDA_DEVICE_MEMORY_LIMIT": "40960m",
              "CUDA_DEVICE_SM_LIMIT": "100", "CUDA_DEVICE_SM_LIMIT_0": "100", "GPU_CORE_UTILIZATION_POLICY": "disable",
              "VGPU_COUNT_MANAGED": "0", "VGPU_ISOLATION_FAIL_OPEN": "1", "VGPU_CONTEXT_OVERHEAD": "0"}
    pod = claim_pod("forger", "share", ["--mib", "11000", "--chunk", "500", "--kernels", "5", "--expect-oom"])
    pod["spec"]["containers"][0]["env"] = [{"name": k, "value": v} for k, v in forged.items()]
    cluster.create_pod(pod)
    wait_until("forger ended", lambda: phase(pod_named(cluster, "forger") or {}) in ("Succeeded", "Failed"), 90)
    report = reports(cluster).get((NAMESPACE, "forger", "main")) or {}
    assert report.get("result") == "oom-refused", report  # refused past its claim's 10 GiB, not at 40 GiB
    assert report["limits"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "10240m"
    assert report["env"]["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert report["env"]["GPU_CORE_UTILIZATION_POLICY"] == "default"
    assert phase(pod_named(cluster, "forger") or {}) == "Succeeded"
