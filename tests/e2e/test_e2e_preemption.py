"""End to end: a high-priority GPU share evicts exactly the right lower-priority shares, through the whole stack.

One node with two A100-40GB (40,960 MiB each), the binpack policy, the kube-scheduler stand-in with upstream's
DefaultPreemption on (its default), our extender, device plugin and the kubelet stand-in, pods deleted gracefully (the
kubelet stand-in stops their processes and makes the final delete). GPU 1 holds two priority-10 shares of 20,000 MiB,
GPU 2 a priority-50 share of 30,000 and a priority-10 share of 10,000. A priority-10 pod of 20,000 fits nowhere and
evicts nothing (equal priority). A priority-100 pod of 20,000 then evicts exactly one priority-10 share of GPU 1 (on
GPU 2 it would have to evict the priority-50 pod) and runs there with its limit, while the waiting priority-10 pod
does not take the room made for it. Without the extender's preemption (`--no-preemption`), kube-scheduler's own
preemption finds no candidate (its dry run does not see GPU memory) and nothing is evicted: the high-priority pod
stays Pending. In DRA mode nothing preempts for claims, by kube-scheduler or by us. The priorities come from
PriorityClasses (`low` 10, `mid` 50, `high` 100) that the fixtures create: the Priority admission plugin sets
spec.priority, no pod may.
"""

from __future__ import annotations

import pytest
from e2e_helpers import WORKLOAD, container, phase, pod, reports, wait_until

from vgpu import keys
from vgpu.assignment import decode
from vgpu.dra import DEVICE_CLASS

pytestmark = pytest.mark.slow

NS = "e2e"
POLICY = ["--node-policy", "binpack"]  # GPUs filled in turn, so the shares stack as planned
CLASSES = {"low": 10, "mid": 50, "high": 100}
RUNNING = [("low-a1", "low", 20000), ("low-a2", "low", 20000), ("mid-b", "mid", 30000), ("low-b", "low", 10000)]


def _classes(cluster) -> None:
    """The PriorityClasses the pods name."""
    for name, value in CLASSES.items():
        cluster.api_post("/apis/scheduling.k8s.io/v1/priorityclasses", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
            "value": value})


def _pod(name: str, priority_class: str, mib: int, hold: int = 600) -> dict:
    body = pod(name, [container("main", WORKLOAD + ["--mib", "100", "--hold", str(hold)], memory=mib)])
    body["spec"]["priorityClassName"] = priority_class
    body["spec"]["terminationGracePeriodSeconds"] = 5
    return body


def _get(cluster, name: str) -> dict:
    return cluster.api_get(f"/api/v1/namespaces/{NS}/pods/{name}") or {}


def _gpu_of(p: dict) -> str:
    ((grant,),) = decode(p["metadata"]["annotations"][keys.VGPU_IDS])
    return grant.uuid


def _fill(cluster) -> dict[str, str]:
    """Run the four lower-priority shares one after another (so binpack stacks them as planned); their GPUs."""
    gpus = {}
    for name, priority_class, mib in RUNNING:
        cluster.create_pod(_pod(name, priority_class, mib))
        running = wait_until(f"{name} running", lambda n=name: (p := _get(cluster, n)) and phase(p) == "Running"
                             and p, 120)
        gpus[name] = _gpu_of(running)
    assert gpus["low-a1"] == gpus["low-a2"] and gpus["mid-b"] == gpus["low-b"] != gpus["low-a1"], gpus
    return gpus


def _evicted(cluster) -> list[str]:
    return sorted(e["involvedObject"]["name"] for e in cluster.events() if e.get("reason") == "Preempted")


@pytest.fixture(scope="module")
def cluster(make_cluster):
    cluster = make_cluster(nodes=1, gpus="2xA100-40GB", graceful_deletion=True, scheduler_args=POLICY)
    _classes(cluster)
    return cluster


@pytest.fixture(scope="module")
def cluster_without(make_cluster):
    cluster = make_cluster(nodes=1, gpus="2xA100-40GB", graceful_deletion=True,
                           scheduler_args=[*POLICY, "--no-preemption"])
    _classes(cluster)
    return cluster


