"""The API-server stand-in, driven through the real `kubernetes` client over HTTP."""

from __future__ import annotations

import httpx
import orjson
import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from vgpu.kube.client import make_api_client, read_json
from vgpu.testbed.apiserver import ApiServerStandIn, Store

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


def pod(name: str, node: str | None = None, labels: dict | None = None, ns: str = "default") -> dict:
    spec: dict = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
            "spec": spec, "status": {"phase": "Running"}}


def create_pod(core: k8s.CoreV1Api, *args, **kw) -> dict:
    body = pod(*args, **kw)
    return read_json(core.create_namespaced_pod(body["metadata"]["namespace"], body, _preload_content=False))


def names(doc: dict) -> list[str]:
    return sorted(i["metadata"]["name"] for i in doc["items"])


def watch_lines(resp) -> list[dict]:
    return [orjson.loads(line) for line in resp.data.splitlines() if line.strip()]


def test_pod_and_node_crud(api):
    core = k8s.CoreV1Api(api)
    node = read_json(core.create_node({"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "4"}}},
                                      _preload_content=False))
    assert node["kind"] == "Node" and node["metadata"]["uid"] and node["status"]["allocatable"] == {"cpu": "4"}
    p = create_pod(core, "p1")
    assert p["status"] == {"phase": "Pending"}, "a client-supplied pod status is dropped on create"
    assert p["metadata"]["uid"] and p["metadata"]["creationTimestamp"].endswith("Z")
    assert int(p["metadata"]["resourceVersion"]) > int(node["metadata"]["resourceVersion"])

    got = read_json(core.read_namespaced_pod("p1", "default", _preload_content=False))
    assert got == p
    model = core.read_namespaced_pod("p1", "default")  # the typed client path works too
    assert model.metadata.uid == p["metadata"]["uid"] and model.status.phase == "Pending"

    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("default", pod("p1"), _preload_content=False)
    assert exc.value.status == 409 and orjson.loads(exc.value.body)["reason"] == "AlreadyExists"

    got["metadata"]["labels"] = {"tier": "gpu"}
    updated = read_json(core.replace_namespaced_pod("p1", "default", got, _preload_content=False))
    assert updated["metadata"]["labels"] == {"tier": "gpu"}
    assert int(updated["metadata"]["resourceVersion"]) > int(got["metadata"]["resourceVersion"])

    deleted = read_json(core.delete_namespaced_pod("p1", "default", grace_period_seconds=30, _preload_content=False))
    assert deleted["metadata"]["name"] == "p1"
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod("p1", "default", _preload_content=False)
    assert exc.value.status == 404
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_pod("p1", "default", _preload_content=False)
    assert exc.value.status == 404


def test_generate_name_and_namespaces(api):
    core = k8s.CoreV1Api(api)
    a = read_json(core.create_namespaced_pod("team-a", {"metadata": {"generateName": "job-"},
                                                          "spec": {"containers": [{"name": "c"}]}},
                                             _preload_content=False))
    assert a["metadata"]["name"].startswith("job-") and a["metadata"]["namespace"] == "team-a"
    create_pod(core, "p", ns="team-b")
    assert names(read_json(core.list_namespaced_pod("team-b", _preload_content=False))) == ["p"]
    assert len(read_json(core.list_pod_for_all_namespaces(_preload_content=False))["items"]) == 2


def test_list_selectors_and_resource_version(api):
    core = k8s.CoreV1Api(api)
    create_pod(core, "a1", node="n1", labels={"app": "a"})
    create_pod(core, "a2", node="n2", labels={"app": "a", "gpu": "yes"})
    last = create_pod(core, "b1", labels={"app": "b"})

    def lst(**kw) -> dict:
        return read_json(core.list_pod_for_all_namespaces(_preload_content=False, **kw))

    assert lst()["metadata"]["resourceVersion"] == last["metadata"]["resourceVersion"]
    assert names(lst(field_selector="spec.nodeName=n1")) == ["a1"]
    assert names(lst(field_selector="spec.nodeName=")) == ["b1"]
    assert names(lst(field_selector="spec.nodeName!=")) == ["a1", "a2"]
    assert names(lst(field_selector="metadata.name=a2")) == ["a2"]
    assert names(lst(field_selector="status.phase=Pending,spec.nodeName=n2")) == ["a2"]
    assert names(lst(label_selector="app=a")) == ["a1", "a2"]
    assert names(lst(label_selector="app!=a")) == ["b1"]
    assert names(lst(label_selector="app=a,gpu")) == ["a2"]
    assert names(lst(label_selector="!gpu")) == ["a1", "b1"]
    assert names(lst(label_selector="app in (b, c)")) == ["b1"]


def test_update_with_stale_resource_version_is_409(api):
    core = k8s.CoreV1Api(api)
    p = create_pod(core, "p")
    read_json(core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"x": "1"}}}, _content_type=MERGE,
                                        _preload_content=False))
    p["metadata"]["labels"] = {"x": "2"}
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_pod("p", "default", p, _preload_content=False)
    assert exc.value.status == 409 and orjson.loads(exc.value.body)["reason"] == "Conflict"


