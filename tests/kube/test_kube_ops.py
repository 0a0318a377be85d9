"""Patches, bindings, events, leader election and client rate limiting, against the API-server stand-in."""

from __future__ import annotations

import time

import pytest
from kubernetes import client as k8s

from vgpu.errors import ConfigError, VGPUError
from vgpu.kube import (
    AlreadyExistsError,
    ConflictError,
    EventRecorder,
    LeaderElector,
    NotFoundError,
    bind_pod,
    make_api_client,
    patch_node_metadata,
    patch_pod_metadata,
    patch_pod_status,
)
from vgpu.kube.client import RateLimitedApiClient, TokenBucket, read_json
from vgpu.kube.errors import UnavailableError
from vgpu.testbed.apiserver import write_kubeconfig


def mkpod(core: k8s.CoreV1Api, name: str) -> dict:
    return read_json(core.create_namespaced_pod("default", {"metadata": {"name": name},
                                                            "spec": {"containers": [{"name": "c"}]}},
                                                _preload_content=False))


# ------------------------------------------------------------------------------------------------------ patches

def test_patch_pod_metadata_sets_deletes_and_checks_resource_version(api):
    core = k8s.CoreV1Api(api)
    p = mkpod(core, "p")
    p1 = patch_pod_metadata(api, "default", "p", annotations={"a": "1", "b": "2"}, labels={"l": "x"})
    assert p1["metadata"]["annotations"] == {"a": "1", "b": "2"} and p1["metadata"]["labels"] == {"l": "x"}
    p2 = patch_pod_metadata(api, "default", "p", annotations={"a": None},
                            resource_version=p1["metadata"]["resourceVersion"])
    assert p2["metadata"]["annotations"] == {"b": "2"}
    with pytest.raises(ConflictError) as exc:
        patch_pod_metadata(api, "default", "p", annotations={"b": "3"},
                           resource_version=p["metadata"]["resourceVersion"])
    assert exc.value.status == 409 and "default/p" in str(exc.value) and isinstance(exc.value, VGPUError)
    assert read_json(core.read_namespaced_pod("p", "default", _preload_content=False))["metadata"]["annotations"] == {
        "b": "2"}
    with pytest.raises(NotFoundError):
        patch_pod_metadata(api, "default", "missing", annotations={"a": "1"})


def test_patch_node_metadata_and_pod_status(api):
    core = k8s.CoreV1Api(api)
    n = read_json(core.create_node({"metadata": {"name": "n1"}}, _preload_content=False))
    n1 = patch_node_metadata(api, "n1",
                             annotations={"volcano.sh/node-vgpu-register": "GPU-a,10,40960,T,true,hami-core:"},
                             resource_version=n["metadata"]["resourceVersion"])
    assert n1["metadata"]["annotations"]["volcano.sh/node-vgpu-register"].endswith(":")
    with pytest.raises(ConflictError):
        patch_node_metadata(api, "n1", labels={"gpu": "on"}, resource_version=n["metadata"]["resourceVersion"])
    mkpod(core, "p")
    assert patch_pod_status(api, "default", "p", {"phase": "Running"})["status"]["phase"] == "Running"


# ------------------------------------------------------------------------------------------------------ binding

def test_bind_pod_carries_annotations_and_uid_precondition(api):
    core = k8s.CoreV1Api(api)
    p = mkpod(core, "p")
    patch_pod_metadata(api, "default", "p", annotations={"user": "mine"})
    with pytest.raises(ConflictError):
        bind_pod(api, "default", "p", "n1", {"volcano.sh/bind-phase": "allocating"}, uid="stale-uid")
    decision = {"volcano.sh/vgpu-node": "n1", "volcano.sh/bind-phase": "allocating",
                "volcano.sh/vgpu-ids-new": "GPU-a,NVIDIA,1000,30:"}
    bind_pod(api, "default", "p", "n1", decision, uid=p["metadata"]["uid"])
    bound = read_json(core.read_namespaced_pod("p", "default", _preload_content=False))
    assert bound["spec"]["nodeName"] == "n1"
    assert bound["metadata"]["annotations"] == {"user": "mine", **decision}
    with pytest.raises(ConflictError):
        bind_pod(api, "default", "p", "n2", decision)
    with pytest.raises(NotFoundError):
        bind_pod(api, "default", "nope", "n1")


