"""The DRA view's claims: pods of one workload (claims that differ only by name) share the placement's evaluations,
and a claim still on its way in the watch is waited for a moment."""

import threading
import time

from sched_builders import dra_device, dra_slice

from vgpu.dra import DEVICE_CLASS, DRIVER
from vgpu.scheduler.draview import DRAView
from vgpu.scheduler.policies.base import make_policy


def _claim(name, memory="30Gi"):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DEVICE_CLASS, "count": 1, "capacity": {"requests": {"memory": memory}}}}]}}}


def _claim_pod(name, claim):
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                     "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}]}}


def test_pods_of_one_workload_share_the_dra_placements_evaluations():
    """Two pods whose claims differ only by name ask the same: the second /filter evaluates no node again."""
    view = DRAView(make_policy("fragaware"))
    for n in range(3):
        view.on_slice(dra_slice(f"d{n}", [dra_device(0), dra_device(1)]))
    names = ["d0", "d1", "d2"]
    for pod_name in ("a", "b"):
        view.on_claim(_claim(f"{pod_name}-gpu"))
    asked_a, asked_b = (view.pod_requests(_claim_pod(p, f"{p}-gpu")) for p in ("a", "b"))
    assert asked_a.requests == asked_b.requests and asked_a.requests
    view.choose(names, _claim_pod("a", "a-gpu"), asked_a.requests)
    before = view.placement.evaluations
    choice, skipped = view.choose(names, _claim_pod("b", "b-gpu"), asked_b.requests)
    assert view.placement.evaluations == before and choice.best is not None and not skipped


def test_wait_claims_returns_when_the_claim_arrives():
    view = DRAView(make_policy("fragaware"))
    pod = _claim_pod("late", "late-gpu")
    assert view.pod_requests(pod).unknown == ("default/late-gpu",)
    started = time.monotonic()
    view.wait_claims(["default/late-gpu"], 0.05)  # nothing comes: the timeout
    assert time.monotonic() - started >= 0.05
    timer = threading.Timer(0.2, lambda: view.on_claim(_claim("late-gpu")))
    timer.start()
    view.wait_claims(["default/late-gpu"], 10.0)
    timer.join()
    assert time.monotonic() - started < 5.0
    assert view.pod_requests(pod).requests and not view.pod_requests(pod).unknown


def _allocated(name, node, device, memory="30Gi"):
    claim = _claim(name, memory)
    claim["status"] = {"allocation": {"devices": {"results": [{
        "request": "gpu", "driver": DRIVER, "pool": node, "device": device, "shareID": f"share-{name}",
        "consumedCapacity": {"memory": memory, "cores": "0"}}]}}}
    return claim


def test_warm_rebuilds_nodes_a_claim_changed_and_the_next_pod_finds_them_evaluated():
    """A claim allocated on a node (the watch's event) leaves it to rebuild; `warm` rebuilds and evaluates it for the
    recent pod shapes off the request path, and the next pod of that shape evaluates nothing."""
    view, cold = DRAView(make_policy("fragaware")), DRAView(make_policy("fragaware"))
    names = ["d0", "d1", "d2"]
    for v in (view, cold):
        for n in range(3):
            v.on_slice(dra_slice(f"d{n}", [dra_device(0), dra_device(1)]))
        v.on_claim(_claim("a-gpu"))
        v.choose(names, _claim_pod("a", "a-gpu"), v.pod_requests(_claim_pod("a", "a-gpu")).requests)
    assert not view.unwarmed()
    for v in (view, cold):
        v.on_claim(_allocated("held", "d1", "gpu-0", memory="50Gi"))
        v.on_claim(_claim("b-gpu"))
    assert view.unwarmed()
    before = view.placement.evaluations
    assert view.warm(16) == 1 and not view.unwarmed()  # d1, for the one pod shape seen
    assert view.placement.evaluations == before + 1
    asked = view.pod_requests(_claim_pod("b", "b-gpu")).requests
    choice, _ = view.choose(names, _claim_pod("b", "b-gpu"), asked)
    assert view.placement.evaluations == before + 1  # found in the memo
    expected, _ = cold.choose(names, _claim_pod("b", "b-gpu"), asked)
    assert choice.best is not None and expected.best is not None
    assert (choice.best.name, choice.result.placement) == (expected.best.name, expected.result.placement)
