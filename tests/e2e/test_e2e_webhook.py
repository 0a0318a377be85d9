"""End to end: pods written for HAMi and for Volcano, unedited, opted in by our admission webhook.

One cluster in a box with `vgpu webhook` registered by the Helm chart's own MutatingWebhookConfiguration (rendered by
the real Helm engine; the API-server stand-in calls it as kube-apiserver calls webhooks). A HAMi pod (nvidia.com/gpu
with gpumem and gpucores, no schedulerName) and Volcano's example pod (schedulerName: volcano, the webhook told to
take Volcano's pods) run with their limits; a whole-GPU nvidia.com/gpu pod is left alone; a namespace quota on
GPU memory counts GPUs x memory and refuses, with kube-apiserver's message as kubectl prints it, the pod that
exceeds it.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from capabilities import tool
from chart_render import webhook_configuration
from e2e_helpers import TERMINAL, WORKLOAD, phase, reports, wait_until

from vgpu import keys
from vgpu.assignment import decode

pytestmark = pytest.mark.slow

NS = "team"


@pytest.fixture(scope="module")
def cluster(make_cluster):
    return make_cluster(nodes=1, gpus="4xA100-40GB", webhook_configuration=webhook_configuration(),
                        webhook_args=["--replace-scheduler-names", "default-scheduler,volcano"])


def _pod(name: str, limits: dict, scheduler: str | None = None, annotations: dict | None = None,
         hold: int = 0) -> dict:
    spec: dict = {"restartPolicy": "Never", "containers": [{
        "name": "main", "image": "cuda", "command": WORKLOAD + ["--mib", "1000", "--hold", str(hold)],
        "resources": {"limits": limits}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "annotations": annotations or {}}, "spec": spec}


def _get(cluster, name: str) -> dict:
    return cluster.api_get(f"/api/v1/namespaces/{NS}/pods/{name}") or {}


def _finished(cluster, names: list[str]) -> dict[str, dict]:
    def done():
        pods = {n: _get(cluster, n) for n in names}
        return pods if all(phase(p) in TERMINAL for p in pods.values()) else None

    return wait_until(f"pods {names} finished", done, 240)


def test_unedited_hami_and_volcano_pods_run_with_their_limits(cluster, request):
    request.node._e2e_cluster = cluster
    hami = cluster.create_pod(_pod("hami-infer", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000",
                                                   "nvidia.com/gpucores": "30"}))
    # volcano-vgpu-device-plugin's README example, as written
    volcano = cluster.create_pod(_pod("gpu-pod1", {"volcano.sh/vgpu-number": "2", "volcano.sh/vgpu-memory": "3000",
                                                   "volcano.sh/vgpu-cores": "50"}, scheduler="volcano",
                                      annotations={keys.VGPU_MODE: "hami-core"}))
    whole = cluster.create_pod(_pod("whole-gpu", {"nvidia.com/gpu": "1"}))
    # what the API server stored: opted in by the webhook
    assert hami["spec"]["schedulerName"] == "vgpu-scheduler"
    assert hami["spec"]["containers"][0]["resources"]["limits"] == {
        "volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "4k", "volcano.sh/vgpu-cores": "30",
        "volcano.sh/vgpu-memory-total": "4k", "volcano.sh/vgpu-cores-total": "30"}
    assert hami["spec"]["containers"][0]["resources"]["requests"] == \
        hami["spec"]["containers"][0]["resources"]["limits"]  # defaulted again after the patch
    assert volcano["spec"]["schedulerName"] == "vgpu-scheduler"
    assert volcano["spec"]["containers"][0]["resources"]["limits"]["volcano.sh/vgpu-memory-total"] == "6k"
    assert whole["spec"]["schedulerName"] == "default-scheduler"  # NVIDIA's whole GPU: not ours, not touched
    assert "volcano.sh/vgpu-memory-total" not in whole["spec"]["containers"][0]["resources"]["limits"]

    done = _finished(cluster, ["hami-infer", "gpu-pod1"])
    assert {n: phase(p) for n, p in done.items()} == {"hami-infer": "Succeeded", "gpu-pod1": "Succeeded"}
    seen = reports(cluster)
    infer = seen[(NS, "hami-infer", "main")]
    assert infer["limits"] == {"CUDA_DEVICE_MEMORY_LIMIT_0": "4000m"}
    assert infer["env"]["CUDA_DEVICE_SM_LIMIT"] == "30"
    example = seen[(NS, "gpu-pod1", "main")]
    assert example["limits"] == {"CUDA_DEVICE_MEMORY_LIMIT_0": "3000m", "CUDA_DEVICE_MEMORY_LIMIT_1": "3000m"}
    (segment,) = decode(done["gpu-pod1"]["metadata"]["annotations"][keys.VGPU_IDS])
    assert [(g.memory, g.cores) for g in segment] == [(3000, 50), (3000, 50)]


def test_a_namespace_quota_counts_gpus_times_memory_and_refuses_the_pod_over_it(cluster, request, tmp_path):
    request.node._e2e_cluster = cluster
    ns = "quota"
    cluster.api_post(f"/api/v1/namespaces/{ns}/resourcequotas", {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu", "namespace": ns},
        "spec": {"hard": {"requests.volcano.sh/vgpu-memory-total": "50000"}}})
    # running while the next pod is created (a pod that has ended no longer counts against the quota)
    first = _pod("train", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "20000"}, hold=300)
    first["metadata"]["namespace"] = ns
    cluster.create_pod(first)  # 2 x 20,000 = 40,000 of 50,000
    quota = cluster.api_get(f"/api/v1/namespaces/{ns}/resourcequotas/gpu")
    assert quota["status"]["used"]["requests.volcano.sh/vgpu-memory-total"] == "40k"
    # per GPU this asks 10,000, which a quota on vgpu-memory would let in; the total (20,000) exceeds what is left
    second = _pod("tune", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "10000"})
    second["metadata"]["namespace"] = ns
    manifest = tmp_path / "tune.json"
    manifest.write_text(json.dumps(second))
    kubectl = tool("kubectl", "https://kubernetes.io/docs/tasks/tools/")
    done = subprocess.run([kubectl, "--kubeconfig", cluster.kubeconfig, "create", "--validate=false", "-f",
                           str(manifest)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().endswith(
        'pods "tune" is forbidden: exceeded quota: gpu, requested: requests.volcano.sh/vgpu-memory-total=20k, '
        'used: requests.volcano.sh/vgpu-memory-total=40k, limited: requests.volcano.sh/vgpu-memory-total=50k'), \
        done.stderr
    assert cluster.api_get(f"/api/v1/namespaces/{ns}/pods/tune") is None
