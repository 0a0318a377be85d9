"""Helpers of the DRA-plugin tests: the real `vgpu dra-plugin` process (sim backend) against the API-server stand-in,
called as kubelet calls it: gRPC over its unix sockets with the generated protos.

A module of its own (not conftest) so that its names never clash with other test folders. The plugin's directories
live under a short /tmp directory: gRPC binds a unix socket path of at most 105 bytes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import orjson
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from vgpu.kube.client import make_api_client, read_json
from vgpu.proto.dra.v1 import api_pb2 as dra_v1
from vgpu.proto.dra.v1 import api_pb2_grpc as dra_v1_grpc
from vgpu.proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from vgpu.proto.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from vgpu.proto.pluginregistration.v1 import api_pb2 as reg
from vgpu.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from vgpu.testbed.apiserver import ApiServerStandIn

ROOT = Path(__file__).resolve().parents[2]
NODE = "node-a"
DRIVER = "gpu.vgpu-sharing.io"
SLICE = f"{NODE}-{DRIVER}"
VERSIONS: dict[str, tuple[ModuleType, Any]] = {
    "v1": (dra_v1, dra_v1_grpc.DRAPluginStub),
    "v1beta1": (dra_v1beta1, dra_v1beta1_grpc.DRAPluginStub),
}


def eventually(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    """Poll until `predicate()` is truthy; its value. AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def result(device: str, request: str = "gpu", memory: str | None = "10Gi", cores: str | None = "30",
           share: str | None = "s1", pool: str = NODE, driver: str = DRIVER) -> dict[str, Any]:
    """One allocation result as kube-scheduler writes it."""
    entry: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    consumed = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
    if consumed:
        entry["consumedCapacity"] = consumed
    if share is not None:
        entry["shareID"] = share
    return entry


