"""Contract tests: the extender over real HTTP, fed kube-scheduler's exact extender JSON, binding through the
API-server stand-in; the bound pod's annotations are checked byte for byte."""

import re
import time

import orjson
import pytest
from prometheus_client import generate_latest
from sched_builders import container, gpu, node, pod
from sched_helpers import wait_until

from vgpu import keys

A100 = "NVIDIA-NVIDIA A100-PCIE-40GB"


def seed(kube, *, broken=True):
    kube.create_node(node("node-a", [gpu("GPU-aaaa", 40960, type_=A100), gpu("GPU-bbbb", 40960, type_=A100)]))
    kube.create_node(node("node-b", [gpu("GPU-cccc", 40960, type_=A100)]))
    if broken:
        kube.create_node(node("node-x", register="GPU-xxxx,10,40960"))
    worker = container(name="worker", number=2, memory=10000, cores=30)
    sidecar = {"name": "sidecar", "image": "busybox", "resources": {}}
    return kube.create_pod(pod("trainer", sidecar, worker))


def go_filter_args(pod_obj, names=None, nodes=None) -> bytes:
    """ExtenderArgs as kube-scheduler's Go encoder writes them (no json tags: Go field names, nulls kept)."""
    nodes_json = b"null" if nodes is None else orjson.dumps({"metadata": {}, "items": nodes})
    names_json = b"null" if names is None else orjson.dumps(names)
    return b'{"Pod":' + orjson.dumps(pod_obj) + b',"Nodes":' + nodes_json + b',"NodeNames":' + names_json + b"}"


def go_bind_args(pod_obj, node_name) -> bytes:
    meta = pod_obj["metadata"]
    return (
        b'{"PodName":"' + meta["name"].encode() + b'","PodNamespace":"' + meta["namespace"].encode()
        + b'","PodUID":"' + meta["uid"].encode() + b'","Node":"' + node_name.encode() + b'"}'
    )


def expected_annotations(bound, node_name, ids):
    got = bound["metadata"]["annotations"]
    stamp = got.get(keys.VGPU_TIME, "")
    assert re.fullmatch(r"[0-9]{10}", stamp) and abs(int(stamp) - time.time()) < 60
    return {
        keys.VGPU_NODE: node_name,
        keys.VGPU_IDS: ids,
        keys.DEVICES_TO_ALLOCATE: ids,
        keys.VGPU_TIME: stamp,
        keys.BIND_TIME: stamp,
        keys.BIND_PHASE: "allocating",
    }


CONTRACT_IDS = "GPU-aaaa,NVIDIA,10000,30:GPU-bbbb,NVIDIA,10000,30:"


def test_decide_mode_filter_and_bind_byte_for_byte(kube, served):
    p = seed(kube)
    ext = served(mode="decide")
    r = ext.post("/filter", go_filter_args(p, names=["node-a", "node-b", "node-x", "node-gone"]))
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    out = r.json()
    assert out["NodeNames"] == ["node-a"] and out["Error"] == ""
    assert "needs 2 GPUs, node has 1" in out["FailedAndUnresolvableNodes"]["node-b"]
    assert "malformed" in out["FailedAndUnresolvableNodes"]["node-x"]
    assert "not known" in out["FailedAndUnresolvableNodes"]["node-gone"]

    r = ext.post("/bind", go_bind_args(p, "node-a"))
    assert r.status_code == 200 and r.json() == {"Error": ""}
    bound = kube.pod("trainer")
    assert bound["spec"]["nodeName"] == "node-a"
    assert bound["metadata"]["annotations"] == expected_annotations(bound, "node-a", CONTRACT_IDS)

    # kube-scheduler retries the bind (e.g. its HTTP call timed out): same answer, no second binding.
    r = ext.post("/bind", go_bind_args(p, "node-a"))
    assert r.json() == {"Error": ""}
    wait_until(lambda: ext.ledger.charges.get(p["metadata"]["uid"], None) is not None
               and ext.ledger.charges[p["metadata"]["uid"]].state == "observed", what="watch confirms the pod")
    usage = [(u.shares, u.memory, u.cores) for u in ext.ledger.nodes["node-a"].usage]
    assert usage == [(1, 10000, 30), (1, 10000, 30)]
    bound_event = wait_until(lambda: next((e for e in kube.events() if e.get("reason") == "BindingSucceeded"), None),
                             what="event")
    assert bound_event["message"] == "bound to node-a: GPU-aaaa (10000 MiB, 30% cores); GPU-bbbb (10000 MiB, 30% cores)"

    text = generate_latest(ext.runtime.metrics.registry).decode()
    assert 'vgpu_scheduler_device_memory_allocated_bytes{device_index="0",device_type=' in text
    assert ('vgpu_scheduler_pod_memory_allocated_bytes{device_uuid="GPU-aaaa",namespace="default",node="node-a",'
            'pod="trainer",state="observed"} 1.048576e+10') in text  # 10000 MiB
    assert 'vgpu_scheduler_decisions_total{decision="bound",verb="bind"} 2.0' in text  # the bind and its retry
    assert 'vgpu_scheduler_decisions_total{decision="placed",verb="filter"} 1.0' in text
    assert 'vgpu_scheduler_request_duration_seconds_count{verb="filter"} 1.0' in text
    assert 'vgpu_scheduler_cache_synced{cache="pods"} 1.0' in text