@pytest.mark.parametrize("ctype", [MERGE, STRATEGIC])
def test_patch_metadata(api, ctype):
    core = k8s.CoreV1Api(api)
    p = create_pod(core, "p")
    rv0 = p["metadata"]["resourceVersion"]
    p1 = read_json(core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"a": "1", "b": "2"},
                                                                           "labels": {"l": "x"}}},
                                             _content_type=ctype, _preload_content=False))
    assert p1["metadata"]["annotations"] == {"a": "1", "b": "2"} and p1["metadata"]["labels"] == {"l": "x"}
    p2 = read_json(core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"a": None, "c": "3"}}},
                                             _content_type=ctype, _preload_content=False))
    assert p2["metadata"]["annotations"] == {"b": "2", "c": "3"}
    assert int(rv0) < int(p1["metadata"]["resourceVersion"]) < int(p2["metadata"]["resourceVersion"])
    # a patch that changes nothing does not bump the resourceVersion
    p3 = read_json(core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"b": "2"}}},
                                             _content_type=ctype, _preload_content=False))
    assert p3["metadata"]["resourceVersion"] == p2["metadata"]["resourceVersion"]
    # stale precondition in the patch -> 409, nothing changed
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", "default", {"metadata": {"resourceVersion": rv0, "annotations": {"b": "9"}}},
                                  _content_type=ctype, _preload_content=False)
    assert exc.value.status == 409
    # fresh precondition -> applied
    p4 = read_json(core.patch_namespaced_pod(
        "p", "default", {"metadata": {"resourceVersion": p3["metadata"]["resourceVersion"], "annotations": {"b": "9"}}},
        _content_type=ctype, _preload_content=False))
    assert p4["metadata"]["annotations"]["b"] == "9"


def test_patch_status_subresource(api):
    core = k8s.CoreV1Api(api)
    create_pod(core, "p")
    # the main endpoint ignores status, as kube-apiserver does for pods
    p = read_json(core.patch_namespaced_pod("p", "default", {"status": {"phase": "Running"}}, _content_type=MERGE,
                                            _preload_content=False))
    assert p["status"]["phase"] == "Pending"
    p = read_json(core.patch_namespaced_pod_status(
        "p", "default", {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}},
        _content_type=MERGE, _preload_content=False))
    assert p["status"]["phase"] == "Running"
    # strategic merge: conditions merge by type
    p = read_json(core.patch_namespaced_pod_status(
        "p", "default", {"status": {"conditions": [{"type": "Initialized", "status": "True"},
                                                   {"type": "Ready", "status": "True"}]}},
        _content_type=STRATEGIC, _preload_content=False))
    assert {c["type"]: c["status"] for c in p["status"]["conditions"]} == {"Ready": "True", "Initialized": "True"}
    # the status endpoint ignores metadata/spec
    p2 = read_json(core.patch_namespaced_pod_status("p", "default", {"spec": {"nodeName": "x"},
                                                                     "status": {"phase": "Succeeded"}},
                                                    _content_type=MERGE, _preload_content=False))
    assert p2["spec"].get("nodeName") is None and p2["status"]["phase"] == "Succeeded"


