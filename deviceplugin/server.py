"""The kubelet-facing side of the device plugin: the gRPC DevicePlugin services and their registration.

`DevicePluginManager` (started by deviceplugin.runtime) serves one `v1beta1.DevicePlugin` per resource on
`<kubelet dir>/nvidia-vgpu-{number,memory,cores}.sock`, registers each with kubelet once it is serving, streams the
fake devices (`<UUID>-<i>`, `<UUID>-memory-<i>`, `<UUID>-core-<i>`) and every health change through ListAndWatch,
and answers GetPreferredAllocation / Allocate (every Allocate call goes to allocator.Allocator, which returns the
container's env on whichever call fixes the match). In whole-GPU mode a fourth service advertises plain
`nvidia.com/gpu` (one device per GPU, ID = the GPU's UUID) on `nvidia-gpu.sock`. One watcher thread notices a
kubelet restart (its socket recreated, or ours deleted) and serves and registers again; one health thread applies
backend events. Neither is ever duplicated.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from vgpu.deviceplugin.allocator import Allocator, UnsafeName
from vgpu.deviceplugin.config import CORE_DEVICES_PER_GPU
from vgpu.deviceplugin.matching import AllocationError
from vgpu.errors import VGPUError
from vgpu.node.backends import GPUBackend, GPUInfo, HealthEvent
from vgpu.node.response import Allocation
from vgpu.proto.deviceplugin.v1beta1 import api_pb2 as pb
from vgpu.proto.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from vgpu.units import MemoryUnit

__all__ = [
    "CORES", "MEMORY", "NUMBER", "WHOLE", "DevicePluginManager", "DeviceState", "ResourceService", "socket_name",
]

log = logging.getLogger(__name__)

NUMBER, MEMORY, CORES, WHOLE = "number", "memory", "cores", "whole"
GPU_KINDS = (NUMBER, WHOLE)
VERSION = "v1beta1"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


def socket_name(resource_name: str) -> str:
    """`volcano.sh/vgpu-number` -> `nvidia-vgpu-number.sock` (the contract's socket names)."""
    return f"nvidia-{resource_name.rsplit('/', 1)[-1]}.sock"



# gRPC carries a status message in a header: clients drop a stream whose metadata exceeds 16 KiB
STATUS_DETAIL_LIMIT = 4000


def _status_detail(exc: Exception) -> str:
    """The error message for kubelet, cut to fit a gRPC status (the log keeps it whole)."""
    text = str(exc)
    if len(text) <= STATUS_DETAIL_LIMIT:
        return text
    return text[: STATUS_DETAIL_LIMIT - 60] + " ... (cut; the device plugin's log has the whole message)"

class DeviceState:
    """GPUs and their health, shared by the services; `version` increases on every change."""

    def __init__(self, gpus: list[GPUInfo]) -> None:
        self.gpus = list(gpus)
        self.health = {g.uuid: True for g in gpus}
        self.version = 0
        self.cond = threading.Condition()
        self.closed = False

    def set_health(self, uuid: str, healthy: bool) -> bool:
        """Record a health change; True if it changed anything."""
        with self.cond:
            if uuid not in self.health or self.health[uuid] == healthy:
                return False
            self.health[uuid] = healthy
            self.version += 1
            self.cond.notify_all()
            return True

    def snapshot(self) -> tuple[int, list[GPUInfo], dict[str, bool]]:
        """(version, gpus, health) taken atomically."""
        with self.cond:
            return self.version, list(self.gpus), dict(self.health)

    def wake(self) -> None:
        """Wake every waiter (used at shutdown)."""
        with self.cond:
            self.cond.notify_all()


@dataclass(frozen=True, slots=True)
class _FakeID:
    uuid: str
    minor: int
    index: int


# ListAndWatch streams one resource's server keeps open at once: kubelet holds one (two across its restart); each
# holds one of the server's SERVER_WORKERS threads for its life, so the others stay free for Allocate.
MAX_WATCHERS = 3
SERVER_WORKERS = 8


class ResourceService(pb_grpc.DevicePluginServicer):
    """One resource's DevicePlugin service."""

    def __init__(
        self,
        kind: str,
        resource_name: str,
        state: DeviceState,
        per_gpu: Callable[[GPUInfo], int],
        allocator: Allocator | None = None,
        on_allocate: Callable[[str, str, float], None] | None = None,
    ) -> None:
        self.kind = kind
        self.resource_name = resource_name
        self.state = state
        self.per_gpu = per_gpu
        self.allocator = allocator
        self.on_allocate = on_allocate  # (resource, result, seconds) of each container's Allocate call
        self.stopping = threading.Event()
        self._watchers = threading.BoundedSemaphore(MAX_WATCHERS)
        self._index: dict[str, _FakeID] = {}
        self._index_version = -1

    def _suffix(self, i: int) -> str:
        if self.kind == NUMBER:
            return f"-{i}"
        if self.kind == MEMORY:
            return f"-memory-{i}"
        if self.kind == WHOLE:
            return ""
        return f"-core-{i}"

    def device_list(self) -> pb.ListAndWatchResponse:
        """The full fake-device list for the current state."""
        _, gpus, health = self.state.snapshot()
        devices = []
        for gpu in gpus:
            status = HEALTHY if health.get(gpu.uuid) else UNHEALTHY
            # A share's GPU is the extender's choice, named in the pod's grant before kubelet admits it; a NUMA node
            # on a share would let kubelet's Topology Manager (any policy but none) offer Allocate only the devices
            # of the NUMA node it prefers, other GPUs than the grant's, and fail the pod. Only a whole GPU, which
            # kubelet itself chooses, says where it sits.
            numa = gpu.numa if self.kind == WHOLE else None
            topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=numa)]) if numa is not None else None
            for i in range(self.per_gpu(gpu)):
                devices.append(pb.Device(ID=gpu.uuid + self._suffix(i), health=status, topology=topology))
        return pb.ListAndWatchResponse(devices=devices)

    def _lookup(self, device_id: str) -> _FakeID | None:
        if self._index_version != 0:
            index = {}
            for gpu in self.state.gpus:
                for i in range(self.per_gpu(gpu)):
                    index[gpu.uuid + self._suffix(i)] = _FakeID(gpu.uuid, gpu.minor, i)
            self._index = index
            self._index_version = 0  # the set of GPUs never changes within a process; health does not matter
        return self._index.get(device_id)

    # gRPC --------------------------------------------------------------------------------------------------------
    def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        """Preferred allocation is offered; no PreStartContainer."""
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: pb.Empty,
                     context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        """Send the list now and again after every change, until kubelet or we go away; a stream beyond
        MAX_WATCHERS open ones is refused (RESOURCE_EXHAUSTED)."""
        if not self._watchers.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{MAX_WATCHERS} ListAndWatch streams of {self.resource_name} are open already")
        try:
            context.add_callback(self.state.wake)
            version = -1
            while not self.stopping.is_set() and context.is_active():
                with self.state.cond:
                    if self.state.version == version:
                        self.state.cond.wait(0.5)
                        continue
                    version = self.state.version
                yield self.device_list()
        finally:
            self._watchers.release()

    def GetPreferredAllocation(self, request: pb.PreferredAllocationRequest,
                               context: grpc.ServicerContext) -> pb.PreferredAllocationResponse:
        """Steer kubelet to IDs on the GPUs the scheduler chose (GPU resources); kubelet's first IDs otherwise."""
        responses = []
        for creq in request.container_requests:
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=self._prefer(creq)))
        return pb.PreferredAllocationResponse(container_responses=responses)

    def _prefer(self, creq: pb.ContainerPreferredAllocationRequest) -> list[str]:
        size = creq.allocation_size
        chosen = list(dict.fromkeys(creq.must_include_deviceIDs))
        if self.kind in GPU_KINDS and self.allocator is not None and len(chosen) < size:
            self._steer(chosen, size, creq.available_deviceIDs)
        # counting resources (memory, cores): any IDs do, so take kubelet's first ones and stop at the size
        taken = set(chosen)
        for d in creq.available_deviceIDs:
            if len(chosen) >= size:
                break
            if d not in taken and self._lookup(d) is not None:
                chosen.append(d)
                taken.add(d)
        return chosen[:size] if size > 0 else chosen

    def _steer(self, chosen: list[str], size: int, available_ids: Iterable[str]) -> None:
        """Add one ID on each GPU the scheduler chose for the container being admitted (distinct GPUs in minor
        order when no plan is known) to `chosen`."""
        assert self.allocator is not None
        taken = set(chosen)
        fakes = [(f, d) for d in available_ids if d not in taken and (f := self._lookup(d)) is not None]
        fakes.sort(key=lambda fd: (fd[0].minor, fd[0].index))
        by_gpu: dict[str, list[str]] = {}
        for fake, d in fakes:
            by_gpu.setdefault(fake.uuid, []).append(d)
        used_gpus = {f.uuid for d in chosen if (f := self._lookup(d)) is not None}
        try:
            gpus = self.allocator.preferred_gpus(self.resource_name, size, set(by_gpu) | used_gpus)
        except VGPUError as exc:
            log.info("event=preferred_lookup_failed error=%s", exc)
            gpus = None
        for uuid in [*(gpus or ()), *by_gpu]:
            if len(chosen) >= size:
                break
            if uuid not in used_gpus and by_gpu.get(uuid):
                chosen.append(by_gpu[uuid][0])
                used_gpus.add(uuid)

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        """The matched container's env, mounts and device specs on the call that fixes the match; else empty."""
        responses = []
        for creq in request.container_requests:
            if self.allocator is None:
                responses.append(pb.ContainerAllocateResponse())
                continue
            start = time.perf_counter()
            uuids = []
            for device_id in creq.devices_ids:
                fake = self._lookup(device_id)
                if fake is None:
                    self._observe("refused", start)
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown device {device_id!r}")
                uuids.append(fake.uuid)
            try:
                if self.kind in GPU_KINDS:
                    allocation = self.allocator.allocate_call(self.resource_name, uuids)
                else:
                    allocation = self.allocator.allocate_call(self.resource_name, count=len(uuids))
            except UnsafeName as exc:
                log.warning("event=allocate_failed resource=%s error=%s", self.resource_name, exc)
                self._observe("refused", start)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, _status_detail(exc))
            except AllocationError as exc:
                log.warning("event=allocate_failed resource=%s error=%s", self.resource_name, exc)
                self._observe("refused", start)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, _status_detail(exc))
            except VGPUError as exc:
                log.warning("event=allocate_failed resource=%s error=%s", self.resource_name, exc)
                self._observe("refused", start)
                context.abort(grpc.StatusCode.UNAVAILABLE, _status_detail(exc))
            self._observe("pending" if allocation is None else "answered", start)
            responses.append(container_response(allocation))
        return pb.AllocateResponse(container_responses=responses)

    def _observe(self, result: str, start: float) -> None:
        if self.on_allocate is not None:
            self.on_allocate(self.resource_name, result, time.perf_counter() - start)

    def PreStartContainer(self, request: pb.PreStartContainerRequest,
                          context: grpc.ServicerContext) -> pb.PreStartContainerResponse:
        """Nothing to do before a container starts."""
        return pb.PreStartContainerResponse()