def test_score_mode_filter_prioritize_bind_with_full_nodes(kube, served):
    kube.create_node(node("n1", [gpu("GPU-1", 8000)]))
    kube.create_node(node("n2", [gpu("GPU-2", 8000)]))
    kube.create_node(node("n3", [gpu("GPU-3", 8000)]))
    kube.create_pod(pod("busy", node_name=None))
    kube.bind("busy", "n2")  # not a vGPU pod: no charge
    existing = kube.create_pod(pod("old", container(number=1, memory=6000)))
    ext = served(mode="score")
    r = ext.post("/filter", go_filter_args(existing, names=["n1"]))
    assert r.json()["NodeNames"] == ["n1"]
    assert ext.post("/bind", go_bind_args(existing, "n1")).json() == {"Error": ""}

    p = kube.create_pod(pod("new", container(number=1, memory=1000)))
    full = [kube._read(kube.core.read_node(n, _preload_content=False)) for n in ("n1", "n2", "n3")]
    out = ext.post("/filter", go_filter_args(p, nodes=full)).json()
    assert out["NodeNames"] == ["n1", "n2", "n3"]
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["n1", "n2", "n3"]

    prio = ext.post("/prioritize", go_filter_args(p, names=["n1", "n2", "n3"])).json()
    assert prio == [{"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 0}, {"Host": "n3", "Score": 0}]

    assert ext.post("/bind", go_bind_args(p, "n1")).json() == {"Error": ""}
    bound = kube.pod("new")
    assert bound["metadata"]["annotations"] == expected_annotations(bound, "n1", "GPU-1,NVIDIA,1000,0:")


def test_bind_conflict_returns_error_and_releases_reservation(kube, served):
    kube.create_node(node("n1", [gpu("GPU-1", 8000)]))
    kube.create_node(node("n2", [gpu("GPU-2", 8000)]))
    p = kube.create_pod(pod("p", container(number=1, memory=3000)))
    ext = served(mode="decide")
    assert ext.post("/filter", go_filter_args(p, names=["n1"])).json()["NodeNames"] == ["n1"]
    assert ext.ledger.nodes["n1"].usage[0].memory == 3000
    kube.bind("p", "n2")  # someone else binds the pod first
    out = ext.post("/bind", go_bind_args(p, "n1")).json()
    assert "conflict" in out["Error"] and "already assigned" in out["Error"]
    assert ext.ledger.nodes["n1"].usage[0].memory == 0
    wait_until(lambda: any(e.get("reason") == "BindingFailed" for e in kube.events()), what="event")


def test_bind_without_filter_refits_from_pod_cache(kube, served):
    kube.create_node(node("n1", [gpu("GPU-1", 8000)]))
    p = kube.create_pod(pod("p", container(number=1, memory=9000)))
    q = kube.create_pod(pod("q", container(number=1, memory=2000, cores=10)))
    ext = served(mode="score")
    wait_until(lambda: ext.runtime.pods.get("default/q") is not None, what="pod cache")
    out = ext.post("/bind", go_bind_args(p, "n1")).json()
    assert "no longer fits" in out["Error"] and "card smaller than request" in out["Error"]
    assert ext.post("/bind", go_bind_args(q, "n1")).json() == {"Error": ""}
    assert kube.pod("q")["metadata"]["annotations"][keys.VGPU_IDS] == "GPU-1,NVIDIA,2000,10:"


def test_a_pod_asking_none_of_our_resources_is_bound_without_an_assignment(kube, served):
    """With an extender entry open to every pod (DRA mode's configuration), pods without GPUs of ours come to /bind
    too: they get a plain Binding, no annotations of the contract and no charge in the ledger."""
    kube.create_node(node("n1", [gpu("GPU-1", 8000)]))
    plain = {"name": "web", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}
    p = kube.create_pod(pod("plain", plain))
    ext = served(mode="score")
    wait_until(lambda: ext.runtime.pods.get("default/plain") is not None, what="pod cache")
    assert ext.post("/filter", go_filter_args(p, names=["n1"])).json()["NodeNames"] == ["n1"]
    assert ext.post("/bind", go_bind_args(p, "n1")).json() == {"Error": ""}
    bound = kube.pod("plain")
    assert bound["spec"]["nodeName"] == "n1"
    assert not any(k.startswith("volcano.sh/") for k in bound["metadata"].get("annotations") or {})
    assert p["metadata"]["uid"] not in ext.runtime.extender.ledger.charges
    assert ext.ledger.nodes["n1"].usage[0].memory == 0


def test_bad_input(kube, served):
    p = seed(kube, broken=False)
    ext = served(mode="score", max_body_bytes=64 * 1024)
    body = go_filter_args(p, names=["node-a"])
    assert ext.post("/filter", body[: len(body) // 2]).status_code == 400
    assert ext.post("/bind", b'{"PodName": "x",').status_code == 400
    assert ext.post("/prioritize", b"{nope").status_code == 400
    r = ext.post("/filter", b"[1, 2]")
    assert r.status_code == 200 and "expected a JSON object" in r.json()["Error"]
    assert "missing Pod" in ext.post("/filter", {"NodeNames": ["node-a"]}).json()["Error"]
    assert "NodeNames must be a list" in ext.post("/filter", {"Pod": p, "NodeNames": "node-a"}).json()["Error"]
    assert "PodName missing" in ext.post("/bind", {"Node": "node-a"}).json()["Error"]
    assert "not found" in ext.post("/bind", {"PodName": "ghost", "PodNamespace": "default", "PodUID": "u",
                                             "Node": "node-a"}).json()["Error"]
    assert ext.post("/prioritize", {"Pod": 5}).json() == []
    big = b'{"Pod": {}, "NodeNames": ["' + b"x" * 100_000 + b'"]}'
    assert ext.post("/filter", big).status_code == 413

    negative = pod("neg", container(name="w", number=1, memory=-5))
    out = ext.post("/filter", {"Pod": negative, "NodeNames": ["node-a"]}).json()
    assert "'w'" in out["Error"] and "volcano.sh/vgpu-memory" in out["Error"] and out["NodeNames"] == []
    huge = pod("huge", container(name="w", number=1, memory=50000))
    out = ext.post("/filter", {"Pod": huge, "NodeNames": ["node-a", "node-b"]}).json()
    assert out["NodeNames"] == [] and "card smaller than request" in out["FailedAndUnresolvableNodes"]["node-a"]
    too_many = pod("many", container(name="w", number=65))
    assert "above 64" in ext.post("/filter", {"Pod": too_many, "NodeNames": ["node-a"]}).json()["Error"]
    # Only resources we do not manage: not our pod, every node passes unchanged.
    other = pod("other", container(name="w", extra={"example.com/fpga": "1"}))
    other["spec"]["containers"][0]["resources"]["limits"] = {"example.com/fpga": "1"}
    out = ext.post("/filter", {"pod": other, "nodenames": ["node-a", "node-b"]}).json()
    assert out["NodeNames"] == ["node-a", "node-b"] and out["Error"] == ""
    # Any capitalisation of the Go field names.
    out = ext.post("/filter", {"POD": p, "nodeNames": ["node-a"]}).json()
    assert out["NodeNames"] == ["node-a"]
    wait_until(lambda: any(e.get("reason") == "FilteringFailed" for e in kube.events()), what="event")
    assert ext.http.get("/healthz").status_code == 200
    assert ext.http.get("/readyz").status_code == 200


def test_follower_is_not_ready_and_refuses(kube, served):
    seed(kube, broken=False)
    leader = served(mode="decide", leader_elect=True, lease_namespace="default")
    wait_until(lambda: leader.http.get("/readyz").status_code == 200, what="leader ready")
    follower = served(mode="decide", leader_elect=True, lease_namespace="default")
    time.sleep(0.5)
    r = follower.http.get("/readyz")
    assert r.status_code == 503 and "not the leader" in r.text
    p = kube.pod("trainer")
    assert "not the leader" in follower.post("/filter", go_filter_args(p, names=["node-a"])).json()["Error"]


def test_the_extender_beside_the_leading_kube_scheduler_serves_and_the_other_refuses(kube, served):
    """--follow-lease: readiness follows kube-scheduler's Lease (an elector named as kube-scheduler names itself,
    `<hostname>_<uuid>`, stands for the kube-scheduler of pod `pod-a`); the other pod's extender refuses /filter
    naming the holder, and binds nothing."""
    from vgpu.kube import LeaderElector

    seed(kube, broken=False)
    scheduler = LeaderElector(kube.api, "kube-sched", "default", identity="pod-a_5d1c", lease_duration=3.0,
                              renew_deadline=2.0, retry_period=0.2).start()
    try:
        assert scheduler.wait_for_leadership(5)
        beside = served(mode="decide", follow_lease="default/kube-sched", leader_identity="pod-a")
        other = served(mode="decide", follow_lease="default/kube-sched", leader_identity="pod-b")
        wait_until(lambda: beside.http.get("/readyz").status_code == 200, what="the leading pod's extender ready")
        r = other.http.get("/readyz")
        assert r.status_code == 503 and "held by pod-a_5d1c, not by pod-b" in r.text, r.text
        p = kube.pod("trainer")
        assert "held by pod-a_5d1c" in other.post("/filter", go_filter_args(p, names=["node-a"])).json()["Error"]
        assert other.http.get("/healthz").status_code == 200  # a standby is not stuck: nothing asks it
        assert beside.post("/filter", go_filter_args(p, names=["node-a"])).json()["NodeNames"] == ["node-a"]
    finally:
        scheduler.stop()


def test_an_extender_that_should_serve_but_cannot_fails_its_liveness_probe(kube, apiserver, served):
    """Its pod list is refused (so its caches never sync) while nothing else leads: /readyz says why at once, and
    /healthz fails once that has lasted unready_restart_seconds, for kubelet to restart the container."""
    apiserver.faults.set([{"action": "error", "method": "GET", "path": "^/api/v1/pods", "status": 500}])
    try:
        ext = served(mode="decide", unready_restart_seconds=1.0)
        assert "pod cache not synced" in ext.http.get("/readyz").text
        assert ext.http.get("/healthz").status_code == 200  # not yet for long
        time.sleep(1.2)
        r = ext.http.get("/healthz")
        assert r.status_code == 503 and "while it should serve: pod cache not synced" in r.text, r.text
        apiserver.faults.clear()
        wait_until(lambda: ext.http.get("/readyz").status_code == 200, timeout=20, what="the caches to sync")
        assert ext.http.get("/healthz").status_code == 200
    finally:
        apiserver.faults.clear()


@pytest.mark.parametrize("mode", ["decide", "score"])
def test_pod_deleted_after_bind_releases(kube, served, mode):
    kube.create_node(node("n1", [gpu("GPU-1", 8000)]))
    p = kube.create_pod(pod("p", container(number=1, memory=3000)))
    ext = served(mode=mode)
    assert ext.post("/filter", go_filter_args(p, names=["n1"])).json()["NodeNames"] == ["n1"]
    assert ext.post("/bind", go_bind_args(p, "n1")).json() == {"Error": ""}
    kube.core.delete_namespaced_pod("p", "default", _preload_content=False).release_conn()
    wait_until(lambda: ext.ledger.nodes["n1"].usage[0].memory == 0, what="release on delete")


def test_whole_gpu_mode_gives_number_only_pods_exclusive_cards(kube, served):
    """With exclusive_whole_gpu, `vgpu-number: 1` alone means one whole card, as `nvidia.com/gpu: 1` users expect."""
    kube.create_node(node("node-a", [gpu("GPU-aaaa", 40960, type_=A100), gpu("GPU-bbbb", 40960, type_=A100)]))
    ext = served(mode="decide", sharing={"exclusive_whole_gpu": True})
    first = kube.create_pod(pod("whole-1", container(number=1)))
    assert ext.post("/filter", go_filter_args(first, names=["node-a"])).json()["NodeNames"] == ["node-a"]
    assert ext.post("/bind", go_bind_args(first, "node-a")).json() == {"Error": ""}
    ids = kube.pod("whole-1")["metadata"]["annotations"][keys.VGPU_IDS]
    assert ids == "GPU-aaaa,NVIDIA,40960,100:"
    # a shared pod no longer fits on the exclusive card; it gets the other one, and a third pod gets nothing
    shared = kube.create_pod(pod("shared", container(number=1, memory=1000, cores=10)))
    assert ext.post("/filter", go_filter_args(shared, names=["node-a"])).json()["NodeNames"] == ["node-a"]
    assert ext.post("/bind", go_bind_args(shared, "node-a")).json() == {"Error": ""}
    assert kube.pod("shared")["metadata"]["annotations"][keys.VGPU_IDS] == "GPU-bbbb,NVIDIA,1000,10:"
    second = kube.create_pod(pod("whole-2", container(number=1)))
    out = ext.post("/filter", go_filter_args(second, names=["node-a"])).json()
    assert out["NodeNames"] == [] and "node-a" in {**out["FailedNodes"], **out["FailedAndUnresolvableNodes"]}


def test_retried_bind_of_a_pod_that_already_finished_leaves_no_charge(kube, served):
    """kube-scheduler's view can lag (a stalled watch): it retries /filter and /bind for a pod we bound and that has
    since finished. The retry succeeds (the binding is there) and must not charge the GPU again."""
    kube.create_node(node("n1", [gpu("GPU-1", 8000)]))
    p = kube.create_pod(pod("p", container(number=1, memory=3000)))
    ext = served(mode="decide")
    assert ext.post("/filter", go_filter_args(p, names=["n1"])).json()["NodeNames"] == ["n1"]
    assert ext.post("/bind", go_bind_args(p, "n1")).json() == {"Error": ""}
    kube.core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Succeeded"}},
                                          _preload_content=False).release_conn()
    wait_until(lambda: ext.ledger.nodes["n1"].usage[0].memory == 0, what="release on Succeeded")
    ext.post("/filter", go_filter_args(p, names=["n1"]))
    assert ext.post("/bind", go_bind_args(p, "n1")).json() == {"Error": ""}
    ext.ledger.expire()
    assert ext.ledger.nodes["n1"].usage[0].memory == 0
    assert "p" not in {c.name for c in ext.ledger.charges.values()}


def test_a_node_deleted_under_bound_pods_is_not_placed_on_and_returns_with_their_charges(kube, served):
    """A node object deleted while pods hold its GPUs (a node re-registering, an operator's mistake): nothing is
    placed there while it is gone, and when it comes back its running pods are charged again, so the GPU they hold
    is not handed out twice."""
    n1 = node("n1", [gpu("GPU-1", 8000)])
    kube.create_node(n1)
    kube.create_node(node("n2", [gpu("GPU-2", 8000)]))
    held = kube.create_pod(pod("held", container(number=1, memory=6000)))
    ext = served(mode="decide")
    assert ext.post("/filter", go_filter_args(held, names=["n1"])).json()["NodeNames"] == ["n1"]
    assert ext.post("/bind", go_bind_args(held, "n1")).json() == {"Error": ""}
    wait_until(lambda: "n1" in ext.ledger.nodes and ext.ledger.nodes["n1"].usage[0].memory == 6000, what="charge")

    kube.core.delete_node("n1", _preload_content=False).read()
    wait_until(lambda: "n1" not in ext.ledger.nodes, what="node gone from the ledger")
    late = kube.create_pod(pod("late", container(number=1, memory=4000)))
    out = ext.post("/filter", go_filter_args(late, names=["n1", "n2"])).json()
    assert out["NodeNames"] == ["n2"] and "not known" in out["FailedAndUnresolvableNodes"]["n1"]

    kube.create_node(n1)
    wait_until(lambda: "n1" in ext.ledger.nodes, what="node back in the ledger")
    assert ext.ledger.nodes["n1"].usage[0].memory == 6000  # the running pod is charged again
    other = kube.create_pod(pod("other", container(number=1, memory=4000)))
    assert ext.post("/filter", go_filter_args(other, names=["n1"])).json()["NodeNames"] == []
