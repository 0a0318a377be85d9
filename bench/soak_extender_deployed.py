"""Memory of the deployed scheduler extender under churn (prints figures; never pass/fail).

`soak_extender.py` drives the extender's placement in one process. Here `vgpu scheduler` runs as deployed, in a
process of its own: the HTTP server, the node and pod watch caches over a real connection to the API-server
stand-in (testbed/apiserver.py, another process), bindings and events written through the API, and as in
deploy/scheduler/deployment.yaml assignments signed with an Ed25519 grant key and a metrics listener (scraped at every
line, as Prometheus would be; the deployment's --follow-lease is left out: no kube-scheduler holds a Lease here). The
stand-in holds
N nodes x 8 GPUs with their inventory annotations and R running pods; the client plays kube-scheduler: each cycle
creates a pod in the API, sends /filter, /prioritize and /bind to the extender's port, and deletes the pod. Every
`--every` cycles: the extender's resident memory (VmRSS of /proc/<pid>/status), and the cycles per second since the
last line.

`--tracemalloc FRAMES` runs the same `vgpu scheduler` command line under tracemalloc (a small harness in this file
that calls `vgpu.cli.main`); tracing starts once the first `--every` cycles are done (the caches and memos have
filled by then), and each later line is followed by the ten allocation sites that grew most since. Tracing slows
the extender about threefold and adds its own bookkeeping to the RSS: read the sites, not the RSS, of such a run.

Run: nice .venv/bin/python bench/soak_extender_deployed.py [--cycles 3000] [--every 500] [--nodes 100] [--pods 500]
     [--fresh-connections] [--tracemalloc 8]
"""

from __future__ import annotations

import argparse
import http.client
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_extender import SHAPES, make_node, node_name, pod_dict, rss_mib, spread
from bench_extender_api import NAMESPACE, standin_port, stop

from vgpu import keys

HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer bench"}


class Client:
    """JSON over one kept-alive connection (the extender's or the API server's)."""

    def __init__(self, port: int, fresh: bool = False) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.fresh = fresh  # a connection of its own for every request


    def call(self, method: str, path: str, body: Any = None) -> Any:
        self.conn.request(method, path, body=None if body is None else orjson.dumps(body), headers=HEADERS)
        resp = self.conn.getresponse()
        data = resp.read()
        if self.fresh:
            self.conn.close()
        if resp.status >= 300:
            raise RuntimeError(f"{method} {path}: {resp.status} {data[:300]!r}")
        return orjson.loads(data) if data else None

    def get(self, path: str) -> tuple[int, bytes]:
        """The status and body of a GET."""
        self.conn.request("GET", path, headers=HEADERS)
        resp = self.conn.getresponse()
        return resp.status, resp.read()


def populate(store: Any, nodes: int, pods: int, key_file: str) -> None:
    """The nodes, and the running pods bound with assignments signed by the extender's grant key (as it would have
    signed them), written in the stand-in's store directly."""
    from vgpu.grants import SIGNATURE, read_key

    key = read_key(key_file, "--grant-key-file")
    for n in range(nodes):
        store.create("v1/nodes", "", make_node(n))
    for i, (n, g, memory, cores) in enumerate(spread(nodes, pods)):
        pod = pod_dict(f"run-{i}", (1, memory, cores))
        pod["spec"]["nodeName"] = node_name(n)
        created = store.create("v1/pods", NAMESPACE, pod)
        ids = f"GPU-{n:05d}-{g},NVIDIA,{memory},{cores}:"
        annotations = {keys.VGPU_NODE: node_name(n), keys.VGPU_IDS: ids,
                       SIGNATURE: key.sign(created["metadata"]["uid"], node_name(n), ids)}
        store.patch("v1/pods", NAMESPACE, f"run-{i}", {"metadata": {"annotations": annotations}},
                    "application/merge-patch+json")


def serve_api(nodes: int, pods: int, kubeconfig: str, key_file: str) -> None:
    """The stand-in process: populate, serve, print "ready URL", serve until stdin closes."""
    from vgpu.testbed.apiserver import ApiServerStandIn

    server = ApiServerStandIn(history_size=10_000)
    populate(server.store, nodes, pods, key_file)
    server.start()
    server.write_kubeconfig(kubeconfig, token="extender")
    print("ready", server.url, flush=True)
    sys.stdin.read()
    server.stop()


