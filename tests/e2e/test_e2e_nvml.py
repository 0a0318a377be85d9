"""The device plugin's NVML backend end to end: a cluster in a box whose plugin reads its GPUs through the simulated
libnvidia-ml.so.1 (`--backend nvml`), pods running on them, an Xid and the recovery, and driver-enforced memory
limits per container cgroup (`--driver-memory-limits auto`) holding for a container that runs without libvgpu.so.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from capabilities import missing
from e2e_helpers import WORKLOAD, container, inventories, phase, pod, reports, wait_until

from vgpu import keys
from vgpu.inventory import decode_volcano

pytestmark = pytest.mark.slow


def cgroup2_mount() -> Path | None:
    """Where a cgroup v2 hierarchy is mounted, if any."""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


@pytest.fixture(scope="module")
def cgroup_root():
    """A cgroup directory of our own for the test bed's containers (None when cgroups cannot be created here)."""
    mount = cgroup2_mount()
    root = mount / f"vgpu-e2e-{uuid.uuid4().hex[:8]}" if mount else None
    try:
        if root is not None:
            root.mkdir()
    except OSError:
        root = None
    yield root
    if root is not None:
        for path in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if path.is_dir():
                try:
                    path.rmdir()
                except OSError:
                    pass
        try:
            root.rmdir()
        except OSError:
            pass


@pytest.fixture(scope="module")
def cluster(make_cluster, cgroup_root):
    plugin_args = ["--register-interval", "2", "--xid-recovery-seconds", "1", "--disable-control-namespaces", "bypass"]
    if cgroup_root is not None:
        plugin_args += ["--driver-memory-limits", "auto"]
    return make_cluster(nodes=1, gpus="2xT4", plugin_args=plugin_args,
                        cgroup_root=str(cgroup_root) if cgroup_root else None)


def _run(cluster, namespace: str, name: str, ctr: dict, timeout: float = 60) -> dict:
    cluster.create_pod(pod(name, [ctr], namespace=namespace))
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    return wait_until(f"{name} finished", lambda: (p := cluster.api_get(path)) and phase(p) in ("Succeeded", "Failed")
                      and p, timeout)


def test_pods_run_on_gpus_the_plugin_found_through_nvml(cluster, request):
    request.node._e2e_cluster = cluster
    gpus = inventories(cluster)[cluster.nodes[0].name]
    assert [g.type for g in gpus] == ["NVIDIA-Tesla T4"] * 2 and all(g.healthy for g in gpus)
    done = _run(cluster, "nv", "limited", container("main", [*WORKLOAD, "--mib", "1500", "--chunk", "250",
                                                             "--expect-oom"], memory=1000))
    assert phase(done) == "Succeeded"
    report = reports(cluster)[("nv", "limited", "main")]
    assert report["result"] == "oom-refused" and report["devices"][0]["allocated_mib"] == 1000
    assert report["nvml_uuids"] == [u for u in (g.uuid for g in gpus) if u in report["env"]["NVIDIA_VISIBLE_DEVICES"]]


def test_an_xid_makes_the_gpu_unhealthy_until_it_recovers(cluster, request):
    request.node._e2e_cluster = cluster
    node = cluster.nodes[0]
    target = inventories(cluster)[node.name][1].uuid

    def healthy() -> bool:
        value = {n["metadata"]["name"]: n for n in cluster.node_objects()}[node.name]["metadata"]["annotations"]
        return next(d.healthy for d in decode_volcano(value[keys.NODE_REGISTER]) if d.uuid == target)

    cluster.inject_gpu_fault(node, 1, "xid", 79)
    wait_until("the Xid GPU published unhealthy", lambda: not healthy(), 15)
    # NVML answers and no further Xid for --xid-recovery-seconds: healthy at the next probe
    wait_until("the GPU healthy again", healthy, 20)
    assert "xid 79" in node.plugin.tail(400)


def test_driver_limit_holds_for_a_container_without_the_library(cluster, cgroup_root, request):
    if cgroup_root is None:
        missing("cgroup-v2", "no cgroup v2 hierarchy in which this test may create cgroups")
    request.node._e2e_cluster = cluster
    # CUDA_DISABLE_CONTROL (allowed in namespace bypass): no ld.so.preload, so nothing in the process limits it;
    # the workload waits for the plugin to find its cgroup, then tries to take 3x its grant
    command = ["sh", "-c", "sleep 3; exec " + " ".join([*WORKLOAD, "--mib", "3000", "--chunk", "250",
                                                         "--kernels", "0", "--expect-oom"])]
    done = _run(cluster, "bypass", "raw", container("main", command, memory=1000,
                                                    env={"CUDA_DISABLE_CONTROL": "true"}))
    report = reports(cluster)[("bypass", "raw", "main")]
    assert "LD_PRELOAD" not in report["env"], report
    assert report["devices"][0]["allocated_mib"] == 1000 and report["devices"][0]["oom_at_mib"] == 1250, report
    assert phase(done) == "Succeeded"
    log = cluster.nodes[0].plugin.tail(400)
    assert "event=driver_limit_set" in log and "memory=driver+libvgpu" in log
