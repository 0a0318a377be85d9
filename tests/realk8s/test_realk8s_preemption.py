"""The extender's preemption of GPU shares through the real Eviction API: kube-apiserver checks each eviction
against the victim's PodDisruptionBudget, whose status kube-controller-manager's disruption controller keeps; the
evicted pod is deleted by kube-apiserver and ended by upstream kubelet, and the preemptor is placed in its room.
While a budget forbids every eviction, the waiting pod's events name the budget, once."""

from __future__ import annotations

import time

import pytest
from realk8s_helpers import create, get_pod, gpu_container, gpu_pod, phase, report, wait_finished

from vgpu.scheduler.preemption import REPLAN_SECONDS

pytestmark = [pytest.mark.realk8s, pytest.mark.slow]


def _priority_class(name: str, value: int) -> dict:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
            "value": value}


def _budget(name: str, app: str, min_available: int) -> dict:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}}}


def _holder(name: str, app: str) -> dict:
    """A low-priority share of 30,000 MiB of the node's one GPU, running until it is evicted."""
    pod = gpu_pod(name, [gpu_container("main", ["--mib", "500", "--hold", "600"], memory=30000)],
                  priorityClassName="low")
    pod["metadata"]["labels"] = {"app": app}
    return pod


@pytest.fixture(scope="module")
def cluster(make_real_cluster):
    cluster = make_real_cluster(nodes=1, gpus="1xA100-40GB")
    for name, value in (("low", 100), ("high", 1000)):
        cluster.post("/apis/scheduling.k8s.io/v1/priorityclasses", _priority_class(name, value))
    return cluster


def _budget_settled(cluster, name: str, expected_allowed: int) -> bool:
    status = cluster.get(f"/apis/policy/v1/namespaces/default/poddisruptionbudgets/{name}").get("status") or {}
    return status.get("observedGeneration") == 1 and status.get("disruptionsAllowed") == expected_allowed \
        and status.get("currentHealthy") == 1


def test_a_budget_that_forbids_the_eviction_keeps_the_victim_and_one_that_allows_it_lets_the_preemptor_in(cluster):
    create(cluster, _holder("guarded", "guarded"))
    cluster.wait("guarded running", lambda: phase(get_pod(cluster, "guarded")) == "Running", 90)
    cluster.post("/apis/policy/v1/namespaces/default/poddisruptionbudgets", _budget("keep", "guarded", 1))
    cluster.wait("the disruption controller's status", lambda: _budget_settled(cluster, "keep", 0), 60)
    create(cluster, gpu_pod("urgent", [gpu_container("main", ["--mib", "500"], memory=20000)],
                            priorityClassName="high"))
    # kube-apiserver answers every eviction of `guarded` with 429 while the budget forbids it: nothing moves
    # the waiting pod is told why, naming the budget, once (not at each of the extender's retries)
    blocked = cluster.wait("the pod told why", lambda: [e for e in cluster.events("default", "urgent")
                                                        if e.startswith("PreemptionBlocked:")], 60)
    assert "The disruption budget keep needs 1 healthy pods and has 1 currently" in blocked[0], blocked
    time.sleep(2 * REPLAN_SECONDS + 1)
    assert [e for e in cluster.events("default", "urgent") if e.startswith("PreemptionBlocked:")] == blocked
    items = cluster.get("/api/v1/namespaces/default/events", fieldSelector="involvedObject.name=urgent")["items"]
    assert [e.get("count", 1) for e in items if e["reason"] == "PreemptionBlocked"] == [1]
    assert phase(get_pod(cluster, "guarded")) == "Running"
    assert not get_pod(cluster, "urgent")["spec"].get("nodeName")
    # the budget relaxed: kube-scheduler sees no event of its own (a budget is none), but the extender plans for
    # the blocked pod again by itself, evicts the victim, and the victim's deletion brings the pod back
    cluster.http.delete("/apis/policy/v1/namespaces/default/poddisruptionbudgets/keep").raise_for_status()
    cluster.post("/apis/policy/v1/namespaces/default/poddisruptionbudgets", _budget("allow", "guarded", 0))
    done = wait_finished(cluster, "urgent", timeout=180)
    assert phase(done) == "Succeeded", cluster.events("default", "urgent")
    assert report(cluster, "urgent", "main")["devices"][0]["total_mib"] == 20000
    victim = cluster.get("/api/v1/namespaces/default/pods", fieldSelector="metadata.name=guarded")["items"]
    assert victim == [] or victim[0]["metadata"].get("deletionTimestamp"), victim
