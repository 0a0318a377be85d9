"""DefaultPreemption (PostFilter) of the kube-scheduler stand-in, against the API-server stand-in and a scripted
HTTP extender (a protocol peer written here, not one of our components).

Checks what kube-scheduler's preemption does (testbed/preemption.py cites the upstream functions): the node whose
most important victim has the lowest priority wins, then the fewest victims; the victims are the fewest pods of
lower priority (the most important ones are reprieved), never pods of equal or higher priority; the preemptor is
nominated (status.nominatedNodeName), its victims get DisruptionTarget, are deleted and get a `Preempted` event,
and it is bound to that node once they are gone; `preemptionPolicy: Never` and a profile without DefaultPreemption
never preempt; an extender's preemptVerb gets ExtenderPreemptionArgs with the candidates and its answer replaces
them; a pod that only an extender's filterVerb rejects gets no candidate (upstream's dry run runs the in-tree
filters only) whether the extender has a preemptVerb or not; a nominated pod holds its node against pods of lower
priority while its victims terminate.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from e2e_helpers import wait_until
from scripted_extender import driver_bed

from vgpu.testbed.scheduler_driver import ConfigError, SchedulerDriver, parse_scheduler_config

GPU = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "1000"}
MERGE = {"Content-Type": "application/merge-patch+json"}


def _config(preempt_verb: str | None = "preempt", cache: bool = True, profile_extra: str = "") -> str:
    verb = f"\n  preemptVerb: {preempt_verb}" if preempt_verb else ""
    return f"""
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: vgpu-scheduler
  percentageOfNodesToScore: 100{profile_extra}
extenders:
- urlPrefix: http://127.0.0.1:8888
  filterVerb: filter{verb}
  bindVerb: bind
  weight: 1
  nodeCacheCapable: {str(cache).lower()}
  httpTimeout: 10s
  managedResources:
  - {{name: volcano.sh/vgpu-number, ignoredByScheduler: true}}
  - {{name: volcano.sh/vgpu-memory, ignoredByScheduler: true}}
"""


@pytest.fixture()
def env(tmp_path):
    with driver_bed(tmp_path) as (api, kubeconfig, ext, http, drivers):
        def make(config_text: str | None = None, nodes: int = 4, **kwargs: Any) -> SchedulerDriver:
            """Create the nodes (cpu 4 each) unless they exist, then start a driver (preemption on, its default)."""
            for i in range(1, nodes + 1):
                http.post("/api/v1/nodes", json={"metadata": {"name": f"n{i}"}, "status": {
                    "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}})
            config = parse_scheduler_config(config_text or _config()).with_extender_url(ext.url)
            driver = SchedulerDriver(config, kubeconfig, seed=1, unschedulable_flush=30.0, **kwargs).start()
            drivers.append(driver)
            return driver

        yield api, ext, make, http


def _resources(cpu: str, gpu: bool) -> dict:
    return {"requests": {"cpu": cpu}, **({"limits": dict(GPU)} if gpu else {})}


def _priority_class(http: httpx.Client, value: int, policy: str = "PreemptLowerPriority") -> str:
    """The name of a PriorityClass of this value and preemptionPolicy, created unless it exists: the Priority
    admission plugin gives its pods spec.priority (a pod may not set it itself)."""
    name = f"p{value}" if policy == "PreemptLowerPriority" else f"p{value}-{policy.lower()}"
    made = http.post("/apis/scheduling.k8s.io/v1/priorityclasses", json={
        "metadata": {"name": name}, "value": value, "preemptionPolicy": policy})
    assert made.status_code in (201, 409), made.text
    return name


def _running(http: httpx.Client, name: str, node: str, cpu: str, priority: int, started_ago: int = 600,
             gpu: bool = False) -> dict:
    """A pod already on `node` (bound, Running, started `started_ago` seconds ago), as the kubelet leaves it."""
    pod = http.post("/api/v1/namespaces/default/pods", json={
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "vgpu-scheduler", "nodeName": node,
                 "priorityClassName": _priority_class(http, priority),
                 "containers": [{"name": "c", "resources": _resources(cpu, gpu)}]}}).json()
    started = (datetime.now(UTC) - timedelta(seconds=started_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
    http.patch(f"/api/v1/namespaces/default/pods/{name}/status", headers=MERGE,
               json={"status": {"phase": "Running", "startTime": started}})
    return pod


def _pending(http: httpx.Client, name: str, cpu: str, priority: int, gpu: bool = False, **spec: Any) -> dict:
    """A pending pod; a preemptionPolicy in `spec` is its class's."""
    policy = spec.pop("preemptionPolicy", "PreemptLowerPriority")
    return http.post("/api/v1/namespaces/default/pods", json={
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "vgpu-scheduler", "priorityClassName": _priority_class(http, priority, policy),
                 "containers": [{"name": "c", "resources": _resources(cpu, gpu)}], **spec}}).json()


