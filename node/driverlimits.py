"""Driver-enforced device-memory limits per container (`--driver-memory-limits auto`).

Recent NVIDIA drivers limit the device memory the processes of one cgroup may hold (`nvmlDeviceSetMemoryLimits_v1`,
a hard limit per cgroup path and GPU). Unlike anything done inside the container by `libvgpu.so`, a tenant cannot
undo it: no environment variable, `dlopen` trick or raw ioctl gets past the driver. `libvgpu.so` stays for compute
limits, for what containers are told about their memory (`cuMemGetInfo`, NVML), and for GPUs whose driver lacks the
call.

Runs in the device plugin (a thread started by deviceplugin.runtime), because the plugin already has what it needs:
the grant of every container it answered (its allocation records, node.records), the pods of its node
(with each container's runtime ID) and NVML. Every `interval` seconds it finds the cgroup of each running container
with a grant (under --cgroup-root: the pod's directory `pod<uid>` or `...pod<uid_with_underscores>.slice`, then the
child named after the container ID, as kubelet's cgroupfs and systemd drivers lay them out), sets the grant as
the hard (and soft) limit on each of its GPUs, and clears limits of containers that are gone and whose cgroup still
exists (the driver drops the limits of a removed cgroup itself). An OCI or NRI hook would set the limit before the
container's first instruction; this loop leaves a window of up to `interval` after start in which only
`libvgpu.so` enforces the grant.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from vgpu.node.backends import MemoryLimitBackend
from vgpu.node.records import RecordStore

__all__ = ["CgroupFinder", "DriverLimits", "container_ids", "start_driver_limits"]

log = logging.getLogger(__name__)

_MAX_DEPTH = 6


def container_ids(pod: dict[str, Any]) -> dict[str, str]:
    """Container name -> runtime ID (`containerd://<id>` without the scheme) of a pod's started containers."""
    out = {}
    status = pod.get("status") or {}
    for entry in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or []):
        cid = str(entry.get("containerID") or "")
        if entry.get("name") and "://" in cid and "running" in (entry.get("state") or {}):
            out[str(entry["name"])] = cid.split("://", 1)[1]
    return out


