"""Kubernetes access under API-server trouble, with faults injected by the API-server stand-in (testbed/faults.py)
and met by the real client: retries with backoff that honour Retry-After, never a blind retry of a POST the
server may have acted on, and watches that go silent detected by the progress check and resumed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from kubernetes import client as k8s

from vgpu.kube import WatchCache, bind_pod, make_api_client
from vgpu.kube.client import read_json
from vgpu.kube.errors import ApiError
from vgpu.kube.patch import patch_pod_metadata
from vgpu.testbed.apiserver import ApiServerStandIn


def _wait_for(cache: WatchCache, key: str, timeout: float) -> None:
    """Wait up to `timeout` seconds for `key` to be in the cache (the caller asserts it)."""
    deadline = time.monotonic() + timeout
    while key not in cache and time.monotonic() < deadline:
        time.sleep(0.05)


def _pod(name: str) -> dict:
    return {"metadata": {"name": name, "namespace": "default"}, "spec": {"containers": [{"name": "c"}]}}


def test_turned_away_reads_are_retried_after_the_servers_retry_after(apiserver, api):
    """Two 503s with Retry-After: 1, then the list succeeds; the client waited as told between attempts."""
    apiserver.faults.set([{"action": "error", "method": "GET", "path": "/api/v1/pods", "status": 503,
                           "retry_after": 1, "times": 2}])
    start = time.monotonic()
    doc = read_json(k8s.CoreV1Api(api).list_pod_for_all_namespaces(_preload_content=False))
    assert doc["items"] == []
    assert apiserver.faults.view()[0]["hits"] == 2
    assert time.monotonic() - start >= 1.9  # honoured twice: not a performance figure, the protocol's rule


def test_a_429_on_a_binding_is_sent_again_but_a_500_is_not(apiserver, api):
    """429 means the server did nothing: the POST is repeated and binds. After a 500 the server may have bound the
    pod: the client reports the error instead of repeating it (the extender then re-checks the pod)."""
    core = k8s.CoreV1Api(api)
    for name in ("a", "b"):
        read_json(core.create_namespaced_pod("default", _pod(name), _preload_content=False))
    apiserver.faults.set([{"action": "error", "method": "POST", "path": "/pods/a/binding", "status": 429,
                           "retry_after": 0, "times": 1},
                          {"action": "error", "method": "POST", "path": "/pods/b/binding", "status": 500}])
    bind_pod(api, "default", "a", "node-1")
    assert read_json(core.read_namespaced_pod("a", "default", _preload_content=False))["spec"]["nodeName"] == "node-1"
    with pytest.raises(ApiError):
        bind_pod(api, "default", "b", "node-1")
    assert [rule["hits"] for rule in apiserver.faults.view()] == [1, 1]


def test_a_patch_survives_a_short_outage(apiserver, api):
    """Three 500s on PATCH (idempotent: a merge of annotations), then it goes through."""
    read_json(k8s.CoreV1Api(api).create_namespaced_pod("default", _pod("p"), _preload_content=False))
    apiserver.faults.set([{"action": "error", "method": "PATCH", "path": "/pods/p", "status": 500, "times": 3}])
    patch_pod_metadata(api, "default", "p", annotations={"x": "1"})
    pod = read_json(k8s.CoreV1Api(api).read_namespaced_pod("p", "default", _preload_content=False))
    assert pod["metadata"]["annotations"] == {"x": "1"}


def test_retries_end_and_the_error_surfaces(apiserver, api):
    """A server that keeps failing: the client gives up after its retries with the server's status."""
    apiserver.faults.set([{"action": "error", "method": "GET", "path": "/api/v1/nodes", "status": 503,
                           "retry_after": 0}])
    with pytest.raises(k8s.ApiException) as caught:
        k8s.CoreV1Api(api).list_node(_preload_content=False)
    assert caught.value.status == 503
    assert apiserver.faults.view()[0]["hits"] == 6  # the call and its 5 retries


def test_without_retries_the_first_failure_surfaces(apiserver):
    api = make_api_client(apiserver.kubeconfig, retries=False)
    apiserver.faults.set([{"action": "error", "method": "GET", "path": "/api/v1/nodes", "status": 503, "times": 1}])
    with pytest.raises(k8s.ApiException):
        k8s.CoreV1Api(api).list_node(_preload_content=False)
    api.close()


def test_a_silent_watch_is_noticed_and_resumed(apiserver, api):
    """The watch stalls (headers sent, then nothing, not even bookmarks) while a pod is created: once silent for
    `stall_after` (150 s by default; 2 s here to keep the test short), the progress check sees the collection move
    on, closes the watch and resumes; the new pod reaches the cache without a relist."""
    apiserver.faults.set([{"action": "stall", "method": "GET", "watch": True, "path": "/pods", "seconds": 120,
                           "times": 1}])  # the cache's first watch
    cache = WatchCache(api, "pods", progress_interval=0.5, watch_timeout=60, stall_after=2.0).start()
    try:
        assert cache.wait_synced(10)
        lists = cache.relists
        read_json(k8s.CoreV1Api(api).create_namespaced_pod("default", _pod("late"), _preload_content=False))
        _wait_for(cache, "default/late", 10)
        assert "default/late" in cache
        assert cache.stalls >= 1 and cache.relists == lists
    finally:
        cache.stop()


