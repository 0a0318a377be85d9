"""The extender while the API server is in trouble (faults injected by the stand-in): /filter keeps answering from
its caches, /bind refuses with a clear reason when the binding cannot be written and leaves nothing reserved, and
a binding the server turned away for a moment (429) goes through."""

from __future__ import annotations

from sched_builders import container, gpu, node, pod

NODES = ["n1"]


def _seed(kube):
    kube.create_node(node("n1", [gpu("GPU-1", 16000)]))
    return kube.create_pod(pod("job", container(number=1, memory=12000, cores=50)))


def test_filter_answers_from_the_caches_during_an_outage(kube, apiserver, served):
    p = _seed(kube)
    ext = served(mode="decide")
    apiserver.faults.set([{"action": "error", "path": "/api", "status": 503, "retry_after": 0}])
    answer = ext.post("/filter", {"Pod": p, "NodeNames": NODES}).json()
    assert answer["NodeNames"] == ["n1"] and not answer["Error"]


def test_bind_refuses_clearly_and_reserves_nothing_when_the_binding_cannot_be_written(kube, apiserver, served):
    p = _seed(kube)
    ext = served(mode="decide")
    assert ext.post("/filter", {"Pod": p, "NodeNames": NODES}).json()["NodeNames"] == ["n1"]
    apiserver.faults.set([{"action": "error", "method": "POST", "path": "/binding", "status": 503,
                           "retry_after": 0}])
    bind = {"PodName": "job", "PodNamespace": "default", "PodUID": p["metadata"]["uid"], "Node": "n1"}
    error = ext.post("/bind", bind).json()["Error"]
    assert "binding failed" in error and "503" in error
    assert [u.memory for u in ext.ledger.nodes["n1"].usage] == [0]  # the reservation went with the failure
    apiserver.faults.clear()
    other = kube.create_pod(pod("other", container(number=1, memory=12000, cores=50)))
    assert ext.post("/filter", {"Pod": other, "NodeNames": NODES}).json()["NodeNames"] == ["n1"]


def test_a_binding_turned_away_for_a_moment_goes_through(kube, apiserver, served):
    p = _seed(kube)
    ext = served(mode="decide")
    assert ext.post("/filter", {"Pod": p, "NodeNames": NODES}).json()["NodeNames"] == ["n1"]
    apiserver.faults.set([{"action": "error", "method": "POST", "path": "/binding", "status": 429,
                           "retry_after": 1, "times": 2}])
    bind = {"PodName": "job", "PodNamespace": "default", "PodUID": p["metadata"]["uid"], "Node": "n1"}
    assert ext.post("/bind", bind).json() == {"Error": ""}
    assert kube.pod("job")["spec"]["nodeName"] == "n1"