def _reject(node: str) -> Callable[[dict], dict]:
    """An extender filter that fails `node` (FailedNodes) and keeps the others, NodeNames or Nodes alike."""
    def answer(body: dict) -> dict:
        if body["NodeNames"] is not None:
            return {"NodeNames": [n for n in body["NodeNames"] if n != node], "FailedNodes": {node: "no vgpu"}}
        items = [n for n in body["Nodes"]["items"] if n["metadata"]["name"] != node]
        return {"Nodes": {"items": items}, "FailedNodes": {node: "no vgpu"}}
    return answer


def _wait(predicate: Callable[[], Any], timeout: float = 15.0) -> Any:
    return wait_until("condition", predicate, timeout, interval=0.03)


def _get(http: httpx.Client, name: str) -> dict | None:
    resp = http.get(f"/api/v1/namespaces/default/pods/{name}")
    return resp.json() if resp.status_code == 200 else None


def _node_of(http: httpx.Client, name: str) -> str:
    return ((_get(http, name) or {}).get("spec") or {}).get("nodeName") or ""


def _unschedulable(http: httpx.Client, name: str) -> str:
    """The PodScheduled=False message, "" while there is none."""
    pod = _get(http, name) or {}
    return next((c["message"] for c in (pod.get("status") or {}).get("conditions") or ()
                 if c["type"] == "PodScheduled" and c["status"] == "False"), "")


def _nominated(http: httpx.Client, name: str) -> str:
    return ((_get(http, name) or {}).get("status") or {}).get("nominatedNodeName") or ""


def _events(http: httpx.Client, name: str, reason: str) -> list[dict]:
    return [e for e in http.get("/api/v1/namespaces/default/events").json()["items"]
            if e["involvedObject"]["name"] == name and e["reason"] == reason]


def _watch_nomination(http: httpx.Client, name: str, timeout: float = 15.0) -> str:
    """The first nominatedNodeName seen on the pod (it may be bound soon after)."""
    return _wait(lambda: _nominated(http, name) or (_node_of(http, name) and "BOUND-WITHOUT-NOMINATION"), timeout)


def test_the_node_whose_most_important_victim_has_the_lowest_priority_wins(env):
    """pickOneNodeForPreemption: n3 needs two victims of priority 5, n2 one of priority 10; the lower priority
    decides before the number of victims. Equal and higher priorities are never victims (n1, n4); on n3 the
    earliest-started pod is reprieved."""
    _api, ext, make, http = env
    _running(http, "eq", "n1", "2", 100)
    _running(http, "low10", "n1", "2", 10)
    _running(http, "low10x", "n2", "3", 10)
    _running(http, "a5", "n3", "1", 5, started_ago=300)
    _running(http, "b5", "n3", "1", 5, started_ago=200)
    _running(http, "c5", "n3", "2", 5, started_ago=100)
    _running(http, "hi", "n4", "4", 1000)
    make()
    preemptor = _pending(http, "p", "3", 100)
    assert _watch_nomination(http, "p") == "n3"
    assert _wait(lambda: _node_of(http, "p")) == "n3"
    assert _get(http, "b5") is None and _get(http, "c5") is None
    for survivor in ("eq", "low10", "low10x", "a5", "hi"):
        assert _get(http, survivor) is not None, survivor
    (failed,) = _events(http, "p", "FailedScheduling")
    assert failed["message"] == "0/4 nodes are available: 4 Insufficient cpu."  # a nomination adds no message
    for victim in ("b5", "c5"):
        (event,) = _events(http, victim, "Preempted")
        assert event["message"] == f"Preempted by pod {preemptor['metadata']['uid']} on node n3"
        assert event["type"] == "Normal" and event["action"] == "Preempting"
        assert event["related"]["name"] == "p"
    assert ext.calls == []  # the extender is not interested in pods without its resources


def test_the_fewest_victims_win_when_priorities_tie(env):
    _api, _ext, make, http = env
    _running(http, "x1", "n1", "2", 10, started_ago=300)
    _running(http, "x2", "n1", "2", 10, started_ago=100)
    for i in range(1, 5):
        _running(http, f"y{i}", "n2", "1", 10, started_ago=500 - 100 * i)
    _running(http, "hi3", "n3", "4", 1000)
    _running(http, "hi4", "n4", "4", 1000)
    make()
    _pending(http, "p", "2", 100)
    assert _watch_nomination(http, "p") == "n1"
    assert _wait(lambda: _node_of(http, "p")) == "n1"
    assert _get(http, "x2") is None  # the later-started one; x1 is reprieved
    assert all(_get(http, name) is not None for name in ("x1", "y1", "y2", "y3", "y4", "hi3", "hi4"))


