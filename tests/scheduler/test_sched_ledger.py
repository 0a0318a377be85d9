"""The usage ledger: node inventory states, incremental pod accounting, reservations and their TTL."""

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sched_builders import container, gpu, node, pod

from vgpu import grants, keys
from vgpu.assignment import DeviceGrant
from vgpu.scheduler.extender import Extender
from vgpu.scheduler.ledger import ChargeState, Ledger
from vgpu.scheduler.policies import make_policy


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def usage(ledger, name):
    return [(u.shares, u.memory, u.cores) for u in ledger.nodes[name].usage]


def test_malformed_annotation_fails_only_that_node():
    ledger = Ledger()
    ledger.on_node(node("good", [gpu("GPU-a")]))
    ledger.on_node(node("bad", register="GPU-b,10,40960,NVIDIA-A100,maybe,hami-core:"))
    ledger.on_node(node("none"))
    ledger.on_node(node("zero", [gpu("GPU-c")], allocatable=0))
    ext = Extender(ledger, make_policy("binpack"), mode="score")
    out = ext.filter({"Pod": pod("p", container(number=1, memory=100)), "NodeNames": ["good", "bad", "none", "zero"]})
    assert out["NodeNames"] == ["good"]
    bad = out["FailedAndUnresolvableNodes"]
    assert "volcano.sh/node-vgpu-register entry 0 health" in bad["bad"] and "'maybe'" in bad["bad"]
    assert "annotation volcano.sh/node-vgpu-register absent" in bad["none"]
    assert "allocatable volcano.sh/vgpu-number is 0" in bad["zero"]


def test_node_becomes_schedulable_when_annotation_is_fixed_and_keeps_usage():
    ledger = Ledger()
    ledger.on_pod(pod("early", node_name="n1", ids="GPU-a,NVIDIA,1000,10:"))
    ledger.on_node(node("n1", register="broken"))
    assert ledger.nodes["n1"].error
    ledger.on_node(node("n1", [gpu("GPU-a")]))
    assert not ledger.nodes["n1"].error
    assert usage(ledger, "n1") == [(1, 1000, 10)]


def test_unchanged_node_update_keeps_generation():
    ledger = Ledger()
    n = node("n1", [gpu("GPU-a")])
    ledger.on_node(n)
    gen = ledger.nodes["n1"].generation
    n2 = dict(n, metadata=dict(n["metadata"], labels={"x": "y"}, resourceVersion="99"))
    ledger.on_node(n2)
    assert ledger.nodes["n1"].generation == gen
    ledger.on_node(node("n1", [gpu("GPU-a", memory=9000)]))
    assert ledger.nodes["n1"].generation == gen + 1


def test_pod_lifecycle_charges_and_releases():
    ledger = Ledger()
    ledger.on_node(node("n1", [gpu("GPU-a"), gpu("GPU-b")]))
    p = pod("p", node_name="n1", ids="GPU-a,NVIDIA,1000,10:;GPU-a,NVIDIA,500,5:GPU-b,NVIDIA,500,5:")
    ledger.on_pod(p)
    assert usage(ledger, "n1") == [(2, 1500, 15), (1, 500, 5)]
    gen = ledger.nodes["n1"].generation
    ledger.on_pod(dict(p, status={"phase": "Running"}))  # a status update changes nothing
    assert ledger.nodes["n1"].generation == gen
    ledger.on_pod(dict(p, status={"phase": "Succeeded"}))
    assert usage(ledger, "n1") == [(0, 0, 0), (0, 0, 0)]
    ledger.on_pod(dict(p, status={"phase": "Running"}))
    ledger.on_pod_delete(p)
    assert usage(ledger, "n1") == [(0, 0, 0), (0, 0, 0)]


def test_an_unbound_pod_is_not_charged_from_its_annotations():
    ledger = Ledger()
    ledger.on_node(node("n1", [gpu("GPU-a")]))
    ledger.on_pod(pod("v", ids="GPU-a,NVIDIA,700,0:", annotations={keys.VGPU_NODE: "n1"}))
    assert usage(ledger, "n1") == [(0, 0, 0)]  # anyone can write vgpu-node; only a binding places a pod


def test_unknown_uuid_and_corrupt_entries_are_ignored():
    ledger = Ledger()
    ledger.on_node(node("n1", [gpu("GPU-a")]))
    ledger.on_pod(pod("p", node_name="n1", ids="GPU-zzz,NVIDIA,100,0:GPU-a,NVIDIA,-5,3:GPU-a,NVIDIA,200,1:"))
    assert usage(ledger, "n1") == [(1, 100, 0)]  # the spec (2 GPUs of 100 units, no cores), not the 200 claimed