def test_already_exists_is_a_conflict(api):
    core = k8s.CoreV1Api(api)
    mkpod(core, "p")
    from vgpu.kube.errors import translate
    with pytest.raises(Exception) as raw:
        mkpod(core, "p")
    err = translate(raw.value, "create pod default/p")
    assert isinstance(err, AlreadyExistsError) and isinstance(err, ConflictError)


# ------------------------------------------------------------------------------------------------------- events

def test_event_recorder_creates_and_aggregates(api):
    core = k8s.CoreV1Api(api)
    p = mkpod(core, "p")
    rec = EventRecorder(api, component="vgpu-scheduler", host="h1")
    try:
        rec.warning(p, "FilteringFailed", "no GPU with 1000 MiB free")
        assert rec.flush(5)
        for _ in range(4):
            rec.warning(p, "FilteringFailed", "no GPU with 1000 MiB free")
        rec.normal(p, "BindingSucceeded", "bound to n1")
        assert rec.flush(5)
        events = read_json(core.list_namespaced_event("default", _preload_content=False))["items"]
        by_reason = {e["reason"]: e for e in events}
        assert set(by_reason) == {"FilteringFailed", "BindingSucceeded"}, "repeats aggregate into one Event"
        failed = by_reason["FilteringFailed"]
        assert failed["count"] == 5 and failed["type"] == "Warning"
        assert failed["involvedObject"] == {"kind": "Pod", "apiVersion": "v1", "name": "p", "namespace": "default",
                                            "uid": p["metadata"]["uid"]}
        assert failed["source"] == {"component": "vgpu-scheduler", "host": "h1"}
        assert failed["firstTimestamp"] and failed["lastTimestamp"] >= failed["firstTimestamp"]
        assert by_reason["BindingSucceeded"]["count"] == 1 and by_reason["BindingSucceeded"]["type"] == "Normal"
        assert rec.created == 2 and rec.failed == 0
        # node events land in "default"
        rec.normal({"kind": "Node", "metadata": {"name": "n1", "uid": "u"}}, "Registered", "4 GPUs")
        assert rec.flush(5)
        assert any(e["involvedObject"]["kind"] == "Node"
                   for e in read_json(core.list_namespaced_event("default", _preload_content=False))["items"])
    finally:
        rec.close()


def test_event_recorder_forgets_a_gone_object_but_still_sends_its_queued_events(api):
    core = k8s.CoreV1Api(api)
    p, q = mkpod(core, "p"), mkpod(core, "q")
    rec = EventRecorder(api, component="vgpu-scheduler")
    try:
        rec.normal(p, "BindingSucceeded", "bound to n1")
        rec.warning(p, "FilteringFailed", "no GPU")
        assert rec.flush(5) and rec.remembered == 2
        rec.normal(q, "BindingSucceeded", "bound to n2")
        rec.forget(q)  # gone while its event is still queued: the event is sent all the same
        rec.forget(p)
        assert rec.flush(5) and rec.remembered == 0, "nothing is kept for objects that are gone"
        rec.forget({"metadata": {"name": "never-seen", "namespace": "default"}})  # nothing to forget: no error
        assert rec.flush(5)
        events = read_json(core.list_namespaced_event("default", _preload_content=False))["items"]
        assert sorted((e["involvedObject"]["name"], e["reason"]) for e in events) == [
            ("p", "BindingSucceeded"), ("p", "FilteringFailed"), ("q", "BindingSucceeded")]
        rec.normal(p, "BindingSucceeded", "bound to n1")  # a repeat after forget starts a new Event
        assert rec.flush(5) and rec.created == 4 and rec.updated == 0
    finally:
        rec.close()


def test_event_recorder_keeps_no_event_past_its_aggregation_window(api):
    core = k8s.CoreV1Api(api)
    pods = [mkpod(core, f"p{i}") for i in range(4)]
    rec = EventRecorder(api, component="vgpu-scheduler", aggregate_window=0.5)
    try:
        for p in pods[:3]:
            rec.normal(p, "BindingSucceeded", "bound")
        assert rec.flush(5) and rec.remembered >= 1
        time.sleep(0.6)
        rec.normal(pods[3], "BindingSucceeded", "bound")
        assert rec.flush(5) and rec.remembered == 1, "the Events past the window are dropped"
    finally:
        rec.close()


