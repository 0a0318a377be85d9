"""Lease-based leader election (coordination.k8s.io/v1 Lease), the algorithm of client-go's leaderelection.

Used by the scheduler extender when several replicas run: only the leader binds and reports ready. A candidate
acquires the Lease when it is free or its holder has not renewed it for `leaseDurationSeconds` (measured on the
candidate's own clock from when it last saw the record change, so clock skew between replicas does not matter).
Every write is an update carrying the resourceVersion that was read, so two candidates can never both win. The
leader renews every `retry_period`; if it cannot renew within `renew_deadline` it stops leading. On `stop()` the
leader releases the Lease (holder cleared) so that another replica takes over at once.

`holds_lease()` is the fence for writes only a leader may make: true only while the last successful renewal is
less than `renew_deadline` old on this process's monotonic clock. Another candidate takes over only after
`lease_duration` without a renewal, so a leader that was paused (a stalled process, a partition) and still believes
it leads stops writing before anyone else may start.

`LeaseFollower` leads by another program's Lease instead: the extender beside kube-scheduler follows the Lease
kube-scheduler campaigns for, so the extender that answers is always the one in the leading kube-scheduler's pod.
kube-scheduler names itself `<hostname>_<uuid>` (cmd/kube-scheduler/app/options/options.go), and both containers of
a pod share the hostname, so the follower leads while the holder is `<its hostname>_...` and the Lease is being
renewed. It reads the Lease every `poll_period` and leads until `renew_deadline` after the last renewal it saw,
on its own monotonic clock; a new holder takes over only after `leaseDurationSeconds` (longer) without one, so a
partitioned follower stops before another pair may start.

Callbacks run on the elector's (follower's) thread and must return quickly.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s

from vgpu.errors import ConfigError
from vgpu.kube.client import read_json
from vgpu.kube.errors import ApiError, NotFoundError, translate

__all__ = ["LeaderElector", "LeaseFollower"]

log = logging.getLogger(__name__)


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaigns for Lease `namespace/name` as `identity` in a thread; `is_leader` tells the current state."""

    def __init__(self, api_client: k8s.ApiClient, name: str, namespace: str = "kube-system", *,
                 identity: str | None = None, lease_duration: float = 15.0, renew_deadline: float = 10.0,
                 retry_period: float = 2.0, on_started_leading: Callable[[], None] | None = None,
                 on_stopped_leading: Callable[[], None] | None = None,
                 on_new_leader: Callable[[str], None] | None = None, release_on_stop: bool = True) -> None:
        if not (lease_duration > renew_deadline > retry_period > 0):
            raise ConfigError("leader election: need lease_duration > renew_deadline > retry_period > 0 "
                              f"(got {lease_duration}, {renew_deadline}, {retry_period})")
        self.name, self.namespace = name, namespace
        self.identity = identity or f"{socket.gethostname()}_{random.getrandbits(32):08x}"
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.on_new_leader = on_new_leader
        self.release_on_stop = release_on_stop
        self._api = k8s.CoordinationV1Api(api_client)
        self._leader = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._observed: dict[str, Any] | None = None  # last Lease we read or wrote
        self._observed_at = 0.0  # monotonic time when the record (holder / renewTime) last changed
        self._renewed = 0.0  # monotonic time of the last successful acquire or renew
        self.holder = ""  # identity of the current leader as last observed
        self.transitions = 0  # how often this elector started leading

    @property
    def is_leader(self) -> bool:
        """True while this elector holds the Lease."""
        return self._leader.is_set()

    def holds_lease(self) -> bool:
        """True while this elector leads and renewed the Lease less than `renew_deadline` ago (the write fence)."""
        return self.is_leader and time.monotonic() - self._renewed < self.renew_deadline

    def start(self) -> LeaderElector:
        """Start campaigning in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name=f"leader-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, release: bool | None = None, timeout: float = 5.0) -> None:
        """Stop campaigning; release the Lease if leading (default `release_on_stop`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.is_leader:
            if self.release_on_stop if release is None else release:
                self._release()
            self._set_leader(False)

    def wait_for_leadership(self, timeout: float | None = None) -> bool:
        """Block until this elector leads; False on timeout."""
        return self._leader.wait(timeout)

    def why_not_leading(self) -> str:
        """"" while `holds_lease()`, else why not, as /readyz says it."""
        if self.holds_lease():
            return ""
        return "not the leader" if not self.is_leader else "the leader's lease is not current"

    # -- algorithm
    def _sleep(self, seconds: float) -> bool:
        """Sleep with jitter; True if asked to stop."""
        return self._stop.wait(seconds * random.uniform(1.0, 1.2))

    def _run(self) -> None:
        while not self._stop.is_set():
            # candidate: try until acquired
            while not self._stop.is_set() and not self._try_acquire_or_renew():
                self._sleep(self.retry_period)
            if self._stop.is_set():
                return
            self._renewed = last_ok = time.monotonic()
            self._set_leader(True)
            # leader: renew until a renewal misses the deadline
            while not self._stop.wait(self.retry_period):
                if self._try_acquire_or_renew():
                    self._renewed = last_ok = time.monotonic()
                elif time.monotonic() - last_ok >= self.renew_deadline or self.holder != self.identity:
                    log.info("lease=%s/%s identity=%s lost leadership", self.namespace, self.name, self.identity)
                    self._set_leader(False)
                    break

    def _set_leader(self, leading: bool) -> None:
        if leading == self._leader.is_set():
            return
        if leading:
            self._leader.set()
            self.transitions += 1
            log.info("lease=%s/%s identity=%s started leading", self.namespace, self.name, self.identity)
            cb = self.on_started_leading
        else:
            self._leader.clear()
            log.info("lease=%s/%s identity=%s stopped leading", self.namespace, self.name, self.identity)
            cb = self.on_stopped_leading
        if cb is not None:
            try:
                cb()
            except Exception:
                log.exception("leader election callback failed")

    def _observe(self, lease: dict[str, Any]) -> None:
        spec = lease.get("spec") or {}
        prev = (self._observed or {}).get("spec") or {}
        if (spec.get("holderIdentity"), spec.get("renewTime")) != (prev.get("holderIdentity"), prev.get("renewTime")) \
                or self._observed is None:
            self._observed_at = time.monotonic()
        self._observed = lease
        holder = spec.get("holderIdentity") or ""
        if holder != self.holder:
            self.holder = holder
            if holder and self.on_new_leader is not None:
                try:
                    self.on_new_leader(holder)
                except Exception:
                    log.exception("leader election callback failed")

    def _try_acquire_or_renew(self) -> bool:
        now = _micro_now()
        duration = max(1, round(self.lease_duration))
        try:
            try:
                lease = read_json(self._api.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                                  _request_timeout=self.retry_period * 2))
            except Exception as exc:
                err = translate(exc, f"get lease {self.namespace}/{self.name}")
                if not isinstance(err, NotFoundError):
                    raise err from exc
                body: Any = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.name, "namespace": self.namespace},
                        "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": duration,
                                 "acquireTime": now, "renewTime": now, "leaseTransitions": 0}}
                created = read_json(self._api.create_namespaced_lease(self.namespace, body, _preload_content=False,
                                                                      _request_timeout=self.retry_period * 2))
                self._observe(created)
                return True
            self._observe(lease)
            spec = dict(lease.get("spec") or {})
            holder = spec.get("holderIdentity") or ""
            held_for = float(spec.get("leaseDurationSeconds") or duration)
            if holder and holder != self.identity and time.monotonic() - self._observed_at < held_for:
                return False  # someone else holds a live lease
            if holder != self.identity:
                spec["acquireTime"] = now
                spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            spec.update(holderIdentity=self.identity, leaseDurationSeconds=duration, renewTime=now)
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": lease["metadata"],
                    "spec": spec}
            updated = read_json(self._api.replace_namespaced_lease(self.name, self.namespace, body,
                                                                   _preload_content=False,
                                                                   _request_timeout=self.retry_period * 2))
            self._observe(updated)
            return True
        except ApiError as exc:
            log.debug("lease=%s/%s identity=%s attempt failed: %s", self.namespace, self.name, self.identity, exc)
            return False
        except Exception as exc:
            log.debug("lease=%s/%s identity=%s attempt failed: %s", self.namespace, self.name, self.identity,
                      translate(exc, "lease"))
            return False

    def _release(self) -> None:
        lease = self._observed
        if not lease or ((lease.get("spec") or {}).get("holderIdentity") != self.identity):
            return
        spec = dict(lease.get("spec") or {})
        spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=_micro_now())
        body: Any = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": lease["metadata"],
                     "spec": spec}
        try:
            read_json(self._api.replace_namespaced_lease(self.name, self.namespace, body, _preload_content=False,
                                                         _request_timeout=5))
            log.info("lease=%s/%s identity=%s released", self.namespace, self.name, self.identity)
        except Exception as exc:
            log.warning("lease=%s/%s release failed: %s", self.namespace, self.name, translate(exc, "lease"))


