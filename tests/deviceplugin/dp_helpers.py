"""Helpers of the device-plugin tests: the real `vgpu device-plugin` process against the kubelet stand-in and the
API-server stand-in (a module of its own, not conftest, so that its names never clash with other test folders).

`PluginBed` gives a fresh API server (in-process stand-in), a Node object, a kubelet stand-in on a temporary
device-plugin directory and `cluster.start_plugin(...)` which runs the plugin as a subprocess with the sim backend.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from vgpu.kube.client import make_api_client, read_json
from vgpu.testbed.apiserver import ApiServerStandIn
from vgpu.testbed.cluster import free_port
from vgpu.testbed.kubelet import KubeletStandIn

ROOT = Path(__file__).resolve().parents[2]
RESOURCES = ("volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores")
NODE = "node-a"


class PluginBed:
    """One node's worth of peers for the plugin."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.apiserver = ApiServerStandIn().start()
        self.kubeconfig = self.apiserver.write_kubeconfig(tmp / "kubeconfig")
        self.api = make_api_client(self.kubeconfig)
        self.core = k8s.CoreV1Api(self.api)
        self.core.create_node({"metadata": {"name": NODE}})
        self.plugin_dir = tmp / "device-plugins"
        self.hook = tmp / "hook"
        self.lock = tmp / "vgpulock"
        self.control = tmp / "sim-control"
        self.control.touch()
        self.kubelet = KubeletStandIn(self.plugin_dir).start()
        self.proc: subprocess.Popen | None = None
        self.metrics_port = 0
        self.plugin_args: list[str] = []

    def start_plugin(self, gpus: str = "2xT4", *extra: str, wait: bool = True, env: dict[str, str] | None = None,
                     resources: tuple[str, ...] = RESOURCES, mode: str = "devices") -> None:
        """Run `vgpu device-plugin` (sim backend) and wait until kubelet has the device lists of `resources`.

        The default `mode` is Volcano's device layout (memory and cores advertised as devices, kubelet's Allocate
        calls for all three), which these tests exercise; `mode="mib"` is the plugin's own default."""
        self.metrics_port = free_port()
        self.plugin_args = [
            sys.executable, "-m", "vgpu.cli", "--log-level", "INFO", "device-plugin",
            "--node-name", NODE, "--kubeconfig", self.kubeconfig, "--backend", "sim", "--sim-gpus", gpus,
            "--sim-control", str(self.control), "--kubelet-dir", str(self.plugin_dir), "--hook-path", str(self.hook),
            "--lock-dir", str(self.lock), "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
            "--resource-mode", mode, *extra,
        ]
        self.plugin_env = dict(env or {})
        self._spawn(wait, resources)

    def _spawn(self, wait: bool = True, resources: tuple[str, ...] = RESOURCES) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), **getattr(self, "plugin_env", {}))
        with open(self.tmp / "plugin.log", "ab") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(self.plugin_args, cwd=ROOT, env=env, stderr=log)
        if wait:
            assert self.kubelet.wait_registered(resources, 20), self.log()

    def restart_plugin(self) -> None:
        """Kill the plugin (SIGKILL, no clean-up) and start it again with the same arguments."""
        before = {n: s.registrations for n, s in self.kubelet.resources.items()}
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)
        self._spawn(wait=False)
        assert self.kubelet.wait_for(
            lambda: all(
                n in self.kubelet.resources and self.kubelet.resources[n].registrations > before.get(n, 0)
                and self.kubelet.resources[n].updates > 0
                for n in RESOURCES
            ),
            20,
        ), self.log()

    def log(self) -> str:
        path = self.tmp / "plugin.log"
        return path.read_text()[-4000:] if path.exists() else ""

    def node_labels(self) -> dict[str, str]:
        node = read_json(self.core.read_node(NODE, _preload_content=False))
        return (node.get("metadata") or {}).get("labels") or {}

    def node_annotations(self) -> dict[str, str]:
        node = read_json(self.core.read_node(NODE, _preload_content=False))
        return (node.get("metadata") or {}).get("annotations") or {}

    def wait_inventory(self, timeout: float = 10.0) -> list[str]:
        """UUIDs of the published inventory, once it is there."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.node_annotations().get("volcano.sh/node-vgpu-register")
            if value:
                return [entry.split(",")[0] for entry in value.split(":") if entry]
            time.sleep(0.05)
        raise AssertionError("no inventory published\n" + self.log())

    def create_pod(self, name: str, containers: list[dict[str, Any]], assignment: str,
                   init_containers: list[dict[str, Any]] | None = None,
                   annotations: dict[str, str] | None = None) -> dict[str, Any]:
        """A pod as the scheduler leaves it at bind: on this node, annotated (`annotations` besides),
        bind-phase=allocating."""
        body: dict[str, Any] = {
            "metadata": {
                "name": name,
                "namespace": "default",
                "annotations": {
                    "volcano.sh/vgpu-node": NODE,
                    "volcano.sh/vgpu-ids-new": assignment,
                    "volcano.sh/devices-to-allocate": assignment,
                    "volcano.sh/vgpu-time": "1784884863",
                    "volcano.sh/bind-time": "1784884863",
                    "volcano.sh/bind-phase": "allocating",
                },
            },
            "spec": {"nodeName": NODE, "schedulerName": "vgpu-scheduler", "containers": containers},
        }
        if init_containers:
            body["spec"]["initContainers"] = init_containers
        body["metadata"]["annotations"].update(annotations or {})
        created = read_json(self.core.create_namespaced_pod("default", body, _preload_content=False))
        return created

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any]:
        return read_json(self.core.read_namespaced_pod(name, namespace, _preload_content=False))

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.kubelet.stop()
        self.api.close()
        self.apiserver.stop()


def gpu_container(name: str, number: int = 1, memory: int | None = None, cores: int | None = None,
                  env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    limits = {"volcano.sh/vgpu-number": str(number)}
    if memory is not None:
        limits["volcano.sh/vgpu-memory"] = str(memory)
    if cores is not None:
        limits["volcano.sh/vgpu-cores"] = str(cores)
    container: dict[str, Any] = {"name": name, "image": "busybox", "resources": {"limits": limits}}
    if env:
        container["env"] = env
    return container


def write_accounting_file(path: Path, uuid: str, limit: int, used: int, sm_util: int) -> None:
    """A shared accounting file in HAMi-core's v1 layout with one process using `used` bytes on device 0."""
    data = bytearray(2008952)
    struct.pack_into("<iII", data, 0, 19920718, 1, 0)
    struct.pack_into("<Q", data, 56, 1)
    data[64:64 + len(uuid)] = uuid.encode()
    struct.pack_into("<Q", data, 1600, limit)
    slot = 1856
    struct.pack_into("<ii", data, slot, 4242, 4242)
    struct.pack_into("<QQQQQ", data, slot + 8, 0, 0, used, 0, used)  # context, module, data, offset, total
    struct.pack_into("<QQQ", data, slot + 1160, 0, 0, sm_util)
    struct.pack_into("<i", data, slot + 1928, 1)
    struct.pack_into("<i", data, 2008896, 1)
    path.write_bytes(bytes(data))
