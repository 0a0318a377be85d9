"""End to end: a mix of pods through the real extender, device plugins and isolation library.

One cluster in a box for the module: node-0 and node-2 with 4 x A100-40GB, node-1 with 2 x T4 + 2 x A100-80GB.
Every assertion reads what a user or the contract can see: the assignment annotations the extender wrote, the
nodes' inventory, and what each container's process saw from inside (the sample workload's report: its env, the
memory the driver reported, where CUDA_ERROR_OUT_OF_MEMORY stopped it).
"""

from __future__ import annotations

import pytest
from e2e_helpers import (
    TERMINAL,
    WORKLOAD,
    assert_usage_converges,
    check_allocations,
    container,
    inventories,
    phase,
    pod,
    reports,
    wait_until,
)

from vgpu import keys
from vgpu.assignment import decode

pytestmark = pytest.mark.slow

GPUS = ["4xA100-40GB", "2xT4,2xA100-80GB", "4xA100-40GB"]


@pytest.fixture(scope="module")
def cluster(make_cluster):
    # the administrator lets namespace "nocontrol" run without the isolation library
    return make_cluster(nodes=3, gpus=GPUS, plugin_args=["--disable-control-namespaces=nocontrol"])


def _units(cluster, mib: int) -> int:
    return -(-mib // cluster.memory_factor)


def _get(cluster, ns: str, name: str) -> dict:
    return cluster.api_get(f"/api/v1/namespaces/{ns}/pods/{name}") or {}


def _done(cluster, ns: str, names: list[str], timeout: float = 300) -> dict[str, dict]:
    def finished():
        pods = {n: _get(cluster, ns, n) for n in names}
        return pods if all(phase(p) in TERMINAL for p in pods.values()) else None

    return wait_until(f"pods {names} finished", finished, timeout)


def _segments(p: dict):
    return decode(p["metadata"]["annotations"][keys.VGPU_IDS])


def test_mix_lands_where_the_contract_says(cluster, request):
    request.node._e2e_cluster = cluster
    inv = inventories(cluster)
    by_uuid = {d.uuid: (node, d) for node, devs in inv.items() for d in devs}
    target = inv["node-2"][1].uuid
    ns = "mix"
    pods = [
        pod("multi", [container("a", WORKLOAD + ["--mib", "6000", "--kernels", "10"], number=2,
                                memory=_units(cluster, 8000), cores=30),
                      container("b", WORKLOAD + ["--mib", "1000", "--kernels", "5"], number=1,
                                memory=_units(cluster, 2000), cores=10)], namespace=ns),
        pod("t4-only", [container("main", WORKLOAD + ["--mib", "1000"], memory=_units(cluster, 4000), cores=10)],
            namespace=ns, annotations={keys.USE_GPU_TYPE: "t4"}),
        pod("no-a100", [container("main", WORKLOAD + ["--mib", "1000"], memory=_units(cluster, 4000), cores=10)],
            namespace=ns, annotations={keys.NOUSE_GPU_TYPE: "A100"}),
        pod("by-uuid", [container("main", WORKLOAD + ["--mib", "1000"], memory=_units(cluster, 2000), cores=5)],
            namespace=ns, annotations={keys.USE_GPU_UUID: target}),
        pod("exclusive", [container("main", WORKLOAD + ["--mib", "20000", "--hold", "2"], cores=100)],
            namespace=ns),
        pod("percent", [container("main", WORKLOAD + ["--mib", "1000"], percent=25, cores=5)], namespace=ns),
    ]
    for p in pods:
        cluster.create_pod(p)
    done = _done(cluster, ns, [p["metadata"]["name"] for p in pods])
    failed = {n: (p["status"].get("reason"), p["status"].get("message")) for n, p in done.items()
              if phase(p) != "Succeeded"}
    assert not failed, failed
    seen = reports(cluster)

    # several containers, several GPUs each: one segment per container, distinct GPUs, all on the pod's node
    multi = done["multi"]
    seg_a, seg_b = _segments(multi)
    assert len(seg_a) == 2 and len({g.uuid for g in seg_a}) == 2 and len(seg_b) == 1
    for grant in seg_a + seg_b:
        assert by_uuid[grant.uuid][0] == multi["spec"]["nodeName"]
    assert [(g.memory, g.cores) for g in seg_a] == [(_units(cluster, 8000), 30)] * 2
    rep_a = seen[(ns, "multi", "a")]
    assert rep_a["env"]["NVIDIA_VISIBLE_DEVICES"] == ",".join(g.uuid for g in seg_a)
    assert rep_a["nvml_uuids"] == [g.uuid for g in seg_a]  # NVML inside names the GPUs the plugin advertised
    assert rep_a["limits"] == {"CUDA_DEVICE_MEMORY_LIMIT_0": f"{_units(cluster, 8000) * cluster.memory_factor}m",
                               "CUDA_DEVICE_MEMORY_LIMIT_1": f"{_units(cluster, 8000) * cluster.memory_factor}m"}
    assert rep_a["env"]["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert [d["total_mib"] for d in rep_a["devices"]] == [8000, 8000]  # the driver reports the limit as total
    assert all(d["allocated_mib"] == 6000 and d["kernels"] == 10 for d in rep_a["devices"])
    assert rep_a["env"]["LD_PRELOAD"].endswith("libvgpu.so")
    cache = rep_a["env"]["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    assert f"/vgpu/containers/{multi['metadata']['uid']}_a/" in cache and cache.endswith(".cache")
    rep_b = seen[(ns, "multi", "b")]
    assert rep_b["env"]["NVIDIA_VISIBLE_DEVICES"] == seg_b[0].uuid
    assert rep_b["env"]["CUDA_DEVICE_SM_LIMIT"] == "10"

    # type selectors
    for name in ("t4-only", "no-a100"):
        (grant,), = _segments(done[name])
        assert "T4" in by_uuid[grant.uuid][1].type, (name, by_uuid[grant.uuid][1].type)
        assert done[name]["spec"]["nodeName"] == "node-1"

    # UUID selector
    (grant,), = _segments(done["by-uuid"])
    assert grant.uuid == target and done["by-uuid"]["spec"]["nodeName"] == "node-2"
    assert seen[(ns, "by-uuid", "main")]["env"]["NVIDIA_VISIBLE_DEVICES"] == target

    # exclusive: the whole card, 100 cores, and nobody else on it
    (grant,), = _segments(done["exclusive"])
    card = by_uuid[grant.uuid][1]
    assert (grant.memory, grant.cores) == (card.memory, 100)
    # no GPU over its memory, cores or shares, every grant on its pod's node, exclusive GPUs unshared
    assert check_allocations(cluster.node_objects(), cluster.pods()) == ([], [])

    # percentage of the card
    (grant,), = _segments(done["percent"])
    assert grant.memory == by_uuid[grant.uuid][1].memory * 25 // 100

    assert_usage_converges(cluster, 120)


def test_over_limit_is_refused_while_its_neighbour_on_the_same_gpu_is_fine(cluster, request):
    request.node._e2e_cluster = cluster
    ns = "oom"
    gpu = inventories(cluster)["node-0"][3].uuid
    pin = {keys.USE_GPU_UUID: gpu}
    limit = _units(cluster, 2000)
    release = cluster.workdir / "oom-release"  # greedy keeps its memory until the test creates this file
    cluster.create_pod(pod("greedy", [container("main", WORKLOAD + ["--mib", "3000", "--chunk", "250",
                                                                     "--expect-oom", "--hold", "600",
                                                                     "--release-file", str(release)],
                                                memory=limit, cores=10)], namespace=ns, annotations=pin))
    wait_until("greedy running", lambda: phase(_get(cluster, ns, "greedy")) != "Pending", 300)
    cluster.create_pod(pod("calm", [container("main", WORKLOAD + ["--mib", "1900", "--chunk", "100"],
                                              memory=limit, cores=10)], namespace=ns, annotations=pin))
    calm_done = _done(cluster, ns, ["calm"])["calm"]
    # the neighbour ran from start to end while greedy held its memory on the same GPU
    greedy_now = _get(cluster, ns, "greedy")
    assert phase(greedy_now) == "Running", greedy_now.get("status")
    release.touch()
    done = _done(cluster, ns, ["greedy"])
    done["calm"] = calm_done
    assert phase(done["greedy"]) == "Succeeded" and phase(done["calm"]) == "Succeeded", done
    seen = reports(cluster)
    greedy, calm = seen[(ns, "greedy", "main")], seen[(ns, "calm", "main")]
    assert greedy["result"] == "oom-refused"
    (dev,) = greedy["devices"]
    assert dev["allocated_mib"] <= 2000 < dev["oom_at_mib"] and dev["total_mib"] == 2000
    assert calm["result"] == "ok" and calm["devices"][0]["allocated_mib"] == 1900
    assert greedy["env"]["NVIDIA_VISIBLE_DEVICES"] == calm["env"]["NVIDIA_VISIBLE_DEVICES"] == gpu
    assert greedy["env"]["CUDA_DEVICE_MEMORY_SHARED_CACHE"] != calm["env"]["CUDA_DEVICE_MEMORY_SHARED_CACHE"]


def test_disabling_control_drops_the_preload(cluster, request):
    request.node._e2e_cluster = cluster
    ns = "nocontrol"
    cluster.create_pod(pod("free", [container("main", WORKLOAD + ["--mib", "3000", "--expect-oom"],
                                              memory=_units(cluster, 2000), cores=10,
                                              env={"CUDA_DISABLE_CONTROL": "true"})], namespace=ns))
    done = _done(cluster, ns, ["free"])
    report = reports(cluster)[(ns, "free", "main")]
    assert "LD_PRELOAD" not in report["env"]  # the plugin left /etc/ld.so.preload out, as the contract says
    assert report["result"] == "limit-not-enforced" and phase(done["free"]) == "Failed"


def test_pods_arriving_together_on_one_gpu_are_all_admitted(cluster, request):
    """Two identical pods bound to the same GPU before kubelet admits either: both must run."""
    request.node._e2e_cluster = cluster
    ns = "together"
    gpu = inventories(cluster)["node-2"][2].uuid
    for name in ("twin-a", "twin-b", "twin-c"):
        cluster.create_pod(pod(name, [container("main", WORKLOAD + ["--mib", "500"], memory=_units(cluster, 1000),
                                                cores=10)], namespace=ns, annotations={keys.USE_GPU_UUID: gpu}))
    done = _done(cluster, ns, ["twin-a", "twin-b", "twin-c"])
    failed = {n: p["status"].get("message") for n, p in done.items() if phase(p) != "Succeeded"}
    assert not failed, failed


def test_a_t4_and_an_a100_in_one_container_each_get_their_own_limit(cluster, request):
    """node-1's T4s sit on lower PCI buses than its A100s, so NVML lists a T4 first while CUDA, fastest first,
    numbers the A100 first: the container sees both GPUs as the node has them, not in grant order, and each gets
    the limit granted for it (50 % of each card)."""
    request.node._e2e_cluster = cluster
    t4, a100 = (next(d for d in inventories(cluster)["node-1"] if kind in d.type) for kind in ("T4", "A100"))
    ns = "mix-order"
    cluster.create_pod(pod("pair", [container("main", WORKLOAD + ["--mib", "1000", "--kernels", "2"], number=2,
                                              percent=50, cores=10)],
                           namespace=ns, annotations={keys.USE_GPU_UUID: f"{t4.uuid},{a100.uuid}"}))
    done = _done(cluster, ns, ["pair"])["pair"]
    assert phase(done) == "Succeeded", done.get("status")
    report = reports(cluster)[(ns, "pair", "main")]
    assert report["nvml_uuids"] == [t4.uuid, a100.uuid]  # NVML: bus order
    assert [d["uuid"] for d in report["devices"]] == [a100.uuid, t4.uuid]  # CUDA: the A100 (more SMs) first
    assert [d["total_mib"] for d in report["devices"]] == [81920 // 2, 15360 // 2]
