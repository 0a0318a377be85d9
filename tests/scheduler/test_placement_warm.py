"""Placement.warm: the nodes changed since recent pod shapes' last requests are evaluated off the request path, and
the next request of each shape then finds them done and chooses exactly what it would have chosen without."""

from __future__ import annotations

from sched_builders import container, gpu, node, pod

from vgpu.inventory import GPUDevice
from vgpu.requests import ContainerRequest, Selectors
from vgpu.scheduler.extender import Extender
from vgpu.scheduler.ledger import Ledger
from vgpu.scheduler.nodestate import NodeState
from vgpu.scheduler.placement import Placement
from vgpu.scheduler.policies import make_policy
from vgpu.scheduler.policies.base import PodContext

GIB = 1024


def _nodes() -> list[NodeState]:
    states = []
    for n in range(6):
        state = NodeState(name=f"n{n}", rank=n)
        state.set_devices(tuple(GPUDevice(uuid=f"n{n}-g{i}", split=10, memory=40 * GIB, type="NVIDIA-A100", index=i)
                                for i in range(4)))
        state.charge(tuple((f"n{n}-g{i}", (n + i) * GIB, 10 * ((n + i) % 3)) for i in range(4)))
        states.append(state)
    return states


def _ask(memory_gib: int, cores: int) -> tuple[ContainerRequest, ...]:
    return (ContainerRequest(container="main", init=False, count=1, memory=memory_gib * GIB, memory_percent=0,
                             cores=cores),)


def _placement(states: list[NodeState]) -> Placement:
    placement = Placement(make_policy("fgd"))
    for state in states:
        placement.register(state)
    return placement


def test_warm_evaluates_changed_nodes_once_and_the_next_request_chooses_as_it_would_have():
    warmed_states, cold_states = _nodes(), _nodes()
    warmed, cold = _placement(warmed_states), _placement(cold_states)
    shapes = [(p, p.shape(_ask(memory, cores), Selectors(), PodContext()))
              for p in (warmed, cold) for memory, cores in ((3, 20), (9, 40))]
    for p, shape in shapes:
        states = warmed_states if p is warmed else cold_states
        assert p.choose(states, shape).best is not None
    assert not warmed.unwarmed()
    for states in (warmed_states, cold_states):  # the same change on both: n2 and n4 take more
        states[2].charge((("n2-g0", 2 * GIB, 10),))
        states[4].charge((("n4-g3", 1 * GIB, 0),))
    assert warmed.unwarmed()
    before, cold_before = warmed.evaluations, cold.evaluations
    assert warmed.warm(3) == 3  # budget spent: two nodes of the recent shape, one of the other
    assert warmed.warm(3) == 1
    assert warmed.warm(3) == 0 and not warmed.unwarmed()
    assert warmed.evaluations == before + 4
    done = warmed.evaluations
    for (p, shape), (q, twin) in zip(shapes[:2], shapes[2:]):
        chosen = p.choose(warmed_states, shape)
        expected = q.choose(cold_states, twin)
        assert chosen.best is not None and expected.best is not None
        assert (chosen.best.name, chosen.result.assignment) == (expected.best.name, expected.result.assignment)
    assert warmed.evaluations == done  # the requests found every changed node evaluated
    assert cold.evaluations == cold_before + 4  # the cold placement evaluated them on the request path


def test_the_extenders_learner_warms_after_a_reservation():
    ledger = Ledger()
    ext = Extender(ledger, make_policy("fragaware"), gpu_policy="binpack", mode="decide")
    names = [f"n{i}" for i in range(4)]
    for i, name in enumerate(names):
        ledger.on_node(node(name, [gpu(f"{name}-0", memory=8000 + 100 * i), gpu(f"{name}-1", memory=8000)]))
    shapes = [container(number=1, memory=1000), container(number=1, memory=3000, cores=30)]
    for k, shape in enumerate(shapes):  # one board per shape
        ledger.on_pod(pod(f"warm-{k}", shape, uid=f"u{k}"))
        assert ext.filter({"Pod": pod(f"warm-{k}", shape, uid=f"u{k}"), "NodeNames": names})["NodeNames"]
    assert ext.placement.unwarmed()  # the reservations changed the chosen nodes
    ext.learn()  # what the learner thread does when woken
    assert not ext.placement.unwarmed()
    done = ext.placement.evaluations
    for k, shape in enumerate(shapes):
        ledger.on_pod(pod(f"next-{k}", shape, uid=f"v{k}"))
        assert ext.filter({"Pod": pod(f"next-{k}", shape, uid=f"v{k}"), "NodeNames": names})["NodeNames"]
    assert ext.placement.evaluations == done + 1  # only the node the first of them reserved on, for the second