@pytest.mark.parametrize("case, suffix", [
    ("never", " preemption: not eligible due to preemptionPolicy=Never."),
    ("disabled", ""),
    ("equal-or-higher", " preemption: 0/4 nodes are available: 4 No preemption victims found for incoming pod."),
], ids=["preemptionPolicy-Never", "DefaultPreemption-disabled", "no-lower-priority"])
def test_no_preemption(env, case, suffix):
    _api, _ext, make, http = env
    for i in range(1, 5):
        _running(http, f"low{i}", f"n{i}", "4", {"equal-or-higher": 100 if i < 3 else 1000}.get(case, 0))
    make(_config(profile_extra="\n  plugins:\n    postFilter:\n      disabled: [{name: DefaultPreemption}]"
                 if case == "disabled" else ""))
    _pending(http, "p", "1", 100, **({"preemptionPolicy": "Never"} if case == "never" else {}))
    message = _wait(lambda: _unschedulable(http, "p"))
    assert message == "0/4 nodes are available: 4 Insufficient cpu." + suffix
    time.sleep(1.5)  # a retry (1 s backoff) changes nothing either
    assert all(_get(http, f"low{i}") is not None for i in range(1, 5))
    assert not _nominated(http, "p") and not _node_of(http, "p")


@pytest.mark.parametrize("cache", [True, False], ids=["NodeNameToMetaVictims", "NodeNameToVictims"])
def test_the_extenders_preempt_verb_gets_the_candidates_and_its_answer_replaces_them(env, cache):
    """In-tree, n3 (victim of priority 5) would win over n2 (victim x of priority 10); the extender drops n3 and
    names y (priority 20, reprieved by the in-tree dry run) as n2's victim instead. n5 is empty, and rejected by
    the extender's filterVerb: no candidate (nothing to evict there)."""
    _api, ext, make, http = env
    _running(http, "hi1", "n1", "4", 1000)
    x = _running(http, "x", "n2", "2", 10, started_ago=300)
    y = _running(http, "y", "n2", "2", 20, started_ago=200)
    z = _running(http, "z", "n3", "4", 5)
    _running(http, "hi4", "n4", "4", 1000)
    ext.preempt = lambda body: {"NodeNameToMetaVictims": {"n2": {"Pods": [{"UID": y["metadata"]["uid"]}],
                                                                 "NumPDBViolations": 0}}}
    ext.filter = _reject("n5")  # n5 has room, but not for the extender
    make(_config(cache=cache), nodes=5)
    _pending(http, "p", "2", 100, gpu=True)
    assert _watch_nomination(http, "p") == "n2"
    assert _wait(lambda: _node_of(http, "p")) == "n2"
    assert _get(http, "y") is None and _get(http, "x") is not None and _get(http, "z") is not None
    (body,) = [b for path, b in ext.calls if path == "/preempt"]
    assert set(body) == {"Pod", "NodeNameToVictims", "NodeNameToMetaVictims"}
    assert body["Pod"]["metadata"]["name"] == "p"
    if cache:
        assert body["NodeNameToVictims"] is None
        assert body["NodeNameToMetaVictims"] == {
            "n2": {"Pods": [{"UID": x["metadata"]["uid"]}], "NumPDBViolations": 0},
            "n3": {"Pods": [{"UID": z["metadata"]["uid"]}], "NumPDBViolations": 0}}
    else:
        assert body["NodeNameToMetaVictims"] is None
        assert {node: ([p["metadata"]["name"] for p in v["Pods"]], v["NumPDBViolations"])
                for node, v in body["NodeNameToVictims"].items()} == {"n2": (["x"], 0), "n3": (["z"], 0)}
    # evaluateNominatedNode: the next cycle asks the extender about the nominated node alone (not n5 too), and it
    # fits there
    after = ext.verbs().index("/preempt")
    filters = [b for path, b in ext.calls[after:] if path == "/filter"]
    names = filters[0]["NodeNames"] if cache else [n["metadata"]["name"] for n in filters[0]["Nodes"]["items"]]
    assert names == ["n2"]
    assert ext.verbs()[-1] == "/bind"


