"""The consolidation planner's guarantees, on snapshots of API objects: the fewest moves, none that does not help,
budgets, priorities, opt-outs, bare pods, DaemonSets and young pods left where they are, and every moved pod
re-placed."""
from __future__ import annotations

import pytest
from cluster_objects import budget, node, pod, whole

from vgpu import keys
from vgpu.planning.consolidate import blocker, plan_consolidation
from vgpu.planning.simulation import Simulation
from vgpu.planning.snapshot import ClusterSnapshot

NOW = 1_800_000_000.0  # after the objects' creation times


def _snapshot(*pods, nodes=None, budgets=()):
    return ClusterSnapshot.from_objects(nodes or [node("n1", 2), node("n2", 2)], list(pods), list(budgets))


def _four_shares(**kw):
    """One 30 % share on each GPU of two 2-GPU nodes (so no GPU is free), and overrides by name."""
    layout = {"a": ("n1", 0), "b": ("n1", 1), "c": ("n2", 0), "d": ("n2", 1)}
    return [pod(name, 10000, 30, on=n, gpu_index=(g,), **kw.get(name, {})) for name, (n, g) in layout.items()]


def _moved(plan):
    return sorted(m.pod.name for s in plan.steps for m in s.moves)


def test_a_whole_gpu_pod_gets_a_gpu_with_one_move_and_the_moved_pod_is_placed_again():
    snapshot = _snapshot(*_four_shares(), whole("big", owner=None))
    plan = plan_consolidation(snapshot, now=NOW)
    assert plan.moves == 1 and plan.unmet == []
    (step,) = plan.steps
    assert step.beneficiary.name == "big" and len(step.gpus) == 1
    (move,) = step.moves
    assert move.source == step.node and move.gpus and set(move.gpus).isdisjoint(step.gpus)
    assert (plan.pending_placed_before, plan.pending_placed_after) == (0, 1)


def test_the_plan_is_what_the_extender_would_then_do():
    """Applied to a simulation, the plan's moves and hold leave room for the pod exactly where planned, and nowhere
    else before them (no step is taken for a pod that fits already)."""
    snapshot = _snapshot(*_four_shares(), whole("big", owner=None))
    before = Simulation(snapshot, "fragaware", True)
    assert before.place(snapshot.pending[0]) is None
    plan = plan_consolidation(snapshot, now=NOW)
    (step,) = plan.steps
    after = Simulation(snapshot, "fragaware", True)
    for move in step.moves:
        after.remove(after.where[move.pod.uid])
    placed = after.place(snapshot.pending[0])
    assert placed is not None and placed.state.name == step.node


def test_two_whole_gpus_on_one_node_take_the_two_moves_they_need_and_no_more():
    snapshot = _snapshot(*_four_shares(), whole("pair", gpus=2, owner=None))
    plan = plan_consolidation(snapshot, now=NOW)
    assert plan.moves == 2
    (step,) = plan.steps
    assert {m.source for m in step.moves} == {step.node} and len(step.gpus) == 2


def test_no_move_is_made_when_moving_every_movable_pod_would_not_make_room():
    # all four GPUs hold a share, and each node holds a bare pod: a two-GPU pod would need a bare pod moved
    pods = _four_shares(a={"owner": None}, c={"owner": None})
    plan = plan_consolidation(_snapshot(*pods, whole("pair", gpus=2, owner=None)), now=NOW)
    assert plan.steps == [] and plan.moves == 0
    assert [t for t, _ in plan.unmet] == ["team/pair"]


def test_moves_that_would_leave_a_moved_pod_without_room_are_no_plan():
    # one node, both GPUs with 60 % shares: freeing one GPU would need its share to move onto the other (90 > 100?
    # no: 60 + 60 > 100 cores), so there is no room for it anywhere
    nodes = [node("n1", 2)]
    pods = [pod("a", 10000, 60, on="n1", gpu_index=(0,)), pod("b", 10000, 60, on="n1", gpu_index=(1,))]
    plan = plan_consolidation(_snapshot(*pods, whole("big", owner=None), nodes=nodes), now=NOW)
    assert plan.steps == []
    assert "would find no room elsewhere" in plan.unmet[0][1]


@pytest.mark.parametrize("override,reason", [
    ({"owner": None}, "bare pod"),
    ({"owner": ("DaemonSet", "ds")}, "DaemonSet"),
    ({"owner": ("Node", "n1")}, "static pod"),
    ({"annotations": {keys.NO_CONSOLIDATE: "true"}}, "opted out"),
    ({"started": "2026-12-07T00:00:00Z"}, "running for less than"),
])
def test_pods_that_may_not_move_stay_and_the_plan_moves_another(override, reason):
    """A share that may not move sits on n1's GPU 0, with a second share on n1's GPU 1; n2 has one share on each
    GPU. The cheapest plan would otherwise free n1's GPU 0 (one move); it frees a GPU of n2 or n1's GPU 1."""
    snapshot = _snapshot(*_four_shares(a=override), whole("big", owner=None))
    kept = next(p for p in snapshot.running if p.name == "a")
    now = kept.started + 600 if "started" in override else NOW   # the young one started ten minutes ago
    assert reason in blocker(kept, now, 3600)
    plan = plan_consolidation(snapshot, now=now, min_age=3600)
    assert plan.moves == 1 and "a" not in _moved(plan)


