"""The fitting engine finds a placement whenever one exists, as Kubernetes' structured DRA allocator does
(kubernetes/dynamic-resource-allocation `structured`: requests in order, devices in order, backtracking to an
earlier request's next device when a later one fits nowhere): the greedy first choice stays the answer where it
works, and a node is never refused that a search over every choice would place (checked against brute force on
generated fragmented nodes and multi-request pods)."""

from __future__ import annotations

import itertools
import random

import pytest

from vgpu.inventory import GPUDevice
from vgpu.requests import ContainerRequest
from vgpu.scheduler.fit import GPUUsage, fit
from vgpu.scheduler.policies.shares import lowest_index_order

GIB = 1024


def _gpus(n: int, memory: int = 40 * GIB) -> list[GPUDevice]:
    return [GPUDevice(uuid=f"GPU-{i}", split=10, memory=memory, type="NVIDIA-A100", index=i) for i in range(n)]


def _ask(name: str, memory: int, count: int = 1, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(container=name, init=False, count=count, memory=memory, memory_percent=0, cores=cores)


def test_an_earlier_request_moves_so_that_a_later_one_fits():
    # two 40 GiB GPUs, gpu-1 with 15 GiB used: a (20 GiB) first on gpu-0 leaves b (40 GiB) nowhere; on gpu-1 it fits
    usage = [GPUUsage(), GPUUsage(shares=1, memory=15 * GIB)]
    result = fit(_gpus(2), usage, [_ask("a", 20 * GIB), _ask("b", 40 * GIB)], order=lowest_index_order)
    assert result.ok, result.reason
    assert result.placement == ((1,), (0,))
    assert [g.uuid for g in result.assignment[0]] == ["GPU-1"]


def test_the_greedy_choice_stays_when_it_works():
    result = fit(_gpus(3), [GPUUsage()] * 3, [_ask("a", 10 * GIB, count=2), _ask("b", 10 * GIB)],
                 order=lowest_index_order)
    assert result.ok and result.placement == ((0, 1), (0,))


def test_a_pod_that_fits_no_way_keeps_the_reason_of_the_first_choice():
    usage = [GPUUsage(shares=1, memory=30 * GIB), GPUUsage(shares=1, memory=30 * GIB)]
    result = fit(_gpus(2), usage, [_ask("a", 5 * GIB), _ask("b", 20 * GIB)], order=lowest_index_order)
    assert not result.ok and "'b'" in result.reason


def _brute_force(devices, usage, requests) -> bool:
    """Whether any choice of distinct devices per request fits (every combination tried)."""
    options = [itertools.combinations(range(len(devices)), r.count) for r in requests]
    for choice in itertools.product(*[list(o) for o in options]):
        memory = [u.memory for u in usage]
        cores = [u.cores for u in usage]
        ok = True
        for request, chosen in zip(requests, choice):
            for i in chosen:
                if cores[i] >= 100 and request.cores == 0:  # a GPU whose compute is all taken takes no share
                    ok = False
                memory[i] += request.memory
                cores[i] += request.cores
                if memory[i] > devices[i].memory or cores[i] > 100:
                    ok = False
        if ok:
            return True
    return False


@pytest.mark.parametrize("seed", range(6))
def test_fit_places_whatever_a_full_search_places(seed):
    rng = random.Random(seed)
    disagreements = []
    for _ in range(300):
        n = rng.randint(1, 4)
        devices = _gpus(n, memory=rng.choice([16, 24, 40]) * GIB)
        usage = [GPUUsage(shares=1, memory=rng.randint(0, d.memory // GIB) * GIB, cores=rng.choice([0, 20, 50]))
                 for d in devices]
        requests = [_ask(f"r{k}", rng.randint(1, 24) * GIB, count=rng.randint(1, min(2, n)),
                         cores=rng.choice([0, 10, 30]))
                    for k in range(rng.randint(1, 3))]
        expected = _brute_force(devices, usage, requests)
        got = fit(devices, usage, requests, order=lowest_index_order)
        if got.ok != expected:
            disagreements.append((n, [(u.memory, u.cores) for u in usage],
                                  [(r.memory, r.count, r.cores) for r in requests], expected))
        if got.ok:  # what it returns is a real placement: distinct devices per request, within every capacity
            memory = [u.memory for u in usage]
            cores = [u.cores for u in usage]
            for request, chosen in zip(requests, got.placement):
                assert len(set(chosen)) == request.count
                for i in chosen:
                    memory[i] += request.memory
                    cores[i] += request.cores
            assert all(m <= d.memory for m, d in zip(memory, devices)) and all(c <= 100 for c in cores)
    assert disagreements == []
