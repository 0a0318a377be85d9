"""`whatif` on snapshots of API objects: the rows, kube-scheduler's filters before the placement, the measures."""
from __future__ import annotations

import pytest
from cluster_objects import node, pod, whole

from vgpu.planning.simulation import tolerated
from vgpu.planning.snapshot import ClusterSnapshot
from vgpu.planning.whatif import KEPT, whatif


def _rows(nodes, pods, **kw):
    return {r.policy: r for r in whatif(ClusterSnapshot.from_objects(nodes, pods), **kw)}


def test_kept_places_only_the_pending_pods_and_a_replacement_may_displace_running_ones():
    # one 2-GPU node: two 60 % shares on separate GPUs (kept), and a pending pod asking a whole GPU
    pods = [pod("a", 10000, 60, on="n1", gpu_index=(0,)), pod("b", 10000, 60, on="n1", gpu_index=(1,)),
            whole("big", owner=None)]
    rows = _rows([node("n1", 2)], pods, policies=("binpack",))
    assert rows[KEPT].pending_placed == 0 and rows[KEPT].waiting == ["team/big"]
    # re-placed under binpack the two shares still need a GPU each (60 + 60 > 100 cores): nothing changes
    assert rows["binpack"].pending_placed == 0 and rows["binpack"].displaced == 0


def test_the_measures_count_free_gpus_unallocated_and_fragmented_shares():
    pods = [pod("a", 10000, 30, on="n1", gpu_index=(0,)), whole("big", owner=None)]
    row = _rows([node("n1", 2)], pods, policies=())[KEPT]
    # big takes GPU 1; GPU 0 has 70 % free, which a whole-GPU pod (half the workload) cannot use
    assert (row.gpus, row.gpus_free, row.pending_placed) == (2, 0, 1)
    assert row.unallocated_pct == pytest.approx(35.0)
    assert 0 < row.fragmented_pct <= row.unallocated_pct


def test_taints_node_selectors_and_cordons_keep_pods_off_nodes():
    tainted = node("n1", 1, taints=[{"key": "gpu", "value": "a100", "effect": "NoSchedule"}])
    cordoned = node("n2", 1, unschedulable=True)
    labelled = node("n3", 1)
    labelled["metadata"]["labels"]["pool"] = "batch"
    plain = whole("plain", owner=None)
    picky = whole("picky", owner=None)
    picky["spec"]["nodeSelector"] = {"pool": "batch"}
    tolerant = whole("tolerant", owner=None)
    tolerant["spec"]["tolerations"] = [{"key": "gpu", "operator": "Exists"}]
    row = _rows([tainted, cordoned, labelled], [plain, picky, tolerant], policies=())[KEPT]
    # in queue order (equal priority and age: by name) picky takes n3, the one node it may use; plain then finds
    # n1 tainted, n2 cordoned and n3 full; tolerant takes n1
    assert row.pending_placed == 2 and row.waiting == ["team/plain"]


@pytest.mark.parametrize("toleration,ok", [
    ({"key": "gpu", "operator": "Exists"}, True),
    ({"operator": "Exists"}, True),
    ({"key": "gpu", "value": "a100"}, True),
    ({"key": "gpu", "value": "h100"}, False),
    ({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, False),
    ({"key": "other", "operator": "Exists"}, False),
])
def test_tolerations_match_as_upstream_matches_them(toleration, ok):
    assert tolerated({"key": "gpu", "value": "a100", "effect": "NoSchedule"}, [toleration]) is ok


def test_a_pending_pod_whose_spec_does_not_parse_is_left_out_and_named():
    bad = whole("bad", owner=None)
    bad["spec"]["containers"][0]["resources"]["limits"]["volcano.sh/vgpu-cores"] = "lots"
    snapshot = ClusterSnapshot.from_objects([node("n1", 1)], [bad, whole("good", owner=None)])
    assert [p.name for p in snapshot.pending] == ["good"]
    assert len(snapshot.unreadable) == 1 and snapshot.unreadable[0].startswith("team/bad: ")


def test_required_node_affinity_is_honoured():
    a, b = node("n1", 1), node("n2", 1)
    b["metadata"]["labels"]["zone"] = "east"
    picky = whole("picky", owner=None)
    picky["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["east"]}]}]}}}
    row = _rows([a, b], [pod("first", 10000, 30, on="n2", gpu_index=(0,)), picky], policies=())[KEPT]
    assert row.waiting == ["team/picky"]   # n1 is free, but only n2 is in the east zone
