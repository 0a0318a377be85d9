"""Golden vectors of the research reports that concern fit and score, run through the ledger and the extender.

Sources: volcano-vgpu-device-plugin's and HAMi's scheduler tests and documented examples (cases 1-9, and HAMi's
V2, V3, V7). Where our semantics differ on purpose the test says so and asserts our behaviour:
- unhealthy GPUs are filtered (Volcano ignores the health flag, plugin #123);
- vgpu-cores > 100 is rejected with a reason (HAMi clamps to 100, V3);
- Volcano's spread score is fixed: an idle GPU scores 100 (Volcano HEAD gives 0, item 2);
- there is no "no policy / index descending" order: the GPU order is binpack or spread (item 4, third case);
- node ties are broken by node name, deterministically (HAMi's unstable sort accepted either device in V7);
- podgroup spread (item 6) is Volcano-scheduler-specific and not implemented here;
- reasons are ours (e.g. "uuid not allowed"), not Volcano's/HAMi's wording; permanent mismatches go to
  FailedAndUnresolvableNodes.
"""

import pytest
from sched_builders import container, gpu, node, pod

from vgpu import keys
from vgpu.scheduler.extender import Extender
from vgpu.scheduler.ledger import Ledger
from vgpu.scheduler.policies import make_policy


def make(nodes, pods=(), node_policy="binpack", gpu_policy="binpack", mode="decide"):
    ledger = Ledger()
    for n in nodes:
        ledger.on_node(n)
    for p in pods:
        ledger.on_pod(p)
    return ledger, Extender(ledger, make_policy(node_policy), gpu_policy=gpu_policy, mode=mode)


def placed(ledger, name):
    """(node, [(uuid, memory, cores)...]) of the reservation of pod `name`."""
    (charge,) = [c for c in ledger.charges.values() if c.name == name]
    return charge.node, list(charge.grants)


def volcano_node(*devices):
    return node("n1", devices)


# --- volcano-vgpu-plugin.md 7.5 -------------------------------------------------------------------------------


def test_v1_binpack_score():
    _ledger, ext = make(
        [volcano_node(gpu("GPU-0", memory=30000))],
        [pod("old", node_name="n1", ids="GPU-0,NVIDIA,3000,0:")],
    )
    new = pod("p", container(number=1, memory=1000))
    result, score = ext.evaluate(new, "n1")
    assert result.ok
    assert result.assignment[0][0].memory == 1000 and result.assignment[0][0].cores == 0
    assert score == pytest.approx(100 * 4000 / 30000)


def test_v2_spread_score_is_fixed():
    # Volcano HEAD scores 0 because it checks UsedNum == 0 after the increment; we score an idle GPU 100.
    _ledger, ext = make([volcano_node(gpu("GPU-0", memory=30000))], node_policy="spread")
    result, score = ext.evaluate(pod("p", container(number=1, memory=1000)), "n1")
    assert result.ok and score == 100


def test_v3_exclusive_multi_card_annotation():
    ledger, ext = make([volcano_node(gpu("GPU-0", 30000), gpu("GPU-1", 20000), gpu("GPU-2", 30000))])
    out = ext.filter({"Pod": pod("p", container(number=3, cores=100)), "NodeNames": ["n1"]})
    assert out["NodeNames"] == ["n1"]
    charge = next(iter(ledger.charges.values()))
    from vgpu.assignment import encode

    assert encode(charge.assignment) == "GPU-0,NVIDIA,30000,100:GPU-1,NVIDIA,20000,100:GPU-2,NVIDIA,30000,100:"


@pytest.mark.parametrize("gpu_policy, expected", [("binpack", "GPU-0"), ("spread", "GPU-1")])
def test_v4_device_choice(gpu_policy, expected):
    devices = [gpu("GPU-0", 16384, split=4), gpu("GPU-1", 16384, split=4)]
    ledger, ext = make([volcano_node(*devices)], [pod("old", node_name="n1", ids="GPU-0,NVIDIA,4096,0:")],
                       gpu_policy=gpu_policy)
    ext.filter({"Pod": pod("p", container(number=1, memory=4096, cores=25)), "NodeNames": ["n1"]})
    assert placed(ledger, "p") == ("n1", [(expected, 4096, 25)])