def container_response(allocation: Allocation | None) -> pb.ContainerAllocateResponse:
    """The protobuf form of an Allocation (empty for None)."""
    if allocation is None:
        return pb.ContainerAllocateResponse()
    return pb.ContainerAllocateResponse(
        envs=allocation.envs,
        mounts=[pb.Mount(container_path=c, host_path=h, read_only=ro) for c, h, ro in allocation.mounts],
        devices=[pb.DeviceSpec(container_path=c, host_path=h, permissions=p) for c, h, p in allocation.devices],
        annotations=allocation.annotations,
    )


class _Served:
    """One gRPC server on one unix socket."""

    def __init__(self, service: ResourceService, path: Path) -> None:
        self.service = service
        self.path = path
        self.server: grpc.Server | None = None
        self.inode = 0

    def start(self) -> None:
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()
        self.service.stopping.clear()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=SERVER_WORKERS,
                                                        thread_name_prefix=self.path.stem))
        pb_grpc.add_DevicePluginServicer_to_server(self.service, server)
        server.add_insecure_port(f"unix://{self.path}")
        server.start()
        self.server = server
        self.inode = os.stat(self.path).st_ino

    def stop(self) -> None:
        self.service.stopping.set()
        self.service.state.wake()
        if self.server is not None:
            self.server.stop(grace=0.2).wait()
            self.server = None
        try:
            if self.path.exists() and os.stat(self.path).st_ino == self.inode:
                self.path.unlink()
        except OSError:
            pass

    def alive(self) -> bool:
        try:
            return self.server is not None and os.stat(self.path).st_ino == self.inode
        except OSError:
            return False