class CgroupFinder:
    """Finds a container's cgroup directory under a cgroup v2 root from its pod UID and container ID."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._pods: dict[str, Path] = {}

    @staticmethod
    def _is_pod_dir(name: str, uid: str) -> bool:
        return name == f"pod{uid}" or name.endswith(f"pod{uid.replace('-', '_')}.slice")

    def _pod_dir(self, uid: str) -> Path | None:
        cached = self._pods.get(uid)
        if cached is not None and cached.is_dir():
            return cached
        for top, dirs, _files in os.walk(self.root):
            depth = len(Path(top).relative_to(self.root).parts)
            for name in dirs:
                if self._is_pod_dir(name, uid):
                    self._pods[uid] = Path(top) / name
                    return self._pods[uid]
            if depth >= _MAX_DEPTH:
                dirs.clear()
        return None

    def find(self, pod_uid: str, container_id: str) -> Path | None:
        """The container's cgroup directory, or None while it does not exist."""
        pod_dir = self._pod_dir(pod_uid)
        if pod_dir is None or not container_id:
            return None
        try:
            names = [e.name for e in os.scandir(pod_dir) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return None
        for name in names:
            stem = name.removesuffix(".scope")
            if stem == container_id or stem.endswith(f"-{container_id}"):
                return pod_dir / name
        return None

    def forget(self, live_uids: Iterable[str]) -> None:
        """Drop cached pod directories of pods not in `live_uids`."""
        keep = set(live_uids)
        self._pods = {uid: path for uid, path in self._pods.items() if uid in keep}


class DriverLimits:
    """Keeps the driver's per-cgroup memory limits equal to the grants of the containers running on this node."""

    def __init__(self, backend: MemoryLimitBackend, records: RecordStore, pods: Callable[[], list[dict[str, Any]]],
                 cgroup_root: str | os.PathLike[str], gpus: Iterable[str], interval: float = 1.0) -> None:
        self.backend = backend
        self.records = records
        self.pods = pods
        self.finder = CgroupFinder(cgroup_root)
        self.interval = interval
        self.gpus = set(gpus)  # GPUs whose driver has the call
        self.applied: dict[tuple[str, str], int] = {}  # (GPU UUID, cgroup dir) -> bytes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def probe(cls, backend: MemoryLimitBackend, gpus: Iterable[str], cgroup_root: str) -> set[str]:
        """The GPUs among `gpus` whose driver can limit cgroups (asked about `cgroup_root`)."""
        return {uuid for uuid in gpus if backend.memory_limits_supported(uuid, str(cgroup_root))}

    def desired(self) -> dict[tuple[str, str], int]:
        """(GPU, cgroup dir) -> granted bytes, for every running container with a grant on a limited GPU."""
        pods = {str((p.get("metadata") or {}).get("uid") or ""): p for p in self.pods()}
        self.finder.forget(pods)
        want: dict[tuple[str, str], int] = {}
        for record in self.records.all():
            pod = pods.get(record.pod_uid)
            cid = container_ids(pod).get(record.container) if pod else None
            cgroup = self.finder.find(record.pod_uid, cid) if cid else None
            if cgroup is None:
                continue
            for uuid, granted in zip(record.gpus, record.memory_bytes):
                if uuid in self.gpus and granted > 0:
                    want[(uuid, str(cgroup))] = granted
        return want

    def reconcile(self) -> None:
        """One round: set missing or changed limits, clear those of containers that are gone."""
        want = self.desired()
        for key, granted in want.items():
            if self.applied.get(key) == granted:
                continue
            try:
                self.backend.set_memory_limit(key[0], key[1], granted)
            except RuntimeError as exc:
                log.warning("event=driver_limit_failed gpu=%s cgroup=%s error=%s", key[0], key[1], exc)
                continue
            self.applied[key] = granted
            log.info("event=driver_limit_set gpu=%s cgroup=%s bytes=%d", key[0], key[1], granted)
        for key in [k for k in self.applied if k not in want]:
            del self.applied[key]
            if not os.path.isdir(key[1]):
                continue  # the driver dropped it with the cgroup
            try:
                self.backend.set_memory_limit(key[0], key[1], None)
                log.info("event=driver_limit_cleared gpu=%s cgroup=%s", key[0], key[1])
            except RuntimeError as exc:
                log.warning("event=driver_limit_clear_failed gpu=%s cgroup=%s error=%s", key[0], key[1], exc)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile()
            except Exception:
                log.exception("event=driver_limits_round_failed")
            self._stop.wait(self.interval)

    def start(self) -> DriverLimits:
        """Reconcile every `interval` seconds in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="driver-limits", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (limits already set stay with their cgroups)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def start_driver_limits(mode: str, backend: object, gpus: list[str], records: RecordStore,
                        pods: Callable[[], list[dict[str, Any]]], cgroup_root: str) -> DriverLimits | None:
    """Log which enforcement each GPU gets and, with mode `auto` and a driver that has the call, start the loop."""
    limited: set[str] = set()
    if mode == "auto":
        if isinstance(backend, MemoryLimitBackend) and os.path.isdir(cgroup_root):
            limited = DriverLimits.probe(backend, gpus, cgroup_root)
        else:
            log.warning("event=driver_limits_unavailable backend=%s cgroup_root=%s: memory limits stay with "
                        "libvgpu.so only", type(backend).__name__, cgroup_root)
    for uuid in gpus:
        log.info("event=enforcement gpu=%s memory=%s compute=libvgpu", uuid,
                 "driver+libvgpu" if uuid in limited else "libvgpu")
    if not limited or not isinstance(backend, MemoryLimitBackend):
        return None
    return DriverLimits(backend, records, pods, cgroup_root, limited).start()
