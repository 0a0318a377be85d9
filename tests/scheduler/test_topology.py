"""Topology-aware placement: a multi-GPU container gets GPUs of one NVLink island, else of one NUMA node, else any
(scheduler/fit.py); a node that offers one island beats one that cannot (scheduler/placement.py); nodes whose
islands are unknown, or the option off, place exactly as before."""

from __future__ import annotations

import argparse
import itertools
import random

import pytest

from vgpu.inventory import GPUDevice
from vgpu.requests import ContainerRequest, Selectors
from vgpu.scheduler.cli import flag_overrides, register
from vgpu.scheduler.config import load_config
from vgpu.scheduler.fit import GPUUsage, _choices, fit, topology_tier
from vgpu.scheduler.nodestate import NodeState
from vgpu.scheduler.placement import TIER_STEP, Placement
from vgpu.scheduler.policies import make_policy
from vgpu.scheduler.policies.base import PodContext
from vgpu.scheduler.policies.shares import lowest_index_order

GIB = 1024
FULL = GPUUsage(shares=1, memory=40 * GIB, cores=100)


def _gpus(islands: list[int], numa: list[int] | None = None) -> list[GPUDevice]:
    numa = numa or [0] * len(islands)
    return [GPUDevice(uuid=f"GPU-{i}", split=10, memory=40 * GIB, type="NVIDIA-A100", index=i, island=isl,
                      numa=nn) for i, (isl, nn) in enumerate(zip(islands, numa))]


def _usage(n: int, used: set[int]) -> list[GPUUsage]:
    return [FULL if i in used else GPUUsage() for i in range(n)]


def _ask(count: int, memory: int = 40 * GIB, name: str = "main") -> ContainerRequest:
    return ContainerRequest(container=name, init=False, count=count, memory=memory, memory_percent=0, cores=0)


TWO_ISLANDS = [0, 0, 0, 0, 1, 1, 1, 1]
PAIRS = [0, 0, 1, 1, 2, 2, 3, 3]  # four islands of two GPUs over two NUMA nodes
HALVES = [0, 0, 0, 0, 1, 1, 1, 1]


def _place(devices, used, count, topology=True):
    return fit(devices, _usage(len(devices), used), [_ask(count)], order=lowest_index_order, topology=topology)


def test_one_island_when_a_node_has_it():
    # free 3, 4, 5: the order's first two (3, 4) straddle the islands; 4 and 5 share one
    result = _place(_gpus(TWO_ISLANDS), {0, 1, 2, 6, 7}, 2)
    assert result.placement == ((4, 5),)
    assert _place(_gpus(TWO_ISLANDS), {0, 1, 2, 6, 7}, 2, topology=False).placement == ((3, 4),)


def test_the_tightest_island_keeps_the_other_whole():
    # island 0 all free, island 1 three free: a 2-GPU container goes to island 1, leaving island 0 for a 4-GPU one
    assert _place(_gpus(TWO_ISLANDS), {4}, 2).placement == ((5, 6),)


def test_then_one_numa_node_then_any():
    devices = _gpus(PAIRS, HALVES)
    # free 1, 4, 6: no island has two; NUMA node 1 has 4 and 6
    result = _place(devices, {0, 2, 3, 5, 7}, 2)
    assert result.placement == ((4, 6),) and topology_tier(devices, result.placement) == 1
    # free 1 and 4 only: different islands and NUMA nodes
    result = _place(devices, {0, 2, 3, 5, 6, 7}, 2)
    assert result.placement == ((1, 4),) and topology_tier(devices, result.placement) == 2


def test_every_choice_is_tried_once_island_first():
    devices = _gpus(PAIRS, HALVES)
    ordered = [7, 0, 3, 4, 1, 6, 2, 5]
    for count in (2, 3, 4):
        choices = list(_choices(devices, ordered, count, True))
        assert sorted(map(sorted, choices)) == sorted(map(sorted, itertools.combinations(ordered, count)))
        tiers = [topology_tier(devices, [c]) for c in choices]
        assert tiers == sorted(tiers)


