"""A learning node policy sees every vGPU pod once: from the pod watch (running pods too) or its first /filter."""

import threading

from sched_builders import container, gpu, node, pod

from vgpu.scheduler.extender import Extender
from vgpu.scheduler.ledger import Ledger
from vgpu.scheduler.policies import NodePolicy, make_policy


class Recording(NodePolicy):
    """A node policy that records what it is asked to learn from."""

    name = "recording"

    def __init__(self):
        super().__init__()
        self.seen = []

    def score(self, devices, usage, requests, result, node=None, pod=None):
        return 0.0

    def observe(self, requests, pod=None):
        self.seen.append(tuple(r.memory for r in requests))


def setup():
    ledger, policy = Ledger(), Recording()
    ext = Extender(ledger, policy, gpu_policy="binpack", mode="decide", binder=lambda *args: None)
    ledger.on_node(node("n1", [gpu("GPU-0", memory=30000)]))
    return ledger, ext, policy


def test_running_pods_from_the_watch_are_learned_once():
    ledger, _ext, policy = setup()
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
    ledger, _ext, policy = setup()
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
    # while the caches sync (not ready), what the watch shows is learned at once: no request waits for it
    Extender(ledger, policy, gpu_policy="binpack", mode="decide", ready=lambda: "pod cache not synced")
    ledger.on_node(node("n1", [gpu("GPU-0", memory=30000)]))
    for i in range(4):
        ledger.on_pod(pod(f"r{i}", container(number=1, memory=3000), node_name="n1",
                          ids="GPU-0,NVIDIA,3000,0:", phase="Running"))
    assert policy.epoch > 0 and len(policy.table) == 1


def _with_capacity(n, cpu, memory="256Gi"):
    n["status"]["allocatable"].update({"cpu": cpu, "memory": memory})
    return n


def _cpu_container(name="main", cpu="1", **gpu_limits):
    c = container(name=name, **gpu_limits)
    c["resources"]["requests"] = {"cpu": cpu, "memory": "1Gi"}
    return c


def test_ledger_tracks_the_cpu_and_memory_that_bound_pods_take():
    ledger = Ledger()
    ledger.on_node(_with_capacity(node("n1", [gpu("GPU-0")]), "16", "64Gi"))
    state = ledger.nodes["n1"]
    web = pod("web", _cpu_container(cpu="1500m"), node_name="n1", phase="Running")
    pending = pod("pending", _cpu_container(cpu="4"))  # not bound: takes nothing yet
    for p in (web, web, pending):
        ledger.on_pod(p)
    ctx = state.context()
    assert (ctx.cpu_free, ctx.cpu_total) == (14_500, 16_000)
    assert (ctx.memory_free, ctx.memory_total) == (65_536 - 1024, 65_536)
    done = pod("web", _cpu_container(cpu="1500m"), uid=web["metadata"]["uid"], node_name="n1", phase="Succeeded")
    ledger.on_pod(done)
    assert state.context().cpu_free == 16_000
    ledger.on_pod(pod("batch", _cpu_container(cpu="2"), node_name="n1", phase="Running"))
    ledger.on_pod_delete(pod("batch", uid="gone"))  # another pod's delete changes nothing
    assert state.context().cpu_free == 14_000
    ledger.on_pod(pod("early", _cpu_container(cpu="1"), node_name="n3", phase="Running"))  # before its node
    ledger.on_node(_with_capacity(node("n3", [gpu("GPU-3")]), "8"))
    assert ledger.nodes["n3"].context().cpu_free == 7_000
    ledger.on_node(node("n2", [gpu("GPU-1")]))  # no memory allocatable: no node context
    assert ledger.nodes["n2"].context() is None


def _cpu_tie_cluster(policy_name):
    ledger = Ledger()
    policy = make_policy(policy_name)
    ext = Extender(ledger, policy, gpu_policy="binpack", mode="decide")
    for name, cpu in (("n1", "24"), ("n2", "15")):
        ledger.on_node(_with_capacity(node(name, [gpu(f"{name}-0", memory=30000), gpu(f"{name}-1", memory=30000)]),
                                      cpu))
    for i in range(4):  # the workload so far: whole GPUs with 8 CPUs each (pending, seen by the watch)
        ledger.on_pod(pod(f"train-{i}", _cpu_container(cpu="8", number=1, memory=30000)))
    ext.learn()  # what the learner thread does after a bind
    return ext


def test_fragaware_in_the_extender_breaks_ties_with_the_nodes_free_cpu():
    small = pod("infer", _cpu_container(cpu="4", number=1, memory=3000))
    # Both nodes look the same to FGD; n2's 15 CPUs already feed only one 8-CPU trainer, so a small pod costs it
    # nothing, while on n1 (24 CPUs) it takes a GPU that CPUs could still feed.
    assert _cpu_tie_cluster("fgd").filter({"Pod": small, "NodeNames": ["n1", "n2"]})["NodeNames"] == ["n1"]
    assert _cpu_tie_cluster("fragaware").filter({"Pod": small, "NodeNames": ["n1", "n2"]})["NodeNames"] == ["n2"]


