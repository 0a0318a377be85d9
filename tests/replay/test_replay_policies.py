"""Node policies of the replay and the extender: hand-computed scores, the fragmentation measure, learning."""

import math
from collections import Counter

import pytest

from vgpu.inventory import GPUDevice
from vgpu.replay.trace import ShareRequest
from vgpu.scheduler.fit import GPUUsage, fit
from vgpu.scheduler.policies import DEFAULT_NODE_POLICY, NODE_POLICIES, make_policy
from vgpu.scheduler.policies.base import NodeContext, PodContext
from vgpu.scheduler.policies.frag import _sigmoid_score
from vgpu.scheduler.policies.fragtable import TypeTable
from vgpu.scheduler.policies.shares import bestfit_gpu_order, idle_milli
from vgpu.scheduler.policies.workload import pod_type, typical_types

CARD = 16_384_000


def gpus(n, model="T4"):
    return tuple(GPUDevice(uuid=f"g{i}", split=1000, memory=CARD, type=f"NVIDIA-{model}", index=i) for i in range(n))


def share(milli, count=1):
    return ShareRequest(container="c", init=False, count=count, memory=0, memory_percent=0,
                        cores=milli // 10, permille=milli)


def used(*milli):
    return [GPUUsage(1 if m else 0, CARD * m // 1000, m // 10) for m in milli]


def test_all_policies_registered_and_the_default_is_fragaware():
    for name in ("random", "bestfit", "dotprod", "packing", "fgd", "fragaware", "binpack", "spread"):
        assert name in NODE_POLICIES
    assert DEFAULT_NODE_POLICY == "fragaware"


@pytest.mark.parametrize("name", sorted(NODE_POLICIES))
def test_policies_work_without_node_context_as_the_extender_calls_them(name):
    policy = make_policy(name)
    devices, usage, reqs = gpus(2), used(0, 600), (share(300),)
    policy.observe(reqs)
    result = fit(devices, usage, reqs, order=policy.gpu_order(None, None) or bestfit_gpu_order)
    assert result.ok
    assert isinstance(policy.score(devices, usage, reqs, result), float)


def test_sigmoid_score_matches_the_simulator_quantisation():
    assert [_sigmoid_score(-d) for d in (0, 1000, 2000, 3000, 4600)] == [50, 26, 11, 4, 0]
    assert _sigmoid_score(1000) == 73


def test_fragment_measure_hand_checked():
    # types: half 1-GPU 500-milli pods (CPU 4000), half CPU-only pods
    table = TypeTable([((4000, (share(500),), pod_type((share(500),), None)[2]), 0.5),
                       ((1000, (), pod_type((), None)[2]), 0.5)])
    devices, usage = gpus(2), used(0, 600)  # free 1000 and 400
    # 500-type: node can host it; the 400-free GPU is a fragment -> 400. CPU-only: all idle 1400 is fragment.
    assert table.fragment(devices, usage, cpu_free=8000) == pytest.approx(0.5 * 400 + 0.5 * 1400)
    # too little CPU for the 500-type: everything idle is fragment for it too
    assert table.fragment(devices, usage, cpu_free=3000) == pytest.approx(1400)
    # the GPU type allow-list: a G2-only type cannot use T4 cards
    from vgpu.requests import Selectors

    typed = TypeTable([((0, (share(500),), Selectors(use_types=("g2",))), 1.0)])
    assert typed.fragment(devices, usage, None) == pytest.approx(1400)
    assert typed.fragment(gpus(2, "G2"), usage, None) == pytest.approx(400)


def test_typical_types_keep_the_top_95_percent_and_renormalise():
    counts = Counter({"a": 50, "b": 30, "c": 16, "d": 4})
    kept = typical_types(Counter({(1, (), pod_type((), None)[2]): 50}), 0.95)
    assert kept[0][1] == 1.0
    # with plain keys the ordering helper needs real types, so build them
    types = {k: (i * 1000, (), pod_type((), None)[2]) for i, k in enumerate(counts)}
    kept = typical_types(Counter({types[k]: n for k, n in counts.items()}), 0.95)
    assert [round(p, 4) for _, p in kept] == [round(50 / 96, 4), round(30 / 96, 4), round(16 / 96, 4)]


def test_fgd_prefers_the_placement_that_fragments_least_and_picks_the_first_best_gpu():
    fgd = make_policy("fgd")
    fgd.set_workload([((share(500),), PodContext(cpu=0))] * 3 + [((share(1000),), PodContext(cpu=0))])
    devices = gpus(3)
    usage = used(500, 0, 500)  # GPUs 0 and 2 half full
    node = NodeContext(cpu_free=10_000, memory_free=10_000)
    order = fgd.gpu_order(node, PodContext(cpu=0))
    assert order(devices, usage, share(500), [0, 1, 2]) == [0, 2, 1]
    empty, half = used(0, 0), used(500, 0)
    r_empty = fit(gpus(2), empty, (share(500),), order=order)
    r_half = fit(gpus(2), half, (share(500),), order=order)
    assert fgd.score(gpus(2), half, (share(500),), r_half, node=node) > fgd.score(gpus(2), empty, (share(500),),
                                                                                r_empty, node=node)


def test_fragaware_learns_the_workload_from_observed_pods():
    ours = make_policy("fragaware")
    assert len(ours.table) == 0
    for _ in range(4):
        ours.observe((share(250),), PodContext(cpu=2000))
    assert len(ours.table) == 0  # observe only counts
    assert ours.relearn() and len(ours.table) == 1 and ours.epoch == 1
    version = ours.epoch
    ours.observe((share(250),), PodContext(cpu=2000))  # 5 pods: no rebuild until 8
    assert not ours.relearn() and ours.epoch == version
    ours.set_workload([((share(900),), PodContext(cpu=100))] * 50)  # no oracle: being told the workload is ignored
    assert ours.epoch == version and [t for t, _ in ours.table.types] == [pod_type((share(250),), PodContext(cpu=2000))]


def test_fragaware_keeps_its_table_while_the_workload_does_not_drift():
    ours = make_policy("fragaware")
    ours.observe((share(250),), PodContext(cpu=2000))
    ours.relearn()
    first = ours.epoch
    for _ in range(600):  # the same single type: every rebuild point finds no drift
        ours.observe((share(250),), PodContext(cpu=2000))
        ours.relearn()
    assert ours.epoch == first
    for _ in range(300):  # a second type appears: the next rebuild point (1024 pods) takes it
        ours.observe((share(500),), PodContext(cpu=2000))
        ours.relearn()
    assert ours.epoch == first + 1 and len(ours.table) == 2


def test_cpu_capacity_limits_the_usable_share_hand_checked():
    whole = ShareRequest(container="c", init=False, count=1, memory=0, memory_percent=0, cores=100, permille=1000)
    t = pod_type((whole,), PodContext(cpu=8000))
    plain, capacity = TypeTable([(t, 1.0)]), TypeTable([(t, 1.0)], cpu_capacity=True)
    devices, idle = gpus(2), used(0, 0)
    # 10 CPU feed one 8-CPU pod: one of the two idle GPUs is usable, the other is fragment
    assert plain.fragment(devices, idle, 10_000) == 0.0
    assert capacity.fragment(devices, idle, 10_000) == 1000.0
    assert capacity.fragment(devices, idle, 16_000) == 0.0  # two pods: both GPUs usable
    assert capacity.fragment(devices, idle, 7_999) == 2000.0  # not even one pod
    assert capacity.fragment(devices, idle, None) == 0.0  # no node context: CPU unlimited


def test_fragaware_breaks_fgd_ties_by_how_well_cpu_feeds_the_gpus():
    ours = make_policy("fragaware")
    for _ in range(4):  # target: whole-GPU pods with 8 CPUs each
        ours.observe((share(1000),), PodContext(cpu=8000))
    ours.relearn()
    devices, idle, nothing = gpus(2), used(0, 0), fit(gpus(2), used(0, 0), ())
    cpu_only = PodContext(cpu=4000)
    memory = 1 << 20
    # 24 -> 20 CPUs still feed both GPUs; 17 -> 13 CPUs feed one of two: FGD's measure sees neither (8 <= 13)
    roomy = ours.score(devices, idle, (), nothing, node=NodeContext(cpu_free=24_000, memory_free=memory), pod=cpu_only)
    tight = ours.score(devices, idle, (), nothing, node=NodeContext(cpu_free=17_000, memory_free=memory), pod=cpu_only)
    assert int(roomy) == int(tight) == 50  # FGD's integer score: a tie
    assert roomy == pytest.approx(50 + 0.999 * 0.5)  # fed measure unchanged: sigmoid(0)
    assert tight == pytest.approx(50 + 0.999 / (1 + math.exp(1)))  # one GPU (1000 milli) no longer fed
    assert ours.score(devices, idle, (), nothing) == 50  # no node context (the extender): no tie-break


def test_fragaware_reads_free_cpu_as_far_as_free_memory_feeds_it():
    """A node with CPU to spare but its memory nearly spent hosts no more pods: ours bounds free CPU by free memory
    at the CPU-to-memory ratio of the pods it has seen (fixed when the target is rebuilt); FGD reads CPU alone."""
    ours, fgd = make_policy("fragaware"), make_policy("fgd")
    for policy in (ours, fgd):
        for _ in range(4):  # target: whole-GPU pods with 8 CPUs and 32 GiB each (250 milli-CPU per GiB)
            policy.observe((share(1000),), PodContext(cpu=8000, memory=32_768))
        policy.relearn()
    devices, idle, nothing = gpus(2), used(0, 0), fit(gpus(2), used(0, 0), ())
    hungry = PodContext(cpu=4000, memory=16_384)
    # 24 -> 20 CPUs feed both GPUs' pods, but 40 -> 24 GiB of memory feeds 10 -> 6 CPUs: no 8-CPU pod fits after
    node = NodeContext(cpu_free=24_000, memory_free=40_960)
    assert fgd.score(devices, idle, (), nothing, node=node, pod=hungry) == 50  # nothing changes for FGD
    assert int(ours.score(devices, idle, (), nothing, node=node, pod=hungry)) == _sigmoid_score(-2000) == 11
    # 64 -> 48 GiB: 16 -> 12 CPUs, from two fed GPUs to one: an FGD tie, broken against the node
    node = NodeContext(cpu_free=24_000, memory_free=65_536)
    tie = 0.999 / (1 + math.exp(1))
    assert ours.score(devices, idle, (), nothing, node=node, pod=hungry) == pytest.approx(50 + tie)
    # pods of the same types asking less memory change the ratio when the target is next due, not before
    for _ in range(4):
        ours.observe((share(1000),), PodContext(cpu=8000, memory=8192))
    epoch = ours.epoch
    assert int(ours.score(devices, idle, (), nothing, node=NodeContext(cpu_free=24_000, memory_free=40_960),
                          pod=hungry)) == 11
    assert ours.due and ours.relearn() and ours.epoch == epoch + 1
    # now 400 milli-CPU per GiB: 40 -> 24 GiB feeds 16 -> 9.6 CPUs, and one 8-CPU pod still fits
    assert int(ours.score(devices, idle, (), nothing, node=NodeContext(cpu_free=24_000, memory_free=40_960),
                          pod=hungry)) == 50


def test_bestfit_dotprod_packing_scores_hand_checked():
    devices, usage, reqs = gpus(2), used(0, 600), (share(300),)
    result = fit(devices, usage, reqs, order=bestfit_gpu_order)
    assert result.placement == ((1,),)  # least free share that fits
    node, pod = NodeContext(cpu_free=64_000, memory_free=1), PodContext(cpu=32_000)
    # s = 0.5*32000/128000 + 0.5*(1400-300)/8000 = 0.125 + 0.06875 -> int(80.625) = 80
    assert make_policy("bestfit").score(devices, usage, reqs, result, node=node, pod=pod) == 80.0
    # dot = 0.5*0.25 + 0.175*0.0375 = 0.1315625 -> int(100*(1-0.0657...)) = 93
    assert make_policy("dotprod").score(devices, usage, reqs, result, node=node, pod=pod) == 93.0
    # packing: uses a shared GPU with 400 free -> 100 - (40 // 10) = 96
    assert make_policy("packing").score(devices, usage, reqs, result) == 96.0
    empty = used(0, 0)
    r2 = fit(devices, empty, reqs, order=bestfit_gpu_order)
    assert make_policy("packing").score(devices, empty, reqs, r2) == 31.0  # max(33 - 2, 2)
    assert make_policy("packing").score(devices, usage, (share(1000),), fit(devices, usage, (share(1000),))) == 49.0


def test_random_policy_draws_ties_uniformly_and_reseeds():
    policy = make_policy("random")
    assert policy.tie_break == "random"
    policy.seed(1)
    a = [policy.gpu_order(None, None)(gpus(8), used(*[0] * 8), share(100), list(range(8))) for _ in range(3)]
    policy.seed(1)
    b = [policy.gpu_order(None, None)(gpus(8), used(*[0] * 8), share(100), list(range(8))) for _ in range(3)]
    assert a == b and len({tuple(x) for x in a}) > 1


def test_idle_share_is_the_smaller_of_memory_and_cores():
    d = gpus(1)[0]
    assert idle_milli(d, GPUUsage(1, CARD // 2, 20)) == 500
    assert idle_milli(d, GPUUsage(1, CARD // 10, 70)) == 300
    assert idle_milli(d, GPUUsage(1000, 0, 0)) == 0  # no free slot


def _learned_fragaware():
    ours = make_policy("fragaware")
    for milli, cpu in ((250, 2000), (500, 4000), (1000, 8000), (250, 2000)):
        ours.observe((share(milli),), PodContext(cpu=cpu))
    ours.relearn()
    return ours


def test_fragaware_score_is_the_same_whatever_the_gpu_order_computed_before_it():
    """`score` reuses the rank its own fit's GPU order computed; scoring another move on the same node state (score
    mode's /prioritize and the replay score fits made earlier) must give what a policy with no such memory gives,
    even when that move ends in a GPU state the order ranked from another starting state."""
    node, pod = NodeContext(cpu_free=32_000, memory_free=1 << 30), PodContext(cpu=2000)
    small, large = share(250), share(500)
    devices = gpus(2)
    for second in (250, 500, 0):
        state = used(0, second)
        # both containers on the empty GPU 0: it ends as GPU 1 ends when `large` alone joins its 250
        both = fit(devices, state, (small, large), order=lambda d, u, r, c: sorted(c))
        assert both.ok and both.placement == ((0,), (0,))
        ours, fresh = _learned_fragaware(), _learned_fragaware()
        assert fit(devices, state, (large,), order=ours.gpu_order(node, pod)).ok  # ranks GPU 0 and GPU 1
        assert ours.score(devices, state, (small, large), both, node=node, pod=pod) == fresh.score(
            devices, state, (small, large), both, node=node, pod=pod)


def test_cpu_capacity_strands_gpus_for_a_cpu_only_type_only_when_its_cpu_does_not_fit():
    t = pod_type((), PodContext(cpu=32000))
    plain, capacity = TypeTable([(t, 1.0)]), TypeTable([(t, 1.0)], cpu_capacity=True)
    devices, usage = gpus(2), used(0, 400)  # 1000 + 600 milli idle
    assert plain.fragment(devices, usage, 40_000) == 1600.0  # FGD: a CPU-only type uses no GPU, ever
    assert capacity.fragment(devices, usage, 40_000) == 0.0  # the node can still take one of its pods
    assert capacity.fragment(devices, usage, 31_999) == 1600.0  # it cannot: its idle GPUs are stranded for it


def test_scarcity_weights_favour_types_pinned_to_few_gpus():
    from vgpu.requests import Selectors
    from vgpu.scheduler.policies.workload import scarcity_weights

    anywhere = (1000, (share(500),), Selectors())
    pinned = (1000, (share(500),), Selectors(use_types=("t4",)))
    cpu_only = (1000, (), Selectors())
    types = [(anywhere, 0.5), (pinned, 0.25), (cpu_only, 0.25)]
    # T4 is a quarter of the GPUs: the pinned type weighs 4 times its share, then all are renormalised
    assert scarcity_weights(types, {"NVIDIA-T4": 2, "NVIDIA-G2": 6}) == pytest.approx([0.5 / 1.75, 1 / 1.75,
                                                                                        0.25 / 1.75])
    assert scarcity_weights(types, {}) == [0.5, 0.25, 0.25]  # no cluster known: the probabilities
