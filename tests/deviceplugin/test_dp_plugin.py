"""The device plugin process against the kubelet stand-in and the API-server stand-in, over real unix sockets."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from capabilities import tool
from dp_helpers import NODE, RESOURCES, gpu_container, write_accounting_file
from prometheus_client.parser import text_string_to_metric_families

from vgpu.deviceplugin.monitor import NODE_METRICS
from vgpu.kube.client import read_json
from vgpu.proto.deviceplugin.v1beta1 import api_pb2 as pb
from vgpu.testbed.kubelet import AdmissionError

MAX_U64 = "18446744073709551615"


def test_registration_counts_and_inventory(cluster):
    cluster.start_plugin("2xA100-40GB", "--gpu-memory-factor", "auto")
    devices = {name: cluster.kubelet.devices(name) for name in RESOURCES}
    uuids = cluster.wait_inventory()
    assert len(uuids) == 2
    # split 10, 40960 MiB / factor 2, 100 cores per GPU
    assert len(devices["volcano.sh/vgpu-number"]) == 20
    assert len(devices["volcano.sh/vgpu-memory"]) == 2 * 40960 // 2
    assert len(devices["volcano.sh/vgpu-cores"]) == 200
    assert set(devices["volcano.sh/vgpu-number"]) == {f"{u}-{i}" for u in uuids for i in range(10)}
    assert f"{uuids[1]}-memory-20479" in devices["volcano.sh/vgpu-memory"]
    assert f"{uuids[0]}-core-99" in devices["volcano.sh/vgpu-cores"]
    assert all(h == "Healthy" for d in devices.values() for h in d.values())
    state = cluster.kubelet.resources["volcano.sh/vgpu-number"]
    assert state.options.get_preferred_allocation_available
    assert state.endpoint == "nvidia-vgpu-number.sock"
    value = cluster.node_annotations()["volcano.sh/node-vgpu-register"]
    assert value == "".join(f"{u},10,20480,NVIDIA-NVIDIA A100-PCIE-40GB,true,hami-core:" for u in uuids)


def test_health_change_reaches_kubelet_and_annotation(cluster):
    cluster.start_plugin("2xT4")
    uuids = cluster.wait_inventory()
    with cluster.control.open("a") as control:
        control.write("xid 1 79\n")

    def unhealthy() -> bool:
        number = cluster.kubelet.resources["volcano.sh/vgpu-number"].devices
        return all(number[f"{uuids[1]}-{i}"] == "Unhealthy" for i in range(10))

    assert cluster.kubelet.wait_for(unhealthy, 1.0), "health change did not reach kubelet within 1 s"
    assert all(h == "Healthy" for d, h in cluster.kubelet.devices("volcano.sh/vgpu-number").items()
               if d.startswith(uuids[0]))
    deadline = time.monotonic() + 5
    while "Tesla T4,false" not in cluster.node_annotations()["volcano.sh/node-vgpu-register"]:
        assert time.monotonic() < deadline, "annotation not updated on health change"
        time.sleep(0.05)
    with cluster.control.open("a") as control:
        control.write("xid 0 43\n")  # ignored Xid: nothing changes
        control.write("recover 1\n")
    assert cluster.kubelet.wait_for(lambda: not unhealthy() and all(
        h == "Healthy" for h in cluster.kubelet.resources["volcano.sh/vgpu-number"].devices.values()), 2.0)


def test_kubelet_restart_reregisters(cluster):
    cluster.start_plugin("1xT4")
    cluster.kubelet.restart()  # deletes every socket, plugin's included, and serves a new kubelet.sock
    assert cluster.kubelet.wait_registered(RESOURCES, 10), cluster.log()
    for name in RESOURCES:
        socket = cluster.plugin_dir / f"nvidia-{name.split('/')[1]}.sock"
        assert socket.is_socket()
    assert len(cluster.kubelet.devices("volcano.sh/vgpu-number")) == 10
    # a second restart works the same (no piled-up loops, no stale registrations)
    cluster.kubelet.restart()
    assert cluster.kubelet.wait_registered(RESOURCES, 10), cluster.log()
    assert cluster.proc.poll() is None


def test_contract_example_allocate_response(cluster):
    """The contract's example pod: [sidecar, worker{2 GPUs, 10000 MiB, 30 cores}], factor 1."""
    cluster.start_plugin("2xT4", "--gpu-memory-factor", "1")
    a, b = cluster.wait_inventory()
    assignment = f"{a},NVIDIA,10000,30:{b},NVIDIA,10000,30:"
    pod = cluster.create_pod(
        "example",
        [{"name": "sidecar", "image": "busybox"}, gpu_container("worker", 2, 10000, 30)],
        assignment,
    )
    uid = pod["metadata"]["uid"]
    admitted = cluster.kubelet.admit(pod)
    assert [c.name for c in admitted] == ["sidecar", "worker"]
    assert admitted[0].responses == {}
    worker = admitted[1]
    assert sorted({d.rsplit("-", 1)[0] for d in worker.devices["volcano.sh/vgpu-number"]}) == sorted([a, b])
    response = worker.responses["volcano.sh/vgpu-number"]
    cache = response.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    assert re.fullmatch(r"/tmp/vgpu/[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\.cache", cache)
    hook = cluster.hook
    expected = pb.ContainerAllocateResponse(
        envs={
            "NVIDIA_VISIBLE_DEVICES": f"{a},{b}",
            "CUDA_DEVICE_MEMORY_LIMIT_0": "10000m",
            "CUDA_DEVICE_MEMORY_LIMIT_1": "10000m",
            "CUDA_DEVICE_SM_LIMIT_0": "30",
            "CUDA_DEVICE_SM_LIMIT_1": "30",
            "CUDA_DEVICE_SM_LIMIT": "30",
            "VGPU_DEVICE_UUIDS": f"{a},{b}",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": cache,
        },
        mounts=[
            pb.Mount(container_path="/usr/local/vgpu/libvgpu.so", host_path=f"{hook}/vgpu/libvgpu.so", read_only=True),
            pb.Mount(container_path="/tmp/vgpu", host_path=f"{hook}/vgpu/containers/{uid}_worker", read_only=False),
            pb.Mount(container_path="/tmp/vgpulock", host_path=f"{cluster.lock}/{uid}_worker", read_only=False),
            pb.Mount(container_path="/usr/local/vgpu/limits.env", host_path=f"{hook}/vgpu/limits/{uid}_worker.env",
                     read_only=True),
            pb.Mount(container_path="/usr/local/vgpu/pace", host_path=f"{hook}/vgpu/pace/{uid}_worker", read_only=True),
            pb.Mount(container_path="/etc/ld.so.preload", host_path=f"{hook}/vgpu/ld.so.preload", read_only=True),
        ],
    )
    assert response == expected
    # the limits file holds the same variables, read-only: libvgpu.so reads them there, not from the environment
    limits = Path(f"{hook}/vgpu/limits/{uid}_worker.env")
    assert dict(line.split("=", 1) for line in limits.read_text().splitlines()) == dict(expected.envs)
    assert limits.stat().st_mode & 0o777 == 0o444
    # the pace directory is there before the container starts (the pacer fills it), the plugin's, not the pod's
    assert Path(f"{hook}/vgpu/pace/{uid}_worker").stat().st_mode & 0o777 == 0o755
    assert dict(response.envs) == dict(expected.envs)
    assert [m.SerializeToString() for m in response.mounts] == [m.SerializeToString() for m in expected.mounts]
    assert not response.devices and not response.annotations and not response.cdi_devices
    # counting resources answer empty responses
    assert worker.responses["volcano.sh/vgpu-memory"] == pb.ContainerAllocateResponse()
    # host side: the worker's directory (not the sidecar's), the preload file
    assert (hook / "vgpu" / "containers" / f"{uid}_worker").is_dir()
    assert not (hook / "vgpu" / "containers" / f"{uid}_sidecar").exists()
    assert (hook / "vgpu" / "ld.so.preload").read_text() == "/usr/local/vgpu/libvgpu.so\n"
    annotations = cluster.pod("example")["metadata"]["annotations"]
    assert annotations["volcano.sh/bind-phase"] == "success"
    assert annotations["volcano.sh/devices-to-allocate"] == ""
    assert annotations["volcano.sh/vgpu-time"] == MAX_U64
    assert annotations["volcano.sh/vgpu-ids-new"] == assignment


