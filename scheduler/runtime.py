"""Wiring of a running extender: API client, node and pod watch caches feeding the ledger, leader election,
event recorder, metrics server, and the FastAPI app. Used by `vgpu scheduler` (vgpu.scheduler.cli) and by tests that
run the extender in-process against the API-server stand-in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s

from vgpu.errors import ConfigError, VGPUError
from vgpu.grants import read_key
from vgpu.httpserve import parse_listen
from vgpu.kube import EventRecorder, LeaderElector, LeaseFollower, WatchCache, bind_pod, make_api_client
from vgpu.kube.cache import Backoff
from vgpu.kube.client import read_object
from vgpu.kube.errors import ApiError, ConflictError, NotFoundError, translate
from vgpu.kube.eviction import evict_pod
from vgpu.quota import LimitedNamespaces
from vgpu.scheduler.claimpath import NO_CLAIMS, DRAPlacement
from vgpu.scheduler.config import SchedulerConfig
from vgpu.scheduler.draview import DRAView
from vgpu.scheduler.extender import BindConflict, Extender
from vgpu.scheduler.ledger import Ledger
from vgpu.scheduler.metrics import SchedulerMetrics
from vgpu.scheduler.policies import make_policy
from vgpu.scheduler.preemption import Preemptor
from vgpu.scheduler.server import create_app

__all__ = ["SchedulerRuntime"]

log = logging.getLogger(__name__)

# seconds between two sweeps of expired reservations (requests sweep too; this covers an idle extender)
EXPIRY_INTERVAL = 1.0
RETRY_INTERVAL = 1.0  # how often the pods whose preemption a budget blocked are looked at (each when it is due)
BIND_ATTEMPTS = 6  # a binding turned away (429, 503) is sent at most this often
# seconds a read of a pod the cache does not hold waits for the pod watch to deliver it before asking the API server
POD_ARRIVAL_WAIT = 0.002


class SchedulerRuntime:
    """Everything `vgpu scheduler` runs, built from a SchedulerConfig; `start()` then serve `app`."""

    def __init__(self, config: SchedulerConfig, api_client: k8s.ApiClient | None = None) -> None:
        self.config = config
        self.api = api_client or make_api_client(config.kubeconfig, config.qps, config.burst)
        # bindings retry in _bind, checking the leader lease before each attempt
        self.bind_api = make_api_client(config.kubeconfig, config.qps, config.burst, retries=False) \
            if api_client is None else api_client
        # the reads of pods the cache lacks (/filter, /bind): a rate limit of their own, so that they never wait behind
        # events or bindings, and no automatic retries, so that one that fails does so at once (/filter's, on the
        # event loop, would hold up every request while it slept)
        self.read_api = make_api_client(config.kubeconfig, config.qps, config.burst, retries=False) \
            if api_client is None else api_client
        names = frozenset(config.scheduler_names)
        key = read_key(config.grant_key_file, "--grant-key-file") if config.grant_key_file else None
        if key is not None and not key.can_sign:
            raise ConfigError(f"--grant-key-file {config.grant_key_file}: holds only public keys; the scheduler signs "
                              f"with the Ed25519 private key (or a shared secret)")
        self.ledger = Ledger(config.sharing, scheduler_names=names, assume_ttl=config.assume_ttl_seconds,
                             bound_ttl=config.bound_ttl_seconds, grant_key=key)
        self.metrics = SchedulerMetrics(self.ledger)
        self.ledger.grant_listeners.append(self._inconsistent)
        self.nodes = WatchCache(self.api, "nodes", name="vgpu-scheduler-nodes")
        self.nodes.add_handlers(self.ledger.on_node, lambda old, new: self.ledger.on_node(new),
                                self.ledger.on_node_delete)
        self.pods = WatchCache(self.api, "pods", field_selector=config.pod_field_selector or None,
                               name="vgpu-scheduler-pods")
        self.pods.add_handlers(self.ledger.on_pod, lambda old, new: self.ledger.on_pod(new),
                               self.ledger.on_pod_delete)
        self.metrics.track_cache("nodes", lambda: self.nodes.synced)
        self.metrics.track_cache("pods", lambda: self.pods.synced)
        # require_quota_totals: where-limited reads the namespaces whose ResourceQuotas limit a quota total
        self.quota_limited: LimitedNamespaces | None = None
        self.quotas: WatchCache | None = None
        if config.sharing.require_quota_totals == "where-limited":
            limited = self.quota_limited = LimitedNamespaces()
            self.quotas = WatchCache(self.api, "resourcequotas", name="vgpu-scheduler-resourcequotas")
            self.quotas.add_handlers(limited.on_quota, lambda old, new: limited.on_quota(new), limited.on_quota_delete)
            quotas = self.quotas
            self.metrics.track_cache("resourcequotas", lambda: quotas.synced)
        policy = make_policy(config.node_policy)  # one policy: DRA pods and device-plugin pods teach it alike
        self.dra_caches: list[WatchCache] = []
        self.dra: DRAView | None = None
        if config.dra:
            view = self.dra = DRAView(policy, decide=config.mode == "decide")
            self.ledger.pod_gone_listeners.append(view.forget_pod)
            slices = WatchCache(self.api, "resourceslices", name="vgpu-scheduler-resourceslices")
            slices.add_handlers(view.on_slice, lambda old, new: view.on_slice(new), view.on_slice_delete)
            claims = WatchCache(self.api, "resourceclaims", name="vgpu-scheduler-resourceclaims")
            claims.add_handlers(view.on_claim, lambda old, new: view.on_claim(new), view.on_claim_delete)
            self.dra_caches = [slices, claims]
            self.metrics.track_cache("resourceslices", lambda: slices.synced)
            self.metrics.track_cache("resourceclaims", lambda: claims.synced)
        self.recorder = EventRecorder(self.api, config.scheduler_name)
        # a deleted pod gets no more events: what the recorder kept to aggregate its repeats goes with it
        self.ledger.pod_gone_listeners.append(lambda pod: self.recorder.forget(pod, kind="Pod"))
        self.elector: LeaderElector | LeaseFollower | None = None
        if config.follow_lease:
            namespace, _, lease = config.follow_lease.partition("/")
            self.elector = LeaseFollower(self.api, lease, namespace, identity=config.leader_identity or None,
                                         on_started_leading=lambda: self.metrics.leader.set(1),
                                         on_stopped_leading=lambda: self.metrics.leader.set(0))
        elif config.leader_elect:
            self.elector = LeaderElector(self.api, config.lease_name, config.lease_namespace,
                                         on_started_leading=lambda: self.metrics.leader.set(1),
                                         on_stopped_leading=lambda: self.metrics.leader.set(0))
        else:
            self.metrics.leader.set(1)
        self.extender = Extender(
            self.ledger,
            policy,
            gpu_policy=config.gpu_policy,
            mode=config.mode,
            binder=self._bind,
            lookup=self._lookup,
            fetch=self._fetch,
            events=self._event,
            ready=self.not_ready,
            scheduler_names=names,
            grant_key=key,
            claims=DRAPlacement(self.dra) if self.dra is not None else NO_CLAIMS,
            preemptor=Preemptor(self.ledger, self._evict, self._lookup, self._event,
                                counted=lambda outcome: self.metrics.preemption_evictions.labels(outcome).inc())
            if config.preemption else None,
            topology=config.topology,
            quota_limited=self.quota_limited,
        )
        for cache in self.dra_caches:  # a DRA node changes with its claims and slices, outside the verbs
            cache.add_handlers(lambda obj: self.extender.changed(), lambda old, new: self.extender.changed(),
                               lambda obj: self.extender.changed())
        self.app = create_app(self.extender, self.not_ready, self.metrics, config.max_body_bytes,
                              housekeeping=self.ledger.expire, housekeeping_interval=EXPIRY_INTERVAL,
                              stuck=self.stuck)
        self._metrics_server: Any = None
        self._unready_since: float | None = None  # while this replica should serve but cannot (see `stuck`)
        self._stopping = threading.Event()
        self._retrier: threading.Thread | None = None

    def _inconsistent(self, pod: Mapping[str, Any], problems: list[str]) -> None:
        """A bound pod's assignment differs from its spec: charged at the larger, counted and reported."""
        self.metrics.inconsistent_grants.inc()
        self.recorder.warning(pod, "VGPUGrantInconsistent",
                              "the pod's GPU assignment differs from its spec (charged at the larger of the two): "
                              + "; ".join(problems))

    def not_ready(self) -> str:
        """"" when this replica may serve, else why not."""
        if not self.nodes.synced:
            return "node cache not synced"
        if not self.pods.synced:
            return "pod cache not synced"
        if self.quotas is not None and not self.quotas.synced:
            return "resourcequota cache not synced"
        for cache in self.dra_caches:
            if not cache.synced:
                return f"{cache.kind} cache not synced"
        if self.elector is not None:
            return self.elector.why_not_leading()
        return ""

    def stuck(self) -> str:
        """"" unless this replica should serve (it leads, or runs alone) and has not been ready for
        `unready_restart_seconds`: then why, for the liveness probe to restart the container (a standby is never
        stuck: nothing asks it)."""
        reason = self.not_ready()
        if not reason or (self.elector is not None and not self.elector.holds_lease()):
            self._unready_since = None
            return ""
        now = time.monotonic()
        if self._unready_since is None:
            self._unready_since = now
        waited = now - self._unready_since
        if waited < self.config.unready_restart_seconds:
            return ""
        return f"not ready for {waited:.0f}s while it should serve: {reason}"

    def _bind(self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> None:
        """Bind through the client without automatic retries, and retry here a binding the API server turned away
        (429, 503: not acted on) while, and only while, this replica still holds its lease: a leader that lost it
        while waiting never binds after another one may have started."""
        backoff = Backoff(base=0.2, cap=2.0)
        for attempt in range(BIND_ATTEMPTS):
            if self.elector is not None and not self.elector.holds_lease():
                raise VGPUError("this replica no longer holds the leader lease; not binding")
            try:
                bind_pod(self.bind_api, namespace, name, node, annotations, uid or None)
                return
            except ConflictError as exc:
                raise BindConflict(str(exc)) from exc
            except ApiError as exc:
                if exc.status not in (429, 503) or attempt == BIND_ATTEMPTS - 1:
                    raise
                time.sleep(min(max(exc.retry_after or 0.0, backoff.next()), 5.0))

    def _evict(self, namespace: str, name: str, uid: str, dry_run: bool) -> None:
        """POST pods/eviction for one pod of this UID (vgpu.kube.eviction), or only check that it would be allowed."""
        evict_pod(self.api, namespace, name, uid, dry_run)

    def _lookup(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.pods.get(f"{namespace}/{name}")

    def _fetch(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod as the API server has it. One the pod cache does not hold is first awaited from the pod watch for
        up to POD_ARRIVAL_WAIT: kube-scheduler sends /filter a moment after a pod's creation, often before the watch
        event has reached the extender, and the event is cheaper to wait for than a read. A pod the cache holds is
        read (the cache may be behind)."""
        if f"{namespace}/{name}" not in self.pods:
            arrived = self.pods.wait_for(f"{namespace}/{name}", POD_ARRIVAL_WAIT)
            if arrived is not None:
                return arrived
        try:
            resp = k8s.CoreV1Api(self.read_api).read_namespaced_pod(name, namespace, _preload_content=False,
                                                                    _request_timeout=10)
            return read_object(resp)
        except Exception as exc:
            err = translate(exc, f"get pod {namespace}/{name}")
            if isinstance(err, NotFoundError):
                return None
            raise err from exc

    def _event(self, pod: Mapping[str, str], kind: str, reason: str, message: str) -> None:
        obj = {"kind": "Pod", "apiVersion": "v1",
               "metadata": {"namespace": pod.get("namespace", ""), "name": pod.get("name", ""),
                            "uid": pod.get("uid", "")}}
        self.recorder.event(obj, kind, reason, message[:1024])

    def start(self, wait: float | None = None) -> SchedulerRuntime:
        """Start the metrics server (first: an address it cannot listen on is a ConfigError before anything else
        starts), caches and leader election; optionally wait `wait` s for the caches."""
        if self.config.metrics_listen:
            from prometheus_client import start_http_server

            host, port = parse_listen(self.config.metrics_listen, 9395)
            try:
                self._metrics_server = start_http_server(port, host, registry=self.metrics.registry)
            except OSError as exc:
                raise ConfigError(f"--metrics-listen {self.config.metrics_listen}: cannot listen there: "
                                  f"{exc.strerror or exc}") from None
        self.nodes.start()
        self.pods.start()
        if self.quotas is not None:
            self.quotas.start()
        for cache in self.dra_caches:
            cache.start()
        if self.elector is not None:
            self.elector.start()
        if self.extender.preemptor is not None:
            self._retrier = threading.Thread(target=self._retry_blocked, args=(self.extender.preemptor,),
                                             name="vgpu-preemption-retry", daemon=True)
            self._retrier.start()
        if wait:
            self.nodes.wait_synced(wait)
            self.pods.wait_synced(wait)
            if self.quotas is not None:
                self.quotas.wait_synced(wait)
            for cache in self.dra_caches:
                cache.wait_synced(wait)
        return self

    def _retry_blocked(self, preemptor: Preemptor) -> None:
        """Each second, while this replica serves (it leads), plan again for the pods whose preemption budgets
        blocked (scheduler.preemption: kube-scheduler would not ask again for up to five minutes)."""
        while not self._stopping.wait(RETRY_INTERVAL):
            if not self.not_ready():
                preemptor.retry_blocked()

    def stop(self) -> None:
        """Stop everything started by `start` (the HTTP server is the caller's)."""
        self._stopping.set()
        if self._retrier is not None:
            self._retrier.join(5.0)
        if self.elector is not None:
            self.elector.stop()
        for cache in self.dra_caches:
            cache.stop()
        self.pods.stop()
        self.nodes.stop()
        if self.quotas is not None:
            self.quotas.stop()
        self.recorder.close(1.0)
        if self._metrics_server is not None:
            server = self._metrics_server[0] if isinstance(self._metrics_server, tuple) else self._metrics_server
            try:
                server.shutdown()
            except Exception:
                pass
