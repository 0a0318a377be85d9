"""TEST INFRASTRUCTURE: a kubelet stand-in speaking the real device-plugin protocol over real unix sockets.

Not used by any shipped component. Tests, the e2e harness and the demo start it so that the real device plugin
(a separate process, unmodified) has a peer that behaves like kubelet's device manager:

* serves `v1beta1.Registration` on `<dir>/kubelet.sock`; on Register it checks the version, dials the plugin's
  endpoint socket `<dir>/<endpoint>`, asks GetDevicePluginOptions and follows ListAndWatch, keeping per resource
  the device list and each device's health (a later Register of the same resource replaces the earlier one);
* `admit(pod)` admits a pod as kubelet does: containers in order (init containers, then containers); for every
  registered resource the container asks for, it picks devices (init-container devices are reused first, then
  GetPreferredAllocation if the plugin advertised it, else the first free healthy IDs) and calls Allocate with one
  container request, collecting the ContainerAllocateResponse per container and per resource; the fake device IDs
  in use are tracked until `release(pod_uid)`;
* serves the pod-resources API (`v1.PodResourcesLister.List`) on `<dir>/../pod-resources/kubelet.sock`, as
  kubelet does: a pod is listed from the moment its admission starts until `release(pod_uid)` (a failed
  admission releases it at once), and a container's devices of a resource appear once that resource's Allocate
  has returned; init containers are not listed;
* `restart()` simulates a kubelet restart: stops serving, deletes every socket in the directory (kubelet does
  this at start), forgets the registrations and serves a fresh `kubelet.sock`.

Hooks: `before_container(pod, container name)` runs before each device-requesting container is allocated
(tests use it to restart the plugin mid-admission). For running containers: `on_admitted(pod, allocations)` is
called after a successful admission with `allocations = {container name: [ContainerAllocateResponse, ...]}`
(testbed/podrunner.py turns those into processes). Standalone: `python -m vgpu.testbed.kubelet --kubelet-dir DIR`
serves registrations and prints the device counts whenever they change.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from vgpu.proto.deviceplugin.v1beta1 import api_pb2 as pb
from vgpu.proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from vgpu.proto.podresources.v1 import api_pb2 as pr
from vgpu.proto.podresources.v1 import api_pb2_grpc as pr_grpc
from vgpu.testbed.kubemath import QuantityError, parse_quantity

__all__ = ["VERSION", "AdmissionError", "AdmittedContainer", "KubeletStandIn", "ResourceState"]

log = logging.getLogger(__name__)

VERSION = "v1beta1"
HEALTHY = "Healthy"


class AdmissionError(Exception):
    """kubelet would reject the pod (UnexpectedAdmissionError or insufficient devices)."""


@dataclass
class ResourceState:
    """What kubelet knows about one registered resource."""

    name: str
    endpoint: str
    options: pb.DevicePluginOptions
    devices: dict[str, str] = field(default_factory=dict)  # fake ID -> health
    updates: int = 0  # ListAndWatch messages received
    last_update: float = 0.0
    connected: bool = False
    registrations: int = 1
    channel: grpc.Channel | None = None
    stub: pb_grpc.DevicePluginStub | None = None
    last_message_bytes: int = 0

    def healthy(self) -> list[str]:
        """IDs of healthy devices."""
        return [d for d, h in self.devices.items() if h == HEALTHY]


@dataclass
class AdmittedContainer:
    """The outcome of admitting one container."""

    name: str
    init: bool
    devices: dict[str, list[str]] = field(default_factory=dict)  # resource -> fake IDs
    responses: dict[str, pb.ContainerAllocateResponse] = field(default_factory=dict)

    def envs(self) -> dict[str, str]:
        """Envs of all responses merged as kubelet does (later resources win)."""
        merged: dict[str, str] = {}
        for response in self.responses.values():
            merged.update(response.envs)
        return merged

    def mounts(self) -> list[tuple[str, str, bool]]:
        """All mounts (container path, host path, read-only)."""
        return [(m.container_path, m.host_path, m.read_only) for r in self.responses.values() for m in r.mounts]


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: KubeletStandIn) -> None:
        self.kubelet = kubelet

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        if request.version != VERSION:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version!r}")
        if "/" not in request.resource_name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid resource name {request.resource_name!r}")
        self.kubelet._on_register(request)
        return pb.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: KubeletStandIn) -> None:
        self.kubelet = kubelet

    def List(self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext) -> pr.ListPodResourcesResponse:
        return pr.ListPodResourcesResponse(pod_resources=self.kubelet.pod_resources())


class KubeletStandIn:
    """kubelet's device manager, reduced to what a device plugin can observe."""

    def __init__(
        self,
        plugin_dir: str | os.PathLike[str],
        on_admitted: Callable[[dict[str, Any], dict[str, list[pb.ContainerAllocateResponse]]], None] | None = None,
        rpc_timeout: float = 10.0,
        before_container: Callable[[Mapping[str, Any], str], None] | None = None,
    ) -> None:
        self.dir = Path(plugin_dir)
        self.on_admitted = on_admitted
        self.rpc_timeout = rpc_timeout
        self.before_container = before_container
        self.resources: dict[str, ResourceState] = {}
        self.in_use: dict[str, dict[str, str]] = {}  # resource -> fake ID -> pod uid
        self.admitted: dict[str, list[AdmittedContainer]] = {}  # pods being admitted or admitted, by uid
        self.pod_names: dict[str, tuple[str, str]] = {}  # uid -> (namespace, name) of those pods
        self.cond = threading.Condition()
        self._server: grpc.Server | None = None
        self._generation = 0
        self._admit_lock = threading.Lock()

    # lifecycle ---------------------------------------------------------------------------------------------
    @property
    def socket(self) -> Path:
        """Path of the Registration socket."""
        return self.dir / "kubelet.sock"

    @property
    def pod_resources_socket(self) -> Path:
        """Path of the pod-resources socket (kubelet's layout: a sibling of the device-plugin directory)."""
        return self.dir.parent / "pod-resources" / "kubelet.sock"

    def start(self) -> KubeletStandIn:
        """Serve `kubelet.sock` and the pod-resources socket (directories are created if needed)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
        for path in (self.socket, self.pod_resources_socket):
            path.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.add_insecure_port(f"unix://{self.pod_resources_socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Stop serving and drop every plugin connection (sockets stay on disk)."""
        with self.cond:
            self._generation += 1
            states = list(self.resources.values())
            self.resources = {}
            self.cond.notify_all()
        for state in states:
            if state.channel is not None:
                state.channel.close()
        if self._server is not None:
            self._server.stop(grace=0).wait()
            self._server = None

    def restart(self) -> None:
        """Simulate a kubelet restart: stop, delete all sockets in the directory, serve a new kubelet.sock."""
        self.stop()
        for entry in self.dir.iterdir():
            if entry.is_socket():
                entry.unlink(missing_ok=True)
        self.start()

    def __enter__(self) -> KubeletStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # registration and ListAndWatch --------------------------------------------------------------------------
    def _on_register(self, request: pb.RegisterRequest) -> None:
        channel = grpc.insecure_channel(f"unix://{self.dir / request.endpoint}")
        state = ResourceState(
            name=request.resource_name,
            endpoint=request.endpoint,
            options=request.options,
            channel=channel,
            stub=pb_grpc.DevicePluginStub(channel),
        )
        with self.cond:
            old = self.resources.get(request.resource_name)
            if old is not None:
                state.registrations = old.registrations + 1
                if old.channel is not None:
                    old.channel.close()
            self.resources[request.resource_name] = state
            generation = self._generation
            self.cond.notify_all()
        threading.Thread(
            target=self._follow, args=(state, generation), name=f"law-{request.resource_name}", daemon=True
        ).start()

    def _follow(self, state: ResourceState, generation: int) -> None:
        assert state.stub is not None
        try:
            options = state.stub.GetDevicePluginOptions(pb.Empty(), timeout=self.rpc_timeout)
            with self.cond:
                state.options = options
            for message in state.stub.ListAndWatch(pb.Empty()):
                with self.cond:
                    if self._generation != generation or self.resources.get(state.name) is not state:
                        return
                    state.devices = {d.ID: d.health for d in message.devices}
                    state.updates += 1
                    state.last_update = time.monotonic()
                    state.last_message_bytes = message.ByteSize()
                    state.connected = True
                    self.cond.notify_all()
        except grpc.RpcError as exc:
            log.debug("ListAndWatch of %s ended: %s", state.name, exc)
        finally:
            with self.cond:
                state.connected = False
                self.cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Wait until `predicate()` (evaluated under the state lock) is true; False on timeout."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.1))
            return True

    def wait_registered(self, names: list[str] | tuple[str, ...], timeout: float = 10.0) -> bool:
        """Wait until every resource in `names` is registered and has sent its device list."""
        return self.wait_for(
            lambda: all(n in self.resources and self.resources[n].updates > 0 for n in names), timeout
        )

    def devices(self, resource: str) -> dict[str, str]:
        """Fake ID -> health of a resource (empty if not registered)."""
        with self.cond:
            state = self.resources.get(resource)
            return dict(state.devices) if state else {}

    # admission ------------------------------------------------------------------------------------------------
    def _needs(self, container: Mapping[str, Any]) -> list[tuple[str, int]]:
        resources = container.get("resources") or {}
        limits = dict(resources.get("requests") or {})
        limits.update(resources.get("limits") or {})
        wanted = []
        for name, raw in limits.items():
            if name in self.resources:
                exact = parse_quantity(raw)
                if exact.denominator != 1:  # the API server allows only whole extended resources
                    raise QuantityError(f"{name}: {raw!r} is not a whole number")
                count = int(exact)
                if count > 0:
                    wanted.append((name, count))
        return wanted

    def _pick(self, state: ResourceState, uid: str, count: int, reusable: list[str]) -> list[str]:
        in_use = self.in_use.setdefault(state.name, {})
        must = sorted(reusable)[:count]
        if len(must) == count:
            return must
        free = sorted(d for d in state.healthy() if d not in in_use and d not in must)
        if len(free) + len(must) < count:
            raise AdmissionError(
                f"resource {state.name}: requested {count}, available {len(free) + len(must)}"
            )
        if state.options.get_preferred_allocation_available and state.stub is not None:
            request = pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=free + must, must_include_deviceIDs=must, allocation_size=count
                    )
                ]
            )
            try:
                answer = state.stub.GetPreferredAllocation(request, timeout=self.rpc_timeout)
                chosen = list(answer.container_responses[0].deviceIDs) if answer.container_responses else []
                allowed = set(free) | set(must)
                if len(chosen) == count and set(chosen) <= allowed and set(must) <= set(chosen):
                    return chosen
            except grpc.RpcError as exc:
                log.info("GetPreferredAllocation of %s failed: %s", state.name, exc)
        return must + free[: count - len(must)]

    def admit(self, pod: Mapping[str, Any]) -> list[AdmittedContainer]:
        """Allocate devices for every container of `pod` in kubelet's order; raises AdmissionError."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
        spec = pod.get("spec") or {}
        ordered = [(c, True) for c in spec.get("initContainers") or ()] + [
            (c, False) for c in spec.get("containers") or ()
        ]
        with self._admit_lock:
            result: list[AdmittedContainer] = []
            with self.cond:
                self.admitted[uid] = result
                self.pod_names[uid] = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
            reusable: dict[str, list[str]] = {}  # devices of init containers, reused by later containers
            taken: dict[str, list[str]] = {}
            try:
                for container, is_init in ordered:
                    admitted = AdmittedContainer(name=str(container.get("name") or ""), init=is_init)
                    with self.cond:
                        result.append(admitted)
                    needs = self._needs(container)
                    if needs and self.before_container is not None:
                        self.before_container(pod, admitted.name)
                    for resource, count in needs:
                        # no grace for a plugin that is away: kubelet marks all its devices unhealthy the moment its
                        # ListAndWatch ends (devicemanager PluginDisconnected) and Allocate fails at once
                        with self.cond:
                            state = self.resources.get(resource)
                            if state is None or not state.connected or state.stub is None or not state.healthy():
                                raise AdmissionError(
                                    f"UnexpectedAdmissionError: Allocate failed due to no healthy devices present; "
                                    f"cannot allocate unhealthy devices {resource}, which is unexpected")
                        ids = self._pick(state, uid, count, reusable.get(resource, []))
                        try:
                            answer = state.stub.Allocate(
                                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]),
                                timeout=self.rpc_timeout,
                            )
                        except grpc.RpcError as exc:
                            raise AdmissionError(
                                f"UnexpectedAdmissionError: container {admitted.name!r} resource {resource}: "
                                f"{exc.details() if hasattr(exc, 'details') else exc}"
                            ) from None
                        if len(answer.container_responses) != 1:
                            raise AdmissionError(
                                f"resource {resource}: {len(answer.container_responses)} container responses for 1"
                            )
                        with self.cond:
                            for device in ids:
                                self.in_use.setdefault(resource, {})[device] = uid
                            admitted.devices[resource] = ids
                        taken.setdefault(resource, []).extend(ids)
                        if is_init:
                            reusable[resource] = sorted(set(reusable.get(resource, [])) | set(ids))
                        else:
                            reusable[resource] = [d for d in reusable.get(resource, []) if d not in ids]
                        admitted.responses[resource] = answer.container_responses[0]
            except Exception:
                self.release(uid)
                raise
        if self.on_admitted is not None:
            self.on_admitted(dict(pod), {c.name: list(c.responses.values()) for c in result})
        return result

    def release(self, pod_uid: str) -> None:
        """Free the devices of a pod (it ended or was deleted)."""
        with self.cond:
            for used in self.in_use.values():
                for device in [d for d, owner in used.items() if owner == pod_uid]:
                    del used[device]
            self.admitted.pop(pod_uid, None)
            self.pod_names.pop(pod_uid, None)

    def pod_resources(self) -> list[pr.PodResources]:
        """What the pod-resources API's List answers: pods being admitted or admitted, devices per container."""
        with self.cond:
            return [
                pr.PodResources(namespace=namespace, name=name, containers=[
                    pr.ContainerResources(name=c.name, devices=[
                        pr.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in c.devices.items()
                    ]) for c in self.admitted.get(uid, ()) if not c.init
                ]) for uid, (namespace, name) in self.pod_names.items()
            ]


def main(argv: list[str] | None = None) -> int:
    """Serve registrations in a directory and print device counts when they change."""
    parser = argparse.ArgumentParser(description="kubelet stand-in (test infrastructure)")
    parser.add_argument("--kubelet-dir", required=True, help="device-plugin directory to serve kubelet.sock in")
    args = parser.parse_args(argv)
    kubelet = KubeletStandIn(args.kubelet_dir).start()
    last: dict[str, tuple[int, int]] = {}
    try:
        while True:
            time.sleep(0.5)
            with kubelet.cond:
                now = {n: (len(s.devices), len(s.healthy())) for n, s in kubelet.resources.items()}
            if now != last:
                for name, (total, healthy) in sorted(now.items()):
                    print(f"{name}: {healthy}/{total} healthy", flush=True)
                last = now
    except KeyboardInterrupt:
        kubelet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