def test_json_patch_and_client_default_content_type(api):
    core = k8s.CoreV1Api(api)
    create_pod(core, "p")
    p = read_json(core.patch_namespaced_pod("p", "default", [{"op": "add", "path": "/metadata/annotations",
                                                              "value": {"k/v": "1"}}], _preload_content=False))
    assert p["metadata"]["annotations"] == {"k/v": "1"}
    p = read_json(core.patch_namespaced_pod("p", "default", [{"op": "remove", "path": "/metadata/annotations/k~1v"}],
                                            _preload_content=False))
    assert p["metadata"]["annotations"] == {}
    # a dict body without a content type: the client sends it as a strategic merge patch
    p = read_json(core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"k": "v"}}},
                                            _preload_content=False))
    assert p["metadata"]["labels"] == {"k": "v"}
    with pytest.raises(ApiException) as exc:  # a failing "test" op leaves the pod alone
        core.patch_namespaced_pod("p", "default", [{"op": "test", "path": "/metadata/name", "value": "q"}],
                                  _preload_content=False)
    assert exc.value.status == 422


def test_binding_sets_node_and_merges_annotations(api):
    core = k8s.CoreV1Api(api)
    p = create_pod(core, "p")
    read_json(core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"user": "keep"}}},
                                        _content_type=MERGE, _preload_content=False))
    binding = {"apiVersion": "v1", "kind": "Binding",
               "metadata": {"name": "p", "uid": p["metadata"]["uid"], "annotations": {"volcano.sh/vgpu-node": "n1"}},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
    wrong_uid = {**binding, "metadata": {**binding["metadata"], "uid": "not-the-uid"}}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_binding("p", "default", wrong_uid, _preload_content=False)
    assert exc.value.status == 409
    status = read_json(core.create_namespaced_pod_binding("p", "default", binding, _preload_content=False))
    assert status["status"] == "Success"
    bound = read_json(core.read_namespaced_pod("p", "default", _preload_content=False))
    assert bound["spec"]["nodeName"] == "n1"
    assert bound["metadata"]["annotations"] == {"user": "keep", "volcano.sh/vgpu-node": "n1"}
    assert any(c["type"] == "PodScheduled" and c["status"] == "True" for c in bound["status"]["conditions"])
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_binding("p", "default", binding, _preload_content=False)
    assert exc.value.status == 409 and "already assigned" in orjson.loads(exc.value.body)["message"]
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_binding("nope", "default", {**binding, "metadata": {"name": "nope"}},
                                           _preload_content=False)
    assert exc.value.status == 404


def test_delete_preconditions(api):
    core = k8s.CoreV1Api(api)
    create_pod(core, "p")
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_pod("p", "default", body={"preconditions": {"uid": "other"}}, _preload_content=False)
    assert exc.value.status == 409
    read_json(core.delete_namespaced_pod("p", "default", body={"gracePeriodSeconds": 0}, _preload_content=False))
    assert read_json(core.list_namespaced_pod("default", _preload_content=False))["items"] == []


def test_watch_resumes_from_resource_version(api):
    core = k8s.CoreV1Api(api)
    create_pod(core, "before")
    rv = read_json(core.list_namespaced_pod("default", _preload_content=False))["metadata"]["resourceVersion"]
    create_pod(core, "p")
    read_json(core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"x": "1"}}}, _content_type=MERGE,
                                        _preload_content=False))
    read_json(core.delete_namespaced_pod("p", "default", _preload_content=False))
    resp = core.list_namespaced_pod("default", watch=True, resource_version=rv, timeout_seconds=1,
                                    _preload_content=False)
    events = watch_lines(resp)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "p")]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)
    # without a resourceVersion the watch starts with the current state
    resp = core.list_namespaced_pod("default", watch=True, timeout_seconds=1, _preload_content=False)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in watch_lines(resp)] == [("ADDED", "before")]


