"""The kubelet-facing gRPC side: the DRA node service (v1 and v1beta1), the device-health stream and the
plugin-registration service.

`DRAServers.start()` removes stale sockets, serves `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` and its v1beta1 twin
from one implementation on the DRA socket, then `pluginregistration.Registration` on the registration socket in
kubelet's registry directory (kubelet's plugin watcher finds it there and calls GetInfo, then
NotifyRegistrationStatus). Both DRA calls are batched: every claim of the request is answered under its UID, a
failed claim carries its `error`, and no claim's failure fails the call or another claim. `v1.DRAResourceHealth`
(on the DRA socket) streams every device's health at once and again at each change.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from vgpu.dra import DRIVER, device_name
from vgpu.draplugin.checkpoint import PreparedClaim, PreparedDevice
from vgpu.draplugin.health import DeviceHealthState, GPUHealth
from vgpu.draplugin.prepare import ClaimPreparer, ClaimRef
from vgpu.errors import VGPUError
from vgpu.proto.dra.v1 import api_pb2 as dra_v1
from vgpu.proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from vgpu.proto.drahealth.v1 import api_pb2 as health_pb
from vgpu.proto.pluginregistration.v1 import api_pb2 as reg

__all__ = ["DRA_VERSIONS", "PLUGIN_TYPE", "DRAServers", "HealthService"]

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# Health streams served at once: kubelet holds one (two across its restart); each holds one of the SERVER_WORKERS
# threads of the server that also prepares claims.
MAX_WATCHERS = 3
SERVER_WORKERS = 8
# the service versions served, as told to kubelet, and their generated messages
DRA_VERSIONS: dict[str, ModuleType] = {"v1.DRAPlugin": dra_v1, "v1beta1.DRAPlugin": dra_v1beta1}


def _claim_error(exc: Exception, verb: str, ref: ClaimRef) -> str:
    if isinstance(exc, VGPUError):
        return str(exc)
    log.exception("event=claim_%s_failed claim=%s/%s uid=%s", verb, ref[0], ref[1], ref[2])
    return f"claim {ref[0]}/{ref[1]} ({ref[2]}): internal error: {type(exc).__name__}: {exc}"


class DRANodeService:
    """NodePrepareResources / NodeUnprepareResources for one version's messages (`pb`), backed by the preparer."""

    def __init__(self, pb: ModuleType, preparer: ClaimPreparer) -> None:
        self.pb = pb
        self.preparer = preparer

    def _device(self, device: PreparedDevice) -> Any:
        message = self.pb.Device(request_names=list(device.request_names), pool_name=device.pool,
                                 device_name=device.device, cdi_device_ids=list(device.cdi_device_ids))
        if device.share_id is not None:
            message.share_id = device.share_id
        return message

    def prepare(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Prepare each claim of the request; the answer is keyed by claim UID."""
        response = self.pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            ref: ClaimRef = (claim.namespace, claim.name, claim.uid)
            entry = response.claims[claim.uid]
            try:
                prepared: PreparedClaim = self.preparer.prepare(ref)
            except Exception as exc:
                entry.error = _claim_error(exc, "prepare", ref)
                log.warning("event=claim_prepare_refused claim=%s/%s uid=%s error=%s", *ref, entry.error)
                continue
            entry.devices.extend(self._device(d) for d in prepared.devices)
        return response

    def unprepare(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Unprepare each claim of the request; the answer is keyed by claim UID."""
        response = self.pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            ref: ClaimRef = (claim.namespace, claim.name, claim.uid)
            entry = response.claims[claim.uid]
            try:
                self.preparer.unprepare(ref)
            except Exception as exc:
                entry.error = _claim_error(exc, "unprepare", ref)
                log.warning("event=claim_unprepare_failed claim=%s/%s uid=%s error=%s", *ref, entry.error)
        return response

    def handler(self) -> grpc.GenericRpcHandler:
        """The gRPC handler of this version's DRAPlugin service (its package's method paths)."""
        pb = self.pb
        service = pb.DESCRIPTOR.services_by_name["DRAPlugin"].full_name
        return grpc.method_handlers_generic_handler(service, {
            "NodePrepareResources": grpc.unary_unary_rpc_method_handler(
                self.prepare, request_deserializer=pb.NodePrepareResourcesRequest.FromString,
                response_serializer=pb.NodePrepareResourcesResponse.SerializeToString),
            "NodeUnprepareResources": grpc.unary_unary_rpc_method_handler(
                self.unprepare, request_deserializer=pb.NodeUnprepareResourcesRequest.FromString,
                response_serializer=pb.NodeUnprepareResourcesResponse.SerializeToString),
        })


class HealthService:
    """`v1.DRAResourceHealth/NodeWatchResources`: the health of every device of this node's pool, sent when the
    stream opens and again whenever a GPU's health changes, until kubelet closes it or the plugin stops."""

    def __init__(self, node: str, health: GPUHealth, check_seconds: float = 1.0) -> None:
        self.node = node
        self.health = health
        self.check_seconds = check_seconds  # how often a quiet stream looks whether it is still wanted
        self.stopping = threading.Event()
        self._watchers = threading.BoundedSemaphore(MAX_WATCHERS)

    def _response(self, states: list[DeviceHealthState]) -> health_pb.NodeWatchResourcesResponse:
        return health_pb.NodeWatchResourcesResponse(devices=[
            health_pb.DeviceHealth(
                device=health_pb.DeviceIdentifier(pool_name=self.node, device_name=device_name(s.gpu.nvml_index)),
                health=health_pb.HEALTHY if s.healthy else health_pb.UNHEALTHY,
                last_updated_time=s.since, message=s.reason)
            for s in states])

    def watch(self, request: health_pb.NodeWatchResourcesRequest,
              context: grpc.ServicerContext) -> Iterator[health_pb.NodeWatchResourcesResponse]:
        """The stream: the current states, then each change; a stream beyond MAX_WATCHERS open ones is refused
        (RESOURCE_EXHAUSTED), so that streams never hold every worker of the server that also prepares claims."""
        if not self._watchers.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{MAX_WATCHERS} health streams are open already")
        try:
            sent = -1
            while context.is_active() and not self.stopping.is_set():
                version, states = self.health.snapshot()
                if version != sent:
                    sent = version
                    yield self._response(states)
                self.health.wait_change(sent, self.check_seconds)
        finally:
            self._watchers.release()

    def handler(self) -> grpc.GenericRpcHandler:
        """The gRPC handler of `v1.DRAResourceHealth`."""
        service = health_pb.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name
        return grpc.method_handlers_generic_handler(service, {
            "NodeWatchResources": grpc.unary_stream_rpc_method_handler(
                self.watch, request_deserializer=health_pb.NodeWatchResourcesRequest.FromString,
                response_serializer=health_pb.NodeWatchResourcesResponse.SerializeToString),
        })


class RegistrationService:
    """`pluginregistration.Registration`: who we are, and kubelet's verdict."""

    def __init__(self, endpoint: Path, on_registered: Callable[[], None]) -> None:
        self.endpoint = endpoint
        self.on_registered = on_registered

    def get_info(self, request: reg.InfoRequest, context: grpc.ServicerContext) -> reg.PluginInfo:
        """Type DRAPlugin, the driver name, the DRA socket and the versions served."""
        return reg.PluginInfo(type=PLUGIN_TYPE, name=DRIVER, endpoint=str(self.endpoint),
                              supported_versions=list(DRA_VERSIONS))

    def notify(self, request: reg.RegistrationStatus,
               context: grpc.ServicerContext) -> reg.RegistrationStatusResponse:
        """Log kubelet's verdict (an error when it refused the plugin); a registration calls `on_registered`."""
        if request.plugin_registered:
            log.info("event=registered_with_kubelet driver=%s endpoint=%s", DRIVER, self.endpoint)
            self.on_registered()
        else:
            log.error("event=registration_refused driver=%s endpoint=%s error=%s", DRIVER, self.endpoint,
                      request.error or "(none given)")
        return reg.RegistrationStatusResponse()

    def handler(self) -> grpc.GenericRpcHandler:
        """The gRPC handler of `pluginregistration.Registration`."""
        service = reg.DESCRIPTOR.services_by_name["Registration"].full_name
        return grpc.method_handlers_generic_handler(service, {
            "GetInfo": grpc.unary_unary_rpc_method_handler(
                self.get_info, request_deserializer=reg.InfoRequest.FromString,
                response_serializer=reg.PluginInfo.SerializeToString),
            "NotifyRegistrationStatus": grpc.unary_unary_rpc_method_handler(
                self.notify, request_deserializer=reg.RegistrationStatus.FromString,
                response_serializer=reg.RegistrationStatusResponse.SerializeToString),
        })


def _remove_socket(path: Path) -> None:
    try:
        path.unlink()
        log.info("event=socket_removed path=%s", path)
    except FileNotFoundError:
        pass


class DRAServers:
    """The two gRPC servers on their unix sockets."""

    def __init__(self, preparer: ClaimPreparer, dra_socket: Path, registration_socket: Path,
                 on_registered: Callable[[], None], health: HealthService) -> None:
        self.preparer = preparer
        self.health = health
        self.on_registered = on_registered
        self.dra_socket = dra_socket.absolute()
        self.registration_socket = registration_socket.absolute()
        self.servers: list[tuple[grpc.Server, Path]] = []

    def start(self) -> None:
        """Serve the DRA services, then the registration service (kubelet may call GetInfo at once)."""
        for path in (self.dra_socket, self.registration_socket):
            path.parent.mkdir(parents=True, exist_ok=True)
            _remove_socket(path)
        handlers = [DRANodeService(pb, self.preparer).handler() for pb in DRA_VERSIONS.values()]
        handlers.append(self.health.handler())
        self._serve(self.dra_socket, handlers, "dra")
        registration = RegistrationService(self.dra_socket, self.on_registered)
        self._serve(self.registration_socket, [registration.handler()], "reg")
        log.info("event=serving dra_socket=%s registration_socket=%s versions=%s", self.dra_socket,
                 self.registration_socket, ",".join(DRA_VERSIONS))

    def _serve(self, path: Path, handlers: list[grpc.GenericRpcHandler], name: str) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=SERVER_WORKERS, thread_name_prefix=f"dra-{name}"))
        server.add_generic_rpc_handlers(tuple(handlers))
        if server.add_insecure_port(f"unix://{path}") == 0:
            raise VGPUError(f"cannot listen on {path}")
        server.start()
        self.servers.append((server, path))

    def stop(self) -> None:
        """Stop serving (registration first, so kubelet stops calling) and remove our sockets."""
        self.health.stopping.set()  # open health streams end instead of holding their workers
        for server, path in reversed(self.servers):
            server.stop(grace=2).wait(5)
            _remove_socket(path)
        self.servers = []
