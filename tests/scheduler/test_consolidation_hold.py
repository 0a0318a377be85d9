"""Consolidation holds (`vgpu-sharing.io/consolidation-hold`, written on nodes by `vgpu consolidate --execute`): the
ledger charges the held GPUs to the pending pod they were freed for, so that every other pod's /filter sees them as
used while that pod may take them; a hold that is gone, out of time, malformed or whose pod is already placed holds
nothing. The extender runs in-process over a ledger fed with node and pod dicts, with clocks of the test's own; the
last test goes through the watch and real HTTP against the API-server stand-in."""

import logging

import pytest
from sched_builders import container, gpu, node, pod
from sched_helpers import wait_until

from vgpu import keys
from vgpu.assignment import decode
from vgpu.holds import MAX_HOLD_SECONDS, Hold, encode_holds
from vgpu.scheduler.extender import Extender
from vgpu.scheduler.ledger import ChargeState, Ledger
from vgpu.scheduler.policies import make_policy
from vgpu.scheduler.preemption import WAITING, Preemptor

NOW = 1_765_130_000.0
WHOLE_0 = "GPU-0,NVIDIA,8000,100:"
WHOLE_1 = "GPU-1,NVIDIA,8000,100:"


class Clocks:
    """The ledger's monotonic clock and wall clock, moved together by the test."""

    def __init__(self):
        self.mono, self.wall = 500.0, NOW

    def advance(self, seconds):
        self.mono += seconds
        self.wall += seconds


def hold(uid, ids=WHOLE_0, until=NOW + 600):
    return Hold(uid, "default", uid, until, decode(ids))


def held_node(holds=None, name="n1"):
    """A node of two 8000-unit GPUs, GPU-0 and GPU-1, with the hold annotation (a list of holds or a raw value)."""
    obj = node(name, [gpu("GPU-0"), gpu("GPU-1")])
    if holds is not None:
        raw = holds if not isinstance(holds, list) else encode_holds(holds)
        obj["metadata"]["annotations"][keys.CONSOLIDATION_HOLD] = raw
    return obj


def whole(name):
    """A pending pod asking one whole GPU."""
    return pod(name, container(number=1, memory=8000, cores=100), uid=name)


def running(name, ids, node_name="n1"):
    return pod(name, uid=name, node_name=node_name, ids=ids, phase="Running")


@pytest.fixture()
def clocks():
    return Clocks()


@pytest.fixture()
def ledger(clocks):
    return Ledger(clock=lambda: clocks.mono, wall_clock=lambda: clocks.wall)


@pytest.fixture()
def ext(ledger):
    return Extender(ledger, make_policy("binpack"), mode="decide")


def filter_(ext, p, names=("n1",)):
    return ext.filter({"Pod": p, "NodeNames": list(names)})


def gpus_of(ledger, uid):
    return [uuid for uuid, _, _ in ledger.charges[uid].grants]


def memory_used(ledger, name="n1"):
    return [u.memory for u in ledger.nodes[name].usage]


def test_other_pods_see_the_held_gpu_as_used(ledger, ext):
    ledger.on_node(held_node([hold("held")]))
    assert ledger.charges["held"].state == ChargeState.NOMINATED
    assert memory_used(ledger) == [8000, 0]
    assert filter_(ext, whole("a"))["NodeNames"] == ["n1"]
    assert gpus_of(ledger, "a") == ["GPU-1"]  # binpack would take GPU-0, the lower index, if it were free
    out = filter_(ext, whole("b"))
    assert out["NodeNames"] == [] and out["FailedNodes"]["n1"]
    small = pod("small", container(number=1, memory=1000), uid="small")
    assert filter_(ext, small)["NodeNames"] == []  # not even a share of the held GPU


def test_the_held_pod_gets_the_held_gpu(ledger, ext):
    ledger.on_node(held_node([hold("held")]))
    ledger.on_pod(running("neighbour", WHOLE_1))
    assert filter_(ext, whole("held"))["NodeNames"] == ["n1"]
    charge = ledger.charges["held"]
    assert charge.state == ChargeState.ASSUMED and gpus_of(ledger, "held") == ["GPU-0"]
    assert memory_used(ledger) == [8000, 8000]  # the hold gave way to the pod's own reservation


