"""Peak memory of `vgpu scheduler` under hostile request bodies (prints figures; never pass/fail).

The extender runs as a real process against the API-server stand-in. Measured from /proc/<pid>/status (VmHWM, the
peak resident set, against VmRSS before the load):
1. a 50 MiB /filter body, declared (Content-Length) and streamed (chunked): refused 413 at the 4 MiB cap;
2. 24 callers at once, each with a 4 MiB body of empty objects (~95 MiB once parsed): all answered; the extender
   reads the bodies as they come (so that a stalled sender holds no one up) and parses two at a time
   (scheduler/server.py, LARGE_BODIES_AT_ONCE), so the peak is the raw bodies plus about two parses.

Run: .venv/bin/python bench/bench_extender_bodies.py [--callers 24]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import orjson

from vgpu.testbed.apiserver import ApiServerStandIn
from vgpu.testbed.cluster import free_port

MiB = 1 << 20


def status_bytes(pid: int, field: str) -> int:
    """Bytes of `field` (VmRSS, VmHWM) in /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def start_extender(kubeconfig: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "vgpu.cli", "scheduler", "--kubeconfig", kubeconfig, "--metrics-listen", "",
           "--listen", f"127.0.0.1:{port}"]
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vgpu scheduler exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("vgpu scheduler did not become ready in 60 s")


def huge_body(url: str) -> tuple[int, int]:
    """Peak RSS growth (bytes) over one declared and one streamed 50 MiB /filter, and the last status."""
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {"containers": []}}
    body = orjson.dumps({"Pod": pod, "NodeNames": [f"node-{i:09d}" for i in range(50 * MiB // 16)]})
    headers = {"Content-Type": "application/json"}
    with httpx.Client(base_url=url, timeout=120) as client:
        first = client.post("/filter", content=body, headers=headers).status_code
        chunks = (body[i:i + MiB] for i in range(0, len(body), MiB))
        second = client.post("/filter", content=chunks, headers=headers).status_code
    return first, second


def concurrent_bodies(url: str, callers: int) -> list[int]:
    body = b"[" + b"{}," * ((4 * MiB - 4) // 3) + b"{}]"
    answers: list[int] = []

    def caller() -> None:
        with httpx.Client(base_url=url, timeout=300) as client:
            answers.append(client.post("/filter", content=body,
                                       headers={"Content-Type": "application/json"}).status_code)

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callers", type=int, default=24)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        api = ApiServerStandIn().start()
        try:
            api.write_kubeconfig(Path(tmp) / "kubeconfig")
            for name, load in (("50 MiB body, declared then streamed", None),
                               (f"{args.callers} callers x 4 MiB body", args.callers)):
                port = free_port()
                proc = start_extender(api.kubeconfig, port, Path(tmp) / f"extender-{port}.log")
                try:
                    url = f"http://127.0.0.1:{port}"
                    if load is None:
                        before = status_bytes(proc.pid, "VmRSS")
                        statuses = list(huge_body(url))
                    else:
                        concurrent_bodies(url, 1)   # the allocator's arenas for one parse belong to the baseline
                        before = status_bytes(proc.pid, "VmRSS")
                        statuses = sorted(set(concurrent_bodies(url, load)))
                    peak = status_bytes(proc.pid, "VmHWM")
                    print(f"{name:40s} statuses={statuses} rss_before={before / MiB:.0f} MiB "
                          f"peak={peak / MiB:.0f} MiB growth={(peak - before) / MiB:.0f} MiB", flush=True)
                finally:
                    proc.terminate()
                    proc.wait(30)
        finally:
            api.stop()


if __name__ == "__main__":
    main()