def serve_traced(frames: int, argv: list[str]) -> int:
    """`vgpu <argv>` under tracemalloc; each "diff" line on stdin is answered with the ten allocation sites that grew
    most since the "mark" line (which starts tracing), then an empty line."""
    import linecache
    import tracemalloc

    from vgpu.cli import main as vgpu_main

    base: list[Any] = []
    # what this harness allocates itself to print the figures
    harness = (tracemalloc, linecache, sys.modules[__name__])
    quiet = [tracemalloc.Filter(False, module.__file__ or "") for module in harness]

    def commands() -> None:
        for line in sys.stdin:
            command = line.strip()
            if command == "mark":  # tracing starts here: the start-up (the first lists, learning) runs at full speed
                tracemalloc.start(frames)
                base[:] = [tracemalloc.take_snapshot().filter_traces(quiet)]
                print("", flush=True)
            elif command == "diff" and base:
                snapshot = tracemalloc.take_snapshot().filter_traces(quiet)
                for stat in snapshot.compare_to(base[0], "traceback")[:10]:
                    print(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks", flush=True)
                    for frame in stat.traceback.format(limit=frames, most_recent_first=True):
                        print(f"      {frame.strip()}", flush=True)
                print("", flush=True)

    threading.Thread(target=commands, daemon=True).start()
    return vgpu_main(argv)


def ask(proc: subprocess.Popen[bytes], command: str) -> str:
    """Send a command to the traced extender and return its answer (the lines up to an empty one)."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(command.encode() + b"\n")
    proc.stdin.flush()
    lines = []
    while (line := proc.stdout.readline().decode()).strip():
        lines.append(line.rstrip())
    return "\n".join(lines)


def soak(args: argparse.Namespace) -> None:
    """Start the stand-in and the extender, run the cycles, print a line every `args.every` cycles."""
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = str(Path(tmp) / "kubeconfig")
        key_file = grant_key(Path(tmp))
        me = [sys.executable, __file__]
        api = subprocess.Popen([*me, "--api", f"{args.nodes}:{args.pods}", "--kubeconfig", kubeconfig,
                                "--grant-key-file", key_file], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        ext: subprocess.Popen[bytes] | None = None
        try:
            api_port = standin_port(api)
            from vgpu.testbed.cluster import free_port  # below the ephemeral range: no outgoing connection takes it

            port = free_port()
            metrics = free_port()
            command = ["--log-level", "warning", "scheduler", "--kubeconfig", kubeconfig,
                       "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics}",
                       "--grant-key-file", key_file]
            if args.tracemalloc:
                ext = subprocess.Popen([*me, "--traced", str(args.tracemalloc), *command],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            else:
                ext = subprocess.Popen([sys.executable, "-m", "vgpu.cli", *command])
            extender = wait_ready(port, ext)
            extender.fresh = args.fresh_connections
            cycles(Client(api_port), extender, Client(metrics), ext, args)
        finally:
            stop(ext, api)


def grant_key(folder: Path) -> str:
    """A new Ed25519 private key in PEM, the extender's --grant-key-file."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = folder / "grant-key.pem"
    path.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return str(path)


def wait_ready(port: int, ext: subprocess.Popen[bytes], timeout: float = 300.0) -> Client:
    """A client of the extender once its /readyz answers 200 (its caches have synced)."""
    deadline = time.monotonic() + timeout
    while True:
        if ext.poll() is not None:
            raise RuntimeError(f"the extender exited ({ext.returncode})")
        try:
            client = Client(port)
            # the extender answers "ok" (another server that took the port would not)
            if client.get("/readyz") == (200, b"ok") and ext.poll() is None:
                return client
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the extender did not become ready")
        time.sleep(0.1)


def cycles(api: Client, extender: Client, metrics: Client, ext: subprocess.Popen[bytes],
           args: argparse.Namespace) -> None:
    """create -> /filter -> /prioritize -> /bind -> delete, `args.cycles` times."""
    names = [node_name(n) for n in range(args.nodes)]
    traced = bool(args.tracemalloc)
    print(f"{args.nodes} nodes x 8 GPUs, {args.pods} running pods: create -> /filter -> /prioritize -> /bind -> "
          f"delete through the API-server stand-in, {args.cycles} cycles, `vgpu scheduler` pid {ext.pid}"
          + (", a new connection per request" if args.fresh_connections else "")
          + (f" under tracemalloc ({args.tracemalloc} frames)" if traced else ""), flush=True)
    print(f"{'cycles':>8} {'RSS MiB':>8} {'cycles/s':>9}", flush=True)
    print(f"{0:>8} {rss_mib(ext.pid):>8.1f} {'':>9}", flush=True)
    bound = 0
    start = last = time.perf_counter()
    for i in range(1, args.cycles + 1):
        name = f"soak-{i}"
        pod = api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod_dict(name, SHAPES[i % len(SHAPES)]))
        out = extender.call("POST", "/filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
        if out["NodeNames"]:
            scores = extender.call("POST", "/prioritize", {"Pod": pod, "Nodes": None, "NodeNames": out["NodeNames"]})
            best = max(scores, key=lambda h: (h["Score"], h["Host"]))["Host"] if scores else out["NodeNames"][0]
            meta = pod["metadata"]
            res = extender.call("POST", "/bind", {"PodName": name, "PodNamespace": NAMESPACE, "PodUID": meta["uid"],
                                                  "Node": best})
            bound += not res["Error"]
        api.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        if i % args.every == 0 or i == args.cycles:
            metrics.get("/metrics")
            now = time.perf_counter()
            done = i % args.every or args.every
            print(f"{i:>8} {rss_mib(ext.pid):>8.1f} {done / (now - last):>9.0f}", flush=True)
            last = now
            if traced:  # tracing starts after the first line's cycles (the caches have filled by then)
                print(ask(ext, "diff" if i > args.every else "mark"), flush=True)
    print(f"{bound} of {args.cycles} pods bound in {time.perf_counter() - start:.0f} s", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=3000)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--pods", type=int, default=500, help="running pods the cluster holds throughout")
    ap.add_argument("--fresh-connections", action="store_true",
                    help="send every request to the extender on a new connection (default: one kept alive)")
    ap.add_argument("--tracemalloc", type=int, default=0, metavar="FRAMES",
                    help="run the extender under tracemalloc and print what grew at every line")
    ap.add_argument("--api", help=argparse.SUPPRESS)
    ap.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    ap.add_argument("--grant-key-file", help=argparse.SUPPRESS)
    if sys.argv[1:2] == ["--traced"]:  # the extender's harness: FRAMES, then `vgpu`'s command line
        return serve_traced(int(sys.argv[2]), sys.argv[3:])
    args = ap.parse_args()
    if args.api:
        nodes, pods = (int(x) for x in args.api.split(":"))
        serve_api(nodes, pods, args.kubeconfig, args.grant_key_file)
        return 0
    if args.nodes < 1 or args.cycles < 1 or args.every < 1 or args.pods < 0:
        ap.error("--nodes, --cycles and --every must be at least 1, --pods at least 0")
    soak(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
