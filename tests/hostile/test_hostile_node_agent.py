"""A tenant against the node agent: what a container can write (its accounting directory) never blocks, crashes or
fools the device plugin, and its directories outlive an API-server outage.

The real `vgpu device-plugin` process runs against the kubelet stand-in (gRPC over unix sockets) and the API-server
stand-in; the container's side is played by writing into the host directory that Allocate mounted at /tmp/vgpu.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from dp_helpers import NODE, PluginBed, gpu_container, write_accounting_file
from prometheus_client.parser import text_string_to_metric_families

MiB = 1 << 20
V1_SIZE = 2008952  # the accounting file write_accounting_file lays out


def _admit(node: PluginBed, name: str, uuid: str, memory: int = 3000, cores: int = 25) -> tuple[Any, Path, str]:
    """Admit a well-formed pod through kubelet; its response, host accounting directory and file name."""
    pod = node.create_pod(name, [gpu_container("app", 1, memory, cores)], f"{uuid},NVIDIA,{memory},{cores}:")
    (app,) = node.kubelet.admit(pod)
    response = app.responses["volcano.sh/vgpu-number"]
    host_dir = Path({m.container_path: m.host_path for m in response.mounts}["/tmp/vgpu"])
    return response, host_dir, response.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"].rsplit("/", 1)[1]


def _scrape(node: PluginBed) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _used(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], pod: str) -> list[float]:
    return [v for (name, labels), v in samples.items()
            if name == "vgpu_container_memory_used_bytes" and ("pod", pod) in labels]


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_a_fifo_in_place_of_the_accounting_file_blocks_no_scrape(node):
    """A FIFO under the accounting file's name: every scrape answers and no thread is left waiting on it (before:
    each scrape blocked forever in open(), one more stuck thread per scrape)."""
    node.start_plugin("1xT4")
    (uuid,) = node.wait_inventory()
    _, host_dir, cache_name = _admit(node, "fifo", uuid)
    os.mkfifo(host_dir / cache_name)
    assert node.proc is not None
    _scrape(node)
    before = _threads(node.proc.pid)
    for _ in range(5):
        samples = _scrape(node)
        assert _used(samples, "fifo") == []  # nothing read from it
    assert _threads(node.proc.pid) <= before + 1
    assert node.proc.poll() is None


def test_truncating_the_accounting_file_during_scrapes_never_kills_the_plugin(node):
    """The container truncates and rewrites its file in a loop while the node is scraped: the plugin survives
    (before: the monitor mapped the file, and a store past the new end raised SIGBUS in the plugin)."""
    node.start_plugin("1xT4")
    (uuid,) = node.wait_inventory()
    _, host_dir, cache_name = _admit(node, "truncator", uuid)
    path = host_dir / cache_name
    write_accounting_file(path, uuid, 3000 * MiB, 100 * MiB, 5)
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            with path.open("r+b") as f:
                f.truncate(0)
                f.truncate(V1_SIZE)  # zeros: a hole where the header was
            write_accounting_file(path, uuid, 3000 * MiB, 100 * MiB, 5)

    worker = threading.Thread(target=churn, daemon=True)
    worker.start()
    try:
        for _ in range(150):
            _scrape(node)
    finally:
        stop.set()
        worker.join(10)
    assert node.proc is not None and node.proc.poll() is None, node.log()
    assert _used(_scrape(node), "truncator") == [100 * MiB]


def test_a_symlink_to_a_host_file_is_not_followed(node, tmp_path):
    """The container replaces its accounting file with a symlink to a host file (here a valid accounting file the
    plugin, running as root, could read): the plugin does not read through it (before: it did, as root)."""
    node.start_plugin("1xT4")
    (uuid,) = node.wait_inventory()
    _, host_dir, cache_name = _admit(node, "linker", uuid)
    host_file = tmp_path / "host-secret.cache"
    write_accounting_file(host_file, uuid, 3000 * MiB, 777 * MiB, 5)
    (host_dir / cache_name).symlink_to(host_file)
    assert 777 * MiB not in _used(_scrape(node), "linker")
    assert _used(_scrape(node), "linker") == []


def test_a_file_that_sorts_first_does_not_stand_for_the_container(node):
    """Beside its real accounting file the container writes '0000.cache' claiming 1 MiB: the metrics still show
    what the real file (named by the plugin at Allocate) says (before: the first name in sorted order won)."""
    node.start_plugin("1xT4")
    (uuid,) = node.wait_inventory()
    _, host_dir, cache_name = _admit(node, "hider", uuid)
    write_accounting_file(host_dir / cache_name, uuid, 3000 * MiB, 2500 * MiB, 90)
    write_accounting_file(host_dir / "0000.cache", uuid, 3000 * MiB, 1 * MiB, 0)
    assert _used(_scrape(node), "hider") == [2500 * MiB]


def test_a_limit_written_into_the_accounting_file_is_not_reported_as_the_grant(node):
    """The container rewrites the limit in its own file to the whole card: the reported limit stays the grant."""
    node.start_plugin("1xT4")
    (uuid,) = node.wait_inventory()
    _, host_dir, cache_name = _admit(node, "boaster", uuid, memory=3000)
    write_accounting_file(host_dir / cache_name, uuid, 15000 * MiB, 10 * MiB, 1)
    limits = [v for (name, labels), v in _scrape(node).items()
              if name == "vgpu_container_memory_limit_bytes" and ("pod", "boaster") in labels]
    assert limits == [3000 * MiB]


def test_each_container_gets_its_own_lock_directory(node):
    """No host directory is mounted writable into two containers (before: /tmp/vgpulock, 0777, shared by all)."""
    node.start_plugin("1xT4")
    (uuid,) = node.wait_inventory()
    first, _, _ = _admit(node, "one", uuid, memory=1000, cores=10)
    second, _, _ = _admit(node, "two", uuid, memory=1000, cores=10)
    writable = [{m.host_path for m in r.mounts if not m.read_only} for r in (first, second)]
    assert writable[0] and writable[1] and not writable[0] & writable[1]
    lock_root = node.lock
    assert lock_root.is_dir() and (lock_root.stat().st_mode & 0o022) == 0  # the root itself is not shared writable


def test_clean_up_during_an_api_outage_keeps_running_containers_directories(node, tmp_path):
    """The plugin restarts while the API server is down (its pod cache never synced): clean-up removes nothing
    (before: an empty cache counted as "no pods here" and running containers lost their accounting directories;
    new processes there then ran without limits). A pod kubelet still runs survives a pod list that lacks it."""
    from vgpu.deviceplugin.allocator import Allocator
    from vgpu.deviceplugin.matching import GrantRules
    from vgpu.deviceplugin.podresources import KubeletPods
    from vgpu.deviceplugin.pods import NodePods
    from vgpu.kube.client import make_api_client
    from vgpu.node.host import HostFiles
    from vgpu.resources import SharingConfig
    from vgpu.testbed.apiserver import ApiServerStandIn

    node.start_plugin("1xT4")
    (uuid,) = node.wait_inventory()
    _, running, _ = _admit(node, "running", uuid)
    hour_ago = time.time() - 3600
    os.utime(running, (hour_ago, hour_ago))
    rules = GrantRules(scheduler_names=frozenset({"vgpu-scheduler"}), card_memory={})

    down = ApiServerStandIn().start()
    kubeconfig = down.write_kubeconfig(tmp_path / "down.kubeconfig")
    down.stop()  # the API server is gone before the restarted plugin could list anything
    api = make_api_client(kubeconfig)
    pods = NodePods(api, NODE).start(timeout=1)
    kubelet = KubeletPods(node.kubelet.pod_resources_socket)
    try:
        host = HostFiles(node.hook, node.lock)
        allocator = Allocator(NODE, SharingConfig(), pods, host, rules=rules, kubelet=kubelet)
        assert allocator.collect_garbage(min_age=0) == []
        assert running.is_dir()

        # the API server answers again but the pod is gone from it, while kubelet still runs its container
        node.core.delete_namespaced_pod("running", "default")
        allocator = Allocator(NODE, SharingConfig(), NodePods(node.api, NODE), host, rules=rules, kubelet=kubelet)
        assert allocator.collect_garbage(min_age=0) == []
        assert running.is_dir()
    finally:
        pods.stop()
        kubelet.close()
        api.close()


def test_open_listandwatch_streams_do_not_starve_allocate(node):
    """Whoever can reach the plugin's socket opens 40 ListAndWatch streams and keeps them open: streams beyond a few
    are refused with RESOURCE_EXHAUSTED, and kubelet's Allocate is answered (before: the streams held every worker
    of the server and Allocate failed with DEADLINE_EXCEEDED)."""
    import grpc

    from vgpu.proto.deviceplugin.v1beta1 import api_pb2 as pb
    from vgpu.proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

    node.start_plugin("1xT4")
    (a,) = node.wait_inventory()
    endpoint = node.plugin_dir / node.kubelet.resources["volcano.sh/vgpu-number"].endpoint
    channels = [grpc.insecure_channel(f"unix://{endpoint}") for _ in range(40)]
    # a deadline, so that a stream no worker ever serves fails instead of waiting for ever
    streams = [pb_grpc.DevicePluginStub(c).ListAndWatch(pb.Empty(), timeout=60) for c in channels]
    refused = 0
    try:
        for stream in streams:
            try:
                next(stream)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                refused += 1
        assert refused >= 36
        pod = node.create_pod("after-streams", [gpu_container("app", 1, 1000, 10)], f"{a},NVIDIA,1000,10:")
        (admitted,) = node.kubelet.admit(pod)
        assert admitted.responses["volcano.sh/vgpu-number"].envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    finally:
        for stream in streams:
            stream.cancel()
        for channel in channels:
            channel.close()

