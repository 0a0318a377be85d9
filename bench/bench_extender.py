"""Benchmark of the scheduler extender at cluster scale (prints figures; never pass/fail).

Cluster: N nodes x 8 GPUs (40960 MiB, split 10; 96 CPUs, 768 GiB) with R running vGPU pods charged from their
`vgpu-ids-new` (1,000 nodes with 20,000 pods, and 5,000 with 100,000), the default node policy and mode. A stream
of pods of six shapes is created in the API (the pod watch shows each one to the extender first) and taken
through /filter, /prioritize and /bind one after another, so every cycle changes a node. Measured:
1. over HTTP against `create_app` served by uvicorn in a separate process: the latency of each verb (p50, p99),
   the cycles per second and the server's resident memory; and, in the same run, the floor: the same server stack
   answering /filter with the candidate names it was sent, without looking at them;
2. in one process (direct calls; the binder stands for the API server and feeds the bound pod back as the pod
   watch would): filter+prioritize+bind cycles per second and resident memory;
3. where the learned target was rebuilt: the threads `NodePolicy.relearn` changed the target on (never a
   request handler's).

Every pod is in the extender's cache when its /filter comes (the client waits SCHEDULER_LAG, and the extender has no
API server to read from); `bench_extender_api.py` measures `vgpu scheduler` as it runs against the API-server
stand-in, the /filter of a pod the pod watch has not delivered yet included, and DRA mode.

Run: nice .venv/bin/python bench/bench_extender.py [--scale 1000:20000 --scale 5000:100000] [--requests 2000]
     [--node-policy NAME] [--mode decide|score]
"""

from __future__ import annotations

import argparse
import gc
import http.client
import os
import random
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import orjson

from vgpu import keys
from vgpu.inventory import GPUDevice, encode_volcano

GPUS = 8
MEMORY = 40960
SPLIT = 10
SHAPES = [(1, 2000, 10), (1, 4000, 0), (1, 8000, 25), (2, 4000, 20), (1, 1000, 0), (1, 10000, 50)]
WARMUP = 100  # cycles before measuring
# between a pod's creation and its /filter, kube-scheduler's own watch delivers it and its in-tree filters run over
# every node (about a millisecond for 1,000): the extender's pod watch has usually taken the pod by then
SCHEDULER_LAG = 0.001


def node_name(n: int) -> str:
    return f"node-{n:05d}"


def make_node(n: int) -> dict[str, Any]:
    """Node n with its GPUs registered by the device plugin."""
    devices = [GPUDevice(f"GPU-{n:05d}-{g}", SPLIT, MEMORY, "NVIDIA-NVIDIA A100-PCIE-40GB", index=g)
               for g in range(GPUS)]
    return {
        "metadata": {"name": node_name(n), "annotations": {keys.NODE_REGISTER: encode_volcano(devices)}},
        "status": {"allocatable": {"volcano.sh/vgpu-number": str(GPUS * SPLIT), "cpu": "96", "memory": "768Gi"}},
    }