def test_watch_with_field_selector_sees_objects_enter_and_leave(api):
    core = k8s.CoreV1Api(api)
    p = create_pod(core, "p")
    rv = p["metadata"]["resourceVersion"]
    read_json(core.create_namespaced_pod_binding("p", "default", {
        "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}}, _preload_content=False))
    read_json(core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"x": "1"}}}, _content_type=MERGE,
                                        _preload_content=False))
    read_json(core.delete_namespaced_pod("p", "default", _preload_content=False))
    resp = core.list_pod_for_all_namespaces(watch=True, resource_version=rv, field_selector="spec.nodeName=n1",
                                            timeout_seconds=1, _preload_content=False)
    assert [e["type"] for e in watch_lines(resp)] == ["ADDED", "MODIFIED", "DELETED"]
    resp = core.list_pod_for_all_namespaces(watch=True, resource_version=rv, field_selector="spec.nodeName=",
                                            timeout_seconds=1, _preload_content=False)
    assert [e["type"] for e in watch_lines(resp)] == ["DELETED"], "leaving the selector is a DELETED"


def test_watch_older_than_history_gets_410(tmp_path):
    srv = ApiServerStandIn(history_size=3).start()
    try:
        core = k8s.CoreV1Api(k8s.ApiClient(k8s.Configuration(host=srv.url)))
        first = read_json(core.create_node({"metadata": {"name": "n0"}}, _preload_content=False))
        for i in range(1, 6):
            read_json(core.create_node({"metadata": {"name": f"n{i}"}}, _preload_content=False))
        resp = core.list_node(watch=True, resource_version=first["metadata"]["resourceVersion"], timeout_seconds=1,
                              _preload_content=False)
        (event,) = watch_lines(resp)
        assert event["type"] == "ERROR" and event["object"]["code"] == 410
        assert event["object"]["reason"] == "Expired"
        # a recent enough resourceVersion is still served
        rv = srv.store.rv - 2
        resp = core.list_node(watch=True, resource_version=str(rv), timeout_seconds=1, _preload_content=False)
        assert [e["object"]["metadata"]["name"] for e in watch_lines(resp)] == ["n4", "n5"]
    finally:
        srv.stop()


