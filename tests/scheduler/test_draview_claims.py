"""The DRA view's claims: pods of one workload (claims that differ only by name) share the placement's evaluations,
and a claim still on its way in the watch is waited for a moment."""

import threading
import time

from sched_builders import dra_device, dra_slice

from vgpu.dra import DEVICE_CLASS
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