@pytest.mark.parametrize("preempt_verb", ["preempt", None], ids=["with-preemptVerb", "without-preemptVerb"])
def test_a_pod_only_an_extender_rejects_gets_no_candidate_and_no_preemption(env, preempt_verb):
    """Upstream's dry run runs the in-tree filters only: on n1 the lower-priority pod is removed and reprieved
    again (the in-tree filters never lacked room), so no node has a victim; the extender is never asked to
    preempt, even with a preemptVerb. This is the upstream behaviour the product must work around."""
    _api, ext, make, http = env
    _running(http, "low", "n1", "1", 0, gpu=True)
    ext.filter = lambda body: {"NodeNames": [], "FailedNodes": {n: "insufficient vgpu memory"
                                                                for n in body["NodeNames"]}}
    make(_config(preempt_verb=preempt_verb), nodes=3)
    _pending(http, "p", "500m", 100, gpu=True)
    assert _wait(lambda: _unschedulable(http, "p")) == (
        '0/3 nodes are available: 3 insufficient vgpu memory. preemption: expected at least one victim pod on '
        'node "n1"')
    http.delete("/api/v1/namespaces/default/pods/low")  # a pod deletion retries p: now no node has a lower priority
    assert _wait(lambda: "No preemption" in _unschedulable(http, "p")) and _unschedulable(http, "p") == (
        "0/3 nodes are available: 3 insufficient vgpu memory. preemption: 0/3 nodes are available: "
        "3 No preemption victims found for incoming pod.")
    assert "/preempt" not in ext.verbs()
    assert not _nominated(http, "p") and not _node_of(http, "p")


def test_a_nominated_pod_holds_its_node_against_lower_priorities_while_its_victims_terminate(env):
    """The victim's deletion is held 3 s by the API server: meanwhile `late` (priority 5) would fit beside the
    victim (3 + 1 of 4 cpu), but the nominated preemptor (priority 100, 3 cpu) counts on n1 for it."""
    api, _ext, make, http = env
    _running(http, "v", "n1", "3", 10)
    api.faults.set([{"action": "delay", "method": "DELETE", "path": r"/pods/v(\?.*)?$", "seconds": 3, "times": 1}])
    make(nodes=1)
    _pending(http, "p", "3", 100)
    assert _watch_nomination(http, "p") == "n1"
    victim = _wait(lambda: next((c for c in ((_get(http, "v") or {}).get("status") or {}).get("conditions") or ()
                                 if c["type"] == "DisruptionTarget"), None), timeout=3)
    assert (victim["status"], victim["reason"], victim["message"]) == (
        "True", "PreemptionByScheduler", "vgpu-scheduler: preempting to accommodate a higher priority pod")
    _pending(http, "late", "1", 5)
    assert _wait(lambda: _unschedulable(http, "late"), timeout=3) == (
        "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: "
        "1 No preemption victims found for incoming pod.")
    assert _get(http, "v") is not None and not _node_of(http, "late")  # still terminating: the hold did it
    # a node event moves the unschedulable pods back to the queue; the preemptor stays held (PreEnqueue) until its
    # victim is gone, it does not fail a second cycle (nor preempt again)
    http.patch("/api/v1/nodes/n1", headers=MERGE, json={"metadata": {"labels": {"touched": "yes"}}})
    assert _wait(lambda: _node_of(http, "p")) == "n1"
    assert _wait(lambda: _node_of(http, "late")) == "n1"  # 3 + 1 cpu once the victim is gone
    assert _get(http, "v") is None
    (failed,) = _events(http, "p", "FailedScheduling")
    assert failed["count"] == 1


def test_preemption_configuration():
    config = parse_scheduler_config(_config())
    assert config.extenders[0].preempt_verb == "preempt"
    (profile,) = config.profiles
    assert profile.default_preemption
    assert (profile.min_candidate_nodes_percentage, profile.min_candidate_nodes_absolute) == (10, 100)
    for plugins, enabled in [
        ("postFilter: {disabled: [{name: DefaultPreemption}]}", False),
        ("postFilter: {disabled: [{name: '*'}]}", False),
        ("multiPoint: {disabled: [{name: DefaultPreemption}]}", False),
        ("postFilter: {disabled: [{name: '*'}], enabled: [{name: DefaultPreemption}]}", True),
        ("postFilter: {disabled: [{name: SomethingElse}]}", True),
    ]:
        (profile,) = parse_scheduler_config(_config(profile_extra=f"\n  plugins: {{{plugins}}}")).profiles
        assert profile.default_preemption is enabled, plugins
    args = "\n  pluginConfig:\n  - name: DefaultPreemption\n    args: {{{}}}"
    (profile,) = parse_scheduler_config(_config(profile_extra=args.format(
        "minCandidateNodesPercentage: 5, minCandidateNodesAbsolute: 3"))).profiles
    assert (profile.min_candidate_nodes_percentage, profile.min_candidate_nodes_absolute) == (5, 3)
    for bad, text in [("minCandidateNodesPercentage: 101", "not in valid range [0, 100]"),
                      ("minCandidateNodesAbsolute: -1", "not in valid range [0, inf)"),
                      ("minCandidateNodesPercentage: 0, minCandidateNodesAbsolute: 0", "cannot be zero")]:
        with pytest.raises(ConfigError, match=text.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            parse_scheduler_config(_config(profile_extra=args.format(bad)))