def test_a_high_priority_share_evicts_exactly_one_lower_share(cluster, request):
    request.node._e2e_cluster = cluster
    gpus = _fill(cluster)
    cluster.create_pod(_pod("same", "low", 20000))
    wait_until("same refused", lambda: any(e.get("reason") == "FailedScheduling"
                                           and e["involvedObject"]["name"] == "same" for e in cluster.events()), 60)
    cluster.create_pod(_pod("high", "high", 20000, hold=3))
    high = wait_until("high running", lambda: (p := _get(cluster, "high")) and phase(p) in ("Running", "Succeeded")
                      and p, 120)
    assert phase(_get(cluster, "same")) == "Pending"  # the room was held for "high"
    assert _gpu_of(high) == gpus["low-a1"]
    assert _evicted(cluster) == ["low-a2"]
    assert _get(cluster, "low-a2") == {}  # gone: the kubelet stand-in made the final delete
    for name in ("low-a1", "mid-b", "low-b"):
        assert phase(_get(cluster, name)) == "Running", name
    wait_until("high finished", lambda: phase(_get(cluster, "high")) == "Succeeded", 60)
    assert reports(cluster)[(NS, "high", "main")]["limits"] == {"CUDA_DEVICE_MEMORY_LIMIT_0": "20000m"}


def test_without_the_extenders_preemption_nothing_is_evicted(cluster_without, request):
    cluster = cluster_without
    request.node._e2e_cluster = cluster
    _fill(cluster)
    cluster.create_pod(_pod("high", "high", 20000))
    wait_until("high refused twice", lambda: sum(e.get("count", 1) for e in cluster.events()
                                                 if e.get("reason") == "FailedScheduling"
                                                 and e["involvedObject"]["name"] == "high") >= 2, 90)
    assert phase(_get(cluster, "high")) == "Pending"
    assert _evicted(cluster) == []
    for name, _, _ in RUNNING:
        assert phase(_get(cluster, name)) == "Running", name


# ------------------------------------------------------------------------------------------------ DRA mode

@pytest.fixture(scope="module")
def dra_cluster(make_cluster):
    from vgpu.testbed.demo_dra import device_classes

    cluster = make_cluster(nodes=1, gpus="2xA100-40GB", dra=True, graceful_deletion=True)
    _classes(cluster)
    for body in device_classes():
        cluster.api_post("/apis/resource.k8s.io/v1/deviceclasses", body)
    request = {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS, "count": 1,
                                          "capacity": {"requests": {"memory": "30Gi", "cores": "50"}}}}
    cluster.api_post(f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "big", "namespace": NS}, "spec": {"spec": {"devices": {"requests": [request]}}}})
    return cluster


def _claim_pod(name: str, priority_class: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"schedulerName": "vgpu-scheduler", "restartPolicy": "Never",
                     "priorityClassName": priority_class,
                     "terminationGracePeriodSeconds": 5,
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "big"}],
                     "containers": [{"name": "main", "image": "sample",
                                     "command": WORKLOAD + ["--mib", "100", "--hold", "600"],
                                     "resources": {"claims": [{"name": "gpu"}],
                                                   "requests": {"cpu": "100m", "memory": "64Mi"}}}]}}


def test_dra_claims_are_not_preempted(dra_cluster, request):
    """DRA mode: a node whose claims cannot be allocated is UnschedulableAndUnresolvable for kube-scheduler
    (pkg/scheduler/framework/plugins/dynamicresources: statusUnschedulable), so its preemption never tries it
    ("Preemption is not helpful for scheduling"), and the extender does not preempt for claims: the pod waits."""
    cluster = dra_cluster
    request.node._e2e_cluster = cluster
    for name in ("dra-low1", "dra-low2"):
        cluster.create_pod(_claim_pod(name, "low"))
        wait_until(f"{name} running", lambda n=name: phase(_get(cluster, n)) == "Running", 120)
    cluster.create_pod(_claim_pod("dra-high", "high"))

    def refusals() -> list[str]:
        return [e.get("message", "") for e in cluster.events()
                if e.get("reason") == "FailedScheduling" and e["involvedObject"]["name"] == "dra-high"]

    messages = wait_until("dra-high refused", refusals, 90)
    assert any("Preemption is not helpful for scheduling" in m for m in messages), messages
    assert phase(_get(cluster, "dra-high")) == "Pending" and _evicted(cluster) == []
    for name in ("dra-low1", "dra-low2"):
        assert phase(_get(cluster, name)) == "Running", name
