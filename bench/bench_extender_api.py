"""Benchmark of the scheduler extender as it runs, against the API-server stand-in (prints figures; never pass/fail).

`bench_extender.py` measures the extender's own work, with every pod already in its cache. Here `vgpu scheduler`'s
wiring (`SchedulerRuntime`: the watch caches, the read of a pod the cache does not have yet, the bindings) serves
in one process and the API-server stand-in (testbed/apiserver.py) in another, holding N nodes x 8 GPUs and R running
pods; the client plays kube-scheduler: it creates each pod in the API, waits `--lag` seconds (0: none, so that the
extender's pod watch may not have delivered the pod when its /filter comes: the hard case, where /filter must make
sure the pod exists before it reserves for it) and sends /filter, /prioritize and /bind one after another, the pods
in six shapes as bench_extender.py.

Device-plugin mode: the nodes and running pods of bench_extender.py. DRA mode (`--dra`): each node publishes one
ResourceSlice of 8 GPUs of our driver (draplugin/slices.py) and the running pods hold allocated ResourceClaims;
each new pod asks through its own claim, created just before the pod, and between /prioritize and /bind the client
allocates the claim on the chosen node as kube-scheduler's PreBind does (the first GPUs with room, in index order).

Printed per run: the latency of each verb (p50, p99) and the cycles per second; the extender's CPU time per cycle,
in all and by thread (less sensitive to a loaded machine than latencies); how often /filter found the pod missing
from the extender's pod cache, and how many pods the extender read from the API server (counted by the stand-in);
how often a DRA pod was answered with every node because its claim had not reached the extender yet; the node
evaluations per cycle and the changes of the learned target; the load average before and after. `--profile FILE`
writes the cProfile statistics of the extender's event loop over the measured cycles.

Run: nice .venv/bin/python bench/bench_extender_api.py [--scale 1000:20000] [--requests 1000] [--lag 0 --lag 0.001]
     [--dra] [--profile FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import http.client
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_extender import (
    GPUS,
    MEMORY,
    SHAPES,
    WARMUP,
    _pct,
    _wait_listening,
    free_port,
    make_node,
    node_name,
    pod_dict,
    spread,
)

from vgpu import keys
from vgpu.dra import DEVICE_CLASS, DRIVER

NAMESPACE = "bench"
EXTENDER_TOKEN = "extender"  # the extender's bearer token (the client's is "bench"): the stand-in counts its reads
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer bench"}


def plain_node(n: int) -> dict[str, Any]:
    """A node without vGPU inventory (its GPUs come through DRA)."""
    return {"metadata": {"name": node_name(n)}, "status": {"allocatable": {"cpu": "96", "memory": "768Gi"}}}


def resource_slice(n: int) -> dict[str, Any]:
    """Node n's ResourceSlice as our DRA plugin publishes it."""
    from vgpu.draplugin.slices import slice_name, slice_spec
    from vgpu.node.backends import GPUInfo

    gpus = [GPUInfo(f"GPU-{n:05d}-{g}", "NVIDIA A100-PCIE-40GB", MEMORY, g) for g in range(GPUS)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": slice_name(node_name(n))}, "spec": slice_spec(node_name(n), gpus, 1)}


def claim_dict(name: str, shape: tuple[int, int, int]) -> dict[str, Any]:
    """A claim of our DeviceClass for a pod of `shape` (GPUs, MiB and cores of each)."""
    number, memory, cores = shape
    exactly = {"deviceClassName": DEVICE_CLASS, "count": number,
               "capacity": {"requests": {"memory": f"{memory}Mi", "cores": str(cores)}}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def allocation(name: str, node: int, gpus: list[int], memory: int, cores: int) -> dict[str, Any]:
    """The claim status kube-scheduler's PreBind writes: one share of each of `gpus` on `node`."""
    results = [{"request": "gpu", "driver": DRIVER, "pool": node_name(node), "device": f"gpu-{g}",
                "shareID": f"{name}-{g}", "consumedCapacity": {"memory": f"{memory}Mi", "cores": str(cores)}}
               for g in gpus]
    return {"allocation": {"devices": {"results": results}}}


def claim_pod(name: str, shape: tuple[int, int, int]) -> dict[str, Any]:
    """A pod that asks its GPU through the claim of its own name."""
    pod = pod_dict(name, shape)
    main = pod["spec"]["containers"][0]
    main["resources"] = {"requests": main["resources"]["requests"], "claims": [{"name": "gpu"}]}
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
    return pod


def populate(store: Any, nodes: int, pods: int, dra: bool) -> None:
    """The cluster as the extender finds it when it starts (written in the stand-in's store directly)."""
    for n in range(nodes):
        store.create("v1/nodes", "", plain_node(n) if dra else make_node(n))
        if dra:
            store.create("resource.k8s.io/v1/resourceslices", "", resource_slice(n))
    for i, (n, g, memory, cores) in enumerate(spread(nodes, pods)):
        name = f"run-{i}"
        if dra:
            store.create("resource.k8s.io/v1/resourceclaims", NAMESPACE, claim_dict(name, (1, memory, cores)))
            store.update("resource.k8s.io/v1/resourceclaims", NAMESPACE, name,
                         {**store.get("resource.k8s.io/v1/resourceclaims", NAMESPACE, name),
                          "status": allocation(name, n, [g], memory, cores)}, subresource="status")
            pod = claim_pod(name, (1, memory, cores))
        else:
            pod = pod_dict(name, (1, memory, cores))
            pod["metadata"]["annotations"] = {keys.VGPU_NODE: node_name(n),
                                              keys.VGPU_IDS: f"GPU-{n:05d}-{g},NVIDIA,{memory},{cores}:"}
        pod["spec"]["nodeName"] = node_name(n)
        store.create("v1/pods", NAMESPACE, pod)


def serve_api(nodes: int, pods: int, dra: bool, kubeconfig: str) -> None:
    """The stand-in process: populate, serve, say "ready"; stdin "stats" prints how many pods the extender has read
    (GET of one pod) so far."""
    from vgpu.testbed.apiserver import ApiServerStandIn

    server = ApiServerStandIn(history_size=100_000, record_requests=True)
    populate(server.store, nodes, pods, dra)
    server.start()
    server.write_kubeconfig(kubeconfig, token=EXTENDER_TOKEN)
    print("ready", server.url, flush=True)
    for line in sys.stdin:
        if line.strip() == "stats":
            asked = [r.attributes for r in server.requests(EXTENDER_TOKEN)]
            print(sum(1 for a in asked if a.verb == "get" and a.resource == "pods" and a.name), flush=True)
    server.stop()


def serve_extender(kubeconfig: str, port: int, mode: str, policy: str, dra: bool, profile: str | None) -> None:
    """The extender process: `vgpu scheduler`'s runtime and server. Commands on stdin, each answered with a line:
    "stats": how often /filter found the pod missing from the pod cache, the node evaluations, the learned target's
    epoch and the CPU time of each thread; with `profile`, "start" starts profiling the event loop's thread (where
    /filter and /prioritize run) and "profile" writes its cProfile statistics there."""
    from vgpu.httpserve import make_uvicorn_server
    from vgpu.scheduler.config import load_config
    from vgpu.scheduler.runtime import SchedulerRuntime

    config = load_config(None, {"kubeconfig": kubeconfig, "metrics_listen": "", "mode": mode, "node_policy": policy,
                                "dra": dra})
    runtime = SchedulerRuntime(config).start(wait=600)
    ext = runtime.extender
    misses = 0
    fetch = ext.fetch
    loop_thread = threading.main_thread()

    def counted(namespace: str, name: str) -> Any:  # the extender reads a pod its cache does not hold
        nonlocal misses
        misses += threading.current_thread() is loop_thread  # /filter runs on the event loop's thread
        return fetch(namespace, name)

    ext.fetch = counted
    gc.collect()
    gc.freeze()
    server = make_uvicorn_server(runtime.app, "127.0.0.1", port)
    profiler = cProfile.Profile()
    loop = asyncio.new_event_loop()

    def on_loop(job: Callable[[], Any]) -> None:  # the profiler is driven from the thread it profiles
        def run() -> None:
            job()
            print("done", flush=True)

        loop.call_soon_threadsafe(run)

    def commands() -> None:
        for line in sys.stdin:
            command = line.strip()
            if command == "stats":
                threads: dict[str, float] = {}
                for thread in threading.enumerate():
                    with contextlib.suppress(OSError):
                        kind = thread.name.split(" ", 1)[-1] if thread.name.startswith("Thread-") else thread.name
                        threads[kind] = threads.get(kind, 0.0) + cpu_seconds(os.getpid(), thread.native_id)
                print(orjson.dumps({"misses": misses, "threads": threads, "evaluations": ext.placement.evaluations
                                    + (runtime.dra.placement.evaluations if runtime.dra else 0),
                                    "epoch": ext.policy.epoch}).decode(), flush=True)
            elif command == "start":
                on_loop(profiler.enable if profile else lambda: None)
            elif command == "profile":
                on_loop(lambda: (profiler.disable(), profiler.dump_stats(profile)) if profile else None)

    threading.Thread(target=commands, daemon=True).start()
    print("ready", flush=True)
    loop.run_until_complete(server.serve())


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """CPU time of a process (or of one of its threads) so far."""
    with open(f"/proc/{pid}/task/{thread}/stat" if thread else f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Client:
    """JSON over one kept-alive connection."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call(self, method: str, path: str, body: Any, content_type: str = "application/json") -> Any:
        self.conn.request(method, path, body=orjson.dumps(body), headers={**HEADERS, "Content-Type": content_type})
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status >= 300:
            raise RuntimeError(f"{method} {path}: {resp.status} {data[:300]!r}")
        return orjson.loads(data)


class Allocator:
    """kube-scheduler's allocation of a claim on the chosen node: the first GPUs with room, in index order."""

    def __init__(self, nodes: int, pods: int) -> None:
        self.free = {(n, g): [MEMORY, 100] for n in range(nodes) for g in range(GPUS)}
        for n, g, memory, cores in spread(nodes, pods):
            self.free[(n, g)][0] -= memory
            self.free[(n, g)][1] -= cores

    def room(self, node: int, shape: tuple[int, int, int]) -> list[int]:
        """The GPUs of `node` with room for one share of `shape`, in index order."""
        _, memory, cores = shape
        return [g for g in range(GPUS) if self.free[(node, g)][0] >= memory and self.free[(node, g)][1] >= cores]

    def take(self, node: int, shape: tuple[int, int, int]) -> list[int]:
        number, memory, cores = shape
        gpus = self.room(node, shape)
        if len(gpus) < number:
            raise RuntimeError(f"{node_name(node)} has no room for {shape} although /filter chose it")
        for g in gpus[:number]:
            self.free[(node, g)][0] -= memory
            self.free[(node, g)][1] -= cores
        return gpus[:number]


def run(nodes: int, pods: int, mode: str, requests: int, policy: str, lag: float, dra: bool,
        profile: str | None) -> dict[str, Any]:
    """One measured run against a fresh stand-in and extender."""
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = str(Path(tmp) / "kubeconfig")
        me = [sys.executable, __file__]
        api = subprocess.Popen([*me, "--api", f"{nodes}:{pods}", "--kubeconfig", kubeconfig]
                               + (["--dra"] if dra else []), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        ext = None
        try:
            api_port = standin_port(api)
            port = free_port()
            ext = subprocess.Popen([*me, "--serve", "--kubeconfig", kubeconfig, "--port", str(port), "--mode", mode,
                                    "--node-policy", policy] + (["--dra"] if dra else [])
                                   + (["--profile", profile] if profile else []),
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            assert ext.stdout is not None and ext.stdin is not None
            if ext.stdout.readline().decode().strip() != "ready":
                raise RuntimeError("extender did not start")
            _wait_listening(port)
            return cycles(Client(api_port), Client(port), ext, api, nodes, pods, requests, lag, dra)
        finally:
            stop(ext, api)


def standin_port(api: subprocess.Popen[bytes]) -> int:
    """The port of a stand-in process started with `--api`, once it says it is ready."""
    assert api.stdout is not None
    word, url = api.stdout.readline().decode().split()
    if word != "ready":
        raise RuntimeError("API-server stand-in did not start")
    return int(url.rsplit(":", 1)[1])


def stop(*procs: subprocess.Popen[bytes] | None) -> None:
    """Terminate the processes that were started, and wait for each."""
    for proc in procs:
        if proc is not None:
            proc.terminate()
            proc.wait(30)


def ask(proc: subprocess.Popen[bytes], command: str) -> bytes:
    """One command to a server process of this benchmark, and its one-line answer."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(command.encode() + b"\n")
    proc.stdin.flush()
    return proc.stdout.readline()


def cycles(api: Client, extender: Client, ext: subprocess.Popen[bytes], api_proc: subprocess.Popen[bytes],
           nodes: int, pods: int, requests: int, lag: float, dra: bool) -> dict[str, Any]:
    """The measured cycles of one run, and what the servers counted meanwhile."""
    names = [node_name(n) for n in range(nodes)]
    allocator = Allocator(nodes, pods)
    lat: dict[str, list[float]] = {"filter": [], "prioritize": [], "bind": []}
    every_node = 0
    load_before = load()
    start = cpu0 = gets0 = 0.0
    before: dict[str, Any] = {}
    for i in range(requests + WARMUP):
        if i == WARMUP:
            start, cpu0 = time.perf_counter(), cpu_seconds(ext.pid)
            before, gets0 = orjson.loads(ask(ext, "stats")), int(ask(api_proc, "stats"))
            ask(ext, "start")
        shape = SHAPES[i % len(SHAPES)]
        name = f"new-{i}"
        if dra:
            api.call("POST", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims",
                     claim_dict(name, shape))
        pod = api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", claim_pod(name, shape) if dra
                       else pod_dict(name, shape))
        if lag:
            time.sleep(lag)
        t0 = time.perf_counter()
        out = extender.call("POST", "/filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
        t1 = time.perf_counter()
        if out["Error"] or not out["NodeNames"]:
            raise RuntimeError(f"filter: {out['Error'] or 'no node'}")
        node = int(out["NodeNames"][0].rsplit("-", 1)[1])
        if dra and len(out["NodeNames"]) == nodes:  # the claim had not reached the extender: no node was judged
            every_node += i >= WARMUP
            node = next(n for n in range(nodes) if len(allocator.room(n, shape)) >= shape[0])
        extender.call("POST", "/prioritize", {"Pod": pod, "Nodes": None, "NodeNames": out["NodeNames"][:1]})
        t2 = time.perf_counter()
        if dra:  # PreBind: the claim's allocation
            api.call("PATCH", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{name}/status",
                     {"status": allocation(name, node, allocator.take(node, shape), shape[1], shape[2])},
                     "application/merge-patch+json")
        t3 = time.perf_counter()
        meta = pod["metadata"]
        res = extender.call("POST", "/bind", {"PodName": meta["name"], "PodNamespace": NAMESPACE,
                                              "PodUID": meta["uid"], "Node": node_name(node)})
        t4 = time.perf_counter()
        if res["Error"]:
            raise RuntimeError(f"bind: {res['Error']}")
        if i >= WARMUP:
            lat["filter"].append(t1 - t0)
            lat["prioritize"].append(t2 - t1)
            lat["bind"].append(t4 - t3)
    elapsed = time.perf_counter() - start
    cpu = cpu_seconds(ext.pid) - cpu0
    after, gets = orjson.loads(ask(ext, "stats")), int(ask(api_proc, "stats"))
    ask(ext, "profile")
    result: dict[str, Any] = {f"{verb}_{q}": _pct(v, p) for verb, v in lat.items()
                              for q, p in (("p50", 0.5), ("p99", 0.99))}
    result.update(cycles_per_s=requests / elapsed, cpu_ms_per_cycle=1000 * cpu / requests,
                  misses=after["misses"] - before["misses"], gets=gets - gets0, every_node=every_node,
                  evaluations=(after["evaluations"] - before["evaluations"]) / requests,
                  epochs=after["epoch"] - before["epoch"],
                  threads={name: 1000 * (cpu - before["threads"].get(name, 0.0)) / requests
                           for name, cpu in after["threads"].items()},
                  load_before=load_before, load_after=load())
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", action="append", help="NODES:RUNNING_PODS (default 1000:20000)")
    ap.add_argument("--requests", type=int, default=1000, help="measured cycles per run")
    ap.add_argument("--lag", type=float, action="append", help="seconds between a pod's creation and its /filter "
                    "(default 0 and 0.001)")
    ap.add_argument("--dra", action="store_true", help="DRA mode: slices, claims, pods asking through claims")
    ap.add_argument("--node-policy", default=None, help="node policy (default: the scheduler's)")
    ap.add_argument("--mode", default="decide", choices=["decide", "score"])
    ap.add_argument("--profile", help="write the cProfile statistics of the extender's event loop here (each run "
                    "overwrites it)")
    ap.add_argument("--api", help=argparse.SUPPRESS)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    from vgpu.scheduler.policies import DEFAULT_NODE_POLICY

    policy = args.node_policy or DEFAULT_NODE_POLICY
    if args.api:
        nodes, pods = (int(x) for x in args.api.split(":"))
        serve_api(nodes, pods, args.dra, args.kubeconfig)
        return 0
    if args.serve:
        serve_extender(args.kubeconfig, args.port, args.mode, policy, args.dra, args.profile)
        return 0
    scales = [tuple(int(x) for x in s.split(":")) for s in (args.scale or ["1000:20000"])]
    print(f"{'DRA' if args.dra else 'device-plugin'} mode, node policy {policy}, mode {args.mode}, "
          f"{len(SHAPES)} pod shapes, {args.requests} measured cycles (after {WARMUP}) of create -> [lag] -> /filter "
          f"-> /prioritize -> {'allocate the claim -> ' if args.dra else ''}/bind, against the API-server stand-in")
    for nodes, pods in scales:
        for lag in args.lag or [0.0, 0.001]:
            r = run(nodes, pods, args.mode, args.requests, policy, lag, args.dra, args.profile)
            print(f"{nodes} nodes x {GPUS} GPUs, {pods} running pods, lag {lag * 1000:g} ms "
                  f"(load average {r['load_before']} before, {r['load_after']} after):")
            for verb in ("filter", "prioritize", "bind"):
                print(f"  /{verb:<10} p50 {r[f'{verb}_p50']:6.2f} ms  p99 {r[f'{verb}_p99']:6.2f} ms")
            print(f"  cycles {r['cycles_per_s']:.0f}/s, extender CPU {r['cpu_ms_per_cycle']:.2f} ms per cycle; "
                  f"the pod was not in the extender's cache at /filter {r['misses']} times of {args.requests}; the "
                  f"extender read a pod from the API server {r['gets']} times; a DRA pod was answered with every node "
                  f"(its claim not seen yet) {r['every_node']} times")
            print(f"  {r['evaluations']:.1f} node evaluations per cycle, learned target changed {r['epochs']} times")
            busy = sorted(r["threads"].items(), key=lambda kv: -kv[1])
            print("  extender CPU ms per cycle by thread: " + ", ".join(f"{n} {v:.2f}" for n, v in busy if v >= 0.05),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