@pytest.mark.parametrize("islands", [[-1] * 8, TWO_ISLANDS])
def test_unknown_islands_or_the_option_off_place_as_before(islands):
    """Fits with topology on a node without islands, and with the option off anywhere, are the greedy first n GPUs
    of the order and the same search as before (a pod of two containers that needs backtracking included)."""
    rng = random.Random(7)
    for _ in range(300):
        usage = [GPUUsage(shares=1, memory=rng.choice([0, 10, 30, 40]) * GIB) if rng.random() < 0.6 else GPUUsage()
                 for _ in range(8)]
        requests = [_ask(rng.choice([1, 2, 3]), rng.choice([10, 30]) * GIB, "a"),
                    _ask(rng.choice([1, 2, 4]), rng.choice([10, 30]) * GIB, "b")]
        devices = _gpus(islands)
        flat = fit(_gpus([-1] * 8), usage, requests, order=lowest_index_order)
        topology = islands == [-1] * 8
        result = fit(devices, usage, requests, order=lowest_index_order, topology=topology)
        assert (result.ok, result.placement, result.reason) == (flat.ok, flat.placement, flat.reason)


def test_topology_keeps_every_placement_the_search_finds():
    rng = random.Random(11)
    for _ in range(300):
        usage = [GPUUsage(shares=1, memory=rng.choice([10, 30, 40]) * GIB) if rng.random() < 0.5 else GPUUsage()
                 for _ in range(8)]
        requests = [_ask(rng.choice([1, 2, 3]), rng.choice([10, 30]) * GIB, "a"),
                    _ask(rng.choice([2, 4]), rng.choice([10, 30]) * GIB, "b")]
        flat = fit(_gpus(PAIRS, HALVES), usage, requests, order=lowest_index_order)
        local = fit(_gpus(PAIRS, HALVES), usage, requests, order=lowest_index_order, topology=True)
        assert local.ok == flat.ok


def _node(name: str, rank: int, islands: list[int], used: set[int]) -> NodeState:
    state = NodeState(name=name, rank=rank)
    state.set_devices(tuple(GPUDevice(uuid=f"{name}-{d.uuid}", split=d.split, memory=d.memory, type=d.type,
                                      index=d.index, island=d.island, numa=d.numa) for d in _gpus(islands)))
    state.charge(tuple((f"{name}-GPU-{i}", 40 * GIB, 100) for i in sorted(used)))
    return state


def _choose(states: list[NodeState], count: int, topology: bool = True, policy: str = "binpack") -> NodeState:
    placement = Placement(make_policy(policy), topology=topology)
    for state in states:
        placement.register(state)
    choice = placement.choose(states, placement.shape((_ask(count),), Selectors(), PodContext()))
    assert choice.best is not None
    return choice.best


@pytest.mark.parametrize("policy", ["binpack", "fgd", "fragaware"])
def test_a_node_with_one_island_free_beats_a_better_ranked_one_without(policy):
    # the same GPU state (GPUs 0 and 1 free): on `a` they are two islands, on `b` one
    a = _node("a", 0, [0, 1, 0, 1], {2, 3})
    b = _node("b", 1, [0, 0, 1, 1], {2, 3})
    assert _choose([a, b], 2, policy=policy).name == "b"
    assert _choose([a, b], 2, topology=False, policy=policy).name == "a"
    assert _choose([a, b], 1, policy=policy).name == "a"  # one GPU: no preference


def test_the_island_penalty_is_one_step_per_tier():
    a = _node("a", 0, [0, 1, 0, 1], {2, 3})
    b = _node("b", 1, [0, 0, 1, 1], {2, 3})
    placement = Placement(make_policy("binpack"))
    shape = placement.shape((_ask(2),), Selectors(), PodContext())
    (_, score_a), (_, score_b) = placement.evaluate(a, shape), placement.evaluate(b, shape)
    assert score_b - score_a == TIER_STEP  # numa 0 on both GPUs of `a`: tier 1


def test_nodes_without_islands_choose_as_before():
    a = _node("a", 0, [-1] * 4, {2, 3})
    b = _node("b", 1, [-1] * 4, {3})
    for count in (1, 2):
        assert _choose([a, b], count).name == _choose([a, b], count, topology=False).name


def test_the_option_in_the_configuration_and_on_the_command_line():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert load_config(None, flag_overrides(parser.parse_args(["scheduler"]))).topology is True
    assert load_config(None, flag_overrides(parser.parse_args(["scheduler", "--no-topology"]))).topology is False
    assert load_config(None, {"topology": False}).topology is False