def test_disable_control_and_core_policy(cluster, tmp_path):
    config = tmp_path / "dp.yaml"
    config.write_text("core_policy: force\ndisable_control_namespaces: [default]\nsharing:\n  split_count: 4\n")
    cluster.start_plugin("1xT4", "--config", str(config))
    (a,) = cluster.wait_inventory()
    pod = cluster.create_pod(
        "opt-out", [gpu_container("main", 1, 2000, env=[{"name": "CUDA_DISABLE_CONTROL", "value": "true"}])],
        f"{a},NVIDIA,2000,0:",
    )
    (main,) = cluster.kubelet.admit(pod)
    response = main.responses["volcano.sh/vgpu-number"]
    assert response.envs["GPU_CORE_UTILIZATION_POLICY"] == "force"
    assert response.envs["CUDA_DEVICE_SM_LIMIT"] == "0"
    assert "/etc/ld.so.preload" not in [m.container_path for m in response.mounts]
    assert len(cluster.kubelet.devices("volcano.sh/vgpu-number")) == 4


def test_two_pods_bound_at_once_get_their_own_gpus(cluster):
    cluster.start_plugin("2xT4")
    a, b = cluster.wait_inventory()
    first = cluster.create_pod("first", [gpu_container("c", 1, 3000, 20)], f"{b},NVIDIA,3000,20:")
    second = cluster.create_pod("second", [gpu_container("c", 1, 4000, 50)], f"{a},NVIDIA,4000,50:")
    got = {}
    for pod in (first, second):
        (container,) = cluster.kubelet.admit(pod)
        got[pod["metadata"]["name"]] = (pod["metadata"]["uid"], container.responses["volcano.sh/vgpu-number"])
    for name, gpu, memory, cores in (("first", b, "3000m", "20"), ("second", a, "4000m", "50")):
        uid, response = got[name]
        assert response.envs["NVIDIA_VISIBLE_DEVICES"] == gpu
        assert response.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == memory
        assert response.envs["CUDA_DEVICE_SM_LIMIT"] == cores
        mounts = {m.container_path: m.host_path for m in response.mounts}
        assert mounts["/tmp/vgpu"] == str(cluster.hook / "vgpu" / "containers" / f"{uid}_c")
        assert cluster.pod(name)["metadata"]["annotations"]["volcano.sh/bind-phase"] == "success"
    assert got["first"][1].envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] != got["second"][1].envs[
        "CUDA_DEVICE_MEMORY_SHARED_CACHE"]