class LeaseFollower:
    """Leads while the Lease `namespace/name`, campaigned for by another program, is held as `identity` or
    `identity_<anything>` and renewed; the same interface as LeaderElector (see the module text)."""

    def __init__(self, api_client: k8s.ApiClient, name: str, namespace: str = "kube-system", *,
                 identity: str | None = None, renew_deadline: float = 10.0, poll_period: float = 1.0,
                 on_started_leading: Callable[[], None] | None = None,
                 on_stopped_leading: Callable[[], None] | None = None) -> None:
        if not renew_deadline > poll_period > 0:
            raise ConfigError(f"lease following: need renew_deadline > poll_period > 0 (got {renew_deadline}, "
                              f"{poll_period})")
        self.name, self.namespace = name, namespace
        self.identity = identity or socket.gethostname()
        self.renew_deadline = renew_deadline
        self.poll_period = poll_period
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self._api = k8s.CoordinationV1Api(api_client)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._record: tuple[str, str] | None = None  # (holder, renewTime) last read
        self._renewed = -float("inf")  # monotonic time the record last changed while held by our pod
        self._leading = False  # as last told to the callbacks
        self.holder = ""  # the holder as last read
        self.error = ""  # why the last read failed ("" when it succeeded)

    def _ours(self, holder: str) -> bool:
        return holder == self.identity or holder.startswith(self.identity + "_")

    def holds_lease(self) -> bool:
        """True while our pod's program holds the Lease and renewed it less than `renew_deadline` ago (as seen
        here): the fence for writes only the leader may make."""
        return self._ours(self.holder) and time.monotonic() - self._renewed < self.renew_deadline

    @property
    def is_leader(self) -> bool:
        """The same as `holds_lease()`: a follower has no state of its own to lose."""
        return self.holds_lease()

    def why_not_leading(self) -> str:
        """"" while leading, else why not, as /readyz says it."""
        if self.holds_lease():
            return ""
        lease = f"Lease {self.namespace}/{self.name}"
        if self.error:
            return f"not the leader: cannot read {lease}: {self.error}"
        if not self.holder:
            return f"not the leader: {lease} has no holder"
        if not self._ours(self.holder):
            return f"not the leader: {lease} is held by {self.holder}, not by {self.identity}"
        return f"not the leader: {lease} was not renewed for {self.renew_deadline:g}s"

    def start(self) -> LeaseFollower:
        """Read the Lease once, then every `poll_period` in a daemon thread."""
        self.poll()
        self._thread = threading.Thread(target=self._run, name=f"follow-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop following (nothing is written: the Lease is not ours)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._tell(False)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_period):
            self.poll()

    def poll(self) -> None:
        """Read the Lease and tell the callbacks when leading starts or stops."""
        try:
            lease = read_json(self._api.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                              _request_timeout=self.poll_period * 2))
        except Exception as exc:
            self.error = str(translate(exc, f"get lease {self.namespace}/{self.name}"))
            log.debug("lease=%s/%s read failed: %s", self.namespace, self.name, self.error)
        else:
            self.error = ""
            spec = lease.get("spec") or {}
            record = (str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or ""))
            if record != self._record:
                if record[0] != self.holder:
                    log.info("lease=%s/%s holder=%s identity=%s", self.namespace, self.name, record[0] or "-",
                             self.identity)
                self._record = record
                self.holder = record[0]
                if self._ours(record[0]):
                    self._renewed = time.monotonic()
        self._tell(self.holds_lease())

    def _tell(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        log.info("lease=%s/%s identity=%s %s", self.namespace, self.name, self.identity,
                 "started leading" if leading else "stopped leading")
        callback = self.on_started_leading if leading else self.on_stopped_leading
        if callback is not None:
            try:
                callback()
            except Exception:
                log.exception("leader election callback failed")
