"""The extender's preemption of GPU shares (scheduler.preemption): which pods go, on which node, and the room held.

The extender runs in-process over a ledger fed with pod dicts; the Eviction API is the one boundary replaced here (a
recorder that can refuse, as a PodDisruptionBudget makes kube-apiserver refuse with 429). The whole path against the
API-server stand-in, kubelet stand-ins and the kube-scheduler stand-in is tests/e2e/test_e2e_preemption.py.
"""

import threading

import pytest
from sched_builders import container, gpu, node, pod
from sched_helpers import wait_until

from vgpu.scheduler.extender import Extender
from vgpu.scheduler.ledger import ChargeState, Ledger
from vgpu.scheduler.policies import make_policy
from vgpu.scheduler.preemption import BLOCKED_RETRY_SECONDS, REPLAN_SECONDS, EvictionRefused, Preemptor


class Evictions:
    """Records eviction calls; refuses those of the pods named in `refuse`."""

    def __init__(self, refuse=()):
        self.calls = []
        self.refuse = set(refuse)
        self.refuse_real = set()  # refused only when not a dry run (two victims of one budget)
        self.lock = threading.Lock()

    def __call__(self, namespace, name, uid, dry_run):
        with self.lock:
            self.calls.append((name, dry_run))
        if name in self.refuse or (name in self.refuse_real and not dry_run):
            raise EvictionRefused("Cannot evict pod as it would violate the pod's disruption budget.")

    def evicted(self):
        with self.lock:
            return sorted(name for name, dry in self.calls if not dry)


def running(name, node_name, ids, priority, **kwargs):
    p = pod(name, uid=name, node_name=node_name, ids=ids, phase="Running", **kwargs)
    p["spec"]["priority"] = priority
    return p


def pending(name, priority=None, number=1, memory=600, policy=None):
    p = pod(name, container(number=number, memory=memory), uid=name)
    if priority is not None:
        p["spec"]["priority"] = priority
    if policy is not None:
        p["spec"]["preemptionPolicy"] = policy
    return p


@pytest.fixture()
def bed():
    ledger = Ledger()
    evictions = Evictions()
    events = []
    preemptor = Preemptor(ledger, evictions, lambda ns, name: None,
                          lambda ref, kind, reason, message: events.append((ref["name"], reason, message)),
                          counted=lambda outcome: events.append(("", "counted", outcome)))
    ext = Extender(ledger, make_policy("binpack"), mode="decide", preemptor=preemptor)
    return ledger, ext, evictions, events


def filter_(ext, p, names=("n1",)):
    return ext.filter({"Pod": p, "NodeNames": list(names)})


def test_the_fewest_lowest_priority_shares_of_one_gpu_go(bed):
    """GPU-a holds two priority-1 shares of 400, GPU-b a priority-5 share of 700 and a priority-1 one of 200: a
    priority-10 pod of 600 evicts one priority-1 share of GPU-a (the one reprieved last), nothing on GPU-b."""
    ledger, ext, evictions, events = bed
    ledger.on_node(node("n1", [gpu("GPU-a", memory=1000), gpu("GPU-b", memory=1000)]))
    ledger.on_pod(running("low1", "n1", "GPU-a,NVIDIA,400,0:", 1))
    ledger.on_pod(running("low2", "n1", "GPU-a,NVIDIA,400,0:", 1))
    ledger.on_pod(running("mid", "n1", "GPU-b,NVIDIA,700,0:", 5))
    ledger.on_pod(running("low3", "n1", "GPU-b,NVIDIA,200,0:", 1))
    out = filter_(ext, pending("high", priority=10))
    assert out["NodeNames"] == []
    assert "preempted for this pod" in out["FailedNodes"]["n1"]
    wait_until(lambda: evictions.evicted() == ["low2"], what="low2 evicted")
    assert ("low2", True) in evictions.calls  # a dry run first
    assert ledger.charges["high"].state == ChargeState.NOMINATED
    assert [g[0] for g in ledger.charges["high"].grants] == ["GPU-a"]
    assert ("low2", "Preempted", "Preempted by pod high on node n1") in events
    assert ("", "counted", "evicted") in events
    # while low2 is still there the pod waits, and nothing more is evicted
    out = filter_(ext, pending("high", priority=10))
    assert out["NodeNames"] == [] and "waiting for 1 of 1 pods" in out["FailedNodes"]["n1"]
    assert evictions.evicted() == ["low2"]
    ledger.on_pod_delete(running("low2", "n1", "GPU-a,NVIDIA,400,0:", 1))
    out = filter_(ext, pending("high", priority=10))
    assert out["NodeNames"] == ["n1"]
    assert ledger.charges["high"].state == ChargeState.ASSUMED
    assert [g[0] for g in ledger.charges["high"].grants] == ["GPU-a"]


