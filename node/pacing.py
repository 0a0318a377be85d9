"""Pacing: the node's correction of libvgpu.so's compute limiter on GPUs that time-slice between contexts.

The limiter charges each launch the GPU time a pair of CUDA events around it reads. On a GPU shared by several
containers the driver time-slices between their contexts, and a kernel longer than the slice is preempted: the pair
then also reads the slices the others ran meanwhile, the container is charged more than it ran, and it gets less
than its limit (about two thirds of it with 2.7 ms kernels on an H100; docs/isolation.md). Only the node sees both
sides: what each pod's processes really ran on a GPU (NVML's per-process utilization, from the driver; the processes
are the pod's by their cgroup, which the pod cannot change) and what the library charged them (the containers'
accounting files). Once a period the pacer compares the two and moves a factor per pod and GPU, which the library
multiplies its timings by (isolation/src/pace.c reads it from a file mounted read-only):

- the factor tends to the ratio of what the pod ran to what its timings read uncorrected (its charge divided by the
  factor then in force), both summed over the last WINDOW periods: a pod charged its neighbours' slices gets a factor
  below 1, one whose timings read short a factor above 1. The sums smooth the lumps of a charge (a burst of queued
  kernels is charged when admitted, runs later), and each period goes half the way (geometrically), so a change in
  the contention is followed within a few seconds without swinging;
- a pod seen running over its limit (over the window) gets its factor raised whatever its accounting file says (the
  file is the pod's to write, so it must never be able to talk its own factor down);
- a pod whose processes NVML does not show (none ran, or the node cannot read their PIDs), and every pod while NVML
  cannot be read, goes back to 1, the uncorrected timing, which errs towards less than the limit;
- factors stay within [FACTOR_MIN, FACTOR_MAX], as the library holds them too.

Idle share (off unless a tenant has a ceiling above its limit, which the node agent gives only where its operator
turned the option on and the pod names one): while everything else on the GPU ran less than IDLE_PCT of the last
period together, a tenant's published factor is its correction times limit / ceiling, so its limiter lets it run up
to the ceiling; the first period in which anything else runs there puts the factor back to the correction alone.
The correction itself keeps learning meanwhile (a period's uncorrected reading is the library's own count of it,
`read_ns` in the accounting file, which holds across a step of the factor that the library takes up to a second to
apply; the charge divided by the factor published, from a library that does not count it), and running over the
limit raises it only where the run exceeded the limit in force then.

`Pacer` is the arithmetic, fed by whoever knows the tenants (the device plugin from its allocation records,
`NodePacer`; the limiter benchmark from its own processes).
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from vgpu.errors import CodecError
from vgpu.isolation.region import RegionSnapshot
from vgpu.node.guard import pod_uid_of
from vgpu.node.records import AllocationRecord
from vgpu.requests import cores_ceiling

__all__ = ["FACTOR_MAX", "FACTOR_MIN", "NodePacer", "Pacer", "PodCeilings", "Tenant", "UtilizationBackend",
           "pace_file_text"]

log = logging.getLogger(__name__)

FACTOR_MIN = 0.2   # isolation/src/pace.c VGPU_PACE_MIN
FACTOR_MAX = 2.0   # isolation/src/pace.c VGPU_PACE_MAX
WINDOW = 4         # periods the ratio of what ran to what was read is taken over
GAIN = 0.5         # each period moves the factor this far (geometrically) towards that ratio
OVER_LIMIT = 1.05  # running more than this times the limit (over the window) raises the factor, whatever was charged
MIN_CHARGED = 1.0  # percent of a period: a pod whose timings read less teaches nothing
IDLE_PCT = 1.0     # everything else on a GPU running less than this (% of a period, together) is idle


@runtime_checkable
class UtilizationBackend(Protocol):
    """A backend that says how much of a GPU each process ran (NVML's per-process utilization)."""

    def process_utilization(self, uuid: str) -> dict[int, float] | None:
        """Host PID -> % of the GPU it ran since the last call for that GPU; None when it cannot be read."""
        ...


@dataclass(frozen=True)
class Tenant:
    """One pod on one GPU, as the pacer needs it."""

    key: str           # stable name of the pod
    uuid: str          # the GPU
    limit_pct: float   # its compute limit there (the sum over its containers); 0: not limited
    charged_ns: int    # GPU ns the library charged its containers there, counted since they started
    ceiling_pct: float = 0.0   # what it may run while everything else on the GPU is idle; at or below the limit: no
    read_ns: int = 0   # what the library would have charged without the factors (0: a library that does not say)


def pace_file_text(factors: Mapping[str, float]) -> str:
    """The pace file of a container: one `UUID FACTOR` line per GPU (isolation/src/pace.c)."""
    return "".join(f"{uuid} {factor:.4f}\n" for uuid, factor in sorted(factors.items()))


@dataclass
class _Track:
    """What the pacer remembers of one tenant."""

    factor: float      # the correction: what ran / what the timings read uncorrected
    time: float
    charged_ns: int
    read_ns: int = 0
    published: float = 1.0   # the factor the library applied during the last period (the correction, or less)
    limit: float = 0.0       # the limit in force during the last period (the ceiling while bursting)
    periods: deque[tuple[float, float, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    # (real, raw, limit in force) %, per period


class Pacer:
    """Factors per (pod, GPU) from one period to the next; see the module text."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tracks: dict[tuple[str, str], _Track] = {}

    def step(self, tenants: Iterable[Tenant], running: Callable[[str], Mapping[int, float] | None],
             owner: Callable[[int], str | None]) -> dict[tuple[str, str], float]:
        """One period: `running(uuid)` is each process's utilization (%) of the GPU since the last call (host PID
        -> %, None when it cannot be read), `owner(pid)` the key of the pod a process belongs to. Returns the factor
        of every tenant; tenants no longer listed are forgotten."""
        now = self._clock()
        real_by_gpu: dict[str, dict[str, float] | None] = {}
        busy_by_gpu: dict[str, float] = {}
        tracks: dict[tuple[str, str], _Track] = {}
        for tenant in tenants:
            k = (tenant.key, tenant.uuid)
            if tenant.uuid not in real_by_gpu:
                samples = running(tenant.uuid)
                real_by_gpu[tenant.uuid] = self._per_pod(samples, owner)
                busy_by_gpu[tenant.uuid] = sum(samples.values()) if samples is not None else 100.0
            track = self._tracks.get(k) or _Track(1.0, now, tenant.charged_ns, tenant.read_ns, limit=tenant.limit_pct)
            real = real_by_gpu[tenant.uuid]
            if real is None or not 0 < tenant.limit_pct < 100:
                track.factor = track.published = 1.0   # NVML cannot say, or nothing to pace: the uncorrected timing
                track.periods.clear()
                track.time, track.charged_ns, track.limit = now, tenant.charged_ns, tenant.limit_pct
                track.read_ns = tenant.read_ns
                tracks[k] = track
                continue
            if now > track.time and tenant.charged_ns >= track.charged_ns:
                per_pct = (now - track.time) * 1e9 / 100
                if tenant.read_ns and tenant.read_ns >= track.read_ns:   # the library's own uncorrected charge
                    read = (tenant.read_ns - track.read_ns) / per_pct
                else:   # a library that does not count it: the charge under the factor published for the period
                    read = (tenant.charged_ns - track.charged_ns) / per_pct / track.published
                track.factor = self.adjust(track, real.get(tenant.key), read, track.limit or tenant.limit_pct)
            others = busy_by_gpu[tenant.uuid] - real.get(tenant.key, 0.0)
            bursting = tenant.ceiling_pct > tenant.limit_pct and others < IDLE_PCT
            track.limit = min(tenant.ceiling_pct, 100.0) if bursting else tenant.limit_pct
            scale = tenant.limit_pct / track.limit
            track.published = float(min(FACTOR_MAX, max(FACTOR_MIN, track.factor * scale)))
            track.time, track.charged_ns, track.read_ns = now, tenant.charged_ns, tenant.read_ns
            tracks[k] = track
        self._tracks = tracks
        return {k: t.published for k, t in tracks.items()}

    @staticmethod
    def _per_pod(samples: Mapping[int, float] | None,
                 owner: Callable[[int], str | None]) -> dict[str, float] | None:
        if samples is None:
            return None
        per_pod: dict[str, float] = {}
        for pid, pct in samples.items():
            key = owner(pid)
            if key is not None:
                per_pod[key] = per_pod.get(key, 0.0) + pct
        return per_pod

    @staticmethod
    def adjust(track: _Track, real: float | None, read: float, limit: float) -> float:
        """The next correction of a pod that ran `real` % of the GPU in the period (None: NVML showed none of its
        processes) and whose timings read `read` % uncorrected, with `limit` % in force: the ratio of what it ran to
        what its timings read, over the last WINDOW periods."""
        if real is None:
            track.periods.clear()
            return 1.0
        track.periods.append((real, read, limit))
        ran = sum(r for r, _, _ in track.periods)
        read = sum(w for _, w, _ in track.periods)
        allowed = sum(lim for _, _, lim in track.periods)
        target = ran / read if read >= MIN_CHARGED * len(track.periods) else track.factor
        if ran > allowed * OVER_LIMIT:
            target = max(target, track.factor * ran / allowed)
        return float(min(FACTOR_MAX, max(FACTOR_MIN, track.factor * (target / track.factor) ** GAIN)))


class PodCeilings:
    """Idle-share ceilings by pod UID, read from the pods' `vgpu-sharing.io/cores-ceiling` annotations (`pods()`,
    the node agent's pod cache) for `NodePacer(ceiling_of=...)`. A value that is not a whole percent 1..100 counts as
    none, with one warning per pod."""

    def __init__(self, pods: Callable[[], Iterable[Mapping[str, Any]]]) -> None:
        self._pods = pods
        self._warned: set[str] = set()

    def __call__(self, uid: str) -> float:
        for pod in self._pods():
            meta = pod.get("metadata") or {}
            if meta.get("uid") != uid:
                continue
            try:
                return float(cores_ceiling(pod))
            except CodecError as exc:
                if uid not in self._warned:
                    self._warned.add(uid)
                    log.warning("event=cores_ceiling_ignored pod=%s/%s error=%s", meta.get("namespace"),
                                meta.get("name"), exc)
                return 0.0
        return 0.0


class NodePacer:
    """The pacer of a node agent: tenants from its allocation records and the containers' accounting files
    (`snapshot(record)`, read without trusting them), the processes' pods from their cgroups, and each container's
    pace file (`pace_path(record)`) rewritten every period. A record's `pod_uid` names its tenant: the pod's own
    UID (device plugin), or whatever `tenant_of_pod(pod UID)` maps a pod to (the DRA plugin: the claim).
    `ceiling_of(tenant)` is the tenant's ceiling for the idle share (% of each of its GPUs; 0: none)."""

    def __init__(self, records: Callable[[], Iterable[AllocationRecord]],
                 running: Callable[[str], Mapping[int, float] | None],
                 snapshot: Callable[[AllocationRecord], RegionSnapshot | None],
                 pace_path: Callable[[AllocationRecord], Path], proc_root: Path = Path("/proc"),
                 tenant_of_pod: Callable[[str], str | None] | None = None,
                 ceiling_of: Callable[[str], float] | None = None) -> None:
        self._records = records
        self._ceiling_of = ceiling_of
        self._running = running
        self._snapshot = snapshot
        self._tenant_of_pod = tenant_of_pod
        self._pace_path = pace_path
        self._proc_root = proc_root
        self._pacer = Pacer()

    def step(self) -> dict[tuple[str, str], float]:
        """One period: factors per (pod UID, GPU), written to every container's pace file."""
        records = list(self._records())
        limits: dict[tuple[str, str], float] = {}
        charged: dict[tuple[str, str], int] = {}
        read: dict[tuple[str, str], int] = {}
        for record in records:
            counters = self._counters(record)
            for uuid in record.gpus:
                k = (record.pod_uid, uuid)
                limits[k] = limits.get(k, 0.0) + (record.cores if 0 < record.cores < 100 else 0.0)
                charged[k] = charged.get(k, 0) + counters.get(uuid, (0, 0))[0]
                read[k] = read.get(k, 0) + counters.get(uuid, (0, 0))[1]
        ceilings = {pod: self._ceiling_of(pod) if self._ceiling_of is not None else 0.0 for pod, _ in limits}
        tenants = [Tenant(pod, uuid, limits[(pod, uuid)], charged[(pod, uuid)], ceilings[pod], read[(pod, uuid)])
                   for pod, uuid in limits]
        pods = {pod for pod, _ in limits}
        factors = self._pacer.step(tenants, self._running, lambda pid: self._owner(pid, pods))
        for record in records:
            mine = {uuid: factors.get((record.pod_uid, uuid), 1.0) for uuid in record.gpus}
            self._write(self._pace_path(record), pace_file_text(mine))
        return factors

    def _owner(self, pid: int, tenants: set[str]) -> str | None:
        uid = pod_uid_of(pid, self._proc_root)
        if uid is None:
            return None
        key = self._tenant_of_pod(uid) if self._tenant_of_pod is not None else uid
        return key if key in tenants else None

    def _counters(self, record: AllocationRecord) -> dict[str, tuple[int, int]]:
        """GPU ns charged, and read uncorrected, per GPU in the container's accounting file; nothing when it cannot
        be read."""
        snap = self._snapshot(record)
        return {d.uuid: (d.charged_ns, d.read_ns) for d in snap.devices} if snap is not None else {}

    @staticmethod
    def _write(path: Path, text: str) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            tmp.write_text(text)
            os.chmod(tmp, 0o444)
            os.replace(tmp, path)
        except OSError as exc:
            log.debug("event=pace_file_unwritable path=%s error=%s", path, exc)
        finally:
            tmp.unlink(missing_ok=True)
