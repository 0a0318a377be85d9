"""Helpers of the kubelet stand-in's DRA tests (a module of its own, not conftest, so its names never clash with the
scheduler-side tests in this folder).

`TestDRAPlugin` is a small DRA kubelet plugin written for these tests only: real gRPC servicers
(`pluginregistration.Registration` on a socket in the registry directory, `v1.DRAPlugin` on its own socket), reading
each claim's allocation from the API server and writing one CDI spec per prepared claim; given `health_services`
it also serves `DRAResourceHealth/NodeWatchResources` under those names (the states of `set_health`, resent at
each change). `NodeBed` gives an
in-process API-server stand-in, the node agent (testbed/podrunner.py NodeAgent, which runs containers as local
processes) with its DRA side, and helpers to create allocated claims and pods bound to the node.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client as k8s

from vgpu.kube.client import make_api_client, read_json
from vgpu.proto.dra.v1 import api_pb2 as dra
from vgpu.proto.dra.v1 import api_pb2_grpc as dra_grpc
from vgpu.proto.drahealth.v1 import api_pb2 as health_v1
from vgpu.proto.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from vgpu.proto.pluginregistration.v1 import api_pb2 as reg
from vgpu.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from vgpu.testbed.apiserver import ApiServerStandIn
from vgpu.testbed.build import ensure_sim_built
from vgpu.testbed.machine import MachineGPU
from vgpu.testbed.podrunner import NodeAgent

NODE = "node-dra"
DRIVER = "dra-test.example.com"
KIND = "dra-test.example.com/gpu"
HEALTH_MESSAGES = {"v1.DRAResourceHealth": health_v1, "v1alpha1.DRAResourceHealth": health_v1alpha1}


def env_name(request: str) -> str:
    """The variable the test plugin sets for a request's device."""
    return "DRA_TEST_" + request.upper().replace("-", "_").replace("/", "__")


