"""The kubelet-facing gRPC side: the DRA node service (v1 and v1beta1), the device-health stream and the
plugin-registration service.

`DRAServers.start()` removes stale sockets, serves `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` and its v1beta1 twin
from one implementation on the DRA socket, then `pluginregistration.Registration` on the registration socket in
kubelet's registry directory (kubelet's plugin watcher finds it there and calls GetInfo, then
NotifyRegistrationStatus). Both DRA calls are batched: every claim of the request is answered under its UID, a
failed claim carries its `error`, and no claim's failure fails the call or another claim.

The device-health stream `DRAResourceHealth/NodeWatchResources` is served on the DRA socket under both packages
kubelet dials: `v1alpha1` (kubelets 1.34 to 1.36, with their `ResourceHealthStatus` feature gate on) and `v1` (kubelet
from kubernetes/kubernetes#139477 on, which prefers it). It sends every device's health at once, again at each change
and at least every RESEND_SECONDS, because kubelet takes a device it has not heard of for 30 s as Unknown. Both
services are listed in the registration's `supported_versions` after the DRAPlugin versions: a 1.34 to 1.36 kubelet
only picks its DRAPlugin version from that list and dials the health stream regardless, while kubelets with #139477
(and the 1.36 backport #141858) open the stream only for a plugin that lists it.
"""

from __future__ import annotations

import logging
import threading
import time
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
from vgpu.proto.drahealth.v1 import api_pb2 as health_v1
from vgpu.proto.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from vgpu.proto.pluginregistration.v1 import api_pb2 as reg

__all__ = ["DRA_VERSIONS", "HEALTH_VERSIONS", "PLUGIN_TYPE", "SUPPORTED_SERVICES", "DRAServers", "HealthService"]

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# Health streams served at once: kubelet holds one (two across its restart); each holds one of the SERVER_WORKERS
# threads of the server that also prepares claims.
MAX_WATCHERS = 3
SERVER_WORKERS = 8
# How often an open health stream repeats the current states when nothing changed: kubelet marks a device Unknown
# when it has heard nothing of it for its health timeout (30 s unless the device sets its own).
RESEND_SECONDS = 10.0
# the service versions served, as told to kubelet, and their generated messages
DRA_VERSIONS: dict[str, ModuleType] = {"v1.DRAPlugin": dra_v1, "v1beta1.DRAPlugin": dra_v1beta1}
HEALTH_VERSIONS: dict[str, ModuleType] = {"v1.DRAResourceHealth": health_v1,
                                          "v1alpha1.DRAResourceHealth": health_v1alpha1}
# `supported_versions` of the registration: the DRAPlugin versions first (kubelet picks the first it speaks), then the
# optional health service
SUPPORTED_SERVICES: tuple[str, ...] = (*DRA_VERSIONS, *HEALTH_VERSIONS)


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
    """`DRAResourceHealth/NodeWatchResources` in each package of HEALTH_VERSIONS: the health of every device of this
    node's pool, sent when the stream opens, again whenever a GPU's health changes and at least every
    `resend_seconds`, until kubelet closes it or the plugin stops. The packages differ only in name on the wire."""

    def __init__(self, node: str, health: GPUHealth, check_seconds: float = 1.0,
                 resend_seconds: float = RESEND_SECONDS) -> None:
        self.node = node
        self.health = health
        self.check_seconds = check_seconds  # how often a quiet stream looks whether it is still wanted
        self.resend_seconds = resend_seconds
        self.stopping = threading.Event()
        self._watchers = threading.BoundedSemaphore(MAX_WATCHERS)

    def _response(self, pb: ModuleType, states: list[DeviceHealthState]) -> Any:
        return pb.NodeWatchResourcesResponse(devices=[
            pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name=self.node, device_name=device_name(s.gpu.nvml_index)),
                health=pb.HEALTHY if s.healthy else pb.UNHEALTHY,
                last_updated_time=s.since, message=s.reason)
            for s in states])

    def _watch(self, pb: ModuleType, context: grpc.ServicerContext) -> Iterator[Any]:
        """The stream: the current states, then each change (or the same again after `resend_seconds`); a stream
        beyond MAX_WATCHERS open ones (all packages together) is refused (RESOURCE_EXHAUSTED), so that streams never
        hold every worker of the server that also prepares claims."""
        if not self._watchers.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{MAX_WATCHERS} health streams are open already")
        try:
            sent, sent_at = -1, 0.0
            while context.is_active() and not self.stopping.is_set():
                version, states = self.health.snapshot()
                if version != sent or time.monotonic() - sent_at >= self.resend_seconds:
                    sent, sent_at = version, time.monotonic()
                    yield self._response(pb, states)
                left = self.resend_seconds - (time.monotonic() - sent_at)
                self.health.wait_change(sent, max(0.0, min(self.check_seconds, left)))
        finally:
            self._watchers.release()

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        """The gRPC handlers of `DRAResourceHealth`, one per package of HEALTH_VERSIONS."""
        found = []
        for pb in HEALTH_VERSIONS.values():
            service = pb.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name

            def watch(request: Any, context: grpc.ServicerContext, pb: ModuleType = pb) -> Iterator[Any]:
                return self._watch(pb, context)

            found.append(grpc.method_handlers_generic_handler(service, {
                "NodeWatchResources": grpc.unary_stream_rpc_method_handler(
                    watch, request_deserializer=pb.NodeWatchResourcesRequest.FromString,
                    response_serializer=pb.NodeWatchResourcesResponse.SerializeToString),
            }))
        return found


class RegistrationService:
    """`pluginregistration.Registration`: who we are, and kubelet's verdict."""

    def __init__(self, endpoint: Path, on_registered: Callable[[], None]) -> None:
        self.endpoint = endpoint
        self.on_registered = on_registered

    def get_info(self, request: reg.InfoRequest, context: grpc.ServicerContext) -> reg.PluginInfo:
        """Type DRAPlugin, the driver name, the DRA socket and the services served (SUPPORTED_SERVICES)."""
        return reg.PluginInfo(type=PLUGIN_TYPE, name=DRIVER, endpoint=str(self.endpoint),
                              supported_versions=list(SUPPORTED_SERVICES))

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
        handlers.extend(self.health.handlers())
        self._serve(self.dra_socket, handlers, "dra")
        registration = RegistrationService(self.dra_socket, self.on_registered)
        self._serve(self.registration_socket, [registration.handler()], "reg")
        log.info("event=serving dra_socket=%s registration_socket=%s versions=%s", self.dra_socket,
                 self.registration_socket, ",".join(SUPPORTED_SERVICES))

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