def test_plugin_restart_mid_admission(cluster):
    cluster.start_plugin("2xT4")
    a, b = cluster.wait_inventory()
    seen: list[str] = []

    def before(pod, container):
        seen.append(container)
        if container == "second":
            cluster.restart_plugin()

    cluster.kubelet.before_container = before
    pod = cluster.create_pod(
        "multi",
        [gpu_container("first", 1, 1000, 10), {"name": "plain", "image": "busybox"},
         gpu_container("second", 1, 2000, 20)],
        f"{a},NVIDIA,1000,10:;{b},NVIDIA,2000,20:",
    )
    uid = pod["metadata"]["uid"]
    admitted = {c.name: c for c in cluster.kubelet.admit(pod)}
    assert seen == ["first", "second"]
    first = admitted["first"].responses["volcano.sh/vgpu-number"]
    second = admitted["second"].responses["volcano.sh/vgpu-number"]
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == a and first.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == b and second.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
    assert {m.container_path: m.host_path for m in second.mounts}["/tmp/vgpu"].endswith(f"{uid}_second")
    annotations = cluster.pod("multi")["metadata"]["annotations"]
    assert annotations["volcano.sh/bind-phase"] == "success"
    assert annotations["volcano.sh/devices-to-allocate"] == ""


def test_a_pod_re_created_under_its_name_has_one_series_per_label_set(cluster):
    """A pod deleted and created again under the same name (a StatefulSet's) while the old one's record is still on
    the node: each container series is exported once, with the new pod's values (before: both records were
    exported under the same labels, and the families grew with every re-creation)."""
    cluster.start_plugin("1xT4")
    (a,) = cluster.wait_inventory()
    for memory in (1000, 2000):
        pod = cluster.create_pod("again", [gpu_container("app", 1, memory, 25)], f"{a},NVIDIA,{memory},25:")
        cluster.kubelet.admit(pod)
        if memory == 1000:
            cluster.core.delete_namespaced_pod("again", "default", grace_period_seconds=0)
            time.sleep(0.05)  # the second record is written later (record files are ordered by when written)
    text = httpx.get(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=5).text
    limits = [sample for family in text_string_to_metric_families(text) for sample in family.samples
              if sample.name == "vgpu_container_memory_limit_bytes" and sample.labels.get("pod") == "again"]
    assert [s.value for s in limits] == [2000 * 2**20], limits
    seen = [(sample.name, tuple(sorted(sample.labels.items()))) for family in text_string_to_metric_families(text)
            for sample in family.samples]
    assert len(seen) == len(set(seen))