def pod_dict(name: str, shape: tuple[int, int, int]) -> dict[str, Any]:
    number, memory, cores = shape
    cpu = str(max(1, memory // 2000))  # CPUs grow with the GPU memory asked
    return {
        "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}", "annotations": {}},
        "spec": {"schedulerName": "vgpu-scheduler", "containers": [{"name": "main", "resources": {
            "requests": {"cpu": cpu, "memory": "8Gi"},
            "limits": {"volcano.sh/vgpu-number": str(number), "volcano.sh/vgpu-memory": str(memory),
                       "volcano.sh/vgpu-cores": str(cores)}}}]},
        "status": {"phase": "Pending"},
    }


def spread(nodes: int, count: int) -> list[tuple[int, int, int, int]]:
    """`count` pods already placed, as (node, GPU, memory, cores), spread over the GPUs with room (memory
    1000..6000, cores 0..20, at most SPLIT per GPU); the same every time."""
    rng = random.Random(1)
    placed = []
    free = {(n, g): [MEMORY, 100, SPLIT] for n in range(nodes) for g in range(GPUS)}
    slots = list(free)
    for _ in range(count):
        while True:
            n, g = rng.choice(slots)
            memory, cores = rng.choice([1000, 2000, 4000, 6000]), rng.choice([0, 0, 10, 20])
            room = free[(n, g)]
            if room[0] >= memory and room[1] >= cores and room[2] >= 1:
                room[0] -= memory
                room[1] -= cores
                room[2] -= 1
                break
        placed.append((n, g, memory, cores))
    return placed


def running_pods(nodes: int, count: int) -> list[dict[str, Any]]:
    """The pods of `spread`, bound and charged from their annotations."""
    pods = []
    for i, (n, g, memory, cores) in enumerate(spread(nodes, count)):
        p = pod_dict(f"run-{i}", (1, memory, cores))
        p["spec"]["nodeName"] = node_name(n)
        p["metadata"]["annotations"] = {keys.VGPU_NODE: node_name(n),
                                        keys.VGPU_IDS: f"GPU-{n:05d}-{g},NVIDIA,{memory},{cores}:"}
        p["status"]["phase"] = "Running"
        pods.append(p)
    return pods


class Rebuilds:
    """Records the thread of every `relearn` that changed the learned target."""

    def __init__(self, policy: Any) -> None:
        self.threads: dict[str, int] = {}
        relearn = policy.relearn

        def recorded(capacity: Any = None) -> bool:
            changed = bool(relearn(capacity))
            if changed:
                name = threading.current_thread().name
                self.threads[name] = self.threads.get(name, 0) + 1
            return changed

        policy.relearn = recorded


def build(nodes: int, pods: int, mode: str, policy: str) -> tuple[Any, Any, Rebuilds]:
    """A ledger with the nodes and running pods seen by the watch (the caches sync before the extender serves)."""
    from vgpu.scheduler.extender import Extender
    from vgpu.scheduler.ledger import Ledger
    from vgpu.scheduler.policies import make_policy

    ledger = Ledger()
    synced = threading.Event()

    def binder(namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> None:
        # the API server, and the watch event of the binding (stream pods are named <prefix>-<index in the stream>)
        bound = pod_dict(name, SHAPES[int(name.rsplit("-", 1)[1]) % len(SHAPES)])
        bound["metadata"]["annotations"] = annotations
        bound["spec"]["nodeName"] = node
        ledger.on_pod(bound)

    chosen = make_policy(policy)
    ext = Extender(ledger, chosen, mode=mode, binder=binder, ready=lambda: "" if synced.is_set() else "syncing")
    for n in range(nodes):
        ledger.on_node(make_node(n))
    for p in running_pods(nodes, pods):
        ledger.on_pod(p)
    synced.set()
    rebuilds = Rebuilds(chosen)  # from here on: serving
    gc.collect()
    gc.freeze()
    return ledger, ext, rebuilds


def create(ledger: Any, pod: dict[str, Any]) -> None:
    """The pod created in the API: the watch shows it."""
    ledger.on_pod(pod)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def serve(nodes: int, pods: int, mode: str, port: int, policy: str, floor: bool) -> None:
    """The server process: our extender, or (floor) the same stack answering /filter with the names it got."""
    from vgpu.httpserve import make_uvicorn_server
    from vgpu.scheduler.server import create_app

    if floor:
        class Echo:
            """Answers /filter with the names sent, /prioritize with zeros, /bind with no error."""

            def filter(self, args: Any) -> Any:
                names = args.get("NodeNames") or []
                return {"Nodes": None, "NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                        "Error": ""}

            def prioritize(self, args: Any) -> Any:
                return [{"Host": n, "Score": 0} for n in args.get("NodeNames") or []]

            def bind(self, args: Any) -> Any:
                return {"Error": ""}

            def preempt(self, args: Any) -> Any:
                return {"NodeNameToMetaVictims": {}}

            def ready(self) -> str:
                return ""

        app = create_app(Echo())  # type: ignore[arg-type]
        ledger = ext = None
    else:
        ledger, ext, _ = build(nodes, pods, mode, policy)
        app = create_app(ext)
    server = make_uvicorn_server(app, "127.0.0.1", port)
    if ext is not None:
        def watch() -> None:  # pods created in the API, one JSON line each on stdin
            for line in sys.stdin.buffer:
                create(ledger, orjson.loads(line))

        threading.Thread(target=watch, daemon=True).start()
    print("ready", flush=True)
    server.run()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_listening(port: int, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def over_http(nodes: int, pods: int, mode: str, requests: int, policy: str, floor: bool) -> dict[str, float]:
    """Cycles through a served extender: per-verb latency (ms), cycles per second, server RSS (MiB)."""
    port = free_port()
    cmd = [sys.executable, __file__, "--serve", f"{nodes}:{pods}", "--mode", mode, "--port", str(port),
           "--node-policy", policy] + (["--floor"] if floor else [])
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        if proc.stdout.readline().decode().strip() != "ready":
            raise RuntimeError("server did not start")
        _wait_listening(port)
        names = [node_name(n) for n in range(nodes)]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        headers = {"Content-Type": "application/json"}

        def post(path: str, body: Any) -> Any:
            conn.request("POST", path, body=orjson.dumps(body), headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                raise RuntimeError(data[:300])
            return orjson.loads(data)

        lat: dict[str, list[float]] = {"filter": [], "prioritize": [], "bind": []}
        start = 0.0
        for i in range(requests + WARMUP):
            if i == WARMUP:
                start = time.perf_counter()
            pod = pod_dict(f"new-{i}", SHAPES[i % len(SHAPES)])
            if not floor:
                proc.stdin.write(orjson.dumps(pod) + b"\n")
                proc.stdin.flush()
                time.sleep(SCHEDULER_LAG)
            t0 = time.perf_counter()
            out = post("/filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
            t1 = time.perf_counter()
            if out["Error"] or not out["NodeNames"]:
                raise RuntimeError(f"filter: {out['Error'] or 'no node'}")
            post("/prioritize", {"Pod": pod, "Nodes": None, "NodeNames": out["NodeNames"][:1]})
            t2 = time.perf_counter()
            meta = pod["metadata"]
            res = post("/bind", {"PodName": meta["name"], "PodNamespace": "bench", "PodUID": meta["uid"],
                                 "Node": out["NodeNames"][0]})
            t3 = time.perf_counter()
            if res["Error"]:
                raise RuntimeError(f"bind: {res['Error']}")
            if i >= WARMUP:
                lat["filter"].append(t1 - t0)
                lat["prioritize"].append(t2 - t1)
                lat["bind"].append(t3 - t2)
        elapsed = time.perf_counter() - start - (0 if floor else requests * SCHEDULER_LAG)
        result = {f"{verb}_{q}": _pct(v, p) for verb, v in lat.items() for q, p in (("p50", 0.5), ("p99", 0.99))}
        result["cycles_per_s"] = requests / elapsed
        result["rss_mib"] = rss_mib(proc.pid)
        return result
    finally:
        proc.terminate()
        proc.wait(30)


def in_process(nodes: int, pods: int, count: int, policy: str, mode: str) -> dict[str, Any]:
    """filter+prioritize+bind cycles per second with direct calls, RSS, and where the target was rebuilt."""
    ledger, ext, rebuilds = build(nodes, pods, mode, policy)
    names = [node_name(n) for n in range(nodes)]
    bound = 0
    start = 0.0
    filter_s: list[float] = []
    for i in range(count + WARMUP):
        if i == WARMUP:
            start = time.perf_counter()
        pod = pod_dict(f"tp-{i}", SHAPES[i % len(SHAPES)])
        create(ledger, pod)
        t0 = time.perf_counter()
        out = ext.filter({"Pod": pod, "NodeNames": names})
        if i >= WARMUP:
            filter_s.append(time.perf_counter() - t0)
        if not out["NodeNames"]:
            continue
        prio = ext.prioritize({"Pod": pod, "NodeNames": out["NodeNames"]})
        best = max(prio, key=lambda h: (h["Score"], h["Host"]))["Host"]
        meta = pod["metadata"]
        binding = {"PodName": meta["name"], "PodNamespace": "bench", "PodUID": meta["uid"], "Node": best}
        if not ext.bind(binding)["Error"]:
            bound += i >= WARMUP
    elapsed = time.perf_counter() - start
    return {"cycles_per_s": bound / elapsed, "bound": bound, "rss_mib": rss_mib(os.getpid()),
            "filter_p50": _pct(filter_s, 0.5), "filter_p99": _pct(filter_s, 0.99), "rebuilds": rebuilds.threads}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", action="append", help="NODES:RUNNING_PODS (default 1000:20000 and 5000:100000)")
    ap.add_argument("--requests", type=int, default=2000, help="measured cycles per run")
    ap.add_argument("--node-policy", default=None, help="node policy (default: the scheduler's)")
    ap.add_argument("--mode", default="decide", choices=["decide", "score"])
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from vgpu.scheduler.policies import DEFAULT_NODE_POLICY

    policy = args.node_policy or DEFAULT_NODE_POLICY
    if args.serve:
        nodes, pods = (int(x) for x in args.serve.split(":"))
        serve(nodes, pods, args.mode, args.port, policy, args.floor)
        return 0
    scales = [tuple(int(x) for x in s.split(":")) for s in (args.scale or ["1000:20000", "5000:100000"])]
    print(f"node policy {policy}, mode {args.mode}, {len(SHAPES)} pod shapes, {args.requests} measured cycles "
          f"(after {WARMUP}) of create -> /filter -> /prioritize -> /bind")
    for nodes, pods in scales:
        floor = over_http(nodes, pods, args.mode, args.requests, policy, floor=True)
        r = over_http(nodes, pods, args.mode, args.requests, policy, floor=False)
        print(f"{nodes} nodes x {GPUS} GPUs, {pods} running pods, over HTTP:")
        for verb in ("filter", "prioritize", "bind"):
            print(f"  /{verb:<10} p50 {r[f'{verb}_p50']:6.2f} ms  p99 {r[f'{verb}_p99']:6.2f} ms   "
                  f"(floor p50 {floor[f'{verb}_p50']:.2f} ms, p99 {floor[f'{verb}_p99']:.2f} ms)")
        print(f"  cycles {r['cycles_per_s']:.0f}/s (floor {floor['cycles_per_s']:.0f}/s), server RSS "
              f"{r['rss_mib']:.0f} MiB (floor {floor['rss_mib']:.0f} MiB)")
        t = in_process(nodes, pods, args.requests, policy, args.mode)
        print(f"  in one process: {t['cycles_per_s']:.0f} filter+prioritize+bind cycles/s ({t['bound']} bound), "
              f"/filter p50 {t['filter_p50']:.2f} ms p99 {t['filter_p99']:.2f} ms, RSS {t['rss_mib']:.0f} MiB; "
              f"target rebuilt on threads {t['rebuilds'] or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
