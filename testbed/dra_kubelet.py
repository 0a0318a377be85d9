"""TEST INFRASTRUCTURE: kubelet's Dynamic Resource Allocation side (DRA plugins, claim preparation, CDI edits).

Written from kubelet's published behaviour (pkg/kubelet/cm/dra and the plugin manager), never from the DRA plugin
it tests. `DRAKubelet` bundles:

* `DRAPlugins`, the handler of plugin type `DRAPlugin` for the plugin watcher (testbed/plugin_watcher.py): a plugin
  must offer version `v1.DRAPlugin`; its endpoint (an absolute socket path) must answer within `connect_timeout`;
  a later registration of the same driver takes over, and when its socket goes the earlier one (if still there)
  serves again; a re-registered driver gets its pending unprepares retried at once;
* `DRAManager.prepare(pod)`, what kubelet does before a pod's containers start: each of `spec.resourceClaims` is
  resolved to a ResourceClaim name (`resourceClaimName`, or for a template the pod's
  `status.resourceClaimStatuses` entry, whose claim must be owned by the pod; no name there means nothing to do),
  plus the special claim of `status.extendedResourceClaimStatus`; each claim is read from the API server and must be
  reserved for the pod (`status.reservedFor` has its UID) and allocated; its drivers must be registered;
  NodePrepareResources is called once per driver with all its claims not prepared yet (a claim shared by pods is
  prepared once; the claim cache counts the pods using it); a per-claim error, an answer for an unknown claim or a
  missing answer fails with a message naming the claim. The CDI device IDs returned are then resolved per container
  (the claims it lists in `resources.claims[]`, narrowed to the devices of `request` when one is named; for the
  extended-resource claim, the requests mapped to the container's DRA-backed extended resources) against the CDI
  specs on disk (testbed/cdi.py); an unknown ID fails the preparation too;
* `DRAManager.unprepare(pod_uid)`, once the pod's containers are gone: claims no other pod uses are unprepared with
  NodeUnprepareResources, per driver and batched, from a worker thread; a failure is retried `unprepare_attempts`
  times with a growing delay, then logged and parked until the driver registers again;
* the device-health stream, only when the `ResourceHealthStatus` feature gate is on (`resource_health_status`,
  default off as in kubelet 1.34 and 1.35; 1.36 turns it on by default). Each registration gets its own stream,
  cancelled when the registration goes. As released in kubelet 1.34 to 1.36 it dials
  `v1alpha1.DRAResourceHealth/NodeWatchResources` whatever the registration lists, and after any end of the
  stream, Unimplemented included, dials again `health_retry` seconds later (kubelet: 5 s). With
  `health_from_registration` it behaves as kubelet with kubernetes/kubernetes#139477 (and the 1.36 backport
  #141858): only a plugin listing `v1.DRAResourceHealth` or `v1alpha1.DRAResourceHealth` (v1 preferred) is
  watched, and Unimplemented ends the watching. Every response is reconciled into the health cache
  (`DeviceHealthCache`, kubelet's healthinfo.go): a reported device is Healthy, Unhealthy or Unknown as of its
  receipt, a device not heard of for its timeout (`health_check_timeout_seconds`, else 30 s) reads Unknown, and
  the driver's entries are dropped whenever its stream ends. `DRAManager.allocated_resources_status(pod)` gives
  what kubelet writes into each container status's `allocatedResourcesStatus` from that cache.

The claim cache is kept in `state_file` (JSON) when one is given, so a restarted node agent still knows which claims
are prepared for which pods, as kubelet's checkpoint does.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from vgpu.proto.dra.v1 import api_pb2 as dra
from vgpu.proto.dra.v1 import api_pb2_grpc as dra_grpc
from vgpu.proto.drahealth.v1 import api_pb2 as health_v1
from vgpu.proto.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from vgpu.testbed.cdi import CDIError, CDIRegistry, ContainerEdits
from vgpu.testbed.plugin_watcher import PluginWatcher

__all__ = [
    "PLUGIN_TYPE",
    "SUPPORTED_VERSIONS",
    "ClaimInfo",
    "DRAKubelet",
    "DRAManager",
    "DRAPlugins",
    "DeviceHealthCache",
    "DriverRegistration",
    "PodPreparation",
    "PrepareError",
    "PreparedDevice",
]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin",)
"""Service versions this stand-in speaks, preferred first."""
HEALTH_V1 = "v1.DRAResourceHealth"
HEALTH_V1ALPHA1 = "v1alpha1.DRAResourceHealth"
RELEASED_HEALTH_SERVICE = HEALTH_V1ALPHA1
"""The one health service kubelets 1.34 to 1.36 dial."""
HEALTH_SERVICES = (HEALTH_V1, HEALTH_V1ALPHA1)
"""Health services a kubelet with kubernetes#139477 takes from the registration, preferred first."""
HEALTH_MESSAGES = {HEALTH_V1: health_v1, HEALTH_V1ALPHA1: health_v1alpha1}
HEALTH_RETRY_SECONDS = 5.0
DEFAULT_HEALTH_TIMEOUT = 30.0
MAX_HEALTH_MESSAGE = 1024


def wait_on(cond: threading.Condition, predicate: Callable[[], bool], timeout: float) -> bool:
    """Wait on `cond` until `predicate()` (evaluated under it) holds; False on timeout."""
    deadline = time.monotonic() + timeout
    with cond:
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            cond.wait(min(left, 0.1))
        return True

