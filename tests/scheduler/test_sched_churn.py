"""Pods that come and go leave nothing behind in the served extender: after pods are created, filtered, prioritized,
bound and deleted through the API server, what it keeps per pod (the Events its recorder keeps to aggregate
repeats, the pods it learned from, the ledger's charges, the pod cache) is back to what it held before, while every
binding's Event was still written."""

from __future__ import annotations

from contextlib import suppress

from sched_builders import container, gpu, node, pod
from sched_helpers import wait_until

CYCLES = 25


def _held(runtime):
    return {"recorded events kept": runtime.recorder.remembered, "pods learned": len(runtime.extender._seen),
            "charges": len(runtime.ledger.charges), "cached pods": len(runtime.pods)}


def test_churned_pods_leave_nothing_behind(kube, served):
    kube.create_node(node("n1", [gpu("GPU-1", 16000), gpu("GPU-2", 16000)]))
    kube.create_pod(pod("stays", container(number=1, memory=2000, cores=10), node_name="n1"))
    ext = served(mode="score")
    runtime = ext.runtime
    wait_until(lambda: len(runtime.pods) == 1, what="the running pod in the cache")
    before = _held(runtime)
    for i in range(CYCLES):
        p = kube.create_pod(pod(f"churn-{i}", container(number=1, memory=4000, cores=10)))
        names = ext.post("/filter", {"Pod": p, "NodeNames": ["n1"]}).json()["NodeNames"]
        assert names == ["n1"]
        assert ext.post("/prioritize", {"Pod": p, "NodeNames": names}).status_code == 200
        bind = {"PodName": p["metadata"]["name"], "PodNamespace": "default", "PodUID": p["metadata"]["uid"],
                "Node": "n1"}
        assert ext.post("/bind", bind).json() == {"Error": ""}
        kube._read(kube.core.delete_namespaced_pod(p["metadata"]["name"], "default", _preload_content=False))
    with suppress(AssertionError):  # the deletions reach the extender through its pod watch
        wait_until(lambda: runtime.recorder.flush(0.2) and _held(runtime) == before, timeout=20)
    assert _held(runtime) == before
    bound = {e["involvedObject"]["name"] for e in kube.events() if e["reason"] == "BindingSucceeded"}
    assert bound == {f"churn-{i}" for i in range(CYCLES)}