def test_missing_match_fails_clearly(cluster):
    cluster.start_plugin("2xT4")
    a, _ = cluster.wait_inventory()
    # the scheduler chose GPU a, but the only free vgpu-number IDs kubelet has are on GPU b
    pod = cluster.create_pod("lonely", [gpu_container("c", 1, 1000)], f"{a},NVIDIA,1000,0:")
    for i in range(10):
        cluster.kubelet.in_use.setdefault("volcano.sh/vgpu-number", {})[f"{a}-{i}"] = "someone-else"
    with pytest.raises(AdmissionError, match=r"no pod with bind-phase=allocating waits for a container with "
                                             r"volcano.sh/vgpu-number=GPUs"):
        cluster.kubelet.admit(pod)
    assert cluster.pod("lonely")["metadata"]["annotations"]["volcano.sh/bind-phase"] == "failed"
    deadline = time.monotonic() + 10
    while True:  # and a Warning event on the pod says why
        events = read_json(cluster.core.list_namespaced_event("default", _preload_content=False))["items"]
        failed = [e for e in events if e.get("reason") == "VGPUAllocationFailed"]
        if failed:
            break
        assert time.monotonic() < deadline, events
        time.sleep(0.1)
    assert failed[0]["involvedObject"]["name"] == "lonely" and failed[0]["type"] == "Warning"
    assert "no pod with bind-phase=allocating waits" in failed[0]["message"]


def test_metrics_show_container_usage(cluster):
    cluster.start_plugin("1xT4", "--legacy-metrics")
    (a,) = cluster.wait_inventory()
    pod = cluster.create_pod("metered", [gpu_container("app", 1, 3000, 25)], f"{a},NVIDIA,3000,25:")
    (app,) = cluster.kubelet.admit(pod)
    response = app.responses["volcano.sh/vgpu-number"]
    host_dir = Path({m.container_path: m.host_path for m in response.mounts}["/tmp/vgpu"])
    cache_name = response.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"].rsplit("/", 1)[1]
    write_accounting_file(host_dir / cache_name, a, 3000 * 2**20, 123 * 2**20, 17)
    with cluster.control.open("a") as control:
        control.write("usage 0 2048 42\n")
    gpu = tuple(sorted({"deviceidx": "0", "deviceuuid": a, "zone": "vGPU"}.items()))
    deadline = time.monotonic() + 5
    while True:
        text = httpx.get(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=5).text
        samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }
        if samples.get(("HostCoreUtilization", gpu)) == 42 and "vGPU_device_memory_usage_in_bytes{" in text:
            break
        assert time.monotonic() < deadline, text
        time.sleep(0.1)
    legacy = tuple(sorted({"podnamespace": "default", "podname": "metered", "ctrname": "app", "vdeviceid": "0",
                           "deviceuuid": a, "zone": "vGPU"}.items()))
    assert samples[("vGPU_device_memory_usage_in_bytes", legacy)] == 123 * 2**20
    assert samples[("vGPU_device_memory_limit_in_bytes", legacy)] == 3000 * 2**20
    assert samples[("Device_utilization_desc_of_container", legacy)] == 17
    new = tuple(sorted({"node": NODE, "namespace": "default", "pod": "metered", "container": "app",
                        "device_index": "0", "device_uuid": a}.items()))
    assert samples[("vgpu_container_memory_used_bytes", new)] == 123 * 2**20
    assert samples[("vgpu_container_memory_limit_bytes", new)] == 3000 * 2**20
    assert samples[("vgpu_container_core_utilization_percent", new)] == 17
    assert samples[("vgpu_container_core_limit_percent", new)] == 25
    assert samples[("HostGPUMemoryUsage", gpu)] == 2048 * 2**20
    assert samples[("HostCoreUtilization", gpu)] == 42
    device = tuple(sorted({"node": NODE, "device_index": "0", "device_uuid": a,
                           "device_type": "Tesla T4"}.items()))
    assert samples[("vgpu_device_core_utilization_percent", device)] == 42
    assert samples[("vgpu_device_plugin_allocate_total", (("node", NODE), ("resource", "volcano.sh/vgpu-number"),
                                                          ("result", "answered")))] >= 1