def test_a_claim_is_charged_at_the_spec_whatever_it_writes():
    """The claim names the GPUs; the amounts come from the spec: inflated, shrunk, or claimed by a container that
    asks no GPU, nothing else is charged."""
    ledger = Ledger()
    ledger.on_node(node("n1", [gpu("GPU-a", 8000), gpu("GPU-b", 8000)]))
    spec = container("c0", number=1, memory=1000, cores=10)
    ledger.on_pod(pod("inflated", spec, node_name="n1", ids="GPU-a,NVIDIA,8000,100:GPU-b,NVIDIA,8000,100:"))
    ledger.on_pod(pod("shrunk", spec, node_name="n1", ids="GPU-b,NVIDIA,1,1:"))
    cpu_only = {"name": "web", "image": "busybox", "resources": {}}
    ledger.on_pod(pod("cpu-only", cpu_only, node_name="n1", ids="GPU-a,NVIDIA,8000,100:;GPU-b,NVIDIA,8000,100:"))
    assert usage(ledger, "n1") == [(1, 1000, 10), (1, 1000, 10)]


def test_reservation_expires_and_bound_charge_survives_stale_events():
    clock = Clock()
    ledger = Ledger(assume_ttl=30, bound_ttl=600, clock=clock)
    ledger.on_node(node("n1", [gpu("GPU-a")]))
    grants = ((DeviceGrant("GPU-a", 1000, 10),),)
    ledger.reserve("u1", "default", "p1", "n1", grants)
    assert usage(ledger, "n1") == [(1, 1000, 10)]
    clock.now += 31
    assert ledger.expire() == 1
    assert usage(ledger, "n1") == [(0, 0, 0)]

    ledger.reserve("u2", "default", "p2", "n1", grants)
    ledger.mark_bound("u2")
    stale = pod("p2", uid="u2")  # an event from before our binding: no annotations, no node
    ledger.on_pod(stale)
    clock.now += 100
    ledger.expire()
    assert usage(ledger, "n1") == [(1, 1000, 10)]
    ledger.on_pod(pod("p2", uid="u2", node_name="n1", ids="GPU-a,NVIDIA,1000,10:"))
    assert ledger.charges["u2"].state == ChargeState.OBSERVED
    clock.now += 10_000
    ledger.expire()
    assert usage(ledger, "n1") == [(1, 1000, 10)]
    ledger.on_pod_delete(stale)
    assert usage(ledger, "n1") == [(0, 0, 0)]


def test_decide_mode_reservation_counts_for_next_pod_and_refilter_replaces_it():
    ledger = Ledger()
    ledger.on_node(node("n1", [gpu("GPU-a", memory=1000, split=10)]))
    ext = Extender(ledger, make_policy("binpack"), mode="decide")
    p = pod("p", container(number=1, memory=600))
    assert ext.filter({"Pod": p, "NodeNames": ["n1"]})["NodeNames"] == ["n1"]
    q = pod("q", container(number=1, memory=600))
    assert ext.filter({"Pod": q, "NodeNames": ["n1"]})["NodeNames"] == []
    # kube-scheduler filters p again (e.g. after a failed cycle): its old reservation is dropped first.
    assert ext.filter({"Pod": p, "NodeNames": ["n1"]})["NodeNames"] == ["n1"]
    assert usage(ledger, "n1") == [(1, 600, 0)]


def test_placement_results_are_shared_by_nodes_in_one_state_and_redone_when_usage_changes():
    ledger = Ledger()
    for name, uuid in (("n1", "GPU-a"), ("n2", "GPU-b"), ("n3", "GPU-c")):
        ledger.on_node(node(name, [gpu(uuid, memory=1000)]))
    ext = Extender(ledger, make_policy("binpack"), mode="score")
    args = {"Pod": pod("p", container(number=1, memory=600)), "NodeNames": ["n1", "n2", "n3"]}
    assert ext.filter(args)["NodeNames"] == ["n1", "n2", "n3"]
    assert ext.placement.evaluations == 1  # three empty 1000-unit GPUs: one fit
    assert ext.filter(args)["NodeNames"] == ["n1", "n2", "n3"]
    assert ext.placement.evaluations == 1  # nothing changed: remembered
    ledger.on_pod(pod("other", node_name="n1", ids="GPU-a,NVIDIA,500,0:"))
    out = ext.filter(args)
    assert out["NodeNames"] == ["n2", "n3"] and "insufficient memory" in out["FailedNodes"]["n1"]
    assert ext.placement.evaluations == 2  # only n1's new state is fitted
    pinned = pod("pinned", container(number=1, memory=100))
    pinned["metadata"]["annotations"] = {"volcano.sh/vgpu-use-gpuuuid": "GPU-c"}
    assert ext.filter({"Pod": pinned, "NodeNames": ["n2", "n3"]})["NodeNames"] == ["n3"]  # per node: UUIDs differ