def test_v4_idle_gpus_binpack_takes_lowest_index():
    # Volcano's "no policy" order (index descending -> GPU-2) does not exist here; binpack breaks ties by index.
    ledger, ext = make([volcano_node(gpu("GPU-0", 16384), gpu("GPU-1", 16384), gpu("GPU-2", 16384))])
    ext.filter({"Pod": pod("p", container(number=1, memory=4096, cores=25)), "NodeNames": ["n1"]})
    assert placed(ledger, "p")[1][0][0] == "GPU-0"


def test_v5_binpack_stacks_sequential_pods():
    ledger, ext = make([volcano_node(gpu("GPU-0", 16384), gpu("GPU-1", 16384), gpu("GPU-2", 16384))])
    for i in range(3):
        ext.filter({"Pod": pod(f"p{i}", container(number=1, memory=4096)), "NodeNames": ["n1"]})
    assert {placed(ledger, f"p{i}")[1][0][0] for i in range(3)} == {"GPU-0"}
    assert ledger.nodes["n1"].usage[0].memory == 3 * 4096


@pytest.mark.parametrize(
    "annotations, expected",
    [
        ({keys.USE_GPU_UUID: "GPU-0, GPU-1"}, "GPU-1"),
        ({keys.USE_GPU_UUID: "GPU-10"}, None),
        ({keys.USE_GPU_UUID: ", ,"}, "GPU-1"),
        ({keys.USE_GPU_UUID: "GPU-1", keys.NOUSE_GPU_UUID: "GPU-1"}, None),
    ],
)
def test_v7_uuid_filter(annotations, expected):
    ledger, ext = make([volcano_node(gpu("GPU-1"))])
    out = ext.filter({"Pod": pod("p", container(number=1, memory=100), annotations=annotations),
                      "NodeNames": ["n1"]})
    if expected is None:
        assert out["NodeNames"] == [] and "uuid not allowed" in out["FailedAndUnresolvableNodes"]["n1"]
    else:
        assert placed(ledger, "p")[1][0][0] == expected


@pytest.mark.parametrize(
    "annotations, expected",
    [
        ({keys.USE_GPU_UUID: "GPU-0000A"}, "GPU-0000A"),
        ({keys.NOUSE_GPU_UUID: "GPU-0000B"}, "GPU-0000A"),
        ({keys.USE_GPU_UUID: "GPU-unknown"}, None),
        ({keys.NOUSE_GPU_UUID: "GPU-0000A,GPU-0000B"}, None),
        # HAMi's names of the same lists (nvidia.com/use-gpuuuid, nouse-gpuuuid), alone and beside Volcano's
        ({keys.HAMI_USE_GPU_UUID: "GPU-0000A"}, "GPU-0000A"),
        ({keys.HAMI_NOUSE_GPU_UUID: "GPU-0000B"}, "GPU-0000A"),
        ({keys.HAMI_NOUSE_GPU_UUID: "GPU-0000A", keys.NOUSE_GPU_UUID: "GPU-0000B"}, None),
    ],
)
def test_v8_uuid_constraint_fit(annotations, expected):
    # Under spread GPU order GPU-0000B would win without constraints, so the selector decides.
    ledger, ext = make([volcano_node(gpu("GPU-0000B"), gpu("GPU-0000A"))], gpu_policy="spread")
    out = ext.filter({"Pod": pod("p", container(number=1, memory=100), annotations=annotations),
                      "NodeNames": ["n1"]})
    if expected is None:
        assert out["NodeNames"] == []
        assert "2 uuid not allowed" in out["FailedAndUnresolvableNodes"]["n1"]
    else:
        assert placed(ledger, "p")[1][0][0] == expected


@pytest.mark.parametrize(
    "annotations, fits",
    [
        ({keys.USE_GPU_TYPE: "nvidia"}, True),
        ({keys.USE_GPU_TYPE: "AMD,INTEL,MLU"}, False),
        ({keys.NOUSE_GPU_TYPE: "AMD,NVIDIA,INTEL"}, False),
        ({}, True),
    ],
)
def test_v9_gpu_type(annotations, fits):
    _ledger, ext = make([volcano_node(gpu("GPU-0", type_="NVIDIA"))])
    out = ext.filter({"Pod": pod("p", container(number=1, memory=100), annotations=annotations),
                      "NodeNames": ["n1"]})
    assert (out["NodeNames"] == ["n1"]) is fits
    if not fits:
        assert "type not allowed" in out["FailedAndUnresolvableNodes"]["n1"]