class PrepareError(Exception):
    """A pod's claims could not be prepared; kubelet keeps the pod waiting and tries again."""


@dataclass(slots=True)
class DriverRegistration:
    """A registered DRA plugin: its driver name, service endpoint and the registration socket it came from."""

    name: str
    endpoint: str
    socket: Path
    versions: tuple[str, ...]
    channel: grpc.Channel
    stub: dra_grpc.DRAPluginStub
    health: HealthStream | None = None


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """What the health cache knows of one device: status (Healthy, Unhealthy, Unknown), message, timeout (seconds)
    and when it was last reported (the cache's clock)."""

    pool: str
    device: str
    health: str
    message: str
    timeout: float
    received: float


def _health_name(pb: Any, value: int) -> str:
    if value == pb.HEALTHY:
        return "Healthy"
    if value == pb.UNHEALTHY:
        return "Unhealthy"
    return "Unknown"


def _short_message(text: str) -> str:
    if len(text) <= MAX_HEALTH_MESSAGE:
        return text
    return text[:MAX_HEALTH_MESSAGE - 3] + "..."


class DeviceHealthCache:
    """Kubelet's cache of device health per driver, keyed `pool/device` (pkg/kubelet/cm/dra/healthinfo.go)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self._drivers: dict[str, dict[str, DeviceHealth]] = {}

    def update(self, driver: str, response: Any, pb: Any) -> list[DeviceHealth]:
        """Reconcile one NodeWatchResourcesResponse; the entries that changed. Reported devices count from now;
        a known device left out turns Unknown once its timeout passed."""
        now = self.clock()
        changed: list[DeviceHealth] = []
        with self.lock:
            known = self._drivers.setdefault(driver, {})
            reported = set()
            for d in response.devices:
                seconds = d.health_check_timeout_seconds
                entry = DeviceHealth(d.device.pool_name, d.device.device_name, _health_name(pb, d.health),
                                     _short_message(d.message),
                                     float(seconds) if seconds > 0 else DEFAULT_HEALTH_TIMEOUT, now)
                key = f"{entry.pool}/{entry.device}"
                reported.add(key)
                old = known.get(key)
                if old is None or (old.health, old.message, old.timeout) != (entry.health, entry.message,
                                                                            entry.timeout):
                    changed.append(entry)
                known[key] = entry
            for key, old in list(known.items()):
                if key not in reported and old.health != "Unknown" and now - old.received > old.timeout:
                    known[key] = DeviceHealth(old.pool, old.device, "Unknown", "", old.timeout, now)
                    changed.append(known[key])
        return changed

    def get(self, driver: str, pool: str, device: str) -> tuple[str, str]:
        """(status, message) of a device: Unknown and no message when never reported or stale."""
        with self.lock:
            entry = self._drivers.get(driver, {}).get(f"{pool}/{device}")
            if entry is None or self.clock() - entry.received > entry.timeout:
                return "Unknown", ""
            return entry.health, entry.message

    def clear(self, driver: str) -> None:
        """Forget the driver (its stream ended)."""
        with self.lock:
            self._drivers.pop(driver, None)

    def snapshot(self) -> dict[str, dict[str, str]]:
        """driver -> `pool/device` -> status, as `get` reads it."""
        with self.lock:
            drivers = {name: list(devices.values()) for name, devices in self._drivers.items()}
        return {name: {f"{e.pool}/{e.device}": self.get(name, e.pool, e.device)[0] for e in entries}
                for name, entries in drivers.items()}


class HealthStream:
    """One registration's health stream: a thread that keeps `NodeWatchResources` of `service` open on the
    registration's connection and feeds its responses to the plugins' health cache."""

    def __init__(self, plugins: DRAPlugins, registration: DriverRegistration, service: str) -> None:
        self.plugins = plugins
        self.registration = registration
        self.service = service
        self.pb = HEALTH_MESSAGES[service]
        self._stop = threading.Event()
        self._call: Any = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"dra-health-{registration.name}", daemon=True)

    def start(self) -> HealthStream:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Cancel the stream and end the thread."""
        self._stop.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5)

    def _run(self) -> None:
        name = self.registration.name
        method = self.registration.channel.unary_stream(
            f"/{self.service}/NodeWatchResources",
            request_serializer=self.pb.NodeWatchResourcesRequest.SerializeToString,
            response_deserializer=self.pb.NodeWatchResourcesResponse.FromString)
        while not self._stop.is_set():
            self.plugins._health_dialled(name, self.service)
            code: grpc.StatusCode | None = None
            try:
                call = method(self.pb.NodeWatchResourcesRequest())
                with self._lock:
                    self._call = call
                if self._stop.is_set():
                    call.cancel()
                for response in call:
                    self.plugins._health_report(name, response, self.pb)
            except grpc.RpcError as exc:
                code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
            except ValueError:  # the channel was closed under us: the registration went
                code = grpc.StatusCode.CANCELLED
            finally:
                with self._lock:
                    self._call = None
                self.plugins._health_ended(name, self.service, code)
            if self._stop.is_set():
                return
            if code == grpc.StatusCode.UNIMPLEMENTED and self.plugins.health_from_registration:
                log.info("event=dra-health-unimplemented driver=%s service=%s", name, self.service)
                return
            self._stop.wait(self.plugins.health_retry)