class DRABed:
    """The API-server stand-in, a Node, the plugin's directories and the plugin process."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
        self.apiserver = ApiServerStandIn().start()
        self.kubeconfig = self.apiserver.write_kubeconfig(self.tmp / "kubeconfig")
        self.api = make_api_client(self.kubeconfig)
        self.core = k8s.CoreV1Api(self.api)
        self.resource = k8s.ResourceV1Api(self.api)
        self.node = read_json(self.core.create_node({"metadata": {"name": NODE}}, _preload_content=False))
        self.plugins = self.tmp / "plugins"
        self.registry = self.tmp / "registry"
        self.cdi = self.tmp / "cdi"
        self.hook = self.tmp / "hook"
        self.lock = self.tmp / "lock"
        self.control = self.tmp / "sim-control"
        self.control.touch()
        self.proc: subprocess.Popen[bytes] | None = None
        self.args: list[str] = []
        self.env: dict[str, str] = {}  # extra environment of the plugin process
        self.channels: list[grpc.Channel] = []

    @property
    def dra_socket(self) -> Path:
        return self.plugins / DRIVER / "dra.sock"

    @property
    def registration_socket(self) -> Path:
        return self.registry / f"{DRIVER}-reg.sock"

    def command(self, *extra: str, gpus: str = "2xA100-40GB") -> list[str]:
        return [sys.executable, "-m", "vgpu.cli", "--log-level", "INFO", "dra-plugin", "--node-name", NODE,
                "--kubeconfig", self.kubeconfig, "--backend", "sim", "--sim-gpus", gpus, "--sim-control",
                str(self.control), "--plugins-dir", str(self.plugins), "--registry-dir", str(self.registry),
                "--cdi-dir", str(self.cdi), "--hook-path", str(self.hook), "--lock-dir", str(self.lock), *extra]

    def start(self, *extra: str, gpus: str = "2xA100-40GB") -> None:
        """Run the plugin; wait until it answers GetInfo and its slice is published."""
        self.args = self.command(*extra, gpus=gpus)
        self._spawn()

    def _spawn(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), **self.env)
        with open(self.tmp / "plugin.log", "ab") as log:
            self.proc = subprocess.Popen(self.args, cwd=ROOT, env=env, stderr=log)
        eventually(lambda: self._answers() or self._exited(), what="the plugin to serve")
        assert self.proc.poll() is None, self.log()
        eventually(self.read_slice, what="the slice")

    def _exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def _answers(self) -> bool:
        if not (self.registration_socket.exists() and self.dra_socket.exists()):
            return False
        try:
            self.get_info()
        except grpc.RpcError:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL: no clean-up at all."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def restart(self) -> None:
        """Kill the plugin and start it again with the same arguments."""
        self.kill()
        self._spawn()

    def stop(self) -> int:
        """SIGTERM; the exit status."""
        assert self.proc is not None
        self.proc.terminate()
        return self.proc.wait(15)

    def log(self) -> str:
        path = self.tmp / "plugin.log"
        return path.read_text()[-6000:] if path.exists() else ""

    def inject(self, line: str) -> None:
        """One command for the simulated GPUs (`xid 1 79`, `recover 1`)."""
        with open(self.control, "a") as handle:
            handle.write(line + "\n")

    # --- gRPC, as kubelet ---------------------------------------------------------------------------------------

    def _channel(self, path: Path) -> grpc.Channel:
        channel = grpc.insecure_channel(f"unix://{path}")
        self.channels.append(channel)
        return channel

    def get_info(self) -> reg.PluginInfo:
        stub = reg_grpc.RegistrationStub(self._channel(self.registration_socket))
        return stub.GetInfo(reg.InfoRequest(), timeout=5)

    def notify(self, registered: bool, error: str = "") -> reg.RegistrationStatusResponse:
        stub = reg_grpc.RegistrationStub(self._channel(self.registration_socket))
        return stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=registered, error=error),
                                             timeout=5)

    def prepare(self, *claims: dict[str, Any], version: str = "v1") -> Any:
        """NodePrepareResources of these claims (API objects as created); the response's claims map."""
        pb, stub_class = VERSIONS[version]
        stub = stub_class(self._channel(self.dra_socket))
        request = pb.NodePrepareResourcesRequest(claims=[self._ref(pb, c) for c in claims])
        return stub.NodePrepareResources(request, timeout=30).claims

    def unprepare(self, *claims: dict[str, Any], version: str = "v1") -> Any:
        pb, stub_class = VERSIONS[version]
        stub = stub_class(self._channel(self.dra_socket))
        request = pb.NodeUnprepareResourcesRequest(claims=[self._ref(pb, c) for c in claims])
        return stub.NodeUnprepareResources(request, timeout=30).claims

    @staticmethod
    def _ref(pb: ModuleType, claim: dict[str, Any]) -> Any:
        meta = claim["metadata"]
        return pb.Claim(namespace=meta.get("namespace", "default"), name=meta["name"], uid=meta["uid"])

    # --- API objects --------------------------------------------------------------------------------------------

    def read_slice(self) -> dict[str, Any] | None:
        try:
            return read_json(self.resource.read_resource_slice(SLICE, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def claim(self, name: str, results: list[dict[str, Any]] | None, requests: tuple[str, ...] = ("gpu",),
              ) -> dict[str, Any]:
        """A ResourceClaim, allocated with `results` through the status subresource (None: left unallocated)."""
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
                "spec": {"devices": {"requests": [
                    {"name": r, "exactly": {"deviceClassName": "vgpu.gpu.vgpu-sharing.io"}} for r in requests]}}}
        created = read_json(self.resource.create_namespaced_resource_claim("default", body, _preload_content=False))
        if results is None:
            return created
        status = {"status": {"allocation": {"devices": {"results": results}}}}
        return read_json(self.resource.patch_namespaced_resource_claim_status(name, "default", status,
                                                                             _preload_content=False))

    def cdi_spec(self, claim: dict[str, Any]) -> dict[str, Any]:
        """The one CDI spec file that holds the claim's devices."""
        found = [p for p in self.cdi.glob("*.json") if claim["metadata"]["uid"] in p.name]
        assert len(found) == 1, sorted(p.name for p in self.cdi.iterdir()) if self.cdi.exists() else "no cdi dir"
        return orjson.loads(found[0].read_bytes())

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for channel in self.channels:
            channel.close()
        self.api.close()
        self.apiserver.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


def cdi_devices(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The spec's devices by fully qualified ID, each as {env: {K: V}, mounts: {containerPath: mount}}."""
    found = {}
    for device in spec["devices"]:
        edits = device["containerEdits"]
        env = dict(item.split("=", 1) for item in edits.get("env", []))
        mounts = {m["containerPath"]: m for m in edits.get("mounts", [])}
        found[f"{spec['kind']}={device['name']}"] = {"env": env, "mounts": mounts}
    return found