# --- hami-scheduler.md 9.2 ------------------------------------------------------------------------------------


def hami_dev(uuid="dev-0", memory=128, split=100, healthy=True):
    return gpu(uuid, memory=memory, split=split, healthy=healthy)


@pytest.mark.parametrize(
    "existing, request_, why, unresolvable",
    [
        ("", dict(number=1, memory=512), "card smaller than request", True),
        ("dev-0,NVIDIA,0,100:", dict(number=1, memory=64, cores=50), "insufficient cores", False),
        ("dev-0,NVIDIA,0,0:", dict(number=1, memory=64, cores=100), "exclusive conflict", False),
        ("dev-0,NVIDIA,0,50:dev-0,NVIDIA,0,50:", dict(number=1, memory=64, cores=0), "exclusive conflict", False),
        ("", dict(number=2, memory=64), "needs 2 GPUs, node has 1", True),
    ],
)
def test_hami_v2_fit_failures(existing, request_, why, unresolvable):
    pods = [pod("old", node_name="n1", ids=existing)] if existing else []
    _ledger, ext = make([volcano_node(hami_dev())], pods)
    out = ext.filter({"Pod": pod("p", container(**request_)), "NodeNames": ["n1"]})
    table = out["FailedAndUnresolvableNodes"] if unresolvable else out["FailedNodes"]
    assert out["NodeNames"] == [] and why in table["n1"], out


def test_hami_v2_time_slicing_exhausted():
    _ledger, ext = make([volcano_node(hami_dev(split=2))],
                       [pod("a", node_name="n1", ids="dev-0,NVIDIA,10,0:"),
                        pod("b", node_name="n1", ids="dev-0,NVIDIA,10,0:")])
    out = ext.filter({"Pod": pod("p", container(number=1, memory=10)), "NodeNames": ["n1"]})
    assert "no free share" in out["FailedNodes"]["n1"]


def test_hami_v2_three_gpus_on_two():
    _ledger, ext = make([volcano_node(hami_dev("dev-0"), hami_dev("dev-1"))])
    out = ext.filter({"Pod": pod("p", container(number=3, memory=10)), "NodeNames": ["n1"]})
    assert "needs 3 GPUs, node has 2" in out["FailedAndUnresolvableNodes"]["n1"]


def test_hami_v2_unhealthy_is_filtered():
    # Volcano schedules onto unhealthy GPUs (it never reads the flag); we do not.
    _ledger, ext = make([volcano_node(hami_dev(healthy=False))])
    out = ext.filter({"Pod": pod("p", container(number=1, memory=10)), "NodeNames": ["n1"]})
    assert "unhealthy" in out["FailedNodes"]["n1"]


def test_hami_v3_cores_over_100_rejected():
    # HAMi clamps 120 to 100; the contract rejects it with a reason naming the container and the resource.
    _ledger, ext = make([volcano_node(hami_dev())])
    out = ext.filter({"Pod": pod("p", container(name="worker", number=1, cores=120)), "NodeNames": ["n1"]})
    assert out["NodeNames"] == []
    assert "worker" in out["Error"] and "volcano.sh/vgpu-cores" in out["Error"]


def test_hami_v3_percentage_charged_on_card():
    ledger, ext = make([volcano_node(hami_dev(memory=1280))],
                       [pod("old", node_name="n1", ids="dev-0,NVIDIA,0,10:")])
    ext.filter({"Pod": pod("p", container(number=1, percent=10, cores=20)), "NodeNames": ["n1"]})
    assert placed(ledger, "p") == ("n1", [("dev-0", 128, 20)])


V7_EXISTING = [
    pod("e1", node_name="node1", ids="device1,NVIDIA,2000,25:"),
    pod("e2", node_name="node2", ids="device4,NVIDIA,6000,75:"),
]


def v7_nodes():
    return [node("node1", [gpu("device1", 8000), gpu("device2", 8000)]),
            node("node2", [gpu("device3", 8000), gpu("device4", 8000)])]