# Placement shares results between nodes whose GPUs are in the same state, so each node of these tests has its own
# card size, by which the policy below tells them apart (a score may depend on the GPUs' state, not their UUIDs).
MEMORY = {"n1": 30000, "n2": 30100, "n3": 30200, "n4": 30300}
NODE_OF = {memory: name for name, memory in MEMORY.items()}


class Shifting(NodePolicy):
    """A learning node policy whose preferred node flips when its target (epoch) changes."""

    name = "shifting"
    def __init__(self):
        super().__init__()
        self.prefs = {0: {"n1": 3, "n2": 2, "n3": 1}, 1: {"n1": 1, "n2": 2, "n3": 3}}
        self.calls = []

    def score(self, devices, usage, requests, result, node=None, pod=None):
        name = NODE_OF[devices[0].memory]
        self.calls.append((self.epoch, name))
        return self.prefs[self.epoch][name]


def _three_nodes(budget):
    ledger, policy = Ledger(), Shifting()
    ext = Extender(ledger, policy, gpu_policy="binpack", mode="decide")
    ext.placement.refresh_budget = budget
    for n in ("n1", "n2", "n3"):
        ledger.on_node(node(n, [gpu(f"{n}-0", memory=MEMORY[n])]))
    return ext, policy


def _decide(ext, name):
    return ext.filter({"Pod": pod(name, container(number=1, memory=1000)), "NodeNames": ["n1", "n2", "n3"]})


def test_decide_mode_spreads_rescoring_after_a_target_change_over_requests():
    ext, policy = _three_nodes(budget=1)
    assert _decide(ext, "a")["NodeNames"] == ["n1"]  # reserving n1 empties its cache
    policy.epoch, policy.calls = 1, []
    # n1 is recomputed (its usage changed), n2 is the one stale node refreshed; n3 keeps its earlier score
    assert _decide(ext, "b")["NodeNames"] == ["n2"]
    assert policy.calls == [(1, "n1"), (1, "n2")]
    policy.calls = []
    assert _decide(ext, "c")["NodeNames"] == ["n3"]  # the next request refreshes n3, now the best
    assert policy.calls == [(1, "n2"), (1, "n3")]


def test_decide_mode_rescores_a_stale_winner_before_placing():
    ext, policy = _three_nodes(budget=0)
    assert _decide(ext, "a")["NodeNames"] == ["n1"]
    policy.epoch, policy.calls = 1, []
    assert _decide(ext, "b")["NodeNames"] == ["n2"]  # best on its earlier score, rescored before the reservation
    assert policy.calls == [(1, "n1"), (1, "n2")]


def test_decide_mode_rescores_stale_nodes_best_first_until_a_current_score_wins():
    ledger, policy = Ledger(), Shifting()
    policy.prefs = {0: {"n1": 1, "n2": 1, "n3": 9, "n4": 8}, 1: {"n1": 2, "n2": 2, "n3": 0, "n4": 7}}
    ext = Extender(ledger, policy, gpu_policy="binpack", mode="decide")
    ext.placement.refresh_budget = 2
    names = ["n1", "n2", "n3", "n4"]
    for n in names:
        ledger.on_node(node(n, [gpu(f"{n}-0", memory=MEMORY[n])]))
    probe = pod("probe", container(number=1, memory=1000))
    for n in names:  # scores cached on the first target, nothing reserved
        assert ext.evaluate(probe, n)[0].ok
    policy.epoch, policy.calls = 1, []
    out = ext.filter({"Pod": pod("b", container(number=1, memory=1000)), "NodeNames": names})
    # n1 and n2 are the two stale nodes refreshed in node order; n3 then ranks first on its earlier score, is
    # rescored and falls to 0, so n4 (next on its earlier score) is rescored and wins on its current score
    assert out["NodeNames"] == ["n4"]
    assert policy.calls == [(1, "n1"), (1, "n2"), (1, "n3"), (1, "n4")]


class Relearning(NodePolicy):
    """A learning policy that rebuilds after every pod and records the thread each rebuild runs on."""

    name = "relearning"

    def __init__(self):
        super().__init__()
        self.pending = 0
        self.threads = []

    def score(self, devices, usage, requests, result, node=None, pod=None):
        return float(self.epoch)

    def observe(self, requests, pod=None):
        self.pending += 1

    @property
    def due(self):
        return self.pending > 0

    def relearn(self, capacity=None):
        if not self.pending:
            return False
        self.pending = 0
        self.epoch += 1
        self.threads.append(threading.current_thread().name)
        return True


def test_rebuilds_run_on_the_learner_thread_never_in_a_request():
    ledger, policy = Ledger(), Relearning()
    ext = Extender(ledger, policy, gpu_policy="binpack", mode="decide", binder=lambda *args: None)
    ledger.on_node(node("n1", [gpu("GPU-0", memory=30000)]))
    for i in range(3):
        p = pod(f"p{i}", container(number=1, memory=1000))
        ledger.on_pod(p)  # the watch: counted, not rebuilt
        assert ext.filter({"Pod": p, "NodeNames": ["n1"]})["NodeNames"] == ["n1"]
        meta = p["metadata"]
        assert ext.bind({"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
                         "Node": "n1"})["Error"] == ""
        assert ext.wait_learned()
    assert policy.epoch == 3 and set(policy.threads) == {"vgpu-learner"}