class DRAPlugins:
    """Registered DRA drivers (the plugin watcher's handler for type `DRAPlugin`)."""

    def __init__(self, connect_timeout: float = 2.0, resource_health_status: bool = False,
                 health_from_registration: bool = False, health_retry: float = HEALTH_RETRY_SECONDS,
                 health_clock: Callable[[], float] = time.monotonic) -> None:
        self.connect_timeout = connect_timeout
        self.resource_health_status = resource_health_status  # kubelet's ResourceHealthStatus feature gate
        self.health_from_registration = health_from_registration
        self.health_retry = health_retry
        self.health = DeviceHealthCache(health_clock)
        self.health_calls: dict[str, list[str]] = {}  # driver -> health services dialled, one entry per call
        self.health_ends: dict[str, list[str]] = {}  # driver -> how each stream ended (status code name, or EOF)
        self.cond = threading.Condition()
        self._by_name: dict[str, list[DriverRegistration]] = {}  # newest last
        self.registrations = 0  # successful registrations so far
        self.on_registered: list[Callable[[str], None]] = []
        self.on_gone: list[Callable[[str], None]] = []  # a driver's last registration went
        self.on_health_changed: list[Callable[[str, list[DeviceHealth]], None]] = []

    def validate_plugin(self, name: str, endpoint: str, versions: list[str]) -> None:
        """ValueError unless the plugin names itself and its endpoint and offers a version we speak."""
        if not name:
            raise ValueError("DRA plugin: empty driver name")
        if not any(v in versions for v in SUPPORTED_VERSIONS):
            raise ValueError(f"DRA plugin {name}: none of the versions {versions} is supported "
                             f"(supported: {', '.join(SUPPORTED_VERSIONS)})")
        if not endpoint or not os.path.isabs(endpoint):
            raise ValueError(f"DRA plugin {name}: endpoint {endpoint!r} is not an absolute socket path")

    def register_plugin(self, name: str, endpoint: str, versions: list[str], socket: Path) -> None:
        """Dial the endpoint and take the driver into use; ValueError when it does not answer."""
        channel = grpc.insecure_channel(f"unix://{endpoint}")
        try:
            grpc.channel_ready_future(channel).result(timeout=self.connect_timeout)
        except grpc.FutureTimeoutError:
            channel.close()
            raise ValueError(f"DRA plugin {name}: endpoint {endpoint} is not reachable") from None
        entry = DriverRegistration(name, endpoint, socket, tuple(versions), channel,
                                   dra_grpc.DRAPluginStub(channel))
        replaced: list[DriverRegistration] = []
        with self.cond:
            stack = self._by_name.setdefault(name, [])
            for old in [r for r in stack if r.socket == socket]:
                stack.remove(old)
                replaced.append(old)
            stack.append(entry)
            self.registrations += 1
            self.cond.notify_all()
        for old in replaced:
            self._drop(old)
        service = self.health_service(versions)
        if service is not None:
            entry.health = HealthStream(self, entry, service).start()
        log.info("event=dra-driver-registered driver=%s endpoint=%s", name, endpoint)
        for callback in self.on_registered:
            callback(name)

    def deregister_plugin(self, name: str, socket: Path) -> None:
        """Forget the registration made through `socket` (an earlier one of the driver serves again)."""
        with self.cond:
            stack = self._by_name.get(name, [])
            removed = [r for r in stack if r.socket == socket]
            for old in removed:
                stack.remove(old)
            gone = not stack
            if gone:
                self._by_name.pop(name, None)
            self.cond.notify_all()
        for old in removed:
            self._drop(old)
        log.info("event=dra-driver-deregistered driver=%s socket=%s", name, socket)
        if gone:
            for callback in self.on_gone:
                callback(name)

    @staticmethod
    def _drop(entry: DriverRegistration) -> None:
        """A registration went: cancel its health stream, close its connection."""
        if entry.health is not None:
            entry.health.stop()
        entry.channel.close()

    # -- device health
    def health_service(self, versions: Iterable[str]) -> str | None:
        """The health service a registration with these versions is watched through; None: not watched."""
        if not self.resource_health_status:
            return None
        if not self.health_from_registration:
            return RELEASED_HEALTH_SERVICE
        offered = set(versions)
        return next((s for s in HEALTH_SERVICES if s in offered), None)

    def _health_dialled(self, name: str, service: str) -> None:
        with self.cond:
            self.health_calls.setdefault(name, []).append(service)
            self.cond.notify_all()

    def _health_report(self, name: str, response: Any, pb: Any) -> None:
        changed = self.health.update(name, response, pb)
        with self.cond:
            self.cond.notify_all()
        if changed:
            log.info("event=dra-health-changed driver=%s devices=%s", name,
                     ",".join(f"{d.pool}/{d.device}={d.health}" for d in changed))
            for callback in self.on_health_changed:
                callback(name, changed)

    def _health_ended(self, name: str, service: str, code: grpc.StatusCode | None) -> None:
        self.health.clear(name)
        with self.cond:
            self.health_ends.setdefault(name, []).append(code.name if code is not None else "EOF")
            self.cond.notify_all()
        log.info("event=dra-health-stream-ended driver=%s service=%s code=%s", name, service,
                 code.name if code is not None else "EOF")

    def wait_health(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Wait until `predicate()` holds (checked at each health event); False on timeout."""
        return self._wait(predicate, timeout)

    def get(self, name: str) -> DriverRegistration | None:
        """The registration in use for a driver, or None."""
        with self.cond:
            stack = self._by_name.get(name)
            return stack[-1] if stack else None

    def _wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        return wait_on(self.cond, predicate, timeout)

    def wait_registered(self, name: str, present: bool = True, timeout: float = 10.0) -> bool:
        """Wait until the driver is registered (or, with present=False, no longer); False on timeout."""
        return self._wait(lambda: bool(self._by_name.get(name)) == present, timeout)

    def wait_for_endpoint(self, name: str, endpoint: str, timeout: float = 10.0) -> bool:
        """Wait until the driver's registration in use has this endpoint; False on timeout."""
        return self._wait(lambda: bool(self._by_name.get(name)) and self._by_name[name][-1].endpoint == endpoint,
                          timeout)

    def drivers(self) -> dict[str, str]:
        """Driver name -> endpoint in use."""
        with self.cond:
            return {name: stack[-1].endpoint for name, stack in self._by_name.items() if stack}

    def close(self) -> None:
        """Close every connection."""
        with self.cond:
            entries = [entry for stack in self._by_name.values() for entry in stack]
            self._by_name.clear()
        for entry in entries:
            self._drop(entry)


@dataclass(slots=True)
class PreparedDevice:
    """One device a driver prepared for a claim."""

    driver: str
    pool: str
    device: str
    request_names: list[str]
    cdi_device_ids: list[str]
    share_id: str | None = None

    def serves(self, request: str) -> bool:
        """Whether a container asking for `request` ("" = the whole claim) gets this device: a device without
        request names serves every container of the claim, otherwise its names must hold `request` exactly
        (kubernetes pkg/kubelet/cm/dra/claiminfo.go `cdiDevicesAsList`, `slices.Contains`); a driver that answers
        `request/alternative` for a firstAvailable result serves no container."""
        if not request or not self.request_names:
            return True
        return request in self.request_names


@dataclass(slots=True)
class ClaimInfo:
    """The claim cache's entry for one ResourceClaim on this node."""

    uid: str
    namespace: str
    name: str
    drivers: list[str]
    pod_uids: set[str] = field(default_factory=set)
    devices: dict[str, list[PreparedDevice]] = field(default_factory=dict)  # per driver that prepared it
    unprepared: set[str] = field(default_factory=set)  # drivers that unprepared it
    attempts: int = 0  # failed unprepare attempts
    next_try: float = 0.0

    @property
    def prepared(self) -> bool:
        """Every driver of the claim prepared it."""
        return all(d in self.devices for d in self.drivers)

    def as_claim(self) -> dra.Claim:
        """The claim's identity on the wire."""
        return dra.Claim(namespace=self.namespace, uid=self.uid, name=self.name)


@dataclass(slots=True)
class PodPreparation:
    """What preparing a pod gave: the claims it uses and, per container, the CDI devices and their edits."""

    uid: str
    claims: list[str]
    cdi_devices: dict[str, list[str]]
    edits: dict[str, ContainerEdits]


def _claim_from_dict(raw: Obj) -> ClaimInfo:
    info = ClaimInfo(uid=raw["uid"], namespace=raw["namespace"], name=raw["name"], drivers=list(raw["drivers"]),
                     pod_uids=set(raw.get("pod_uids") or ()), unprepared=set(raw.get("unprepared") or ()))
    info.devices = {driver: [PreparedDevice(**d) for d in devices]
                    for driver, devices in (raw.get("devices") or {}).items()}
    return info


class DRAManager:
    """Prepares and unprepares a node's ResourceClaims (see the module docstring)."""

    def __init__(self, api_client: Any, plugins: DRAPlugins, cdi: CDIRegistry, state_file: Path | None = None,
                 rpc_timeout: float = 10.0, unprepare_attempts: int = 5, retry_delay: float = 0.2) -> None:
        from kubernetes import client as k8s

        self.resource = k8s.ResourceV1Api(api_client)
        self.plugins = plugins
        self.cdi = cdi
        self.state_file = state_file
        self.rpc_timeout = rpc_timeout
        self.unprepare_attempts = unprepare_attempts
        self.retry_delay = retry_delay
        self.cond = threading.Condition()
        self.claims: dict[tuple[str, str], ClaimInfo] = {}  # (namespace, name) -> entry
        self.pending: dict[str, ClaimInfo] = {}  # claim uid -> entry no pod uses any more, to unprepare
        self.pods: dict[str, PodPreparation] = {}  # pod uid -> last successful preparation
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.health_updates: list[set[str]] = []  # per health change that touched prepared claims: the pod UIDs
        self._load()
        plugins.on_registered.append(self._driver_back)
        plugins.on_health_changed.append(self._health_changed)

    # -- lifecycle
    def start(self) -> DRAManager:
        """Start the unprepare worker."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._unprepare_loop, name="dra-unprepare", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the worker (pending unprepares stay in the state file)."""
        self._stop.set()
        with self.cond:
            self.cond.notify_all()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Wait until `predicate()` (evaluated under the lock) holds; False on timeout."""
        return wait_on(self.cond, predicate, timeout)

    # -- state file
    def _load(self) -> None:
        if self.state_file is None or not self.state_file.exists():
            return
        try:
            raw = json.loads(self.state_file.read_text())
            claims = [_claim_from_dict(c) for c in raw.get("claims") or ()]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("event=dra-state-unreadable path=%s error=%s", self.state_file, exc)
            return
        for info in claims:
            if info.pod_uids:
                self.claims[(info.namespace, info.name)] = info
            else:
                self.pending[info.uid] = info

    def _save(self) -> None:
        """Write the claim cache (callers hold the lock)."""
        if self.state_file is None:
            return
        entries = list(self.claims.values()) + [c for c in self.pending.values()
                                                 if self.claims.get((c.namespace, c.name)) is not c]
        data = {"claims": [{**asdict(c), "pod_uids": sorted(c.pod_uids), "unprepared": sorted(c.unprepared)}
                           for c in entries]}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.state_file)

    # -- prepare
    def prepare(self, pod: Mapping[str, Any]) -> PodPreparation:
        """Prepare the pod's claims and resolve each container's CDI edits; PrepareError says why not."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        namespace = str(meta.get("namespace") or "default")
        by_pod_claim, extended = self._claim_names(pod)
        names = list(dict.fromkeys([n for n in by_pod_claim.values() if n] + ([extended] if extended else [])))
        owned = {n for pc, n in by_pod_claim.items() if n and self._from_template(pod, pc)}
        claims = [self._fetch(pod, name, must_own=name in owned) for name in names]
        batches: dict[str, list[ClaimInfo]] = {}
        with self.cond:
            for claim in claims:
                cmeta = claim["metadata"]
                drivers = list(dict.fromkeys(r.get("driver") or "" for r in _results(claim)))
                key = (namespace, cmeta["name"])
                info = self.claims.get(key)
                if info is None:
                    info = self.pending.pop(cmeta["uid"], None) or ClaimInfo(cmeta["uid"], namespace, cmeta["name"],
                                                                             drivers)
                    for driver in info.unprepared:  # a claim taken back before all its drivers unprepared it
                        info.devices.pop(driver, None)
                    info.unprepared.clear()
                    self.claims[key] = info
                elif info.uid != cmeta["uid"]:
                    raise PrepareError(f"an older ResourceClaim {cmeta['name']} with UID {info.uid} is still in use "
                                       f"on this node (the new one has UID {cmeta['uid']})")
                info.pod_uids.add(uid)
                for driver in info.drivers:
                    if driver not in info.devices:
                        batches.setdefault(driver, []).append(info)
            self._save()
        for driver, infos in batches.items():
            self._prepare_batch(driver, infos)
        edits, devices = self._container_edits(pod, by_pod_claim, extended)
        preparation = PodPreparation(uid=uid, claims=names, cdi_devices=devices, edits=edits)
        with self.cond:
            self.pods[uid] = preparation
            self.cond.notify_all()
        return preparation

    @staticmethod
    def _from_template(pod: Mapping[str, Any], pod_claim: str) -> bool:
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
            if entry.get("name") == pod_claim:
                return not entry.get("resourceClaimName")
        return False

    @staticmethod
    def _claim_names(pod: Mapping[str, Any]) -> tuple[dict[str, str | None], str | None]:
        """pod claim name -> ResourceClaim name (None: no claim was generated), and the extended-resource claim."""
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        generated = {s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or ()}
        out: dict[str, str | None] = {}
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
            name = str(entry.get("name") or "")
            if entry.get("resourceClaimName"):
                out[name] = str(entry["resourceClaimName"])
            elif entry.get("resourceClaimTemplateName"):
                if name not in generated:
                    raise PrepareError(f"pod {meta.get('namespace')}/{meta.get('name')}: no ResourceClaim generated "
                                       f"yet for {name!r} (status.resourceClaimStatuses has no entry)")
                out[name] = generated[name] or None
            else:
                raise PrepareError(f"pod {meta.get('namespace')}/{meta.get('name')}: resourceClaims entry {name!r} "
                                   "names neither resourceClaimName nor resourceClaimTemplateName")
        extended = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName") or None
        return out, extended

    def _fetch(self, pod: Mapping[str, Any], name: str, must_own: bool) -> Obj:
        from kubernetes.client.exceptions import ApiException

        from vgpu.testbed.kubeclient import read_json

        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        namespace = str(meta.get("namespace") or "default")
        try:
            claim: Obj = read_json(self.resource.read_namespaced_resource_claim(name, namespace,
                                                                                _preload_content=False))
        except ApiException as exc:
            raise PrepareError(f"fetch ResourceClaim {name}: {exc.status} {exc.reason}") from None
        except Exception as exc:
            raise PrepareError(f"fetch ResourceClaim {name}: {type(exc).__name__}: {exc}") from None
        cmeta = claim.get("metadata") or {}
        if must_own and not any(o.get("uid") == uid and o.get("controller")
                                for o in cmeta.get("ownerReferences") or ()):
            raise PrepareError(f"ResourceClaim {name} was not created for pod {namespace}/{meta.get('name')} "
                               "(the pod is not its owner)")
        status = claim.get("status") or {}
        if not any(r.get("uid") == uid for r in status.get("reservedFor") or ()):
            raise PrepareError(f"pod {meta.get('name')} ({uid}) is not allowed to use ResourceClaim {name} "
                               f"({cmeta.get('uid')}): it is not reserved for the pod")
        if not status.get("allocation"):
            raise PrepareError(f"ResourceClaim {name} is not allocated")
        if not _results(claim):
            raise PrepareError(f"ResourceClaim {name}: its allocation has no device results")
        for driver in dict.fromkeys(r.get("driver") or "" for r in _results(claim)):
            if self.plugins.get(driver) is None:
                raise PrepareError(f"ResourceClaim {name}: DRA driver {driver} is not registered")
        return claim

    def _prepare_batch(self, driver: str, infos: list[ClaimInfo]) -> None:
        plugin = self.plugins.get(driver)
        if plugin is None:
            raise PrepareError(f"DRA driver {driver} is not registered")
        request = dra.NodePrepareResourcesRequest(claims=[i.as_claim() for i in infos])
        try:
            response = plugin.stub.NodePrepareResources(request, timeout=self.rpc_timeout)
        except grpc.RpcError as exc:
            raise PrepareError(f"NodePrepareResources ({driver}): {_rpc_error(exc)}") from None
        by_uid = {i.uid: i for i in infos}
        for claim_uid, result in response.claims.items():
            info = by_uid.get(claim_uid)
            if info is None:
                raise PrepareError(f"NodePrepareResources ({driver}) answered for unknown claim UID {claim_uid}")
            if result.error:
                raise PrepareError(f"NodePrepareResources failed for ResourceClaim {info.name}: {result.error}")
            devices = [PreparedDevice(driver, d.pool_name, d.device_name, list(d.request_names),
                                      list(d.cdi_device_ids), d.share_id if d.HasField("share_id") else None)
                       for d in result.devices]
            with self.cond:
                info.devices[driver] = devices
                self._save()
            log.info("event=dra-claim-prepared driver=%s claim=%s/%s devices=%d", driver, info.namespace,
                     info.name, len(devices))
        missing = [i.name for i in infos if i.uid not in response.claims]
        if missing:
            raise PrepareError(f"NodePrepareResources ({driver}) skipped {len(missing)} ResourceClaims: "
                               f"{', '.join(missing)}")

    def _container_edits(self, pod: Mapping[str, Any], by_pod_claim: Mapping[str, str | None],
                         extended: str | None) -> tuple[dict[str, ContainerEdits], dict[str, list[str]]]:
        namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
        spec = pod.get("spec") or {}
        mappings = ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get("requestMappings") or ()
        edits: dict[str, ContainerEdits] = {}
        devices: dict[str, list[str]] = {}
        for ctr in list(spec.get("initContainers") or ()) + list(spec.get("containers") or ()):
            name = str(ctr.get("name") or "")
            wanted: list[tuple[str, str]] = []
            for ref in (ctr.get("resources") or {}).get("claims") or ():
                claim = by_pod_claim.get(str(ref.get("name") or ""))
                if claim:
                    wanted.append((claim, str(ref.get("request") or "")))
            if extended:
                asked = _extended_resources(ctr)
                wanted += [(extended, str(m.get("requestName") or "")) for m in mappings
                           if m.get("containerName") == name and m.get("resourceName") in asked]
            ids: list[str] = []
            with self.cond:
                for claim, request in wanted:
                    info = self.claims.get((namespace, claim))
                    if info is None:
                        raise PrepareError(f"container {name}: ResourceClaim {claim} is not prepared")
                    for per_driver in info.devices.values():
                        for device in per_driver:
                            if device.serves(request):
                                ids.extend(device.cdi_device_ids)
            ids = list(dict.fromkeys(ids))
            if not ids:
                continue
            try:
                edits[name] = self.cdi.resolve(ids)
            except CDIError as exc:
                raise PrepareError(f"container {name}: {exc}") from None
            devices[name] = ids
        return edits, devices

    # -- unprepare
    def unprepare(self, pod_uid: str) -> None:
        """The pod's containers are gone: queue its claims that no other pod uses for NodeUnprepareResources."""
        with self.cond:
            self.pods.pop(pod_uid, None)
            for key, info in list(self.claims.items()):
                if pod_uid not in info.pod_uids:
                    continue
                info.pod_uids.discard(pod_uid)
                if not info.pod_uids:
                    del self.claims[key]
                    info.attempts, info.next_try = 0, 0.0
                    self.pending[info.uid] = info
            self._save()
            self.cond.notify_all()

    # -- device health
    def _health_changed(self, driver: str, changed: list[DeviceHealth]) -> None:
        """Which pods use a device whose health changed (kubelet then syncs their status)."""
        keys = {(d.pool, d.device) for d in changed}
        with self.cond:
            infos = list(self.claims.values()) + list(self.pending.values())
            pods = {uid for info in infos
                    if any((d.pool, d.device) in keys for d in info.devices.get(driver, ()))
                    for uid in info.pod_uids}
            if pods:
                self.health_updates.append(pods)
                self.cond.notify_all()

    def allocated_resources_status(self, pod: Mapping[str, Any]) -> dict[str, list[Obj]]:
        """Container name -> the `allocatedResourcesStatus` kubelet gives it from the health cache: per claim the
        container names (`claim:<name>` or `claim:<name>/<request>`), every device the claim got, as `resourceID`
        (its first CDI device ID, else `<driver>/<pool>/<device>`), `health` and, when the plugin sent one,
        `message`. As kubelet does, only claims found through `status.resourceClaimStatuses` count, only regular
        containers are covered, a claim this node has not prepared gives nothing, and with the ResourceHealthStatus
        gate off there is no such status at all."""
        if not self.plugins.resource_health_status:
            return {}
        namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
        generated = {s.get("name"): s.get("resourceClaimName")
                     for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()}
        out: dict[str, list[Obj]] = {}
        for ctr in (pod.get("spec") or {}).get("containers") or ():
            statuses: dict[str, Obj] = {}
            for ref in (ctr.get("resources") or {}).get("claims") or ():
                claim = generated.get(ref.get("name"))
                if not claim:
                    continue
                with self.cond:
                    info = self.claims.get((namespace, claim))
                    devices = [d for per_driver in info.devices.values() for d in per_driver] if info else []
                if info is None:
                    continue
                name = f"claim:{ref['name']}" + (f"/{ref['request']}" if ref.get("request") else "")
                resources = []
                for device in devices:
                    health, message = self.plugins.health.get(device.driver, device.pool, device.device)
                    entry: Obj = {"resourceID": device.cdi_device_ids[0] if device.cdi_device_ids
                                  else f"{device.driver}/{device.pool}/{device.device}", "health": health}
                    if message:
                        entry["message"] = message
                    resources.append(entry)
                statuses[name] = {"name": name, "resources": resources}
            kept = [status for status in statuses.values() if status["resources"]]
            if kept:
                out[str(ctr.get("name") or "")] = kept
        return out

    def prepared_claims(self, pod_uid: str) -> list[ClaimInfo]:
        """The cache entries a pod uses."""
        with self.cond:
            return [info for info in self.claims.values() if pod_uid in info.pod_uids]

    def _driver_back(self, driver: str) -> None:
        with self.cond:
            for info in self.pending.values():
                if driver in info.drivers:
                    info.next_try = 0.0
            self.cond.notify_all()

    def _unprepare_loop(self) -> None:
        while not self._stop.is_set():
            with self.cond:
                now = time.monotonic()
                due = [i for i in self.pending.values() if i.next_try <= now]
                if not due:
                    soonest = min((i.next_try for i in self.pending.values()), default=math.inf)
                    self.cond.wait(min(1.0, max(0.01, soonest - now)))
                    continue
            batches: dict[str, list[ClaimInfo]] = {}
            for info in due:
                for driver in info.drivers:
                    if driver not in info.unprepared:
                        batches.setdefault(driver, []).append(info)
            failed: dict[str, str] = {}  # claim uid -> error
            for driver, infos in batches.items():
                failed.update(self._unprepare_batch(driver, infos))
            with self.cond:
                for info in due:
                    if info.uid in failed:
                        info.attempts += 1
                        if info.attempts >= self.unprepare_attempts:
                            info.next_try = math.inf
                            log.warning("event=dra-unprepare-gave-up claim=%s/%s attempts=%d error=%s",
                                        info.namespace, info.name, info.attempts, failed[info.uid])
                        else:
                            info.next_try = time.monotonic() + self.retry_delay * 2 ** (info.attempts - 1)
                    elif all(d in info.unprepared for d in info.drivers):
                        self.pending.pop(info.uid, None)
                        log.info("event=dra-claim-unprepared claim=%s/%s", info.namespace, info.name)
                self._save()
                self.cond.notify_all()

    def _unprepare_batch(self, driver: str, infos: list[ClaimInfo]) -> dict[str, str]:
        plugin = self.plugins.get(driver)
        if plugin is None:
            return {i.uid: f"DRA driver {driver} is not registered" for i in infos}
        request = dra.NodeUnprepareResourcesRequest(claims=[i.as_claim() for i in infos])
        try:
            response = plugin.stub.NodeUnprepareResources(request, timeout=self.rpc_timeout)
        except grpc.RpcError as exc:
            return {i.uid: f"NodeUnprepareResources ({driver}): {_rpc_error(exc)}" for i in infos}
        failed = {}
        for info in infos:
            result = response.claims.get(info.uid)
            if result is None:
                failed[info.uid] = f"NodeUnprepareResources ({driver}) skipped ResourceClaim {info.name}"
            elif result.error:
                failed[info.uid] = f"NodeUnprepareResources failed for ResourceClaim {info.name}: {result.error}"
            else:
                with self.cond:
                    info.unprepared.add(driver)
        for uid, error in failed.items():
            log.info("event=dra-unprepare-failed driver=%s claim_uid=%s error=%s", driver, uid, error)
        return failed


def _results(claim: Mapping[str, Any]) -> list[Obj]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or ())