@pytest.mark.parametrize("with_preemptor", [False, True], ids=["no-preemption", "preemptor-without-plan"])
def test_the_held_pod_waits_while_the_evicted_pods_end_and_their_replacements_stay_out(ledger, ext, with_preemptor):
    evictions = []
    if with_preemptor:
        ext.preemptor = Preemptor(ledger, lambda *call: evictions.append(call), lambda ns, name: None,
                                  lambda *event: None)
    ledger.on_pod(running("evicted", WHOLE_0))
    ledger.on_pod(running("neighbour", WHOLE_1))
    ledger.on_node(held_node([hold("held")]))
    out = filter_(ext, whole("held"))
    assert out["NodeNames"] == [] and out["FailedNodes"] == {"n1": WAITING}
    assert ledger.charges["held"].state == ChargeState.NOMINATED  # put back
    assert evictions == []  # the room is coming: nothing is preempted for the pod
    ledger.on_pod_delete(running("evicted", WHOLE_0))
    assert filter_(ext, whole("replacement"))["NodeNames"] == []
    assert filter_(ext, whole("held"))["NodeNames"] == ["n1"]
    assert gpus_of(ledger, "held") == ["GPU-0"] and ledger.charges["held"].state == ChargeState.ASSUMED


def test_in_score_mode_the_held_node_is_feasible_for_the_held_pod_only(ledger):
    ext = Extender(ledger, make_policy("binpack"), mode="score")
    ledger.on_node(held_node([hold("held")]))
    ledger.on_pod(running("neighbour", WHOLE_1))
    assert filter_(ext, whole("other"))["NodeNames"] == []
    out = filter_(ext, whole("held"))
    assert out["NodeNames"] == ["n1"] and out["FailedNodes"] == {}
    assert ledger.charges["held"].state == ChargeState.NOMINATED  # kept until /bind places the pod


def test_an_expired_hold_holds_nothing(ledger, ext):
    ledger.on_node(held_node([hold("held", until=NOW - 1)]))
    assert "held" not in ledger.charges
    assert filter_(ext, whole("a"))["NodeNames"] == ["n1"]
    assert gpus_of(ledger, "a") == ["GPU-0"]


def test_a_hold_runs_out_at_its_until_and_at_most_an_hour_after_it_is_seen(ledger, ext, clocks):
    ledger.on_node(held_node([hold("held", until=NOW + 100)]))
    assert ledger.charges["held"].expires == clocks.mono + 100
    clocks.advance(101)
    assert filter_(ext, whole("a"))["NodeNames"] == ["n1"]
    assert "held" not in ledger.charges and gpus_of(ledger, "a") == ["GPU-0"]

    ledger.on_node(held_node([hold("far", ids=WHOLE_1, until=clocks.wall + 10 * MAX_HOLD_SECONDS)]))
    assert ledger.charges["far"].expires == clocks.mono + MAX_HOLD_SECONDS
    clocks.advance(MAX_HOLD_SECONDS + 1)
    ledger.expire()
    assert "far" not in ledger.charges and memory_used(ledger)[1] == 0


def test_a_hold_the_node_stops_listing_is_dropped(ledger, ext):
    ledger.on_node(held_node([hold("held"), hold("other", ids=WHOLE_1)]))
    assert memory_used(ledger) == [8000, 8000]
    ledger.on_node(held_node([hold("other", ids=WHOLE_1)]))
    assert "held" not in ledger.charges and "other" in ledger.charges
    ledger.on_node(held_node())
    assert ledger.charges == {} and memory_used(ledger) == [0, 0]
    assert filter_(ext, whole("a"))["NodeNames"] == ["n1"] and gpus_of(ledger, "a") == ["GPU-0"]


def test_a_changed_hold_replaces_its_nomination_and_an_unchanged_one_is_not_charged_again(ledger, clocks):
    ledger.on_node(held_node([hold("held")]))
    ledger.on_node(held_node([hold("held", ids=WHOLE_1, until=NOW + 60)]))
    assert gpus_of(ledger, "held") == ["GPU-1"] and ledger.charges["held"].expires == clocks.mono + 60
    assert memory_used(ledger) == [0, 8000]
    ledger.on_pod_delete(whole("held"))  # the pod went: its hold goes with it
    relabelled = held_node([hold("held", ids=WHOLE_1, until=NOW + 60)])
    relabelled["metadata"]["annotations"][keys.NODE_TOPOLOGY] = "{}"  # the node changes, its hold does not
    ledger.on_node(relabelled)
    assert "held" not in ledger.charges and memory_used(ledger) == [0, 0]


