"""A learning node policy sees every vGPU pod once: from the pod watch (running pods too) or its first /filter."""

from sched_builders import container, gpu, node, pod

from scheduler.extender import Extender
from scheduler.ledger import Ledger
from scheduler.policies import make_policy


class Recording:
    """A node policy (the NodePolicy protocol) that records what it is asked to learn from."""

    name = "recording"
    gpu_order = None

    def __init__(self):
        self.seen = []

    def score(self, devices, usage, requests, result, node=None, pod=None):
        return 0.0

    def observe(self, requests, pod=None):
        self.seen.append(tuple(r.memory for r in requests))


def setup():
    ledger, policy = Ledger(), Recording()
    ext = Extender(ledger, policy, "binpack", "decide", binder=lambda *args: None)
    ledger.on_node(node("n1", [gpu("GPU-0", memory=30000)]))
    return ledger, ext, policy


def test_running_pods_from_the_watch_are_learned_once():
    ledger, ext, policy = setup()
    running = pod("old", container(number=1, memory=3000), node_name="n1", ids="GPU-0,NVIDIA,3000,0:",
                  phase="Running")
    ledger.on_pod(running)
    ledger.on_pod(running)  # an update event of the same pod
    assert policy.seen == [(3000,)]
    assert ledger.nodes["n1"].usage[0].memory == 3000  # the ledger still accounts it


def test_a_pod_is_learned_once_across_watch_filter_and_bind():
    ledger, ext, policy = setup()
    new = pod("new", container(number=1, memory=1000))
    ledger.on_pod(new)  # the watch shows it pending
    out = ext.filter({"Pod": new, "NodeNames": ["n1"]})
    assert out["NodeNames"] == ["n1"]
    meta = new["metadata"]
    assert ext.bind({"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
                     "Node": "n1"})["Error"] == ""
    bound = pod("new", container(number=1, memory=1000), uid=meta["uid"], node_name="n1",
                ids="GPU-0,NVIDIA,1000,0:")
    ledger.on_pod(bound)  # the watch shows the binding
    other = pod("other", container(number=1, memory=2000))
    ext.filter({"Pod": other, "NodeNames": ["n1"]})  # first seen at /filter
    ledger.on_pod(other)
    assert policy.seen == [(1000,), (2000,)]


def test_cpu_only_and_invalid_pods_are_not_learned_and_do_not_break_the_watch():
    ledger, ext, policy = setup()
    cpu_only = pod("web", {"name": "web", "image": "nginx", "resources": {"limits": {"cpu": "1"}}})
    invalid = pod("bad", container(number=1, memory=1000, cores=150))
    ledger.on_pod(cpu_only)
    ledger.on_pod(invalid)
    assert policy.seen == []
    ledger.on_pod(pod("ok", container(number=1, memory=500)))
    assert policy.seen == [(500,)]


def test_fragaware_starts_from_the_running_workload():
    ledger = Ledger()
    policy = make_policy("fragaware")
    Extender(ledger, policy, "binpack", "decide")
    ledger.on_node(node("n1", [gpu("GPU-0", memory=30000)]))
    for i in range(4):
        ledger.on_pod(pod(f"r{i}", container(number=1, memory=3000), node_name="n1",
                          ids="GPU-0,NVIDIA,3000,0:", phase="Running"))
    assert policy.epoch > 0 and len(policy.table) == 1
