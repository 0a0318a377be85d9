"""The kube-scheduler stand-in against a real HTTP extender peer and the API-server stand-in.

Checks that the driver calls an extender as kube-scheduler does: the order filter -> prioritize -> bind, the Go
field names of ExtenderArgs / ExtenderBindingArgs, NodeNames vs Nodes by nodeCacheCapable, only the nodes that
passed the in-tree fit, score x weight x 10, managedResources gating, FailedScheduling with the reasons, retry
after an error, and the httpTimeout bound. The extender here is a scripted HTTP server (a protocol peer), not one of
our components; the real extender is covered by the end-to-end tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from e2e_helpers import wait_until
from scripted_extender import driver_bed

from vgpu.testbed.kubemath import pod_requests
from vgpu.testbed.scheduler_driver import (
    BUILTIN_CONFIG,
    ConfigError,
    SchedulerDriver,
    find_deploy_config,
    load_scheduler_config,
    parse_duration,
    parse_scheduler_config,
)


@pytest.fixture()
def env(tmp_path):
    with driver_bed(tmp_path) as (api, kubeconfig, ext, http, drivers):
        def make(config_text: str = BUILTIN_CONFIG, **kwargs: Any) -> SchedulerDriver:
            config = parse_scheduler_config(config_text).with_extender_url(ext.url)
            driver = SchedulerDriver(config, kubeconfig, seed=1, unschedulable_flush=kwargs.pop("flush", 30.0),
                                     **kwargs).start()
            drivers.append(driver)
            return driver

        for name, cpu in (("n1", "4"), ("n2", "4"), ("n3", "1")):
            http.post("/api/v1/nodes", json={"metadata": {"name": name, "labels": {"zone": name}},
                                             "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"}}})
        yield api, ext, make, http


def _pod(name: str, gpu: bool = True, cpu: str = "500m", **spec: Any) -> dict:
    resources: dict = {"requests": {"cpu": cpu}}
    if gpu:
        resources["limits"] = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "1000"}
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulerName": "vgpu-scheduler", "containers": [{"name": "c", "resources": resources}],
                     **spec}}


def _wait(predicate: Callable[[], Any], timeout: float = 15.0) -> Any:
    return wait_until("condition", predicate, timeout, interval=0.05)


def _get(http: httpx.Client, name: str) -> dict:
    return http.get(f"/api/v1/namespaces/default/pods/{name}").json()


def test_calls_filter_prioritize_bind_with_go_field_names(env):
    _api, ext, make, http = env
    ext.filter = lambda b: {"NodeNames": [n for n in b["NodeNames"] if n != "n2"],
                            "FailedNodes": {"n2": "insufficient memory"}, "Error": ""}
    ext.prioritize = lambda b: [{"Host": n, "Score": 9 if n == "n3" else 1} for n in b["NodeNames"]]
    make()
    http.post("/api/v1/namespaces/default/pods", json=_pod("a"))
    pod = _wait(lambda: (p := _get(http, "a"))["spec"].get("nodeName") and p)
    assert pod["spec"]["nodeName"] == "n3"
    assert ext.verbs() == ["/filter", "/prioritize", "/bind"]
    filt, prio, bind = (body for _, body in ext.calls)
    assert set(filt) == {"Pod", "Nodes", "NodeNames"} and filt["Nodes"] is None
    assert filt["NodeNames"] == ["n1", "n2", "n3"]
    assert filt["Pod"]["metadata"]["name"] == "a" and filt["Pod"]["metadata"]["uid"]
    assert prio["NodeNames"] == ["n1", "n3"]
    assert set(bind) == {"PodName", "PodNamespace", "PodUID", "Node"}
    assert bind == {"PodName": "a", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "n3"}


def test_only_nodes_passing_in_tree_fit_reach_the_extender(env):
    _api, ext, make, http = env
    make()
    http.post("/api/v1/namespaces/default/pods", json=_pod("big", cpu="2"))
    _wait(lambda: _get(http, "big")["spec"].get("nodeName"))
    assert ext.calls[0][1]["NodeNames"] == ["n1", "n2"]  # n3 has 1 cpu


def test_single_feasible_node_skips_prioritize(env):
    _api, ext, make, http = env
    ext.filter = lambda b: {"NodeNames": ["n1"], "FailedNodes": {"n2": "x", "n3": "y"}}
    make()
    http.post("/api/v1/namespaces/default/pods", json=_pod("one"))
    _wait(lambda: _get(http, "one")["spec"].get("nodeName"))
    assert ext.verbs() == ["/filter", "/bind"]


def test_pod_without_managed_resources_uses_default_binder(env):
    _api, ext, make, http = env
    make()
    http.post("/api/v1/namespaces/default/pods", json=_pod("plain", gpu=False))
    assert _wait(lambda: _get(http, "plain")["spec"].get("nodeName"))
    assert ext.calls == []


def test_node_names_or_node_list_by_node_cache_capable(env):
    _api, ext, make, http = env
    ext.filter = lambda b: {"Nodes": {"items": [n for n in b["Nodes"]["items"]
                                                if n["metadata"]["name"] == "n2"]}, "FailedNodes": {}}
    make(BUILTIN_CONFIG.replace("nodeCacheCapable: true", "nodeCacheCapable: false"))
    http.post("/api/v1/namespaces/default/pods", json=_pod("full"))
    pod = _wait(lambda: (p := _get(http, "full"))["spec"].get("nodeName") and p)
    assert pod["spec"]["nodeName"] == "n2"
    body = ext.calls[0][1]
    assert body["NodeNames"] is None and [n["metadata"]["name"] for n in body["Nodes"]["items"]] == \
        ["n1", "n2", "n3"]


def test_unschedulable_records_reasons_then_retries_when_room_appears(env):
    _api, ext, make, http = env
    room = {"open": False}
    ext.filter = lambda b: ({"NodeNames": b["NodeNames"], "FailedNodes": {}} if room["open"] else
                            {"NodeNames": [], "FailedNodes": {n: "insufficient memory" for n in b["NodeNames"]}})
    make(flush=2.0)
    http.post("/api/v1/namespaces/default/pods", json=_pod("wait"))

    def condition() -> dict | None:
        for cond in _get(http, "wait")["status"].get("conditions") or ():
            if cond["type"] == "PodScheduled" and cond["status"] == "False":
                return cond
        return None

    cond = _wait(condition)
    assert cond["reason"] == "Unschedulable"
    # the PostFilter (DefaultPreemption, on as in kube-scheduler's default profile) adds why it could not help
    assert cond["message"] == ("0/3 nodes are available: 3 insufficient memory. preemption: 0/3 nodes are available: "
                               "3 No preemption victims found for incoming pod.")
    events = http.get("/api/v1/namespaces/default/events").json()["items"]
    assert any(e["reason"] == "FailedScheduling" and e["involvedObject"]["name"] == "wait" for e in events)
    room["open"] = True
    assert _wait(lambda: _get(http, "wait")["spec"].get("nodeName"), timeout=20)


def test_extender_error_fails_the_cycle_and_is_retried_with_backoff(env):
    _api, ext, make, http = env
    answers = iter([{"Error": "cache not ready"}])
    ext.filter = lambda b: next(answers, {"NodeNames": b["NodeNames"], "FailedNodes": {}})
    make()
    http.post("/api/v1/namespaces/default/pods", json=_pod("err"))
    assert _wait(lambda: _get(http, "err")["spec"].get("nodeName"), timeout=20)
    assert ext.verbs().count("/filter") >= 2
    events = http.get("/api/v1/namespaces/default/events").json()["items"]
    assert any("cache not ready" in e["message"] for e in events if e["reason"] == "FailedScheduling")


def test_http_timeout_bounds_every_call(env):
    _api, ext, make, http = env
    """An extender that never answers: the cycle fails on httpTimeout, while the call is still unanswered."""
    ext.answering.clear()
    try:
        make(BUILTIN_CONFIG.replace("httpTimeout: 30s", "httpTimeout: 300ms"))
        http.post("/api/v1/namespaces/default/pods", json=_pod("slow"))

        def failed() -> bool:
            events = http.get("/api/v1/namespaces/default/events").json()["items"]
            return any(e["reason"] == "FailedScheduling" and "filter" in e["message"] for e in events)

        _wait(failed, timeout=20)
        assert ext.verbs().count("/filter") >= 1   # asked, never answered
        assert not _get(http, "slow")["spec"].get("nodeName")
    finally:
        ext.answering.set()


def test_other_scheduler_names_are_left_alone(env):
    _api, ext, make, http = env
    make()
    pod = _pod("other")
    pod["spec"]["schedulerName"] = "default-scheduler"
    http.post("/api/v1/namespaces/default/pods", json=pod)
    time.sleep(1.0)
    assert not _get(http, "other")["spec"].get("nodeName") and ext.calls == []


def test_parsers():
    assert parse_duration("1m30s") == 90 and parse_duration("500ms") == 0.5 and parse_duration(None) == 0
    requests = pod_requests({"spec": {
        "containers": [{"resources": {"requests": {"cpu": "250m"}, "limits": {"memory": "1Gi"}}},
                       {"resources": {"requests": {"cpu": "1"}}}],
        "initContainers": [{"resources": {"requests": {"cpu": "2"}}}]}})
    assert requests["cpu"] == 2000 and requests["memory"] == 2**30


def test_deploy_configuration_is_the_one_driven():
    path = find_deploy_config()
    assert path is not None, "deploy/ holds no KubeSchedulerConfiguration"
    config = load_scheduler_config(path)
    assert "vgpu-scheduler" in config.scheduler_names
    ext = config.extenders[0]
    assert ext.filter_verb and ext.bind_verb and ext.node_cache_capable
    assert {"volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores"} <= ext.ignored_resources


ONE_ENTRY_CONFIG = """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: vgpu-scheduler
  percentageOfNodesToScore: 100
  pluginConfig:
  - name: NodeResourcesFit
    args: {ignoredResources: [volcano.sh/vgpu-number, volcano.sh/vgpu-memory]}
