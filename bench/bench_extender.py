"""Benchmark of the scheduler extender (prints figures; never pass/fail).

Cluster: 1000 nodes x 8 GPUs (40960 MiB, split 10; 96 CPUs, 768 GiB) with N running vGPU pods charged from
their `vgpu-ids-new` (20,000 and 2,000); pods request 1-5 CPUs and 8 GiB. Measured:
1. /filter latency over HTTP (p50/p99) with 1000 candidate names, against the extender served by uvicorn in a
   separate process (so the client does not share its interpreter), in score mode (pure filter) and in decide
   mode (filter + reservation of the best node);
2. pods/s through filter + prioritize + bind in one process, in score and in decide mode (direct calls; the
   binder stands for the API server and feeds the bound pod back as the pod watch would);
3. resident memory of the serving process.

Run: .venv/bin/python bench/bench_extender.py [--pods 20000 2000] [--requests 2000] [--node-policy NAME]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import socket
import statistics
import subprocess
import sys
import time

from vgpu import keys
from vgpu.inventory import GPUDevice, encode_volcano

N_NODES = 1000
GPUS = 8
MEMORY = 40960
SPLIT = 10
SHAPES = [(1, 2000, 10), (1, 4000, 0), (1, 8000, 25), (2, 4000, 20), (1, 1000, 0), (1, 10000, 50)]


def make_nodes() -> list[dict]:
    nodes = []
    for n in range(N_NODES):
        devices = [GPUDevice(f"GPU-{n:04d}-{g}", SPLIT, MEMORY, "NVIDIA-NVIDIA A100-PCIE-40GB", index=g)
                   for g in range(GPUS)]
        nodes.append({
            "metadata": {"name": f"node-{n:04d}", "annotations": {keys.NODE_REGISTER: encode_volcano(devices)}},
            "status": {"allocatable": {"volcano.sh/vgpu-number": str(GPUS * SPLIT), "cpu": "96", "memory": "768Gi"}},
        })
    return nodes


def pod_dict(name: str, shape: tuple[int, int, int], uid: str | None = None) -> dict:
    number, memory, cores = shape
    cpu = str(max(1, memory // 2000))  # CPUs grow with the GPU memory asked
    return {
        "metadata": {"name": name, "namespace": "bench", "uid": uid or f"uid-{name}", "annotations": {}},
        "spec": {"schedulerName": "vgpu-scheduler", "containers": [{"name": "main", "resources": {
            "requests": {"cpu": cpu, "memory": "8Gi"},
            "limits": {"volcano.sh/vgpu-number": str(number), "volcano.sh/vgpu-memory": str(memory),
                       "volcano.sh/vgpu-cores": str(cores)}}}]},
        "status": {"phase": "Pending"},
    }


def running_pods(count: int, rng: random.Random) -> list[dict]:
    """`count` pods already placed, spread over the GPUs with room (memory 1000..6000, cores 0..20)."""
    pods = []
    free = {(n, g): [MEMORY, 100, SPLIT] for n in range(N_NODES) for g in range(GPUS)}
    slots = list(free)
    for i in range(count):
        while True:
            n, g = rng.choice(slots)
            memory, cores = rng.choice([1000, 2000, 4000, 6000]), rng.choice([0, 0, 10, 20])
            room = free[(n, g)]
            if room[0] >= memory and room[1] >= cores and room[2] >= 1:
                room[0] -= memory
                room[1] -= cores
                room[2] -= 1
                break
        p = pod_dict(f"run-{i}", (1, memory, cores))
        p["spec"]["nodeName"] = f"node-{n:04d}"
        p["metadata"]["annotations"] = {keys.VGPU_NODE: f"node-{n:04d}",
                                        keys.VGPU_IDS: f"GPU-{n:04d}-{g},NVIDIA,{memory},{cores}:"}
        p["status"]["phase"] = "Running"
        pods.append(p)
    return pods


def build(pods: int, mode: str, policy: str):
    from vgpu.scheduler.extender import Extender
    from vgpu.scheduler.ledger import Ledger
    from vgpu.scheduler.policies import make_policy

    ledger = Ledger()

    def binder(namespace, name, uid, node, annotations):  # the API server + the watch event it causes
        ledger.on_pod({"metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": annotations},
                       "spec": {"nodeName": node}, "status": {"phase": "Pending"}})

    # before the watch, as vgpu scheduler does
    ext = Extender(ledger, make_policy(policy), gpu_policy="binpack", mode=mode, binder=binder)
    for node in make_nodes():
        ledger.on_node(node)
    for p in running_pods(pods, random.Random(1)):
        ledger.on_pod(p)
    gc.collect()
    gc.freeze()
    return ledger, ext


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def serve(pods: int, mode: str, port: int, policy: str) -> None:
    from vgpu.scheduler.server import create_app, make_uvicorn_server

    _, ext = build(pods, mode, policy)
    server = make_uvicorn_server(create_app(ext), "127.0.0.1", port)
    print("ready", flush=True)
    server.run()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, timeout: float = 60.0) -> None:
    """Block until uvicorn accepts connections on `port` ("ready" is printed before it binds)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def http_latency(pods: int, mode: str, requests: int, policy: str) -> dict:
    import http.client

    import orjson

    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(pods), "--mode", mode, "--port", str(port),
                             "--node-policy", policy],
                            stdout=subprocess.PIPE, env=dict(os.environ))
    try:
        assert proc.stdout is not None
        t0 = time.perf_counter()
        line = proc.stdout.readline().decode().strip()
        if line != "ready":
            raise RuntimeError(f"server did not start: {line!r}")
        _wait_listening(port)
        build_s = time.perf_counter() - t0
        names = [f"node-{n:04d}" for n in range(N_NODES)]
        # A lean keep-alive client (stdlib http.client), closer to kube-scheduler's Go client than httpx.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        headers = {"Content-Type": "application/json"}
        bodies = [orjson.dumps({"Pod": pod_dict(f"new-{i}", SHAPES[i % len(SHAPES)]), "Nodes": None,
                                "NodeNames": names}) for i in range(requests + 100)]
        samples = []
        for i, body in enumerate(bodies):
            start = time.perf_counter()
            conn.request("POST", "/filter", body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            elapsed = time.perf_counter() - start
            if resp.status != 200 or orjson.loads(data)["Error"]:
                raise RuntimeError(data[:300])
            if i >= 100:
                samples.append(elapsed)
        samples.sort()
        return {
            "p50_ms": 1000 * samples[len(samples) // 2],
            "p99_ms": 1000 * samples[int(len(samples) * 0.99)],
            "mean_ms": 1000 * statistics.fmean(samples),
            "rss_mib": rss_mib(proc.pid),
            "startup_s": build_s,
        }
    finally:
        proc.terminate()
        proc.wait(10)


def throughput(pods: int, count: int, policy: str, mode: str) -> dict:
    _, ext = build(pods, mode, policy)
    names = [f"node-{n:04d}" for n in range(N_NODES)]
    for i, shape in enumerate(SHAPES):  # warm the per-node fit caches once per request shape
        ext.filter({"Pod": pod_dict(f"warm-{i}", shape), "NodeNames": names})
    bound = 0
    start = time.perf_counter()
    for i in range(count):
        p = pod_dict(f"tp-{i}", SHAPES[i % len(SHAPES)])
        out = ext.filter({"Pod": p, "NodeNames": names})
        if not out["NodeNames"]:
            continue
        prio = ext.prioritize({"Pod": p, "NodeNames": out["NodeNames"]})
        best = max(prio, key=lambda h: (h["Score"], h["Host"]))["Host"]
        meta = p["metadata"]
        res = ext.bind({"PodName": meta["name"], "PodNamespace": "bench", "PodUID": meta["uid"], "Node": best})
        if not res["Error"]:
            bound += 1
    elapsed = time.perf_counter() - start
    return {"pods_per_s": bound / elapsed, "bound": bound, "rss_mib": rss_mib(os.getpid())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, nargs="+", default=[20000, 2000])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--throughput-pods", type=int, default=2000)
    ap.add_argument("--node-policy", default=None, help="node policy (default: the scheduler's default)")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="score", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    from vgpu.scheduler.policies import DEFAULT_NODE_POLICY

    policy = args.node_policy or DEFAULT_NODE_POLICY
    if args.serve is not None:
        serve(args.serve, args.mode, args.port, policy)
        return 0
    print(f"cluster: {N_NODES} nodes x {GPUS} GPUs, /filter with {N_NODES} candidate names, "
          f"{args.requests} measured requests, {len(SHAPES)} request shapes, node policy {policy}")
    for pods in args.pods:
        for mode in ("score", "decide"):
            r = http_latency(pods, mode, args.requests, policy)
            print(f"running pods {pods:>6}  mode {mode:<6}  /filter over HTTP  p50 {r['p50_ms']:.2f} ms  "
                  f"p99 {r['p99_ms']:.2f} ms  mean {r['mean_ms']:.2f} ms  server RSS {r['rss_mib']:.0f} MiB  "
                  f"(startup {r['startup_s']:.1f} s)")
    for pods in args.pods[:1]:
        for mode in ("score", "decide"):
            r = throughput(pods, args.throughput_pods, policy, mode)
            print(f"running pods {pods:>6}  mode {mode:<6}  filter+prioritize+bind in one process: "
                  f"{r['pods_per_s']:.0f} pods/s ({r['bound']} bound)  RSS {r['rss_mib']:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