def test_event_recorder_never_raises_when_api_is_down(tmp_path):
    kc = write_kubeconfig(tmp_path / "kc", "http://127.0.0.1:9")  # nothing listens on the discard port
    api = make_api_client(kc)
    rec = EventRecorder(api, component="test")
    try:
        rec.warning({"metadata": {"name": "p", "namespace": "default"}}, "R", "m")
        rec.event({}, "Normal", "Broken", "object without metadata")  # still no exception
        assert rec.flush(10)
        assert rec.failed >= 1 and rec.created == 0
    finally:
        rec.close()


# ----------------------------------------------------------------------------------------------- rate limiting

def test_token_bucket_counts():
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    bucket = TokenBucket(qps=10, burst=5, clock=lambda: now[0], sleep=sleep)
    assert sum(bucket.try_acquire() for _ in range(8)) == 5, "burst tokens at once, then none"
    now[0] += 0.35  # 3.5 tokens accrue at 10 qps
    assert sum(bucket.try_acquire() for _ in range(8)) == 3
    now[0] += 100  # never more than the burst
    assert sum(bucket.try_acquire() for _ in range(20)) == 5
    for _ in range(20):
        bucket.acquire()
    # after the burst is spent, each further token costs 1/qps seconds of (fake) time
    assert now[0] - 100.35 == pytest.approx(20 / 10)
    assert bucket.granted == 5 + 3 + 5 + 20
    with pytest.raises(ConfigError):
        TokenBucket(qps=0, burst=1)


def test_api_client_takes_one_token_per_request(apiserver):
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    default = make_api_client(apiserver.kubeconfig)
    assert (default.rate_limiter.qps, default.rate_limiter.burst) == (50, 100), "not the client-go 5/10"
    cfg = default.configuration
    api = RateLimitedApiClient(cfg, TokenBucket(qps=4, burst=2, clock=lambda: now[0], sleep=sleep))
    core = k8s.CoreV1Api(api)
    for _ in range(6):
        read_json(core.list_node(_preload_content=False))
    assert api.rate_limiter.granted == 6
    assert slept == pytest.approx([0.25] * 4), "two burst requests free, then one every 1/qps"
    default.close()
    api.close()


# --------------------------------------------------------------------------------------------- leader election

def test_leader_election_two_electors(api, eventually):
    events: list[str] = []
    kw = dict(name="vgpu-scheduler", namespace="kube-system", lease_duration=2.0, renew_deadline=1.2,
              retry_period=0.1)
    a = LeaderElector(api, identity="a", on_started_leading=lambda: events.append("a+"),
                      on_stopped_leading=lambda: events.append("a-"), **kw)
    b = LeaderElector(api, identity="b", on_started_leading=lambda: events.append("b+"),
                      on_stopped_leading=lambda: events.append("b-"), **kw)
    a.start()
    assert a.wait_for_leadership(5)
    b.start()
    coord = k8s.CoordinationV1Api(api)
    try:
        for _ in range(10):  # b keeps trying for a second while a renews
            assert a.is_leader and not b.is_leader
            time.sleep(0.1)
        assert b.holder == "a"
        lease = read_json(coord.read_namespaced_lease("vgpu-scheduler", "kube-system", _preload_content=False))
        assert lease["spec"]["holderIdentity"] == "a" and lease["spec"]["leaseDurationSeconds"] == 2
        # a stops renewing without releasing (as if it hung or was killed): b takes over after the lease expires
        a.stop(release=False)
        assert b.wait_for_leadership(5)
        lease = read_json(coord.read_namespaced_lease("vgpu-scheduler", "kube-system", _preload_content=False))
        assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
        # a graceful stop releases the lease: a new candidate gets it without waiting for expiry
        b.stop()
        lease = read_json(coord.read_namespaced_lease("vgpu-scheduler", "kube-system", _preload_content=False))
        assert lease["spec"]["holderIdentity"] == ""
        c = LeaderElector(api, identity="c", **kw).start()
        assert c.wait_for_leadership(5)
        c.stop()
        assert events == ["a+", "a-", "b+", "b-"]
    finally:
        a.stop()
        b.stop()


def test_leader_election_rejects_bad_timings(api):
    with pytest.raises(ConfigError):
        LeaderElector(api, name="x", lease_duration=1, renew_deadline=2, retry_period=0.5)


def test_unavailable_api_is_reported_as_such(tmp_path):
    api = make_api_client(write_kubeconfig(tmp_path / "kc", "http://127.0.0.1:9"))
    with pytest.raises(UnavailableError):
        patch_pod_metadata(api, "default", "p", annotations={"a": "1"}, timeout=2)
