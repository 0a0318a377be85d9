"""Device-plugin mode judged by the real Kubernetes: the Helm chart applied with kubectl, pods opted in by our
webhook through kube-apiserver, refused by the chart's admission policies with kube-apiserver's words, placed by
upstream kube-scheduler through our extender (the chart's KubeSchedulerConfiguration), admitted by upstream kubelet
through our device plugin, run by containerd and runc with the limits the plugin answered, and read back through
kube-apiserver (`kubectl logs`)."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest
import yaml
from capabilities import tool
from chart_render import render, webhook_configuration
from realk8s_helpers import (
    WORKLOAD,
    create,
    get_pod,
    gpu_container,
    gpu_pod,
    phase,
    report,
    wait_finished,
)

from vgpu import keys
from vgpu.assignment import decode
from vgpu.testbed.cluster import free_port
from vgpu.testbed.realcluster import real_pod

pytestmark = [pytest.mark.realk8s, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(make_real_cluster):
    docs = render()
    return make_real_cluster(nodes=2, gpus="2xA100-40GB", manifests=docs,
                             webhook_configuration=webhook_configuration(docs),
                             webhook_args=["--replace-scheduler-names", "default-scheduler,volcano"])


def test_a_container_past_its_limit_is_refused_while_its_neighbour_runs(cluster):
    """Two shares of one GPU (the policy packs them): the one allocating past its 1000 MiB gets out-of-memory at the
    crossing step, the other gets all it asked; both placed by kube-scheduler through the extender."""
    create(cluster, gpu_pod("over", [gpu_container("main", ["--mib", "1500", "--chunk", "250", "--expect-oom"],
                                                   memory=1000, cores=20)]))
    create(cluster, gpu_pod("neighbour", [gpu_container("main", ["--mib", "2000", "--chunk", "500"],
                                                        memory=3000, cores=20)]))
    over, neighbour = wait_finished(cluster, "over"), wait_finished(cluster, "neighbour")
    assert phase(over) == "Succeeded", cluster.events("default", "over")
    assert phase(neighbour) == "Succeeded", cluster.events("default", "neighbour")
    limited = report(cluster, "over", "main")
    assert limited["result"] == "oom-refused"
    (device,) = limited["devices"]
    assert device["total_mib"] == 1000 and device["allocated_mib"] == 1000 and device["oom_at_mib"] == 1250
    (free,) = report(cluster, "neighbour", "main")["devices"]
    assert free["total_mib"] == 3000 and free["allocated_mib"] == 2000 and free["oom_at_mib"] is None
    # placed by the real kube-scheduler, bound by our extender; the container saw the GPU its grant names
    for pod, seen in ((over, device), (neighbour, free)):
        name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
        (segment,) = decode(pod["metadata"]["annotations"][keys.VGPU_IDS])
        assert [g.uuid for g in segment] == [seen["uuid"]]
        assert any(e.startswith("Scheduled:") and node in e for e in cluster.events("default", name))
    assert get_pod(cluster, "over")["metadata"]["annotations"].get(keys.BIND_PHASE) == "success"


def test_the_chart_policies_refuse_a_forged_assignment_with_kube_apiservers_words(cluster, tmp_path):
    """The same refusal tests/kube/test_kube_admission.py expects of the API-server stand-in, word for word."""
    forged = tmp_path / "forged.yaml"
    forged.write_text("apiVersion: v1\nkind: Pod\nmetadata:\n  name: forged\n  annotations:\n"
                      "    volcano.sh/vgpu-ids-new: 'GPU-0,NVIDIA,40960,100:'\n"
                      "spec:\n  containers: [{name: c, image: busybox}]\n")
    refused = cluster.kubectl("apply", "-f", str(forged), check=False)
    assert refused.returncode != 0
    assert 'Error from server (Forbidden): error when creating "' in refused.stderr, refused.stderr
    assert ('pods "forged" is forbidden: ValidatingAdmissionPolicy \'vgpu-sharing-assignment-annotations\' with '
            "binding 'vgpu-sharing-assignment-annotations' denied request: a pod may not be created with GPU "
            "assignment annotations") in refused.stderr, refused.stderr
    assert cluster.kubectl("get", "pod", "forged", check=False).returncode != 0  # nothing stored


def _unedited(name: str, limits: dict, scheduler: str | None = None, annotations: dict | None = None,
              args: tuple[str, ...] = ("--mib", "1000"), namespace: str = "default") -> dict:
    """A pod as a HAMi or Volcano user writes it: no vgpu-scheduler, their resource names (as the tier runs it)."""
    spec: dict = {"restartPolicy": "Never",
                  "containers": [{"name": "main", "command": [*WORKLOAD, *args],
                                  "resources": {"limits": limits}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return real_pod({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
                     "spec": spec})


def test_hami_and_volcano_pods_are_opted_in_by_the_webhook_and_run_with_their_limits(cluster):
    """kube-apiserver calls our webhook (the chart's MutatingWebhookConfiguration); the pods it stored carry our
    scheduler and names, with quantities as kube-apiserver writes them; they run with their limits."""
    hami = create(cluster, _unedited("hami-infer", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000",
                                                    "nvidia.com/gpucores": "30"}))
    volcano = create(cluster, _unedited("gpu-pod1", {"volcano.sh/vgpu-number": "2", "volcano.sh/vgpu-memory": "3000",
                                                     "volcano.sh/vgpu-cores": "50"}, scheduler="volcano",
                                        annotations={keys.VGPU_MODE: "hami-core"}))
    assert hami["spec"]["schedulerName"] == "vgpu-scheduler"
    # kube-apiserver stores a quantity in its canonical form: 4000 is written back as 4k
    assert hami["spec"]["containers"][0]["resources"]["limits"] == {
        "volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "4k", "volcano.sh/vgpu-cores": "30",
        "volcano.sh/vgpu-memory-total": "4k", "volcano.sh/vgpu-cores-total": "30"}
    assert volcano["spec"]["schedulerName"] == "vgpu-scheduler"
    assert volcano["spec"]["containers"][0]["resources"]["limits"]["volcano.sh/vgpu-memory-total"] == "6k"
    done = {name: wait_finished(cluster, name, timeout=150) for name in ("hami-infer", "gpu-pod1")}
    assert {n: phase(p) for n, p in done.items()} == {"hami-infer": "Succeeded", "gpu-pod1": "Succeeded"}, \
        {n: cluster.events("default", n) for n in done}
    infer = report(cluster, "hami-infer", "main")
    assert infer["limits"] == {"CUDA_DEVICE_MEMORY_LIMIT_0": "4000m"}
    assert infer["env"]["CUDA_DEVICE_SM_LIMIT"] == "30"
    example = report(cluster, "gpu-pod1", "main")
    assert example["limits"] == {"CUDA_DEVICE_MEMORY_LIMIT_0": "3000m", "CUDA_DEVICE_MEMORY_LIMIT_1": "3000m"}
    assert [d["total_mib"] for d in example["devices"]] == [3000, 3000]


def test_prometheus_scrapes_what_a_real_container_uses(cluster, tmp_path):
    """A container of the real runtime holds 1500 MiB; the Prometheus server (Debian's) scrapes the node's device
    plugin and stores that use under the pod's name, as the plugin exposes it."""
    binary = tool("prometheus", "Debian's prometheus package; .ci/run installs it")
    create(cluster, gpu_pod("holder", [gpu_container("main", ["--mib", "1500", "--chunk", "500", "--hold", "60"],
                                                     memory=2000)]))
    pod = cluster.wait("holder running", lambda: (p := get_pod(cluster, "holder")) and phase(p) == "Running" and p,
                       120)
    node = next(n for n in cluster.nodes if n.name == pod["spec"]["nodeName"])
    port = free_port()
    config = {"global": {"scrape_interval": "1s"},
              "scrape_configs": [{"job_name": "vgpu-device-plugin",
                                  "static_configs": [{"targets": [f"127.0.0.1:{node.metrics_port}"]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    with open(tmp_path / "prometheus.log", "wb") as log:
        server = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={tmp_path / 'data'}",
                                   f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], stdout=log,
                                  stderr=log)
    query = 'vgpu_container_memory_used_bytes{pod="holder"}'
    try:
        stored = cluster.wait("Prometheus storing the holder's memory", lambda: [
            float(r["value"][1]) for r in httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": query},
                                                    timeout=5).json()["data"]["result"]
            if float(r["value"][1]) >= 1500 * 2**20], 90)
    finally:
        server.terminate()
        server.wait(20)
    exposed = httpx.get(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=5).text
    assert stored == [1500 * 2**20], (stored, [line for line in exposed.splitlines() if "holder" in line])


def test_a_namespace_quota_counts_the_webhooks_totals_and_refuses_the_pod_over_it(cluster, tmp_path):
    """The scenario of tests/e2e/test_e2e_webhook.py on the real kube-apiserver and quota controller: the same
    refusal, word for word."""
    cluster.kubectl("create", "namespace", "quota")
    cluster.post("/api/v1/namespaces/quota/resourcequotas", {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu", "namespace": "quota"},
        "spec": {"hard": {"requests.volcano.sh/vgpu-memory-total": "50000"}}})
    cluster.wait("the quota controller's status", lambda: cluster.get(
        "/api/v1/namespaces/quota/resourcequotas/gpu").get("status", {}).get("hard"), 60)
    first = _unedited("train", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "20000"}, args=("--mib", "100", "--hold",
                                                                                           "120"), namespace="quota")
    create(cluster, first)  # 2 x 20,000 = 40,000 of 50,000
    used = cluster.get("/api/v1/namespaces/quota/resourcequotas/gpu")["status"]["used"]
    assert used["requests.volcano.sh/vgpu-memory-total"] == "40k"
    second = _unedited("tune", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "10000"}, namespace="quota")
    manifest = tmp_path / "tune.json"
    manifest.write_text(json.dumps(second))
    done = cluster.kubectl("create", "-f", str(manifest), check=False)
    assert done.returncode == 1
    assert done.stderr.strip().endswith(
        'pods "tune" is forbidden: exceeded quota: gpu, requested: requests.volcano.sh/vgpu-memory-total=20k, '
        'used: requests.volcano.sh/vgpu-memory-total=40k, limited: requests.volcano.sh/vgpu-memory-total=50k'), \
        done.stderr
    cluster.kubectl("delete", "pod", "-n", "quota", "train", "--wait=false")


def test_a_pod_created_while_the_webhook_is_down_never_escapes_its_namespaces_quota(cluster):
    """The webhook stopped: kube-apiserver admits a pod without it (the chart's failurePolicy Ignore), so the pod has
    no quota totals and the quota does not count it. In a namespace whose quota limits a total the extender refuses
    it (require_quota_totals: where-limited, the default), and kube-scheduler tells why; the same pod runs in a
    namespace without such a quota. With the webhook back, the pod created again is counted, and refused at once."""
    for namespace in ("quota-down", "free-down"):
        cluster.kubectl("create", "namespace", namespace)
    cluster.post("/api/v1/namespaces/quota-down/resourcequotas", {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu", "namespace": "quota-down"},
        "spec": {"hard": {"requests.volcano.sh/vgpu-memory-total": "30000"}}})
    cluster.wait("the quota controller's status", lambda: cluster.get(
        "/api/v1/namespaces/quota-down/resourcequotas/gpu").get("status", {}).get("hard"), 60)
    webhook = cluster.procs["webhook"]
    webhook.kill()
    try:
        limits = {"volcano.sh/vgpu-number": "2", "volcano.sh/vgpu-memory": "20000"}  # 40,000 of a 30,000 quota
        for namespace in ("quota-down", "free-down"):
            stored = create(cluster, _unedited("unseen", limits, scheduler="vgpu-scheduler", namespace=namespace))
            assert "volcano.sh/vgpu-memory-total" not in stored["spec"]["containers"][0]["resources"]["limits"]
        assert phase(wait_finished(cluster, "unseen", "free-down", timeout=150)) == "Succeeded"
        why = cluster.wait("kube-scheduler telling why", lambda: [
            e for e in cluster.events("quota-down", "unseen") if e.startswith("FailedScheduling")
            and "volcano.sh/vgpu-memory-total: absent: the admission webhook did not see this pod" in e], 90)
        assert "re-create the pod" in why[0], why
        assert not get_pod(cluster, "unseen", "quota-down")["spec"].get("nodeName")
        used = cluster.get("/api/v1/namespaces/quota-down/resourcequotas/gpu")["status"].get("used", {})
        assert used.get("requests.volcano.sh/vgpu-memory-total", "0") == "0", used
    finally:
        webhook.start()
    cluster.wait("the webhook back", lambda: httpx.get(f"https://127.0.0.1:{cluster.webhook_port}/healthz",
                                                       verify=False, timeout=2).status_code == 200, 30, proc=webhook)
    cluster.kubectl("delete", "pod", "-n", "quota-down", "unseen", "--wait=false")
    manifest = _unedited("unseen-again", limits, scheduler="vgpu-scheduler", namespace="quota-down")
    done = cluster.kubectl("create", "-f", "-", check=False, stdin=json.dumps(manifest))
    assert done.returncode == 1 and "exceeded quota: gpu, requested: requests.volcano.sh/vgpu-memory-total=40k" \
        in done.stderr, done.stderr


def test_env_from_a_configmap_does_not_raise_a_limit(cluster):
    """The real kubelet puts envFrom values after the device plugin's variables, so a ConfigMap with the prefix
    CUDA_DEVICE_ replaces the memory limit in the container's environment (and another one names a limits file of
    its own and turns the core policy off). libvgpu.so reads its variables from the read-only file the plugin
    mounts instead: the container still stops at its 1000 MiB."""
    for name, data in (("loose", {"MEMORY_LIMIT_0": "30000m", "MEMORY_LIMIT": "30000m", "SM_LIMIT": "100"}),
                       ("elsewhere", {"VGPU_LIMITS_FILE": "/dev/null", "GPU_CORE_UTILIZATION_POLICY": "disable"})):
        cluster.post("/api/v1/namespaces/default/configmaps", {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"},
            "data": data})
    container = gpu_container("main", ["--mib", "1500", "--chunk", "250", "--expect-oom"], memory=1000, cores=20)
    container["envFrom"] = [{"prefix": "CUDA_DEVICE_", "configMapRef": {"name": "loose"}},
                            {"configMapRef": {"name": "elsewhere"}}]
    create(cluster, gpu_pod("env-from", [container]))
    done = wait_finished(cluster, "env-from")
    assert phase(done) == "Succeeded", cluster.pod_logs("default", "env-from", "main")  # it stopped at its limit
    seen = report(cluster, "env-from", "main")
    assert seen["limits"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "30000m"  # the environment was overridden
    assert seen["env"]["GPU_CORE_UTILIZATION_POLICY"] == "disable"
    (device,) = seen["devices"]
    assert seen["result"] == "oom-refused" and device["total_mib"] == 1000 and device["allocated_mib"] == 1000


def test_the_chart_policy_refuses_a_pod_asking_our_resources_under_another_scheduler(cluster, tmp_path):
    """The refusal tests/kube/test_kube_admission.py expects of the API-server stand-in (deploy/'s policy), word
    for word from the real kube-apiserver (the chart's): a scheduler the webhook does not rewrite (my-scheduler)."""
    manifest = tmp_path / "elsewhere.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: elsewhere}\nspec:\n  schedulerName: my-scheduler\n"
        "  containers: [{name: c, image: busybox, resources: {limits: {volcano.sh/vgpu-number: '1'}}}]\n")
    refused = cluster.kubectl("create", "-f", str(manifest), check=False)
    assert refused.returncode != 0
    assert (
        'pods "elsewhere" is forbidden: ValidatingAdmissionPolicy \'vgpu-sharing-scheduled-placement\' with binding '
        "'vgpu-sharing-scheduled-placement' denied request: a pod that asks for volcano.sh/vgpu-number or the other "
        "vGPU resources must be placed by vgpu-scheduler: set schedulerName: vgpu-scheduler (the admission webhook "
        "that moves such pods there did not see this one)") in refused.stderr, refused.stderr


def test_the_node_lease_and_pod_logs_as_the_stand_ins_copy_them(cluster):
    """What tests/e2e/test_kubectl.py holds the stand-ins to, said by the real kubelet and kube-apiserver: kubectl
    describe node shows the node's Lease, a pod on no node has an empty log, and a pod of two containers must be
    told which one."""
    described = cluster.kubectl("describe", "node", "node-0").stdout
    assert "Failed to get lease" not in described and "HolderIdentity:  node-0" in described
    two = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "two", "namespace": "default"},
           "spec": {"schedulerName": "nobody", "containers": [{"name": "a", "image": "pause"},
                                                               {"name": "b", "image": "pause"}]}}
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(two))
    assert cluster.kubectl("logs", "two", "-c", "a").stdout == ""
    raw = cluster.kubectl("get", "--raw", "/api/v1/namespaces/default/pods/two/log", check=False)
    assert raw.returncode == 1
    assert "a container name must be specified for pod two, choose one of: [a b]" in raw.stderr
    wrong = cluster.kubectl("logs", "two", "-c", "c", check=False)
    assert wrong.returncode == 1 and "container c is not valid for pod two" in wrong.stderr