def test_the_room_held_is_not_taken_by_a_pod_of_lower_or_equal_priority(bed):
    ledger, ext, evictions, _ = bed
    ledger.on_node(node("n1", [gpu("GPU-a", memory=1000)]))
    ledger.on_pod(running("low", "n1", "GPU-a,NVIDIA,800,0:", 1))
    assert filter_(ext, pending("high", priority=10))["NodeNames"] == []
    wait_until(lambda: evictions.evicted() == ["low"], what="low evicted")
    ledger.on_pod_delete(running("low", "n1", "GPU-a,NVIDIA,800,0:", 1))
    out = filter_(ext, pending("other", priority=10, memory=500))
    assert out["NodeNames"] == [] and "insufficient memory" in out["FailedNodes"]["n1"]
    assert filter_(ext, pending("high", priority=10))["NodeNames"] == ["n1"]


@pytest.mark.parametrize("pending_pod", [
    pending("equal", priority=1),
    pending("never", priority=10, policy="Never"),
    pending("no-priority"),
], ids=["equal-priority", "preemptionPolicy-Never", "no-priority"])
def test_no_preemption(bed, pending_pod):
    ledger, ext, evictions, _ = bed
    ledger.on_node(node("n1", [gpu("GPU-a", memory=1000)]))
    ledger.on_pod(running("low", "n1", "GPU-a,NVIDIA,800,0:", 1))
    out = filter_(ext, pending_pod)
    assert out["NodeNames"] == [] and "insufficient memory" in out["FailedNodes"]["n1"]
    assert evictions.calls == [] and pending_pod["metadata"]["uid"] not in ledger.charges


def test_a_pod_of_higher_priority_is_never_a_victim(bed):
    ledger, ext, evictions, _ = bed
    ledger.on_node(node("n1", [gpu("GPU-a", memory=1000)]))
    ledger.on_pod(running("low", "n1", "GPU-a,NVIDIA,300,0:", 1))
    ledger.on_pod(running("top", "n1", "GPU-a,NVIDIA,500,0:", 20))
    out = filter_(ext, pending("high", priority=10))
    assert out["NodeNames"] == [] and evictions.calls == []


def test_a_two_gpu_pod_empties_the_two_cheapest_gpus_only(bed):
    """Four GPUs: a holds a priority-5 share, b and c priority-1 shares, d two priority-1 shares: a 2-GPU pod
    evicts on b and c (one victim each at priority 1), not d (two) nor a (priority 5)."""
    ledger, ext, evictions, _ = bed
    ledger.on_node(node("n1", [gpu(f"GPU-{g}", memory=1000) for g in "abcd"]))
    ledger.on_pod(running("mid", "n1", "GPU-a,NVIDIA,600,0:", 5))
    ledger.on_pod(running("b1", "n1", "GPU-b,NVIDIA,600,0:", 1))
    ledger.on_pod(running("c1", "n1", "GPU-c,NVIDIA,600,0:", 1))
    ledger.on_pod(running("d1", "n1", "GPU-d,NVIDIA,300,0:", 1))
    ledger.on_pod(running("d2", "n1", "GPU-d,NVIDIA,300,0:", 1))
    assert filter_(ext, pending("pair", priority=10, number=2))["NodeNames"] == []
    wait_until(lambda: evictions.evicted() == ["b1", "c1"], what="b1 and c1 evicted")
    assert sorted(g[0] for g in ledger.charges["pair"].grants) == ["GPU-b", "GPU-c"]


def test_the_node_whose_victims_matter_least_is_chosen(bed):
    ledger, ext, evictions, _ = bed
    ledger.on_node(node("n1", [gpu("GPU-a", memory=1000)]))
    ledger.on_node(node("n2", [gpu("GPU-b", memory=1000)]))
    ledger.on_node(node("n3", [gpu("GPU-c", memory=1000)]))
    ledger.on_pod(running("n1-mid", "n1", "GPU-a,NVIDIA,800,0:", 5))
    ledger.on_pod(running("n2-low1", "n2", "GPU-b,NVIDIA,400,0:", 1))
    ledger.on_pod(running("n2-low2", "n2", "GPU-b,NVIDIA,400,0:", 1))
    ledger.on_pod(running("n3-low", "n3", "GPU-c,NVIDIA,800,0:", 1))
    assert filter_(ext, pending("high", priority=10), ("n1", "n2", "n3"))["NodeNames"] == []
    # n2 and n3 both need one priority-1 victim; n2 comes first in the node order
    wait_until(lambda: evictions.evicted() == ["n2-low2"], what="n2-low2 evicted")
    assert ledger.charges["high"].node == "n2"


