"""Webhook figures: how long an ordinary pod's review takes while other clients post the largest reviews they can.

Runs the real `vgpu webhook` process over HTTPS (a CA of its own) and posts an ordinary review (one HAMi container)
`--samples` times, first alone, then while `--flooders` clients each post, one after the other, a review of a pod
of 30,000 containers (about 2.9 MiB, under the 3 MiB cap: what a client that reaches the Service directly can
send; the webhook refuses it by its container count). kube-apiserver gives each review the webhook's
`timeoutSeconds` (5 s) and then admits the pod unmutated (failurePolicy Ignore). Prints figures; never passes or
fails.

    .venv/bin/python bench/bench_webhook_holdup.py [--samples 200] [--flooders 4]
"""

from __future__ import annotations

import argparse
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import orjson

from vgpu.testbed.cluster import free_port
from vgpu.testbed.pki import make_pki


def _review(containers: list[dict]) -> bytes:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "infer-", "namespace": "team"},
           "spec": {"schedulerName": "default-scheduler", "containers": containers}}
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                                     "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                     "resource": {"group": "", "version": "v1", "resource": "pods"},
                                     "namespace": "team", "operation": "CREATE", "object": pod,
                                     "userInfo": {"username": "alice"}, "dryRun": False}})


def _container(i: int) -> dict:
    return {"name": f"c{i}", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": 1,
                                                                      "nvidia.com/gpumem": 1000}}}


def _percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (f"p50 {statistics.median(ordered) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
            f"max {ordered[-1] * 1000:.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--flooders", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-webhook-") as tmp:
        pki = make_pki(Path(tmp))
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "vgpu.cli", "webhook", "--listen", f"127.0.0.1:{port}",
                                 "--tls-cert-file", str(pki["cert"]), "--tls-private-key-file", str(pki["key"])],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        context = ssl.create_default_context(cafile=pki["ca"])
        url = f"https://127.0.0.1:{port}"
        try:
            with httpx.Client(base_url=url, verify=context, timeout=30) as client:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        client.get("/healthz")
                        break
                    except httpx.HTTPError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
                ordinary = _review([_container(0)])
                large = _review([_container(i) for i in range(30_000)])
                print(f"ordinary review {len(ordinary)} bytes; large review {len(large) / 2**20:.1f} MiB")

                def sample() -> list[float]:
                    took = []
                    for _ in range(args.samples):
                        began = time.perf_counter()
                        client.post("/mutate-pods", content=ordinary).raise_for_status()
                        took.append(time.perf_counter() - began)
                    return took

                print(f"alone: {_percentiles(sample())}")
                stop = threading.Event()
                sent = [0] * args.flooders

                def flood(index: int) -> None:
                    with httpx.Client(base_url=url, verify=context, timeout=60) as own:
                        while not stop.is_set():
                            own.post("/mutate-pods", content=large)
                            sent[index] += 1

                threads = [threading.Thread(target=flood, args=(i,), daemon=True) for i in range(args.flooders)]
                for thread in threads:
                    thread.start()
                time.sleep(1.0)
                under = sample()
                stop.set()
                for thread in threads:
                    thread.join(60)
                late = sum(1 for t in under if t > 5.0)
                print(f"with {args.flooders} clients posting large reviews ({sum(sent)} sent): {_percentiles(under)}; "
                      f"{late} of {len(under)} past kube-apiserver's 5 s timeout")
        finally:
            proc.terminate()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