def test_preempt_keeps_nodes_where_victims_free_enough():
    ledger = Ledger()
    ledger.on_node(node("n1", [gpu("GPU-a", memory=1000)]))
    ledger.on_node(node("n2", [gpu("GPU-b", memory=1000)]))
    ledger.on_pod(pod("v1", uid="v1", node_name="n1", ids="GPU-a,NVIDIA,800,0:"))
    ledger.on_pod(pod("v2", uid="v2", node_name="n2", ids="GPU-b,NVIDIA,300,0:"))
    ledger.on_pod(pod("keep", uid="k2", node_name="n2", ids="GPU-b,NVIDIA,500,0:"))
    ext = Extender(ledger, make_policy("binpack"), mode="score")
    out = ext.preempt({
        "Pod": pod("p", container(number=1, memory=600)),
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "v1"}], "NumPDBViolations": 0},
                                  "n2": {"Pods": [{"UID": "v2"}], "NumPDBViolations": 1}},
    })
    assert out == {"NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "v1"}], "NumPDBViolations": 0}}}


def test_with_a_grant_key_an_unsigned_claim_leaves_the_ledgers_record_in_place():
    """A bound pod moves its signed claim to another GPU of its node: the signature no longer verifies, the charge
    stays where the signed claim put it, and the claim is reported."""
    key = grants.GrantKey(private=Ed25519PrivateKey.generate())
    ledger = Ledger(grant_key=key)
    reported: list[list[str]] = []
    ledger.grant_listeners.append(lambda pod_obj, problems: reported.append(problems))
    ledger.on_node(node("n1", [gpu("GPU-a", 8000), gpu("GPU-b", 8000)]))
    spec = container("c0", number=1, memory=1000, cores=10)
    value = "GPU-a,NVIDIA,1000,10:"
    signature = {grants.SIGNATURE: key.sign("u1", "n1", value)}
    ledger.on_pod(pod("p", spec, node_name="n1", ids=value, uid="u1", annotations=signature))
    assert usage(ledger, "n1") == [(1, 1000, 10), (0, 0, 0)] and not reported
    ledger.on_pod(pod("p", spec, node_name="n1", ids="GPU-b,NVIDIA,1000,10:", uid="u1", annotations=signature))
    assert usage(ledger, "n1") == [(1, 1000, 10), (0, 0, 0)]
    assert reported and "signature" in reported[-1][-1]


def test_nothing_of_a_deleted_pod_stays_in_the_extender(monkeypatch):
    """Pods created, placed, bound and deleted: the extender keeps no entry for any of them, and the ledger's expiry
    queue follows its live charges (before: one memo entry per pod ever seen, up to 200,000, and an expiry entry per
    reservation until its TTL passed; the extender's memory grew by kilobytes per pod under churn)."""
    import vgpu.scheduler.ledger as ledger_module

    monkeypatch.setattr(ledger_module, "EXPIRY_SLACK", 8)
    ledger = Ledger()
    ledger.on_node(node("n1", [gpu("GPU-a", memory=8000)]))

    def binder(namespace, name, uid, node_name, annotations):  # the API server, and the watch event of the binding
        ledger.on_pod({**made[name], "metadata": {**made[name]["metadata"], "annotations": annotations},
                       "spec": {**made[name]["spec"], "nodeName": node_name}})

    ext = Extender(ledger, make_policy("binpack"), mode="decide", binder=binder)
    made = {}
    for i in range(60):
        p = made[f"p{i}"] = pod(f"p{i}", container(number=1, memory=1000))
        ledger.on_pod(p)
        assert ext.filter({"Pod": p, "NodeNames": ["n1"]})["NodeNames"] == ["n1"]
        meta = p["metadata"]
        assert not ext.bind({"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
                             "Node": "n1"})["Error"]
        ledger.on_pod_delete(p)
        assert len(ledger._expiry) <= 2 * 2 + 8 + 1  # at most two charges live at once, plus the slack
    assert not ext._seen and not ledger.charges
    assert usage(ledger, "n1") == [(0, 0, 0)]
