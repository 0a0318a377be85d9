"""A stored fit outlives a new learned target, and serves nodes of every free CPU, when the frag policies' GPU order
could not have depended on the target or the node; otherwise it is refitted (or fitted per CPU class), and the
placement is the one a fresh placement makes."""

from __future__ import annotations

from vgpu.inventory import GPUDevice
from vgpu.requests import ContainerRequest, Selectors
from vgpu.scheduler.fit import GPUUsage, fit
from vgpu.scheduler.nodestate import NodeState
from vgpu.scheduler.placement import Placement
from vgpu.scheduler.policies import make_policy
from vgpu.scheduler.policies.base import PodContext

GIB = 1024


def _ask(count: int = 1, memory_gib: int = 4, cores: int = 20) -> tuple[ContainerRequest, ...]:
    return (ContainerRequest(container="main", init=False, count=count, memory=memory_gib * GIB, memory_percent=0,
                             cores=cores),)


def _devices(node: str = "n") -> tuple[GPUDevice, ...]:
    return tuple(GPUDevice(uuid=f"{node}-g{i}", split=10, memory=40 * GIB, type="NVIDIA-A100", index=i)
                 for i in range(4))


def _taught(name: str = "fragaware"):
    policy = make_policy(name)
    for memory in (4, 10, 4):
        policy.observe(_ask(memory_gib=memory), PodContext(cpu=1000))
    policy.relearn()
    return policy


def test_the_order_says_whether_the_target_could_change_it():
    policy = _taught()
    idle = [GPUUsage()] * 4
    mixed = [GPUUsage(1, 10 * GIB, 30)] + [GPUUsage()] * 3
    for usage, requests, depends in ((idle, _ask(), False), (mixed, _ask(), True), (mixed, _ask(count=2), False)):
        order = policy.gpu_order(None, None)
        assert fit(_devices(), usage, requests, order=order).ok
        assert order.depends_on_policy is depends


def test_a_fit_outlives_a_new_target_only_when_no_target_could_change_it():
    policy = _taught()
    idle, busy = NodeState(name="idle", rank=0), NodeState(name="busy", rank=1)
    for state in (idle, busy):
        state.set_devices(_devices(state.name))
    busy.charge((("busy-g0", 10 * GIB, 30),))
    placement = Placement(policy)
    for state in (idle, busy):
        placement.register(state)
    shape = placement.shape(_ask(), Selectors(), PodContext())
    placement.choose([idle], shape)
    placement.choose([busy], shape)
    before, epoch = placement.evaluations, policy.epoch
    policy.observe(_ask(memory_gib=20), PodContext(cpu=1000))  # a fourth pod: the target is rebuilt
    assert policy.relearn() and policy.epoch == epoch + 1
    idle_choice = placement.choose([idle], shape)
    assert placement.evaluations == before  # the idle node's GPUs are all in one state: its fit is kept
    busy_choice = placement.choose([busy], shape)
    assert placement.evaluations == before + 1  # two states: refitted under the new target
    fresh = Placement(policy)
    for state, choice in ((idle, idle_choice), (busy, busy_choice)):
        fresh.register(state)
        again = fresh.choose([state], fresh.shape(_ask(), Selectors(), PodContext()))
        assert choice.result is not None and again.result is not None
        assert choice.result.assignment == again.result.assignment
        assert placement.evaluate(state, shape)[1] == fresh.evaluate(state, fresh.shape(_ask(), Selectors(),
                                                                                          PodContext()))[1]


def test_a_fit_no_order_could_change_serves_every_cpu_class():
    policy = _taught()
    states = []
    for name, cpu, held in (("roomy", 64_000, False), ("tight", 1_500, False), ("roomy-mixed", 64_000, True),
                            ("tight-mixed", 1_500, True)):
        state = NodeState(name=name, rank=len(states))
        state.set_devices(_devices(name))
        state.set_allocatable(cpu, 256 * GIB)
        if held:
            state.charge(((f"{name}-g0", 10 * GIB, 30),))
        states.append(state)
    placement = Placement(policy)
    for state in states:
        placement.register(state)
    shape = placement.shape(_ask(), Selectors(), PodContext(cpu=1000, memory=GIB))
    assert policy.context_class(64_000, 256 * GIB, shape.context) != policy.context_class(1_500, 256 * GIB,
                                                                                          shape.context)
    made = []
    for state in states:
        placement.choose([state], shape)
        made.append(placement.evaluations)
    # one fit for both idle nodes (all GPUs in one state), one per CPU class (the pod leaves the tight node short
    # of the CPU of every type) where the GPUs differ
    assert made == [1, 1, 2, 3]
    fresh = Placement(policy)
    for state in states:
        fresh.register(state)
        choice = placement.choose([state], shape)
        again = fresh.choose([state], fresh.shape(_ask(), Selectors(), PodContext(cpu=1000, memory=GIB)))
        assert choice.result is not None and again.result is not None
        assert choice.result.assignment == again.result.assignment
