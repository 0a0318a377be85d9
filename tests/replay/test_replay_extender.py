"""The replay places as the extender does: one short trace through `vgpu scheduler` over HTTP (API-server stand-in,
kube-scheduler driver, the deploy/ configuration, default node policy and mode) and through `replay.run.replay`
gives the same node for every pod and the same usage on every GPU.

The extender learns off the request path (its learner thread after each bind); the test waits for the thread
before it creates the next pod, which the replay matches by relearning after each pod and rescoring every stale
result between pods (`background`). Every share is a multiple of 250 milli of a 16 GiB card, so the pods' MiB
requests equal the replay's exact shares; CPU-only pods are left out (kube-scheduler places them without the
extender)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from vgpu import keys
from vgpu.inventory import GPUDevice, encode_volcano
from vgpu.replay.cluster import ReplayCluster
from vgpu.replay.run import prepare_policy, replay
from vgpu.replay.trace import CARD_MIB, DEVICE_PREFIX, TraceNode, TracePod

CARD = CARD_MIB["T4"]
assert CARD_MIB["P100"] == CARD  # one card size: a pod's MiB request is the same share on every node
SPLIT = 10


def _trace() -> tuple[list[TraceNode], list[TracePod]]:
    rng = np.random.default_rng(7)
    nodes = [TraceNode(f"n{i:02d}", cpu=32000, memory=131072, gpus=4, model="T4") for i in range(4)]
    nodes += [TraceNode(f"n{i:02d}", cpu=24000, memory=65536, gpus=2, model="P100") for i in range(4, 8)]
    pods = []
    for i in range(30):
        kind = rng.random()
        count, milli = (2, 1000) if kind < 0.1 else (1, 1000) if kind < 0.3 else (1, int(rng.choice([250, 500, 750])))
        spec = (str(rng.choice(["T4", "P100"])),) if rng.random() < 0.2 else ()
        pods.append(TracePod(f"p{i:02d}", cpu=int(rng.choice([1000, 4000, 8000])), memory=int(rng.choice([2048, 8192])),
                             num_gpu=count, gpu_milli=milli, gpu_spec=spec, created=10 * i))
    return nodes, pods


def _node(n: TraceNode) -> dict:
    devices = [GPUDevice(f"{n.name}-gpu{g}", SPLIT, CARD, DEVICE_PREFIX + n.model, index=g) for g in range(n.gpus)]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": n.name, "annotations": {keys.NODE_REGISTER: encode_volcano(devices)}},
            "status": {"allocatable": {"volcano.sh/vgpu-number": str(n.gpus * SPLIT), "cpu": f"{n.cpu}m",
                                       "memory": f"{n.memory}Mi", "pods": "110"}}}


def _pod(p: TracePod) -> dict:
    limits = {"volcano.sh/vgpu-number": str(p.num_gpu), "volcano.sh/vgpu-memory": str(CARD * p.gpu_milli // 1000),
              "volcano.sh/vgpu-cores": str(p.gpu_milli // 10)}
    annotations = {keys.USE_GPU_TYPE: ",".join(p.gpu_spec)} if p.gpu_spec else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": p.name, "namespace": "default", "annotations": annotations},
            "spec": {"schedulerName": "vgpu-scheduler", "containers": [{
                "name": "main", "image": "busybox",
                "resources": {"requests": {"cpu": f"{p.cpu}m", "memory": f"{p.memory}Mi"}, "limits": limits}}]}}


def _replayed(nodes: list[TraceNode], pods: list[TracePod]) -> tuple[list[str], dict[str, tuple[int, int, int]]]:
    cluster = ReplayCluster(nodes)
    sequence = sorted(range(len(pods)), key=lambda j: pods[j].created)
    rank = np.arange(len(nodes))  # the ledger ranks nodes by name; the trace's nodes are sorted by name
    policy = prepare_policy("fragaware", pods, 0)
    _, _, where = replay(cluster, pods, sequence, rank, policy, background=1 << 62)
    usage = {d.uuid: (u.shares, u.memory // 1000, u.cores)  # replay memory is in 1/1000 MiB
             for state in cluster.states for d, u in zip(state.devices, state.usage)}
    return [nodes[n].name if n >= 0 else "" for n in where.tolist()], usage


@pytest.fixture
def cluster(tmp_path):
    """API-server stand-in, `vgpu scheduler` served over HTTP in this process, and the kube-scheduler driver."""
    from vgpu.httpserve import make_uvicorn_server
    from vgpu.kube import make_api_client
    from vgpu.scheduler.config import load_config
    from vgpu.scheduler.runtime import SchedulerRuntime
    from vgpu.testbed.apiserver import ApiServerStandIn
    from vgpu.testbed.cluster import free_port
    from vgpu.testbed.scheduler_driver import SchedulerDriver, find_deploy_config, load_scheduler_config

    api = ApiServerStandIn().start()
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    runtime = SchedulerRuntime(load_config(None, {"kubeconfig": kubeconfig, "metrics_listen": ""})).start(wait=10)
    port = free_port()
    server = make_uvicorn_server(runtime.app, "127.0.0.1", port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    config = load_scheduler_config(find_deploy_config()).with_extender_url(f"http://127.0.0.1:{port}")
    driver = SchedulerDriver(config, kubeconfig, seed=1).start()
    yield make_api_client(kubeconfig, qps=1000, burst=1000), runtime
    driver.stop()
    server.should_exit = True
    thread.join(10)
    runtime.stop()
    api.stop()


def _read(resp):
    from vgpu.kube.client import read_json

    return read_json(resp)


def test_the_http_extender_and_the_replay_place_a_trace_alike(cluster):
    from kubernetes import client as k8s

    api, runtime = cluster
    core = k8s.CoreV1Api(api)
    nodes, pods = _trace()
    expected, expected_usage = _replayed(nodes, pods)
    assert all(expected), "the trace is sized so that every pod fits"
    for n in nodes:
        core.create_node(_node(n), _preload_content=False)
    deadline = time.monotonic() + 10
    while len(runtime.ledger.nodes) < len(nodes) and time.monotonic() < deadline:
        time.sleep(0.02)
    placed = []
    for p in sorted(pods, key=lambda p: p.created):  # one at a time: each pod is placed on what the last left
        core.create_namespaced_pod("default", _pod(p), _preload_content=False)
        deadline = time.monotonic() + 20
        node = ""
        while not node and time.monotonic() < deadline:
            node = (_read(core.read_namespaced_pod(p.name, "default", _preload_content=False))["spec"]
                    .get("nodeName") or "")
            time.sleep(0.01)
        assert node, f"{p.name} was not bound"
        assert runtime.extender.wait_learned()
        placed.append(node)
    assert placed == expected
    with runtime.ledger.lock:
        usage = {d.uuid: (u.shares, u.memory, u.cores)
                 for state in runtime.ledger.nodes.values() for d, u in zip(state.devices, state.usage)}
    assert usage == expected_usage
