"""Device-plugin figures: Allocate latency with 110 pods on the node, ListAndWatch message sizes.

Runs the real `vgpu device-plugin` process (sim backend, 8 x A100-80GB) against the kubelet stand-in and the
API-server stand-in, both in this process. Prints figures; never passes or fails.

    .venv/bin/python bench/bench_deviceplugin.py [--pods 110]

Allocate: 110 pods are bound to the node at once, all `bind-phase=allocating` with distinct GPU sets (1 to 4 GPUs),
so every call scans the full candidate set; the kubelet stand-in then admits each pod as kubelet does
(GetPreferredAllocation, then one Allocate per resource, while its pod-resources API lists the pod), and the wall
time of each Allocate RPC (pod matching, the pod-resources query, directory creation and the annotation patch
included) is recorded.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kubernetes import client as k8s

from vgpu.deviceplugin.server import MEMORY, DeviceState, ResourceService
from vgpu.kube.client import make_api_client, read_json
from vgpu.node.backends import GPUInfo
from vgpu.proto.deviceplugin.v1beta1 import api_pb2 as pb
from vgpu.proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from vgpu.testbed.apiserver import ApiServerStandIn
from vgpu.testbed.kubelet import AdmissionError, KubeletStandIn

ROOT = Path(__file__).resolve().parents[1]

RESOURCES = ("volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores")
KUBELET_BUDGET = 4 * 1024 * 1024


def memory_message_size(gpus: int, mib: int, factor: int) -> tuple[int, int]:
    """(entries, serialized bytes) of the vgpu-memory ListAndWatch message for `gpus` cards."""
    infos = [GPUInfo(uuid=f"GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd", name="x", memory_mib=mib, minor=i)
             for i in range(gpus)]
    service = ResourceService(MEMORY, "volcano.sh/vgpu-memory", DeviceState(infos), lambda g: g.memory_mib // factor)
    message = service.device_list()
    return len(message.devices), message.ByteSize()


def gpu_sets(uuids: list[str], count: int) -> list[tuple[str, ...]]:
    """`count` distinct GPU sets, smallest first."""
    sets: list[tuple[str, ...]] = []
    for size in range(1, len(uuids) + 1):
        for combo in itertools.combinations(uuids, size):
            sets.append(combo)
            if len(sets) == count:
                return sets
    return sets


class _TimedStub:
    """A device-plugin stub that records the wall time of each Allocate RPC (ms) and passes everything else on."""

    def __init__(self, stub: pb_grpc.DevicePluginStub, sink: list[float]) -> None:
        self._stub = stub
        self._sink = sink

    def Allocate(self, request: pb.AllocateRequest, timeout: float | None = None) -> pb.AllocateResponse:
        start = time.perf_counter()
        try:
            return self._stub.Allocate(request, timeout=timeout)
        finally:
            self._sink.append((time.perf_counter() - start) * 1000)

    def __getattr__(self, name: str) -> object:
        return getattr(self._stub, name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=110)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-dp-"))
    apiserver = ApiServerStandIn().start()
    kubeconfig = apiserver.write_kubeconfig(tmp / "kubeconfig")
    api = make_api_client(kubeconfig, qps=1000, burst=2000)
    core = k8s.CoreV1Api(api)
    core.create_node({"metadata": {"name": "bench-node"}})
    kubelet = KubeletStandIn(tmp / "dp").start()
    plugin_log = open(tmp / "plugin.log", "wb")  # noqa: SIM115 - the plugin writes it until the end of main
    plugin = subprocess.Popen(
        [sys.executable, "-m", "vgpu.cli", "--log-level", "WARNING", "device-plugin", "--node-name", "bench-node",
         "--kubeconfig", kubeconfig, "--backend", "sim", "--sim-gpus", "8xA100-80GB", "--gpu-memory-factor", "auto",
         "--kubelet-dir", str(tmp / "dp"), "--hook-path", str(tmp / "hook"), "--lock-dir", str(tmp / "lock"),
         "--metrics-listen", ""],
        cwd=ROOT, stderr=plugin_log,
    )
    try:
        if not kubelet.wait_registered(RESOURCES, 60):
            print("plugin did not register; see", tmp / "plugin.log")
            return 1
        memory_state = kubelet.resources["volcano.sh/vgpu-memory"]
        print("ListAndWatch, 8 x A100-80GB (81920 MiB), as received by the kubelet stand-in (factor auto):")
        for name in RESOURCES:
            state = kubelet.resources[name]
            print(f"  {name:24s} {len(state.devices):7d} devices  {state.last_message_bytes:9d} bytes "
                  f"({100 * state.last_message_bytes / KUBELET_BUDGET:.1f}% of 4 MiB)")
        print("vgpu-memory message size by gpuMemoryFactor (8 x 81920 MiB):")
        for factor in (1, 2, 10, 11, 16):
            entries, size = memory_message_size(8, 81920, factor)
            verdict = "fits" if size <= KUBELET_BUDGET else "REJECTED by kubelet"
            print(f"  factor {factor:3d}: {entries:7d} entries {size:10d} bytes  {verdict}")
        del memory_state

        uuids = sorted({d.rsplit("-", 1)[0] for d in kubelet.devices("volcano.sh/vgpu-number")})
        sets = gpu_sets(uuids, args.pods)
        pods = []
        for i, gpus in enumerate(sets):
            value = "".join(f"{u},NVIDIA,1000,10:" for u in gpus)
            body = {
                "metadata": {"name": f"p{i:03d}", "namespace": "default", "annotations": {
                    "volcano.sh/vgpu-node": "bench-node", "volcano.sh/vgpu-ids-new": value,
                    "volcano.sh/devices-to-allocate": value, "volcano.sh/bind-phase": "allocating"}},
                "spec": {"nodeName": "bench-node", "containers": [{"name": "c", "image": "x", "resources": {
                    "limits": {"volcano.sh/vgpu-number": str(len(gpus)), "volcano.sh/vgpu-memory": "1000"}}}]},
            }
            pods.append(read_json(core.create_namespaced_pod("default", body, _preload_content=False)))
        time.sleep(1.0)  # let the plugin's pod cache see them
        latencies: list[float] = []
        for name in ("volcano.sh/vgpu-number", "volcano.sh/vgpu-memory"):
            state = kubelet.resources[name]
            state.stub = _TimedStub(state.stub, latencies)
        failures = 0
        for pod in reversed(pods):  # largest GPU sets first: the candidate list is full for the slow cases
            try:
                kubelet.admit(pod)
            except AdmissionError as exc:
                failures += 1
                print("admission failed:", exc)
            kubelet.release(pod["metadata"]["uid"])  # frees its device IDs: 110 pods need more shares than 8 GPUs have
        latencies.sort()
        p50 = statistics.median(latencies)
        p99 = latencies[min(len(latencies) - 1, round(0.99 * len(latencies)) - 1)]
        print(f"Allocate with {len(pods)} pods on the node ({failures} failures): "
              f"p50 {p50:.2f} ms  p99 {p99:.2f} ms  max {latencies[-1]:.2f} ms  (goal p99 <= 20 ms)")
    finally:
        plugin.terminate()
        plugin.wait(10)
        plugin_log.close()
        kubelet.stop()
        api.close()
        apiserver.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