@pytest.mark.parametrize("legacy", [False, True], ids=["default", "legacy-metrics"])
def test_volcano_names_only_with_legacy_metrics_and_promtool_flags_only_them(cluster, legacy):
    """By default :9394 serves no legacy name and passes `promtool check metrics` (before: it exited 3); with
    --legacy-metrics the five names are back, and they are all promtool reports."""
    promtool = tool("promtool", "Debian's prometheus package; .ci/run installs it")
    cluster.start_plugin("1xT4", *(["--legacy-metrics"] if legacy else []))
    (a,) = cluster.wait_inventory()
    pod = cluster.create_pod("metered", [gpu_container("app", 1, 3000, 25)], f"{a},NVIDIA,3000,25:")
    cluster.kubelet.admit(pod)
    with cluster.control.open("a") as control:
        control.write("usage 0 2048 42\n")
    deadline = time.monotonic() + 5
    while "vgpu_device_core_utilization_percent{" not in (
            text := httpx.get(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=5).text):
        assert time.monotonic() < deadline, text
        time.sleep(0.1)
    served = {family.name for family in text_string_to_metric_families(text)}
    legacy_names = {spec.name for spec in NODE_METRICS if spec.legacy}
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    flagged = {line.split()[0].rstrip(":") for line in (res.stdout + res.stderr).splitlines() if line.strip()}
    if legacy:
        assert {"HostGPUMemoryUsage", "HostCoreUtilization", "vGPU_device_memory_limit_in_bytes"} <= served
        assert flagged and flagged <= legacy_names, flagged
    else:
        assert not served & legacy_names
        assert res.returncode == 0 and not flagged, flagged


def test_bad_explicit_memory_factor_is_refused(cluster):
    cluster.start_plugin("8xA100-80GB", "--gpu-memory-factor", "2", wait=False)
    assert cluster.proc.wait(30) == 2
    assert "gpu_memory_factor: 2 gives 327680 volcano.sh/vgpu-memory devices" in cluster.log()
    assert "at least 11" in cluster.log()
    assert NODE  # the node is untouched
    assert "volcano.sh/node-vgpu-register" not in cluster.node_annotations()


def test_garbage_collection_keeps_live_pods_dirs(cluster):
    """Directories of pods still on the node survive; those of pods that are gone go once old enough."""
    import os

    from vgpu.deviceplugin.allocator import Allocator
    from vgpu.deviceplugin.matching import GrantRules
    from vgpu.deviceplugin.pods import NodePods
    from vgpu.node.host import HostFiles
    from vgpu.resources import SharingConfig

    live = cluster.create_pod("alive", [gpu_container("c")], "GPU-x,NVIDIA,1,0:")
    pods = NodePods(cluster.api, NODE).start()
    try:
        rules = GrantRules(scheduler_names=frozenset({"vgpu-scheduler"}), card_memory={})
        allocator = Allocator(NODE, SharingConfig(), pods, HostFiles(cluster.hook, str(cluster.lock)), rules=rules)
        root = allocator.host.containers_root
        keep = root / f"{live['metadata']['uid']}_c"
        gone = root / "00000000-dead-beef-0000-000000000000_c"
        young = root / "11111111-dead-beef-0000-000000000000_c"
        for directory in (keep, gone, young):
            directory.mkdir(parents=True)
        old = time.time() - 3600
        for directory in (keep, gone):
            os.utime(directory, (old, old))
        assert allocator.collect_garbage(min_age=300) == [gone.name]
        assert keep.is_dir() and young.is_dir() and not gone.exists()
    finally:
        pods.stop()


def test_plugin_installs_the_isolation_library(cluster):
    """At start the plugin puts the built libvgpu.so where its Allocate mounts point, replacing an old copy by
    rename (a container holding the old file keeps it) and leaving an identical one alone."""
    from vgpu.isolation.build import ensure_built

    library = ensure_built().libvgpu.read_bytes()   # the tests need the library built (docs/DEVELOPING.md)
    target = cluster.hook / "vgpu" / "libvgpu.so"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"an older library")
    with target.open("rb") as held:  # what a running container has mapped
        cluster.start_plugin("1xT4")
        assert target.read_bytes() == library
        assert held.read() == b"an older library"
    inode = target.stat().st_ino
    cluster.restart_plugin()
    assert target.stat().st_ino == inode
    (a,) = cluster.wait_inventory()
    (container,) = cluster.kubelet.admit(cluster.create_pod("p", [gpu_container("c", 1, 1000)], f"{a},NVIDIA,1000,0:"))
    mounts = {m.container_path: m.host_path for r in container.responses.values() for m in r.mounts}
    assert mounts["/usr/local/vgpu/libvgpu.so"] == str(target)