class DevicePluginManager:
    """Serves and registers the three resources, follows health, re-registers after kubelet restarts."""

    def __init__(
        self,
        kubelet_dir: str,
        backend: GPUBackend,
        state: DeviceState,
        resource_names: dict[str, str],
        *,
        split_count: int,
        memory_factor: int,
        allocator: Allocator | None,
        on_allocate: Callable[[str, str, float], None] | None = None,
        on_health_change: Callable[[HealthEvent], None] | None = None,
        poll_interval: float = 0.2,
        health_filter: Callable[[HealthEvent], bool] | None = None,
    ) -> None:
        self.dir = Path(kubelet_dir)
        self.backend = backend
        self.state = state
        self.on_health_change = on_health_change
        self.poll_interval = poll_interval
        self.health_filter = health_filter
        per_gpu = {
            NUMBER: lambda g: split_count,
            MEMORY: lambda g: MemoryUnit(memory_factor).units(g.memory_mib),
            CORES: lambda g: CORE_DEVICES_PER_GPU,
            WHOLE: lambda g: 1,
        }
        self.services = {
            kind: ResourceService(kind, name, state, per_gpu[kind], allocator, on_allocate)
            for kind, name in resource_names.items()
        }
        self.served = {
            kind: _Served(svc, self.dir / socket_name(svc.resource_name)) for kind, svc in self.services.items()
        }
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._kubelet_inode = 0
        self.registrations = 0

    @property
    def kubelet_socket(self) -> Path:
        """kubelet's Registration socket."""
        return self.dir / "kubelet.sock"

    def _serve(self) -> None:
        for served in self.served.values():
            served.stop()
            served.start()

    def _register(self) -> bool:
        """Register every resource; False if kubelet is not reachable (retried by the watcher)."""
        try:
            inode = os.stat(self.kubelet_socket).st_ino
        except OSError:
            return False
        try:
            with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
                stub = pb_grpc.RegistrationStub(channel)
                for served in self.served.values():
                    stub.Register(
                        pb.RegisterRequest(
                            version=VERSION,
                            endpoint=served.path.name,
                            resource_name=served.service.resource_name,
                            options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
                        ),
                        timeout=5,
                    )
        except grpc.RpcError as exc:
            log.warning("event=register_failed kubelet=%s error=%s", self.kubelet_socket, exc.details() or exc)
            return False
        self._kubelet_inode = inode
        self.registrations += 1
        log.info("event=registered kubelet=%s resources=%d", self.kubelet_socket, len(self.served))
        return True

    def start(self) -> None:
        """Serve, register (retrying in the background if kubelet is absent), start the watcher and health loop."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._serve()
        self._registered = self._register()
        for target, name in ((self._watch, "kubelet-watch"), (self._health, "health")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _kubelet_restarted(self) -> bool:
        try:
            inode = os.stat(self.kubelet_socket).st_ino
        except OSError:
            return False  # kubelet is down; register once it is back
        return inode != self._kubelet_inode

    def _watch(self) -> None:
        last_attempt = 0.0
        while not self._stop.wait(self.poll_interval):
            ours_gone = any(not s.alive() for s in self.served.values())
            if ours_gone or (self._registered and self._kubelet_restarted()):
                log.info("event=kubelet_restart_detected sockets_gone=%s", ours_gone)
                self._serve()
                self._registered = False
                last_attempt = 0.0
            if not self._registered and time.monotonic() - last_attempt >= 1.0:
                last_attempt = time.monotonic()
                self._registered = self._register()

    def _health(self) -> None:
        while not self._stop.is_set():
            try:
                events = self.backend.poll_health(0.2)
            except Exception as exc:
                log.warning("event=health_poll_failed error=%s", exc)
                time.sleep(1.0)
                continue
            for event in events:
                if self.health_filter is not None and not self.health_filter(event):
                    log.info("event=health_ignored uuid=%s healthy=%s reason=%s", event.uuid, event.healthy,
                             event.reason)
                    continue
                if self.state.set_health(event.uuid, event.healthy):
                    log.info("event=health uuid=%s healthy=%s reason=%s", event.uuid, event.healthy, event.reason)
                    if self.on_health_change is not None:
                        self.on_health_change(event)

    def stop(self) -> None:
        """Stop the loops and the servers; remove our sockets."""
        self._stop.set()
        for served in self.served.values():
            served.stop()
        for thread in self._threads:
            thread.join(timeout=2)