def test_leases_and_events_endpoints(api):
    coord = k8s.CoordinationV1Api(api)
    lease = read_json(coord.create_namespaced_lease("kube-system", {
        "metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}, _preload_content=False))
    assert lease["apiVersion"] == "coordination.k8s.io/v1"
    lease["spec"]["holderIdentity"] = "b"
    read_json(coord.replace_namespaced_lease("l", "kube-system", lease, _preload_content=False))
    with pytest.raises(ApiException) as exc:  # the first writer's resourceVersion is now stale
        coord.replace_namespaced_lease("l", "kube-system", lease, _preload_content=False)
    assert exc.value.status == 409
    ev = k8s.EventsV1Api(api)
    read_json(ev.create_namespaced_event("default", {"metadata": {"name": "e1"}, "reason": "R", "note": "n",
                                                     "eventTime": "2024-01-01T00:00:00.000000Z",
                                                     "reportingController": "t", "reportingInstance": "i",
                                                     "action": "A", "type": "Normal"}, _preload_content=False))
    assert names(read_json(ev.list_namespaced_event("default", _preload_content=False))) == ["e1"]


def test_store_persists_across_restarts(tmp_path):
    data = tmp_path / "state.json"
    store = Store(data)
    store.create("v1/nodes", "", {"metadata": {"name": "n1"}})
    spec = {"containers": [{"name": "c"}]}
    store.create("v1/pods", "default", {"metadata": {"name": "p1"}, "spec": spec})
    store.patch("v1/pods", "default", "p1", {"metadata": {"labels": {"a": "b"}}}, MERGE)
    store.create("v1/pods", "default", {"metadata": {"name": "p2"}, "spec": spec})
    store.delete("v1/pods", "default", "p2")
    rv = store.rv
    # no close(): as after SIGKILL, only the journal has the changes; add a torn last line
    with open(str(data) + ".journal", "ab") as f:
        f.write(b'{"rv": 99, "op": "put"')
    again = Store(data)
    assert again.rv == rv
    assert again.get("v1/pods", "default", "p1")["metadata"]["labels"] == {"a": "b"}
    assert [o["metadata"]["name"] for o in again.list("v1/pods")[0]] == ["p1"]
    assert again.compacted_rv == rv, "history is not kept across restarts"
    created = again.create("v1/nodes", "", {"metadata": {"name": "n2"}})
    assert int(created["metadata"]["resourceVersion"]) == rv + 1
    again.close()
    assert Store(data).rv == rv + 1


@pytest.mark.parametrize("spec, field", [
    ({"containers": "oops"}, "spec.containers"),
    ({}, "spec.containers"),
    ({"containers": [{"image": "x"}]}, "spec.containers[0].name"),
    ({"containers": [{"name": "c", "resources": {"limits": "all"}}]}, "spec.containers[0].resources.limits"),
    ({"containers": [{"name": "c"}], "initContainers": "no"}, "spec.initContainers"),
])
def test_a_malformed_pod_is_refused_at_create(apiserver, api, spec, field):
    """As kube-apiserver does: 422 Invalid naming the field, and nothing is stored. Posted as raw JSON, as kubectl
    with --validate=false would (the typed client refuses such a body before sending it)."""
    answer = httpx.post(f"{apiserver.url}/api/v1/namespaces/default/pods",
                        json={"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad"}, "spec": spec})
    assert answer.status_code == 422 and field in answer.json()["message"], answer.text
    core = k8s.CoreV1Api(api)
    assert read_json(core.list_namespaced_pod("default", _preload_content=False))["items"] == []


def test_limits_without_requests_are_copied_to_requests(api):
    core = k8s.CoreV1Api(api)
    body = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {
        "limits": {"volcano.sh/vgpu-number": "1", "cpu": "1"}, "requests": {"cpu": "500m"}}}]}}
    created = read_json(core.create_namespaced_pod("default", body, _preload_content=False))
    assert created["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "500m", "volcano.sh/vgpu-number": "1"}


def test_bookmarks_come_once_a_minute_by_default_and_reach_filtered_watches(tmp_path):
    # kube-apiserver's watch cache: defaultBookmarkFrequency = time.Minute (cacher.go); a bookmark carries the
    # current resourceVersion whatever the watch's selector. 0.5 s here only so that the test sees one quickly.
    assert ApiServerStandIn()._server.bookmark_interval == 60.0
    srv = ApiServerStandIn(bookmark_interval=0.5).start()
    try:
        api = make_api_client(srv.write_kubeconfig(tmp_path / "kubeconfig"))
        core = k8s.CoreV1Api(api)
        other = create_pod(core, "elsewhere", node="n2")
        resp = core.list_pod_for_all_namespaces(watch=True, resource_version=other["metadata"]["resourceVersion"],
                                                field_selector="spec.nodeName=n1", allow_watch_bookmarks=True,
                                                timeout_seconds=2, _preload_content=False)
        events = watch_lines(resp)
        assert events and {e["type"] for e in events} == {"BOOKMARK"}
        assert events[0]["object"]["metadata"]["resourceVersion"] == other["metadata"]["resourceVersion"]
        api.close()
    finally:
        srv.stop()