def test_a_victim_a_budget_protects_moves_preemption_to_the_next_node(bed):
    ledger, ext, evictions, _ = bed
    evictions.refuse.add("n1-low")
    ledger.on_node(node("n1", [gpu("GPU-a", memory=1000)]))
    ledger.on_node(node("n2", [gpu("GPU-b", memory=1000)]))
    ledger.on_pod(running("n1-low", "n1", "GPU-a,NVIDIA,800,0:", 1))
    ledger.on_pod(running("n2-low", "n2", "GPU-b,NVIDIA,800,0:", 2))
    assert filter_(ext, pending("high", priority=10), ("n1", "n2"))["NodeNames"] == []
    wait_until(lambda: evictions.evicted() == ["n2-low"], what="n2-low evicted")
    assert ("n1-low", True) in evictions.calls and ("n1-low", False) not in evictions.calls
    assert ledger.charges["high"].node == "n2"


def test_no_plan_means_no_nomination_and_a_later_plan(bed):
    """Nothing evictable: the pod is refused as before; it is planned for again only after REPLAN_SECONDS."""
    ledger, ext, evictions, _ = bed
    ledger.on_node(node("n1", [gpu("GPU-a", memory=1000)]))
    ledger.on_pod(running("top", "n1", "GPU-a,NVIDIA,800,0:", 20))
    assert filter_(ext, pending("high", priority=10))["NodeNames"] == []
    assert not ext.preemptor.due("high")
    assert "high" not in ledger.charges and evictions.calls == []


def test_a_refused_eviction_stops_the_preemption_and_drops_the_nomination(bed):
    """The dry runs pass, then the API server refuses the second real eviction (two victims of one budget with
    one disruption allowed): the preemption stops, the room is no longer held and the pod is told."""
    ledger, ext, evictions, events = bed
    evictions.refuse_real.add("low2")
    ledger.on_node(node("n1", [gpu("GPU-a", memory=1000)]))
    ledger.on_pod(running("low1", "n1", "GPU-a,NVIDIA,400,0:", 1))
    ledger.on_pod(running("low2", "n1", "GPU-a,NVIDIA,400,0:", 1))
    assert filter_(ext, pending("high", priority=10, memory=900))["NodeNames"] == []
    wait_until(lambda: ("", "counted", "refused") in events, what="the refusal")
    wait_until(lambda: "high" not in ledger.charges, what="the nomination dropped")
    assert evictions.evicted() == ["low1", "low2"]  # low1 went; low2 was refused
    assert any(name == "high" and reason == "PreemptionFailed" and "low2" in message
               for name, reason, message in events)


@pytest.mark.parametrize(("flags", "preempts", "topology"), [
    ([], True, True), (["--no-preemption", "--no-topology"], False, False)])
def test_the_runtime_hands_the_options_to_the_extender(tmp_path, flags, preempts, topology):
    from vgpu.cli import build_parser
    from vgpu.scheduler.cli import flag_overrides
    from vgpu.scheduler.config import load_config
    from vgpu.scheduler.runtime import SchedulerRuntime

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n")
    args = build_parser().parse_args(["scheduler", "--kubeconfig", str(kubeconfig), "--metrics-listen", "", *flags])
    runtime = SchedulerRuntime(load_config(None, flag_overrides(args)))
    assert (runtime.extender.preemptor is not None) is preempts
    assert runtime.extender.placement.topology is topology


def test_planning_stops_at_upstreams_number_of_candidates(bed):
    """Of 300 nodes where preemption would work, 100 are planned (max(10 %, 100)), from a random node on."""
    ledger, ext, _, _ = bed
    names = [f"n{i:03d}" for i in range(300)]
    for i, name in enumerate(names):
        ledger.on_node(node(name, [gpu(f"GPU-{i}", memory=1000)]))
        ledger.on_pod(running(f"low-{i}", name, f"GPU-{i},NVIDIA,800,0:", 1))
    ext.preemptor.random.seed(7)
    info = ext._pod_info(pending("high", priority=10))
    with ledger.lock:
        plans = ext.preemptor.plans([ledger.nodes[name] for name in names], info.requests, info.selectors, 10,
                                    ext.placement.default_order)
    assert len(plans) == 100
    assert {p.node for p in plans} != set(names[:100])  # not from the first node