def test_a_higher_priority_pod_is_never_moved_for_a_lower_one():
    pods = _four_shares(a={"priority": 1000}, b={"priority": 1000}, c={"priority": 1000}, d={"priority": 1000})
    plan = plan_consolidation(_snapshot(*pods, whole("big", owner=None, priority=10)), now=NOW)
    assert plan.steps == []
    # of equal priority, it may
    pods = _four_shares(a={"priority": 10}, b={"priority": 1000}, c={"priority": 1000}, d={"priority": 1000})
    plan = plan_consolidation(_snapshot(*pods, whole("big", owner=None, priority=10)), now=NOW)
    assert _moved(plan) == ["a"]


def test_budgets_bound_the_moves_of_the_pods_they_select():
    labels = {name: {"labels": {"app": "guarded" if name in "ab" else name}} for name in "abcd"}
    guarded = budget("keep", {"app": "guarded"}, 0)
    plan = plan_consolidation(_snapshot(*_four_shares(**labels), whole("big", owner=None), budgets=[guarded]),
                              now=NOW)
    assert plan.moves == 1 and set(_moved(plan)) <= {"c", "d"}
    # a budget of one disruption lets one of its pods go, not two: a pod asking two GPUs of n1 finds no plan there
    plan = plan_consolidation(_snapshot(*_four_shares(**labels), whole("pair", gpus=2, owner=None),
                                        nodes=[node("n1", 2), node("n2", 2)],
                                        budgets=[budget("one", {"app": "guarded"}, 1)]), now=NOW)
    assert plan.moves == 2 and _moved(plan) == ["c", "d"]


def test_a_budget_in_another_namespace_or_with_another_selector_does_not_apply():
    elsewhere = budget("other", {"app": "a"}, 0, namespace="elsewhere")
    plan = plan_consolidation(_snapshot(*_four_shares(), whole("big", owner=None), budgets=[elsewhere]), now=NOW)
    assert plan.moves == 1


def test_pending_pods_that_fit_are_placed_first_and_need_no_step():
    pods = [*_four_shares(), pod("small", 5000, 20), whole("big", owner=None)]
    plan = plan_consolidation(_snapshot(*pods), now=NOW)
    assert plan.fitting == ["team/small"] and [s.beneficiary.name for s in plan.steps] == ["big"]


def test_max_moves_bounds_the_plan():
    plan = plan_consolidation(_snapshot(*_four_shares(), whole("pair", gpus=2, owner=None)), now=NOW, max_moves=1)
    assert plan.steps == [] and "--max-moves" in plan.unmet[0][1]


def test_free_gpus_counts_the_free_ones_and_frees_the_rest_with_the_fewest_moves():
    pods = [pod("a", 10000, 30, on="n1", gpu_index=(0,)), pod("b", 10000, 30, on="n1", gpu_index=(1,)),
            pod("c", 10000, 30, on="n2", gpu_index=(0,))]
    snapshot = _snapshot(*pods)
    plan = plan_consolidation(snapshot, now=NOW, free_gpus=1)
    assert plan.steps == [] and plan.held == ["GPU-n2-1"] and plan.gpus_free_after == 1
    plan = plan_consolidation(snapshot, now=NOW, free_gpus=3)
    assert plan.moves == 2 and plan.gpus_free_after == 3 and plan.unmet == []
    freed = [g for s in plan.steps for g in s.gpus]
    assert "GPU-n2-1" not in freed and len(set(freed)) == 2
    for step in plan.steps:   # no moved pod lands on a GPU freed before or by its own step
        assert all(set(m.gpus).isdisjoint(freed) for m in step.moves)


def test_free_gpus_says_when_no_more_can_be_freed():
    plan = plan_consolidation(_snapshot(*_four_shares(a={"owner": None}, b={"owner": None}, c={"owner": None},
                                                      d={"owner": None})), now=NOW, free_gpus=1)
    assert plan.steps == [] and plan.unmet and plan.unmet[0][0] == "GPU 1 of 1"


@pytest.mark.parametrize("selector,applies", [
    ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["a", "x"]}]}, True),
    ({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["a"]}]}, False),
    ({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, True),
    ({"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}, False),   # not a label operator
    ({}, True),   # an empty selector selects every pod of its namespace
])
def test_budget_selectors_select_as_label_selectors_do(selector, applies):
    guard = budget("guard", {}, 0)
    guard["spec"]["selector"] = selector
    plan = plan_consolidation(_snapshot(*_four_shares(), whole("big", owner=None), budgets=[guard]), now=NOW)
    assert ("a" not in _moved(plan)) is applies
