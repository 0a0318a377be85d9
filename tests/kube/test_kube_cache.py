"""WatchCache against the API-server stand-in: list-then-watch, handlers, node scope, 410 relist, restarts."""

from __future__ import annotations

import threading

from kubernetes import client as k8s

from vgpu.kube.cache import WatchCache
from vgpu.kube.client import make_api_client, read_json
from vgpu.testbed.apiserver import Store

MERGE = "application/merge-patch+json"


class Recorder:
    """Collects handler calls as (type, key) in arrival order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def _key(self, obj: dict) -> str:
        m = obj["metadata"]
        return f"{m['namespace']}/{m['name']}" if m.get("namespace") else m["name"]

    def add(self, obj: dict) -> None:
        with self.lock:
            self.calls.append(("add", self._key(obj)))

    def update(self, old: dict, new: dict) -> None:
        assert self._key(old) == self._key(new)
        assert int(new["metadata"]["resourceVersion"]) > int(old["metadata"]["resourceVersion"])
        with self.lock:
            self.calls.append(("update", self._key(new)))

    def delete(self, obj: dict) -> None:
        with self.lock:
            self.calls.append(("delete", self._key(obj)))

    def handlers(self) -> dict:
        return {"on_add": self.add, "on_update": self.update, "on_delete": self.delete}


def mkpod(core: k8s.CoreV1Api, name: str, ns: str = "default") -> dict:
    return read_json(core.create_namespaced_pod(ns, {"metadata": {"name": name},
                                                     "spec": {"containers": [{"name": "c"}]}},
                                                _preload_content=False))


def bind(core: k8s.CoreV1Api, name: str, node: str) -> None:
    read_json(core.create_namespaced_pod_binding(name, "default", {"metadata": {"name": name},
                                                                   "target": {"kind": "Node", "name": node}},
                                                 _preload_content=False))


def annotate(core: k8s.CoreV1Api, name: str, value: str) -> None:
    read_json(core.patch_namespaced_pod(name, "default", {"metadata": {"annotations": {"v": value}}},
                                        _content_type=MERGE, _preload_content=False))


def test_list_then_watch_calls_handlers_in_order(api, eventually):
    core = k8s.CoreV1Api(api)
    mkpod(core, "old")
    rec = Recorder()
    cache = WatchCache(api, "pods", **rec.handlers()).start()
    try:
        assert cache.wait_synced(5) and cache.synced
        assert rec.calls == [("add", "default/old")]
        mkpod(core, "p")
        annotate(core, "p", "1")
        annotate(core, "p", "2")
        read_json(core.delete_namespaced_pod("old", "default", _preload_content=False))
        eventually(lambda: len(rec.calls) == 5, what="handler calls")
        assert rec.calls[1:] == [("add", "default/p"), ("update", "default/p"), ("update", "default/p"),
                                 ("delete", "default/old")]
        assert cache.get("default/p")["metadata"]["annotations"] == {"v": "2"}
        assert cache.get("default/old") is None
        assert [k for k, _ in cache.items()] == ["default/p"] and len(cache) == 1
        assert cache.relists == 1
    finally:
        cache.stop()


def test_wait_for_returns_an_object_the_watch_delivers_meanwhile(api):
    """A reader waiting for a key gets the object as soon as its watch event is stored; a key that never comes
    gives None after the timeout."""
    core = k8s.CoreV1Api(api)
    cache = WatchCache(api, "pods").start()
    try:
        assert cache.wait_synced(5)
        assert cache.wait_for("default/late", 0.05) is None
        timer = threading.Timer(0.3, lambda: mkpod(core, "late"))
        timer.start()
        got = cache.wait_for("default/late", 10.0)
        timer.join()
        assert got is not None and got["metadata"]["name"] == "late"
        assert cache.wait_for("default/late", 0.0)["metadata"]["name"] == "late"  # stored: no wait
    finally:
        cache.stop()


def test_node_cache(api, eventually):
    core = k8s.CoreV1Api(api)
    read_json(core.create_node({"metadata": {"name": "n1"}}, _preload_content=False))
    cache = WatchCache(api, "nodes").start()
    try:
        assert cache.wait_synced(5)
        assert cache.get("n1")["metadata"]["name"] == "n1"
        read_json(core.patch_node("n1", {"metadata": {"annotations": {"volcano.sh/node-vgpu-register": "x:"}}},
                                  _content_type=MERGE, _preload_content=False))
        eventually(lambda: (cache.get("n1")["metadata"].get("annotations") or {}).get(
            "volcano.sh/node-vgpu-register") == "x:", what="node annotation in cache")
    finally:
        cache.stop()


def test_node_scoped_pod_cache(api, eventually):
    core = k8s.CoreV1Api(api)
    rec = Recorder()
    cache = WatchCache(api, "pods", field_selector="spec.nodeName=n1", **rec.handlers()).start()
    try:
        assert cache.wait_synced(5)
        mkpod(core, "a")
        mkpod(core, "b")
        bind(core, "b", "n2")
        bind(core, "a", "n1")
        eventually(lambda: cache.get("default/a") is not None, what="pod bound to n1 in the node cache")
        annotate(core, "a", "x")
        eventually(lambda: ("update", "default/a") in rec.calls, what="update")
        read_json(core.delete_namespaced_pod("a", "default", _preload_content=False))
        eventually(lambda: cache.get("default/a") is None, what="delete")
        assert rec.calls == [("add", "default/a"), ("update", "default/a"), ("delete", "default/a")]
        assert "default/b" not in cache
    finally:
        cache.stop()


def test_compaction_forces_410_and_relist_in_process(apiserver, api, eventually):
    core = k8s.CoreV1Api(api)
    cache = WatchCache(api, "pods").start()
    try:
        assert cache.wait_synced(5)
        mkpod(core, "a")
        eventually(lambda: "default/a" in cache, what="pod a")
        apiserver.store.compact(drop_watches=True)  # every open watch ends with ERROR 410
        eventually(lambda: cache.relists == 2, what="relist after 410")
        mkpod(core, "b")
        eventually(lambda: "default/b" in cache, what="pod b after the relist")
    finally:
        cache.stop()


def test_restart_under_running_cache_converges(apiserver_process, eventually):
    api = make_api_client(apiserver_process.kubeconfig)
    core = k8s.CoreV1Api(api)
    mkpod(core, "keep")
    mkpod(core, "doomed")
    read_json(core.create_node({"metadata": {"name": "n1"}}, _preload_content=False))
    rec = Recorder()
    pods = WatchCache(api, "pods", **rec.handlers()).start()
    nodes = WatchCache(api, "nodes").start()
    try:
        assert pods.wait_synced(5) and nodes.wait_synced(5)
        apiserver_process.kill()  # SIGKILL: nothing flushed beyond the journal
        eventually(lambda: pods.errors > 0 or pods.watches > 1, what="cache notices the outage")
        apiserver_process.start()  # same port, same data
        mkpod(core, "new")
        read_json(core.delete_namespaced_pod("doomed", "default", _preload_content=False))
        annotate(core, "keep", "after-restart")
        read_json(core.create_node({"metadata": {"name": "n2"}}, _preload_content=False))
        eventually(lambda: sorted(k for k, _ in pods.items()) == ["default/keep", "default/new"], what="pods converge")
        eventually(lambda: (pods.get("default/keep")["metadata"].get("annotations") or {}).get("v")
                   == "after-restart", what="annotation")
        eventually(lambda: sorted(k for k, _ in nodes.items()) == ["n1", "n2"], what="nodes converge")
        truth = read_json(core.list_pod_for_all_namespaces(_preload_content=False))
        assert {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in truth["items"]} == {
            o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in pods.list()}
        # handlers saw exactly the changes: no duplicate add for objects that survived the restart
        assert rec.calls.count(("add", "default/keep")) == 1
        assert ("delete", "default/doomed") in rec.calls and ("add", "default/new") in rec.calls
    finally:
        pods.stop()
        nodes.stop()
        api.close()


def test_outage_with_missed_changes_relists_and_emits_the_difference(apiserver_process, eventually):
    api = make_api_client(apiserver_process.kubeconfig)
    core = k8s.CoreV1Api(api)
    for name in ("stay", "gone", "changed"):
        mkpod(core, name)
    rec = Recorder()
    cache = WatchCache(api, "pods", **rec.handlers()).start()
    try:
        assert cache.wait_synced(5)
        assert sorted(rec.calls) == [("add", "default/changed"), ("add", "default/gone"), ("add", "default/stay")]
        rec.calls.clear()
        apiserver_process.kill()
        # While the server is down, its data changes behind the cache's back (as etcd would after a long outage
        # with compaction): the restarted server no longer has the history the cache would resume from.
        store = Store(apiserver_process.data_path)
        store.delete("v1/pods", "default", "gone")
        store.patch("v1/pods", "default", "changed", {"metadata": {"labels": {"x": "1"}}}, MERGE)
        store.create("v1/pods", "default", {"metadata": {"name": "born"}, "spec": {"containers": [{"name": "c"}]}})
        store.close()
        apiserver_process.start()
        eventually(lambda: cache.relists == 2, what="relist after 410")
        eventually(lambda: len(rec.calls) == 3, what="the three implied events")
        assert sorted(rec.calls) == [("add", "default/born"), ("delete", "default/gone"),
                                     ("update", "default/changed")]
        assert sorted(k for k, _ in cache.items()) == ["default/born", "default/changed", "default/stay"]
        assert cache.get("default/changed")["metadata"]["labels"] == {"x": "1"}
    finally:
        cache.stop()
        api.close()


def test_handler_exception_does_not_stop_the_cache(api, eventually):
    core = k8s.CoreV1Api(api)
    seen: list[str] = []

    def bad(obj: dict) -> None:
        seen.append(obj["metadata"]["name"])
        raise RuntimeError("handler bug")

    cache = WatchCache(api, "pods", on_add=bad).start()
    try:
        assert cache.wait_synced(5)
        mkpod(core, "a")
        mkpod(core, "b")
        eventually(lambda: seen == ["a", "b"], what="both adds despite the failing handler")
        assert "default/b" in cache
    finally:
        cache.stop()


def test_watch_timeouts_resume_without_relist(api, eventually):
    core = k8s.CoreV1Api(api)
    cache = WatchCache(api, "pods", watch_timeout=1).start()
    try:
        assert cache.wait_synced(5)
        eventually(lambda: cache.watches >= 3, what="several server-side watch timeouts")
        mkpod(core, "late")
        eventually(lambda: "default/late" in cache, what="pod created after the watch timeouts")
        assert cache.relists == 1 and cache.errors == 0
    finally:
        cache.stop()


def test_many_concurrent_node_scoped_caches(api, eventually):
    """Sixty device-plugin-like caches, one per node, each seeing only its own pod."""
    core = k8s.CoreV1Api(api)
    n = 60
    caches = [WatchCache(api, "pods", field_selector=f"spec.nodeName=node-{i}").start() for i in range(n)]
    try:
        assert all(c.wait_synced(10) for c in caches)
        for i in range(n):
            mkpod(core, f"p{i}")
            bind(core, f"p{i}", f"node-{i}")
        eventually(lambda: all(len(c) == 1 for c in caches), timeout=20, what="every node cache has its pod")
        assert all(c.get(f"default/p{i}")["spec"]["nodeName"] == f"node-{i}" for i, c in enumerate(caches))
    finally:
        for c in caches:
            c.stop()
