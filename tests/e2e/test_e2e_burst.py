"""End to end: a burst of 300 pods on 3 nodes x 4 GPUs.

While the burst runs, a sampler reads node inventories and pod assignments every 0.3 s and records any GPU over
its memory, cores or shares, any exclusive GPU shared, and any grant on a GPU of another node. At the end every
pod has either run or is pending with a reason, nothing is stuck in `allocating`, and the extender's accounting
equals what the pods hold.
"""

from __future__ import annotations

import pytest
from burst import IMPOSSIBLE_LABEL, burst_pods, submit
from e2e_helpers import (
    TERMINAL,
    Sampler,
    assert_usage_converges,
    phase,
    scheduled_condition,
    settled,
    stuck_allocating,
    wait_until,
)

pytestmark = pytest.mark.slow


def test_burst_of_300_pods(make_cluster, request):
    cluster = make_cluster(nodes=3, gpus="4xA100-40GB")
    request.node._e2e_cluster = cluster
    pods = burst_pods(300, cluster.memory_factor)
    names = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods}
    with Sampler(cluster) as sampler:
        submit(cluster, pods)

        def finished():
            live = [p for p in cluster.pods() if (p["metadata"]["namespace"], p["metadata"]["name"]) in names]
            normal = [p for p in live if not (p["metadata"].get("labels") or {}).get(IMPOSSIBLE_LABEL)]
            return len(live) == len(pods) and all(phase(p) in TERMINAL for p in normal) and live

        live = wait_until("every schedulable pod of the burst finished", finished, timeout=240, interval=1.0)
    assert sampler.result.samples > 10
    assert sampler.result.overcommit == [], sampler.result.overcommit[:5]
    assert sampler.result.foreign == [], sampler.result.foreign[:5]
    ok, offenders = settled(live)
    assert ok, offenders[:10]
    assert stuck_allocating(live) == []
    failed = {p["metadata"]["name"]: (p["status"].get("reason"), p["status"].get("message")) for p in live
              if phase(p) == "Failed"}
    assert failed == {}, f"{len(failed)} pods failed, e.g. {list(failed.items())[:3]}"
    for p in live:
        if (p["metadata"].get("labels") or {}).get(IMPOSSIBLE_LABEL):
            cond = scheduled_condition(p)
            assert phase(p) == "Pending" and not p["spec"].get("nodeName")
            assert cond and cond["status"] == "False" and cond["message"].startswith("0/3 nodes are available")
    assert_usage_converges(cluster, 30)