def test_a_pod_whose_every_preemption_a_budget_refuses_is_told_once_per_reason():
    """Every plan's dry-run eviction refused (a PodDisruptionBudget): the pod gets one PreemptionBlocked event naming
    the refusal; planning again for the same reason adds none; another reason is told again."""
    now = [0.0]
    ledger, evictions, events = Ledger(), Evictions(refuse={"low"}), []
    preemptor = Preemptor(ledger, evictions, lambda ns, name: None,
                          lambda ref, kind, reason, message: events.append((ref["name"], reason, message)),
                          clock=lambda: now[0])
    ext = Extender(ledger, make_policy("binpack"), mode="decide", preemptor=preemptor)
    ledger.on_node(node("n1", [gpu("GPU-a", memory=1000)]))
    ledger.on_pod(running("low", "n1", "GPU-a,NVIDIA,800,0:", 1))

    def blocked():
        return [m for name, reason, m in events if name == "high" and reason == "PreemptionBlocked"]

    for _ in range(3):
        assert filter_(ext, pending("high", priority=10))["NodeNames"] == []
        now[0] += REPLAN_SECONDS
    (message,) = blocked()
    assert message.startswith("preemption would free room, but the evictions are refused: on n1: cannot evict "
                              "default/low: Cannot evict pod as it would violate the pod's disruption budget."), message
    evictions.refuse = {"low", "other"}  # the same refusal: nothing new
    assert filter_(ext, pending("high", priority=10))["NodeNames"] == []
    assert len(blocked()) == 1
    ledger.on_node(node("n2", [gpu("GPU-b", memory=1000)]))  # a second node, whose victim a budget keeps too
    ledger.on_pod(running("low-b", "n2", "GPU-b,NVIDIA,800,0:", 1))
    evictions.refuse = {"low", "low-b"}
    now[0] += REPLAN_SECONDS
    assert filter_(ext, pending("high", priority=10), ("n1", "n2"))["NodeNames"] == []
    assert len(blocked()) == 2 and "default/low-b" in blocked()[1] and "default/low:" in blocked()[1]
    assert evictions.evicted() == []


def test_a_blocked_pod_is_planned_for_again_by_the_extender_and_preempts_once_the_budget_allows():
    """kube-scheduler does not ask again when a budget changes: the extender plans for the blocked pod itself every
    BLOCKED_RETRY_SECONDS, on the candidates of its last /filter, and evicts once the budget lets the victim go. A
    blocked pod deleted meanwhile is planned for no more."""
    now = [0.0]
    pods = {}
    ledger, evictions, events = Ledger(), Evictions(refuse={"low", "low-b"}), []
    preemptor = Preemptor(ledger, evictions, lambda ns, name: pods.get(name),
                          lambda ref, kind, reason, message: events.append((ref["name"], reason, message)),
                          clock=lambda: now[0])
    ext = Extender(ledger, make_policy("binpack"), mode="decide", preemptor=preemptor,
                   lookup=lambda ns, name: pods.get(name))
    for name, gpu_id, victim in (("n1", "GPU-a", "low"), ("n2", "GPU-b", "low-b")):
        ledger.on_node(node(name, [gpu(gpu_id, memory=1000)]))
        pods[victim] = running(victim, name, f"{gpu_id},NVIDIA,800,0:", 1)
        ledger.on_pod(pods[victim])
    pods["high"], pods["other"] = pending("high", priority=10), pending("other", priority=10)
    assert filter_(ext, pods["high"])["NodeNames"] == []  # candidates: n1 only
    assert filter_(ext, pods["other"], ("n2",))["NodeNames"] == []
    assert [name for name, reason, _ in events if reason == "PreemptionBlocked"] == ["high", "other"]
    assert preemptor.retry_blocked() == 0  # planned for just now
    now[0] += BLOCKED_RETRY_SECONDS
    assert preemptor.retry_blocked() == 2  # still refused: nothing evicted, nothing told again
    assert evictions.evicted() == [] and len(events) == 2
    del pods["other"]  # deleted while it waited
    evictions.refuse = {"low-b"}  # the budget of `low` allows its eviction now
    now[0] += BLOCKED_RETRY_SECONDS
    calls = len(evictions.calls)
    assert preemptor.retry_blocked() == 2
    wait_until(lambda: evictions.evicted() == ["low"])
    assert ledger.charges["high"].state == ChargeState.NOMINATED and ledger.charges["high"].node == "n1"
    assert ("low", True) in evictions.calls[calls:] and ("low-b", True) not in evictions.calls[calls:]
    now[0] += BLOCKED_RETRY_SECONDS
    assert preemptor.retry_blocked() == 0  # one carried out, one gone: nothing is left to retry