@pytest.mark.parametrize(
    "node_policy, gpu_policy, expected",
    [
        ("binpack", "binpack", ("node2", "device4")),
        # HAMi: node2/device3 (its node score is the utilisation before the pod); ours is the GPU memory after
        # placement, equal on both nodes (12.5), so the tie goes to the first name.
        ("binpack", "spread", ("node1", "device2")),
        ("spread", "binpack", ("node1", "device1")),
        ("spread", "spread", ("node1", "device2")),
    ],
)
def test_hami_v7_end_to_end_filter(node_policy, gpu_policy, expected):
    ledger, ext = make(v7_nodes(), V7_EXISTING, node_policy, gpu_policy)
    out = ext.filter({"Pod": pod("p", container(number=1, memory=1000, cores=20)),
                      "NodeNames": ["node1", "node2"]})
    assert out["NodeNames"] == [expected[0]]
    assert placed(ledger, "p") == (expected[0], [(expected[1], 1000, 20)])


def test_hami_v7_init_container_case():
    # HAMi charges max(init, app) per GPU; we charge init and app containers cumulatively (conservative), so the
    # init container (5000) and the app container (4000) cannot share device3 (8000) and take separate GPUs.
    ledger, ext = make(v7_nodes(), V7_EXISTING)
    p = pod("p", container(name="app", number=1, memory=4000, cores=20))
    p["spec"]["initContainers"] = [container(name="init", number=1, memory=5000, cores=20)]
    out = ext.filter({"Pod": p, "NodeNames": ["node1", "node2"]})
    assert out["NodeNames"] == ["node1"]
    _node_name, grants = placed(ledger, "p")
    assert sorted(g[1] for g in grants) == [4000, 5000]


@pytest.mark.parametrize("scheduler_order, annotation, expected", [
    ("binpack", None, "GPU-used"),
    ("binpack", "spread", "GPU-free"),
    ("spread", None, "GPU-free"),
    ("spread", "Binpack", "GPU-used"),
    ("spread", "roundrobin", "GPU-free"),  # not a GPU order: the scheduler's
])
def test_hami_gpu_scheduler_policy_orders_the_pods_own_gpus(scheduler_order, annotation, expected):
    """HAMi's hami.io/gpu-scheduler-policy: a pod's own GPU order inside the node, over --gpu-policy."""
    busy = pod("busy", ids="GPU-used,NVIDIA,4000,0:", node_name="n1")
    ledger, ext = make([volcano_node(gpu("GPU-used", 16384), gpu("GPU-free", 16384))], pods=[busy],
                       gpu_policy=scheduler_order)
    annotations = {keys.HAMI_GPU_SCHEDULER_POLICY: annotation} if annotation else None
    for name in ("first", "second"):  # the second pod, of the other order, is not served the first one's fit
        order = annotations if name == "first" else (
            {keys.HAMI_GPU_SCHEDULER_POLICY: "spread" if expected == "GPU-used" else "binpack"})
        out = ext.filter({"Pod": pod(name, container(number=1, memory=1000), annotations=order),
                          "NodeNames": ["n1"]})
        assert out["NodeNames"] == ["n1"]
    assert placed(ledger, "first")[1][0][0] == expected
    assert placed(ledger, "second")[1][0][0] != expected


@pytest.mark.parametrize("node_policy, annotation, expected", [
    ("binpack", None, ("node2", "device4")),
    ("binpack", "spread", ("node1", "device1")),
    ("spread", "binpack", ("node2", "device4")),
    ("fragaware", None, ("node1", "device1")),
    ("fragaware", "Spread", ("node2", "device3")),  # the GPU order stays fragaware's: an idle GPU of node2 wins
    ("spread", "leastused", ("node1", "device1")),  # not a node order: the scheduler's
])
def test_hami_node_scheduler_policy_scores_nodes_for_the_pod(node_policy, annotation, expected):
    """HAMi's hami.io/node-scheduler-policy: the pod's own node score (binpack or spread), over --node-policy; the
    same pod shape under another annotation is not served the first one's scores."""
    ledger, ext = make(v7_nodes(), V7_EXISTING, node_policy)
    annotations = {keys.HAMI_NODE_SCHEDULER_POLICY: annotation} if annotation else None
    out = ext.filter({"Pod": pod("p", container(number=1, memory=1000, cores=20), annotations=annotations),
                      "NodeNames": ["node1", "node2"]})
    assert out["NodeNames"] == [expected[0]]
    assert placed(ledger, "p") == (expected[0], [(expected[1], 1000, 20)])