def _extended_resources(container: Mapping[str, Any]) -> set[str]:
    """Names the container asks for a non-zero amount of (requests, or limits, which default requests)."""
    from vgpu.testbed.kubemath import parse_quantity

    resources = container.get("resources") or {}
    asked: set[str] = set()
    for table in (resources.get("limits") or {}, resources.get("requests") or {}):
        for name, raw in table.items():
            try:
                if parse_quantity(raw) != 0:
                    asked.add(str(name))
            except ValueError:
                continue
    return asked


def _rpc_error(exc: grpc.RpcError) -> str:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    return f"{code.name if code else 'error'}: {details}"


class SliceWiper:
    """What kubelet does to the ResourceSlices of its node (kubernetes pkg/kubelet/cm/dra/plugin/
    dra_plugin_manager.go, `wipeResourceSlices`): at its start it deletes every driver's slices of the node, and
    when a driver's last plugin deregisters it deletes that driver's slices after a delay (30 s: time for a
    replacement plugin to come back), which a new registration of the driver cancels."""

    def __init__(self, api_client: Any, node_name: str, delay: float = 30.0) -> None:
        from kubernetes import client as k8s

        self.resource: Any = k8s.ResourceV1Api(api_client)
        self.node_name = node_name
        self.delay = delay
        self._timers: dict[str, threading.Timer] = {}
        self._lock = threading.Lock()

    def wipe(self, driver: str = "") -> int:
        """Delete the node's slices (of `driver` only, when given); how many went."""
        from vgpu.testbed.kubeclient import read_json

        listed = read_json(self.resource.list_resource_slice(field_selector=f"spec.nodeName={self.node_name}",
                                                             _preload_content=False)) or {}
        gone = 0
        for item in listed.get("items") or ():
            if driver and (item.get("spec") or {}).get("driver") != driver:
                continue
            try:
                self.resource.delete_resource_slice(item["metadata"]["name"], _preload_content=False)
                gone += 1
            except Exception as exc:  # already gone, or the API server is away: kubelet retries, we log
                log.info("event=dra-slice-wipe-failed slice=%s error=%s", item["metadata"]["name"], exc)
        log.info("event=dra-slices-wiped node=%s driver=%s count=%d", self.node_name, driver or "*", gone)
        return gone

    def driver_gone(self, driver: str) -> None:
        """Schedule the driver's wipe."""
        timer = threading.Timer(self.delay, self._wipe_later, (driver,))
        timer.daemon = True
        with self._lock:
            old = self._timers.pop(driver, None)
            self._timers[driver] = timer
        if old is not None:
            old.cancel()
        timer.start()

    def driver_back(self, driver: str) -> None:
        """A registration of the driver cancels its pending wipe."""
        with self._lock:
            timer = self._timers.pop(driver, None)
        if timer is not None:
            timer.cancel()

    def _wipe_later(self, driver: str) -> None:
        with self._lock:
            if driver not in self._timers:
                return
            del self._timers[driver]
        try:
            self.wipe(driver)
        except Exception as exc:
            log.info("event=dra-slice-wipe-failed driver=%s error=%s", driver, exc)

    def stop(self) -> None:
        with self._lock:
            timers, self._timers = list(self._timers.values()), {}
        for timer in timers:
            timer.cancel()