def _on(name: str, node: str) -> dict:
    pod = _pod(name)
    pod["spec"]["nodeName"] = node
    return pod


def _node(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def _stays_open_while_others_change(tmp_path, cache_args: dict, others: Callable[[k8s.CoreV1Api, int], object],
                                    mine: Callable[[k8s.CoreV1Api], object], key: str) -> None:
    """Against a stand-in sending bookmarks once a minute, as kube-apiserver does: a watch that `others` (6 s of
    changes it does not select) leave silent, while about twenty progress checks find it behind, stays open, and
    the change `mine` makes (object `key`) arrives on it."""
    server = ApiServerStandIn(bookmark_interval=60.0).start()
    api = make_api_client(server.write_kubeconfig(tmp_path / "kubeconfig"))
    core = k8s.CoreV1Api(api)
    cache = WatchCache(api, progress_interval=0.3, **cache_args).start()
    try:
        assert cache.wait_synced(10)
        watches = cache.watches
        for i in range(12):
            read_json(others(core, i))
            time.sleep(0.5)
        read_json(mine(core))
        _wait_for(cache, key, 10)
        assert key in cache
        assert (cache.stalls, cache.watches) == (0, watches)
    finally:
        cache.stop()
        api.close()
        server.stop()


def test_a_node_filtered_watch_is_not_reopened_while_other_nodes_pods_change(tmp_path):
    """kube-apiserver sends a watcher a BOOKMARK about once a minute (cacher.go defaultBookmarkFrequency), and the
    stand-in here does the same; a watch of one node's pods is silent while other nodes' pods change, which moves
    the collection's resourceVersion. That silence is not a stall: the watch stays open, and this node's next pod
    still arrives on it."""
    _stays_open_while_others_change(
        tmp_path, {"kind": "pods", "field_selector": "spec.nodeName=n1"},
        lambda core, i: core.create_namespaced_pod("default", _on(f"other-{i}", "n2"), _preload_content=False),
        lambda core: core.create_namespaced_pod("default", _on("mine", "n1"), _preload_content=False),
        "default/mine")


def test_a_quiet_watch_is_not_reopened_while_other_kinds_change(tmp_path):
    """A list's resourceVersion is etcd's revision, shared by every kind (etcd3/store.go GetList), so it moves while
    a watch of nodes that do not change delivers nothing but a BOOKMARK about once a minute. That silence is not a
    stall: the watch stays open, and the next node change arrives on it."""
    _stays_open_while_others_change(
        tmp_path, {"kind": "nodes"},
        lambda core, i: core.create_namespaced_pod("default", _pod(f"other-{i}"), _preload_content=False),
        lambda core: core.create_node(_node("n2"), _preload_content=False),
        "n2")


def test_a_filtered_watch_silent_past_the_bookmark_cadence_is_resumed(apiserver, api):
    """A node-filtered watch that stalls (nothing, not even bookmarks) while its node gets a pod is resumed once
    silent for `stall_after` (150 s by default; 2 s here to keep the test short) with the collection moved on."""
    apiserver.faults.set([{"action": "stall", "method": "GET", "watch": True, "path": "/pods", "seconds": 120,
                           "times": 1}])
    cache = WatchCache(api, "pods", field_selector="spec.nodeName=n1", progress_interval=0.3,
                       stall_after=2.0).start()
    try:
        assert cache.wait_synced(10)
        read_json(k8s.CoreV1Api(api).create_namespaced_pod("default", _on("late", "n1"), _preload_content=False))
        _wait_for(cache, "default/late", 15)
        assert "default/late" in cache and cache.stalls >= 1
    finally:
        cache.stop()


def test_a_410_on_resume_relists(apiserver, api):
    """The API server answers a watch resumed from an old resourceVersion with 410: the cache relists and holds
    the pods created meanwhile."""
    # the first watch ends at once with nothing; the cache resumes from its resourceVersion and gets 410
    apiserver.faults.set([{"action": "drop", "watch": True, "path": "/pods", "times": 1},
                          {"action": "gone", "watch": True, "path": "/pods", "times": 1}])
    cache = WatchCache(api, "pods", progress_interval=0).start()
    try:
        assert cache.wait_synced(10)
        read_json(k8s.CoreV1Api(api).create_namespaced_pod("default", _pod("after"), _preload_content=False))
        _wait_for(cache, "default/after", 10)
        assert "default/after" in cache and cache.relists >= 2
    finally:
        cache.stop()


def test_faults_are_set_over_http_for_a_stand_in_in_another_process(apiserver):
    answer = httpx.post(f"{apiserver.url}/standin/faults", json={"rules": [
        {"action": "delay", "path": "/api/v1/nodes", "seconds": 0.01}]})
    assert answer.status_code == 200 and answer.json()["rules"][0]["action"] == "delay"
    assert httpx.post(f"{apiserver.url}/standin/faults", json={"rules": [{"action": "melt"}]}).status_code == 400
    assert httpx.delete(f"{apiserver.url}/standin/faults").json() == {"rules": []}