def test_a_hold_whose_pod_is_already_placed_is_ignored(ledger, ext):
    ledger.on_pod(running("bound", WHOLE_1))
    ledger.on_node(node("n2", [gpu("GPU-2")]))
    assert filter_(ext, whole("assumed"), names=["n2"])["NodeNames"] == ["n2"]
    ledger.on_node(held_node([hold("bound"), hold("assumed")]))
    assert ledger.charges["bound"].state == ChargeState.OBSERVED and gpus_of(ledger, "bound") == ["GPU-1"]
    assert ledger.charges["assumed"].state == ChargeState.ASSUMED and ledger.charges["assumed"].node == "n2"
    assert memory_used(ledger) == [0, 8000]
    ledger.on_node(held_node())  # their holds go: their own charges stay
    assert ledger.charges["bound"].state == ChargeState.OBSERVED
    assert ledger.charges["assumed"].state == ChargeState.ASSUMED


def test_deleting_the_node_drops_its_holds(ledger):
    ledger.on_node(held_node([hold("held")]))
    ledger.on_pod(running("neighbour", WHOLE_1))
    ledger.on_node_delete(held_node())
    assert set(ledger.charges) == {"neighbour"}
    ledger.on_node(held_node())
    assert memory_used(ledger) == [0, 8000]


@pytest.mark.parametrize("garbage", ["", "[", "{}", '[{"uid":"held"}]', encode_holds([hold("held")]) + " x",
                                     encode_holds([hold("held"), hold("held")]), "[" + "[]," * 64 + "[]]", 42])
def test_a_malformed_hold_annotation_leaves_the_node_schedulable(ledger, ext, garbage, caplog):
    ledger.on_node(held_node([hold("held")]))
    with caplog.at_level(logging.WARNING, logger="vgpu.scheduler.ledger"):
        ledger.on_node(held_node(garbage))
        topology_too = held_node(garbage)
        topology_too["metadata"]["annotations"][keys.NODE_TOPOLOGY] = "{}"
        ledger.on_node(topology_too)  # read again: the same problem is not logged again
    assert ledger.nodes["n1"].error == ""
    assert "held" not in ledger.charges  # the value holds nothing, not even the hold it listed before
    assert filter_(ext, whole("a"))["NodeNames"] == ["n1"] and gpus_of(ledger, "a") == ["GPU-0"]
    logged = [r.getMessage() for r in caplog.records if "consolidation_hold_ignored" in r.getMessage()]
    assert len(logged) == 1 and "node=n1" in logged[0]


def test_a_hold_written_on_the_node_steers_the_served_extender(kube, served):
    kube.create_node(node("n1", [gpu("GPU-0"), gpu("GPU-1")]))
    held = kube.create_pod(whole("held"))
    uid = held["metadata"]["uid"]
    others = [kube.create_pod(whole(name)) for name in ("a", "b")]
    ext = served(mode="decide")
    value = encode_holds([Hold(uid, "default", "held", NOW * 2, decode(WHOLE_0))])  # an hour, capped
    kube.core.patch_node("n1", {"metadata": {"annotations": {keys.CONSOLIDATION_HOLD: value}}})
    wait_until(lambda: uid in ext.ledger.charges, what="the hold charged")

    def filtered(p):
        return ext.post("/filter", {"Pod": p, "NodeNames": ["n1"]}).json()["NodeNames"]

    assert filtered(others[0]) == ["n1"]
    assert [g[0] for g in ext.ledger.charges[others[0]["metadata"]["uid"]].grants] == ["GPU-1"]
    assert filtered(others[1]) == []
    kube.core.patch_node("n1", {"metadata": {"annotations": {keys.CONSOLIDATION_HOLD: None}}})
    wait_until(lambda: uid not in ext.ledger.charges, what="the hold dropped")
    assert filtered(others[1]) == ["n1"]