extenders:
- {urlPrefix: "http://127.0.0.1:8888", filterVerb: filter, prioritizeVerb: prioritize, bindVerb: bind, weight: 1,
   nodeCacheCapable: true}
"""


def test_an_entry_without_managed_resources_sees_every_pod_once_and_binds_it(env):
    _api, ext, make, http = env
    make(ONE_ENTRY_CONFIG)
    http.post("/api/v1/namespaces/default/pods", json=_pod("gpu"))
    http.post("/api/v1/namespaces/default/pods", json=_pod("plain", gpu=False))
    _wait(lambda: _get(http, "gpu")["spec"].get("nodeName") and _get(http, "plain")["spec"].get("nodeName"))
    for name in ("gpu", "plain"):
        verbs = [path for path, body in ext.calls
                 if (body.get("Pod") or {}).get("metadata", {}).get("name", body.get("PodName")) == name]
        assert verbs == ["/filter", "/prioritize", "/bind"], (name, verbs)


def test_the_profiles_ignored_resources_keep_them_out_of_the_in_tree_fit(env):
    """The nodes advertise no volcano.sh resources: NodeResourcesFit would find every node short of them."""
    _api, ext, make, http = env
    make(ONE_ENTRY_CONFIG.replace("volcano.sh/vgpu-memory]", "volcano.sh/vgpu-cores]"))
    http.post("/api/v1/namespaces/default/pods", json=_pod("short"))
    message = _wait(lambda: next((c["message"] for c in _get(http, "short")["status"].get("conditions") or ()
                                  if c.get("reason") == "Unschedulable"), None))
    assert "Insufficient volcano.sh/vgpu-memory" in message and "vgpu-number" not in message
    assert ext.calls == []


def test_the_profiles_ignored_resource_groups_keep_a_whole_domain_out_of_the_in_tree_fit(env):
    _api, _ext, make, http = env
    make(ONE_ENTRY_CONFIG.replace("ignoredResources: [volcano.sh/vgpu-number, volcano.sh/vgpu-memory]",
                                  "ignoredResourceGroups: [volcano.sh]"))
    http.post("/api/v1/namespaces/default/pods", json=_pod("grouped"))
    assert _wait(lambda: _get(http, "grouped")["spec"].get("nodeName"))


def test_extenders_ignored_resources_replace_the_profiles():
    """buildExtenders (pkg/scheduler/scheduler.go) overwrites NodeResourcesFit's ignoredResources with the entries'
    ignoredByScheduler names when there are any; ignoredResourceGroups stay."""
    text = ONE_ENTRY_CONFIG.replace("nodeCacheCapable: true}", "nodeCacheCapable: true,\n   managedResources: "
                                    "[{name: example.com/foo, ignoredByScheduler: true}]}")
    text = text.replace("args: {", "args: {ignoredResourceGroups: [vendor.io], ")
    config = parse_scheduler_config(text)
    (profile,) = config.profiles
    assert profile.ignored_resources == {"volcano.sh/vgpu-number", "volcano.sh/vgpu-memory"}
    assert config.ignored(profile) == ({"example.com/foo"}, {"vendor.io"})
    with pytest.raises(ConfigError, match="ignoredResources: must be a list of strings"):
        parse_scheduler_config(ONE_ENTRY_CONFIG.replace("[volcano.sh/vgpu-number, volcano.sh/vgpu-memory]", "x"))


def test_dra_deploy_configuration_has_one_entry_for_every_pod():
    path = find_deploy_config(dra=True)
    assert path is not None and "dra" in path.parts
    config = load_scheduler_config(path)
    (ext,) = config.extenders
    assert ext.is_interested({"spec": {"containers": [{"name": "c"}]}}) and ext.bind_verb
    (profile,) = config.profiles
    assert {"volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores"} \
        <= config.ignored(profile)[0]