class DRAKubelet:
    """The DRA side of one node's kubelet: plugin watcher, registered drivers, claim manager, CDI registry,
    (given the node's name) the wiping of its ResourceSlices, and (with `resource_health_status`, kubelet's
    ResourceHealthStatus gate) the device-health streams."""

    def __init__(self, registry_dir: str | Path, cdi_dirs: Iterable[str | Path], api_client: Any,
                 state_file: Path | None = None, rpc_timeout: float = 10.0, unprepare_attempts: int = 5,
                 retry_delay: float = 0.2, watch_interval: float = 0.1, node_name: str | None = None,
                 wipe_delay: float = 30.0, resource_health_status: bool = False,
                 health_from_registration: bool = False, health_retry: float = HEALTH_RETRY_SECONDS) -> None:
        self.plugins = DRAPlugins(resource_health_status=resource_health_status,
                                  health_from_registration=health_from_registration, health_retry=health_retry)
        self.wiper = SliceWiper(api_client, node_name, wipe_delay) if node_name else None
        if self.wiper is not None:
            self.plugins.on_registered.append(self.wiper.driver_back)
            self.plugins.on_gone.append(self.wiper.driver_gone)
        self.watcher = PluginWatcher(registry_dir, {PLUGIN_TYPE: self.plugins}, interval=watch_interval)
        self.cdi = CDIRegistry(list(cdi_dirs))
        self.manager = DRAManager(api_client, self.plugins, self.cdi, state_file=state_file, rpc_timeout=rpc_timeout,
                                  unprepare_attempts=unprepare_attempts, retry_delay=retry_delay)

    def start(self) -> DRAKubelet:
        """Start watching for plugins and the unprepare worker."""
        for directory in self.cdi.dirs:
            directory.mkdir(parents=True, exist_ok=True)
        if self.wiper is not None:  # before any plugin registers: their republishing follows the wipe
            try:
                self.wiper.wipe()
            except Exception as exc:
                log.warning("event=dra-slice-wipe-failed node=%s error=%s", self.wiper.node_name, exc)
        self.manager.start()
        self.watcher.start()
        return self

    def stop(self) -> None:
        """Stop watching, stop the worker, close plugin connections."""
        self.watcher.stop()
        if self.wiper is not None:
            self.wiper.stop()
        self.manager.stop()
        self.plugins.close()

    def drivers(self) -> dict[str, str]:
        """Registered driver -> endpoint."""
        return self.plugins.drivers()

    def status(self) -> dict[str, Any]:
        """Registered drivers, rejected plugin sockets, per pod the prepared claims and container edits, and the
        device health heard from the drivers."""
        with self.manager.cond:
            pods = {uid: {"claims": list(p.claims), "cdiDevices": dict(p.cdi_devices),
                          "edits": {name: e.as_dict() for name, e in p.edits.items()}}
                    for uid, p in self.manager.pods.items()}
            pending = sorted(f"{i.namespace}/{i.name}" for i in self.manager.pending.values())
        with self.watcher.cond:
            rejected = {str(path): error for path, error in self.watcher.rejected.items()}
        return {"drivers": self.drivers(), "rejected": rejected, "pods": pods, "pendingUnprepare": pending,
                "deviceHealth": self.plugins.health.snapshot()}