class TestDRAPlugin:
    """A DRA plugin for tests; `prepares` / `unprepares` record the claims of each call as (namespace, uid, name)."""

    __test__ = False  # not a pytest class

    def __init__(self, registry: Path, plugin_dir: Path, cdi_dir: Path, api: k8s.ApiClient, driver: str = DRIVER,
                 plugin_type: str = "DRAPlugin", versions: tuple[str, ...] = ("v1.DRAPlugin",),
                 endpoint: str | None = None, socket_name: str | None = None,
                 health_services: tuple[str, ...] = ()) -> None:
        self.registry, self.plugin_dir, self.cdi_dir = registry, plugin_dir, cdi_dir
        self.resource = k8s.ResourceV1Api(api)
        self.driver, self.plugin_type, self.versions = driver, plugin_type, versions
        self.service_socket = plugin_dir / "dra.sock"
        self.endpoint = endpoint or str(self.service_socket)
        self.reg_socket = registry / (socket_name or f"{driver}-reg.sock")
        self.prepares: list[list[tuple[str, str, str]]] = []
        self.unprepares: list[list[tuple[str, str, str]]] = []
        self.statuses: list[tuple[bool, str]] = []
        self.prepare_errors: dict[str, str] = {}  # claim name -> error answered
        self.unprepare_errors: dict[str, str] = {}
        self.skip: set[str] = set()  # claim names left out of the answer
        self.on_prepare: Callable[[dra.Claim], None] | None = None
        self.spec_edits: dict[str, Any] = {}  # more spec-level containerEdits (mounts)
        self.device_edits: Callable[[dra.Claim, dict[str, Any]], dict[str, Any]] | None = None  # per result
        self.health_services = health_services  # DRAResourceHealth names served (not listed unless in versions)
        self.health: dict[str, tuple[int, str, int]] = {}  # device -> (HealthStatus value, message, timeout s)
        self.health_version = 0
        self.health_calls: list[str] = []  # the service of each NodeWatchResources call
        self.health_error: grpc.StatusCode | None = None  # answer every health call with this status
        self.cond = threading.Condition()
        self._servers: list[grpc.Server] = []
        self._stopping = threading.Event()

    # -- lifecycle
    def start(self) -> TestDRAPlugin:
        """Serve the DRA service, then the registration socket (the order a plugin uses)."""
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.registry.mkdir(parents=True, exist_ok=True)
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        self._stopping.clear()
        service = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        dra_grpc.add_DRAPluginServicer_to_server(_Service(self), service)
        if self.health_services:
            service.add_generic_rpc_handlers(tuple(self._health_handler(name) for name in self.health_services))
        self.service_socket.unlink(missing_ok=True)
        service.add_insecure_port(f"unix://{self.service_socket}")
        service.start()
        registration = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), registration)
        self.reg_socket.unlink(missing_ok=True)
        registration.add_insecure_port(f"unix://{self.reg_socket}")
        registration.start()
        self._servers = [service, registration]
        return self

    def stop(self) -> None:
        """Stop serving and remove both sockets (what a plugin that exits cleanly leaves behind)."""
        self._stopping.set()
        with self.cond:
            self.cond.notify_all()
        for server in self._servers:
            server.stop(grace=0).wait()
        self._servers = []
        self.reg_socket.unlink(missing_ok=True)
        self.service_socket.unlink(missing_ok=True)

    def wait(self, predicate: Callable[[], bool], timeout: float = 15.0) -> bool:
        """Wait until `predicate()` (under the plugin's lock) holds."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.1))
            return True

    # -- device health
    def set_health(self, device: str, health: str, message: str = "", timeout: int = 0) -> None:
        """Report `device` (of pool NODE) as HEALTHY, UNHEALTHY or UNKNOWN on every open health stream."""
        with self.cond:
            self.health[device] = (health_v1.HealthStatus.Value(health), message, timeout)
            self.health_version += 1
            self.cond.notify_all()

    def _health_response(self, pb: Any) -> Any:
        return pb.NodeWatchResourcesResponse(devices=[
            pb.DeviceHealth(device=pb.DeviceIdentifier(pool_name=NODE, device_name=device), health=health,
                            last_updated_time=int(time.time()), health_check_timeout_seconds=timeout,
                            message=message)
            for device, (health, message, timeout) in sorted(self.health.items())])

    def _health_handler(self, name: str) -> grpc.GenericRpcHandler:
        pb = HEALTH_MESSAGES[name]

        def watch(request: Any, context: grpc.ServicerContext) -> Any:
            with self.cond:
                self.health_calls.append(name)
                self.cond.notify_all()
            if self.health_error is not None:
                context.abort(self.health_error, "device health reporting is not supported by this driver")
            sent = -1
            while context.is_active() and not self._stopping.is_set():
                with self.cond:
                    if sent == self.health_version:
                        self.cond.wait(0.1)
                        continue
                    sent = self.health_version
                    response = self._health_response(pb)
                yield response

        return grpc.method_handlers_generic_handler(name, {"NodeWatchResources": grpc.unary_stream_rpc_method_handler(
            watch, request_deserializer=pb.NodeWatchResourcesRequest.FromString,
            response_serializer=pb.NodeWatchResourcesResponse.SerializeToString)})

    def spec_path(self, claim_uid: str) -> Path:
        """The CDI spec the plugin writes for a claim."""
        return self.cdi_dir / f"dra-test-{claim_uid}.json"

    # -- what the servicers do
    def prepare(self, claim: dra.Claim) -> dra.NodePrepareResourceResponse:
        if claim.name in self.prepare_errors:
            return dra.NodePrepareResourceResponse(error=self.prepare_errors[claim.name])
        obj = read_json(self.resource.read_namespaced_resource_claim(claim.name, claim.namespace,
                                                                     _preload_content=False))
        if obj["metadata"]["uid"] != claim.uid:
            return dra.NodePrepareResourceResponse(error=f"claim {claim.name}: UID {claim.uid} is not current")
        results = [r for r in obj["status"]["allocation"]["devices"]["results"] if r["driver"] == self.driver]
        devices, spec_devices = [], []
        for result in results:
            name = f"{claim.uid}-{result['request'].replace('/', '-')}-{result['device']}"
            edits: dict[str, Any] = {"env": [f"{env_name(result['request'])}={result['pool']}/{result['device']}",
                                             f"DRA_TEST_LAST_DEVICE={result['device']}"]}
            if self.device_edits is not None:
                extra = self.device_edits(claim, result)
                edits = {"env": edits["env"] + extra.get("env", []), "mounts": extra.get("mounts", [])}
            spec_devices.append({"name": name, "containerEdits": edits})
            devices.append(dra.Device(request_names=[result["request"]], pool_name=result["pool"],
                                      device_name=result["device"], cdi_device_ids=[f"{KIND}={name}"]))
        spec = {"cdiVersion": "0.6.0", "kind": KIND,
                "containerEdits": {"env": [f"DRA_TEST_CLAIM={claim.namespace}/{claim.name}"], **self.spec_edits},
                "devices": spec_devices}
        tmp = self.spec_path(claim.uid).with_suffix(".tmp")
        tmp.write_text(json.dumps(spec))
        tmp.replace(self.spec_path(claim.uid))
        if self.on_prepare is not None:
            self.on_prepare(claim)
        return dra.NodePrepareResourceResponse(devices=devices)

    def unprepare(self, claim: dra.Claim) -> dra.NodeUnprepareResourceResponse:
        if claim.name in self.unprepare_errors:
            return dra.NodeUnprepareResourceResponse(error=self.unprepare_errors[claim.name])
        self.spec_path(claim.uid).unlink(missing_ok=True)
        return dra.NodeUnprepareResourceResponse()


def _ids(claims: Any) -> list[tuple[str, str, str]]:
    return [(c.namespace, c.uid, c.name) for c in claims]


class _Service(dra_grpc.DRAPluginServicer):
    def __init__(self, plugin: TestDRAPlugin) -> None:
        self.plugin = plugin

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        with self.plugin.cond:
            self.plugin.prepares.append(_ids(request.claims))
            self.plugin.cond.notify_all()
        answer = dra.NodePrepareResourcesResponse()
        for claim in request.claims:
            if claim.name not in self.plugin.skip:
                answer.claims[claim.uid].CopyFrom(self.plugin.prepare(claim))
        return answer

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        answer = dra.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            answer.claims[claim.uid].CopyFrom(self.plugin.unprepare(claim))
        with self.plugin.cond:
            self.plugin.unprepares.append(_ids(request.claims))
            self.plugin.cond.notify_all()
        return answer


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, plugin: TestDRAPlugin) -> None:
        self.plugin = plugin

    def GetInfo(self, request: Any, context: Any) -> Any:
        p = self.plugin
        return reg.PluginInfo(type=p.plugin_type, name=p.driver, endpoint=p.endpoint, supported_versions=p.versions)

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        with self.plugin.cond:
            self.plugin.statuses.append((request.plugin_registered, request.error))
            self.plugin.cond.notify_all()
        return reg.RegistrationStatusResponse()


class NodeBed:
    """The API server, one node agent with DRA, and helpers for claims and pods."""

    def __init__(self, tmp: Path, gpus: Sequence[MachineGPU] = (), resource_health_status: bool = False,
                 health_from_registration: bool = False, health_retry: float = 5.0) -> None:
        self.tmp = tmp
        # the node agent builds its DRA side with kubelet's defaults; these are set before it starts
        self.health_options = {"resource_health_status": resource_health_status,
                               "health_from_registration": health_from_registration, "health_retry": health_retry}
        self.gpus = list(gpus)  # the node's GPUs, as the test bed describes the node
        self.apiserver = ApiServerStandIn().start()
        self.kubeconfig = self.apiserver.write_kubeconfig(tmp / "kubeconfig")
        self.api = make_api_client(self.kubeconfig)
        self.core = k8s.CoreV1Api(self.api)
        self.resource = k8s.ResourceV1Api(self.api)
        # unix socket paths are limited to 107 bytes: the kubelet root lives in a short directory of its own
        self.kubelet_root = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))
        self.registry = self.kubelet_root / "plugins_registry"
        self.workdir = tmp / "node"
        self.cdi_dir = self.workdir / "cdi"
        self.agent = self._agent()
        self.plugins: list[TestDRAPlugin] = []

    def _agent(self) -> NodeAgent:
        agent = NodeAgent(NODE, self.kubelet_root / "device-plugins", self.workdir, self.kubeconfig,
                          dra_retry=0.2, gpus=self.gpus, sim_dir=ensure_sim_built().sim_dir)
        for option, value in self.health_options.items():
            setattr(agent.dra.plugins, option, value)
        return agent.start()

    def restart_agent(self) -> None:
        """Stop the node agent (its pods' processes die with it) and start a new one on the same directories."""
        self.agent.stop()
        self.agent = self._agent()

    def plugin(self, **kwargs: Any) -> TestDRAPlugin:
        """A test plugin registering with this node (not started)."""
        plugin = TestDRAPlugin(self.registry, self.kubelet_root / "plugins" / kwargs.get("driver", DRIVER),
                               self.cdi_dir, self.api, **kwargs)
        self.plugins.append(plugin)
        return plugin

    def wait_driver(self, driver: str = DRIVER, present: bool = True, timeout: float = 15.0) -> bool:
        """Wait until the driver is (or is no longer) registered with the node."""
        return self.agent.dra.plugins.wait_registered(driver, present, timeout)

    # -- objects
    def create_pod(self, name: str, containers: list[dict[str, Any]], claims: list[dict[str, Any]],
                   node: str | None = None) -> dict[str, Any]:
        """A pod with these resourceClaims, not yet bound (unless `node`)."""
        spec: dict[str, Any] = {"containers": containers, "resourceClaims": claims, "restartPolicy": "Never"}
        if node:
            spec["nodeName"] = node
        body = {"metadata": {"name": name, "namespace": "default"}, "spec": spec}
        created: dict[str, Any] = read_json(self.core.create_namespaced_pod("default", body, _preload_content=False))
        return created

    def bind(self, name: str) -> None:
        """Bind a pod to the node (as the scheduler does)."""
        self.core.create_namespaced_pod_binding(name, "default", {"metadata": {"name": name},
                                                                  "target": {"kind": "Node", "name": NODE}},
                                                _preload_content=False)

    def create_claim(self, name: str, requests: tuple[str, ...] = ("gpu",),
                     owner: dict[str, Any] | None = None) -> dict[str, Any]:
        """A claim with one `exactly` request per name."""
        body: dict[str, Any] = {"metadata": {"name": name}, "spec": {"devices": {"requests": [
            {"name": r, "exactly": {"deviceClassName": "test.example.com"}} for r in requests]}}}
        if owner is not None:
            body["metadata"]["ownerReferences"] = [owner]
        created: dict[str, Any] = read_json(self.resource.create_namespaced_resource_claim(
            "default", body, _preload_content=False))
        return created

    def allocate(self, claim: dict[str, Any], pod: dict[str, Any] | None,
                 devices: dict[str, str] | None = None, driver: str = DRIVER) -> dict[str, Any]:
        """Write the claim's allocation (request -> device, default gpu-0 for each) and reserve it for `pod`."""
        claim = read_json(self.resource.read_namespaced_resource_claim(claim["metadata"]["name"], "default",
                                                                       _preload_content=False))
        requests = [r["name"] for r in claim["spec"]["devices"]["requests"]]
        devices = devices or {r: "gpu-0" for r in requests}
        status: dict[str, Any] = {"allocation": {"devices": {"results": [
            {"request": r, "driver": driver, "pool": NODE, "device": d} for r, d in devices.items()]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}}}
        if pod is not None:
            status["reservedFor"] = [{"resource": "pods", "name": pod["metadata"]["name"],
                                      "uid": pod["metadata"]["uid"]}]
        body = dict(claim, status=status)
        updated: dict[str, Any] = read_json(self.resource.replace_namespaced_resource_claim_status(
            claim["metadata"]["name"], "default", body, _preload_content=False))
        return updated

    def pod(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = read_json(self.core.read_namespaced_pod(name, "default", _preload_content=False))
        return found

    def wait_phase(self, name: str, phases: tuple[str, ...], timeout: float = 30.0) -> dict[str, Any]:
        """The pod once its phase is one of `phases`."""
        deadline = time.monotonic() + timeout
        while True:
            pod = self.pod(name)
            if (pod.get("status") or {}).get("phase") in phases:
                return pod
            if time.monotonic() > deadline:
                raise AssertionError(f"pod {name} never reached {phases}: {pod.get('status')}")
            time.sleep(0.05)

    def container_env(self, pod: str, container: str) -> dict[str, str]:
        """The environment the container's process printed (`env -0`, its log)."""
        path = self.workdir / "logs" / f"default_{pod}_{container}.log"
        raw = path.read_bytes()
        return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)

    def log_exists(self, pod: str, container: str) -> bool:
        return (self.workdir / "logs" / f"default_{pod}_{container}.log").exists()

    def events(self, pod: str) -> list[dict[str, Any]]:
        items = read_json(self.core.list_namespaced_event("default", _preload_content=False))["items"]
        return [e for e in items if (e.get("involvedObject") or {}).get("name") == pod]

    def close(self) -> None:
        for plugin in self.plugins:
            plugin.stop()
        self.agent.stop()
        self.api.close()
        self.apiserver.stop()
        shutil.rmtree(self.kubelet_root, ignore_errors=True)


def env_container(name: str, claims: list[dict[str, str]], env: list[dict[str, str]] | None = None,
                  script: str = "env -0") -> dict[str, Any]:
    """A container that prints its environment (NUL-separated) and exits."""
    ctr: dict[str, Any] = {"name": name, "image": "busybox", "command": ["/bin/sh", "-c", script],
                           "resources": {"claims": claims}}
    if env:
        ctr["env"] = env
    return ctr
