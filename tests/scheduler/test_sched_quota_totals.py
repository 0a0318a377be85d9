"""Quotas that hold while the admission webhook is down (require_quota_totals). The webhook's failurePolicy is
Ignore, so a pod created during its outage has no quota totals and no ResourceQuota counts it; by default
(where-limited) the extender refuses such a pod in the namespaces whose quota limits a total, read from a
ResourceQuota watch of the API-server stand-in, and places it elsewhere. The same on the real kube-apiserver, with
the real webhook stopped: tests/realk8s/test_realk8s_deviceplugin.py."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s
from sched_builders import container, gpu, node, pod
from sched_helpers import wait_until
from test_sched_contract import go_filter_args

from vgpu.kube.client import read_json
from vgpu.quota import LimitedNamespaces, limits_totals

ABSENT = "volcano.sh/vgpu-memory-total: absent: the admission webhook did not see this pod"


def _quota(name: str, namespace: str, hard: dict) -> dict:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name, "namespace": namespace},
            "spec": {"hard": hard}}


def _unseen(kube, namespace: str) -> dict:
    """A vGPU pod as kube-apiserver stores it when the webhook did not answer: no totals."""
    return kube.create_pod(pod(f"unseen-{namespace}", container(number=1, memory=2000), namespace=namespace),
                           namespace=namespace)


def _filter(ext, p) -> dict:
    return ext.post("/filter", go_filter_args(p, names=["n1"])).json()


def test_a_pod_without_totals_waits_where_a_quota_limits_them_and_runs_elsewhere(kube, served):
    kube.create_node(node("n1", [gpu("GPU-1", 10000)]))
    quotas = k8s.CoreV1Api(kube.api)
    read_json(quotas.create_namespaced_resource_quota("team", _quota("gpu", "team", {
        "requests.volcano.sh/vgpu-memory-total": "50000"}), _preload_content=False))
    read_json(quotas.create_namespaced_resource_quota("other", _quota("count", "other", {"pods": "10"}),
                                                      _preload_content=False))
    ext = served(mode="decide")  # require_quota_totals: where-limited, the default
    limited, other, free = _unseen(kube, "team"), _unseen(kube, "other"), _unseen(kube, "default")
    out = _filter(ext, limited)
    assert out["NodeNames"] == [] and ABSENT in out["Error"] and "re-create the pod" in out["Error"], out
    assert _filter(ext, other)["NodeNames"] == ["n1"]  # its quota limits no total
    assert _filter(ext, free)["NodeNames"] == ["n1"]
    read_json(quotas.delete_namespaced_resource_quota("gpu", "team", _preload_content=False))
    wait_until(lambda: _filter(ext, limited)["NodeNames"] == ["n1"], what="the quota's deletion seen")


@pytest.mark.parametrize(("mode", "refused"), [(True, True), (False, False)])
def test_true_refuses_such_a_pod_everywhere_and_false_nowhere(kube, served, mode, refused):
    kube.create_node(node("n1", [gpu("GPU-1", 10000)]))
    ext = served(mode="decide", sharing={"require_quota_totals": mode})
    assert ext.runtime.quotas is None  # no quota watch: nothing depends on the namespaces' quotas
    out = _filter(ext, _unseen(kube, "default"))
    assert (ABSENT in out["Error"]) is refused and (out["NodeNames"] == []) is refused, out


def test_which_quotas_limit_a_total_and_the_namespaces_that_have_one():
    assert limits_totals(_quota("q", "a", {"requests.volcano.sh/vgpu-cores-total": "100"}))
    assert limits_totals(_quota("q", "a", {"volcano.sh/vgpu-memory-total": "1"}))
    assert not limits_totals(_quota("q", "a", {"requests.volcano.sh/vgpu-memory": "1000"}))
    assert not limits_totals({"spec": {"hard": "junk"}}) and not limits_totals({})
    namespaces = LimitedNamespaces()
    first = _quota("one", "a", {"requests.volcano.sh/vgpu-memory-total": "1"})
    second = _quota("two", "a", {"requests.volcano.sh/vgpu-cores-total": "1"})
    namespaces.on_quota(first)
    namespaces.on_quota(second)
    assert namespaces("a") and not namespaces("b")
    namespaces.on_quota_delete(first)
    assert namespaces("a")
    namespaces.on_quota(_quota("two", "a", {"requests.cpu": "1"}))  # changed to limit no total
    assert not namespaces("a")
