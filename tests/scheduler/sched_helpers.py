"""Helpers of the scheduler tests: ports, waits, a client wrapper and extender servers (in-process and real)."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import orjson
from kubernetes import client as k8s

from vgpu.testbed.cluster import free_port

REPO = Path(__file__).resolve().parents[2]


def wait_until(predicate, timeout=10.0, interval=0.02, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


class Kube:
    """Thin dict-in/dict-out helper over the official client, for seeding and reading the stand-in."""

    def __init__(self, kubeconfig: str):
        from vgpu.kube import make_api_client

        self.api = make_api_client(kubeconfig, qps=1000, burst=1000)
        self.core = k8s.CoreV1Api(self.api)

    @staticmethod
    def _read(resp):
        from vgpu.kube.client import read_json

        return read_json(resp)

    def create_node(self, body):
        return self._read(self.core.create_node(body, _preload_content=False))

    def create_pod(self, body, namespace="default"):
        body = dict(body)
        body["metadata"] = {k: v for k, v in body["metadata"].items() if k != "uid"}
        body.pop("status", None)
        return self._read(self.core.create_namespaced_pod(namespace, body, _preload_content=False))

    def pod(self, name, namespace="default"):
        return self._read(self.core.read_namespaced_pod(name, namespace, _preload_content=False))

    def pods(self, namespace="default"):
        return self._read(self.core.list_namespaced_pod(namespace, _preload_content=False))["items"]

    def events(self, namespace="default"):
        return self._read(self.core.list_namespaced_event(namespace, _preload_content=False))["items"]

    def bind(self, name, node, namespace="default"):
        from vgpu.kube import bind_pod

        bind_pod(self.api, namespace, name, node)


class ServedExtender:
    """SchedulerRuntime + uvicorn in threads of this process, on a free port."""

    def __init__(self, kubeconfig: str, **overrides):
        from vgpu.httpserve import make_uvicorn_server
        from vgpu.scheduler.config import load_config
        from vgpu.scheduler.runtime import SchedulerRuntime

        overrides.setdefault("metrics_listen", "")
        self.config = load_config(None, {"kubeconfig": kubeconfig, **overrides})
        self.runtime = SchedulerRuntime(self.config).start(wait=10)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = make_uvicorn_server(self.runtime.app, "127.0.0.1", self.port)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, what="uvicorn start")
        self.http = httpx.Client(base_url=self.url, timeout=30)

    @property
    def ledger(self):
        return self.runtime.ledger

    def post(self, path, body):
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        return self.http.post(path, content=data, headers={"Content-Type": "application/json"})

    def stop(self):
        self.http.close()
        self.server.should_exit = True
        self.thread.join(10)
        self.runtime.stop()


class ExtenderProcess:
    """`vgpu scheduler` as a real subprocess (for kill/restart)."""

    def __init__(self, kubeconfig: str, *args: str):
        self.kubeconfig = kubeconfig
        self.args = args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self, ready: bool = True):
        """Start the process and wait until it answers /readyz (with `ready`) or /healthz (a standby replica)."""
        env = dict(os.environ)
        cmd = [sys.executable, "-m", "vgpu.cli", "scheduler", "--kubeconfig", self.kubeconfig,
               "--listen", f"127.0.0.1:{self.port}", "--metrics-listen", "", *self.args]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        def answers():
            if self.proc.poll() is not None:
                raise AssertionError(f"extender exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                return httpx.get(self.url + probe, timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        probe = "/readyz" if ready else "/healthz"
        wait_until(answers, timeout=30, interval=0.1, what=f"extender {probe}")
        return self

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc and self.proc.stderr:
            self.proc.stderr.close()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc and self.proc.stderr:
            self.proc.stderr.close()
