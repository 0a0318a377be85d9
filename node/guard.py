"""The node-side memory guard: stops a pod that holds more device memory than it was granted, by whatever path.

libvgpu.so limits the processes that load it and go through the interposed entry points; code in the container can
get around that (a private copy of the driver through dlmopen or /proc/self/map_files, a static binary, raw
ioctls; docs/security.md). The driver still knows what each process holds and says so through NVML's running
processes. The device plugin knows every grant (its allocation records, written at Allocate and mounted into no
container), so it compares, per pod and GPU, what NVML counts for the pod's processes with the pod's grant there
plus `allowance` bytes per process (what the driver keeps per context, which the library does not count). A pod
over it has its processes on that GPU killed (SIGKILL); `check` returns what it stopped, for the caller's log line,
event and metric.

A process belongs to the pod whose UID its cgroup path names (`.../pod<uid>/...`, as kubelet names pod cgroups with
either cgroup driver): the kernel writes that path, the container cannot. Processes of pods without a record here
(not placed by us) are left alone; a pod of ours holding memory on a GPU it was not granted is over a grant of 0.
NVML's PIDs are the host's, so the plugin needs the host's PID namespace (hostPID) to read their cgroups.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from vgpu.node.records import AllocationRecord
from vgpu.units import bytes_of_mib, mib_floor

__all__ = ["DEFAULT_ALLOWANCE_MIB", "MemoryGuard", "ProcessBackend", "Stopped", "pod_uid_of"]

log = logging.getLogger(__name__)

# what the driver keeps per process beyond the allocations libvgpu.so counts (about 500 MiB for a CUDA 12 context
# on an H100), with room to spare
DEFAULT_ALLOWANCE_MIB = 1024
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


@runtime_checkable
class ProcessBackend(Protocol):
    """A backend that says which processes hold memory on a GPU (NVML's running processes)."""

    def processes(self, uuid: str) -> list[tuple[int, int]] | None:
        """(host PID, bytes held) of each process holding memory on the GPU; None when it cannot be read."""
        ...


@dataclass(frozen=True)
class Stopped:
    """A pod found over its grant on one GPU, and the processes killed for it."""

    namespace: str
    pod: str
    pod_uid: str
    uuid: str
    held: int  # bytes its processes held on the GPU
    allowed: int  # its grant there, plus the allowance per process
    pids: tuple[int, ...]

    def describe(self) -> str:
        """One line for the log and the pod's event."""
        return (f"its processes held {mib_floor(self.held)} MiB of GPU {self.uuid}, over the "
                f"{mib_floor(self.allowed)} MiB allowed (its grant and the driver's overhead of {len(self.pids)} "
                "process(es)); killed process(es) "
                f"{', '.join(map(str, self.pids)) or 'none (they had ended)'}")


def pod_uid_of(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The UID of the pod whose cgroup the process is in, from /proc/<pid>/cgroup; None when it names none."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    found = _POD.search(text)
    return found.group(1).replace("_", "-") if found else None


class MemoryGuard:
    """See the module text; the device plugin calls `check` every few seconds."""

    def __init__(self, backend: ProcessBackend, records: Callable[[], Iterable[AllocationRecord]],
                 allowance_mib: int = DEFAULT_ALLOWANCE_MIB, proc_root: Path = Path("/proc"),
                 kill: Callable[[int, int], None] = os.kill) -> None:
        self.backend = backend
        self.records = records
        self.allowance = bytes_of_mib(allowance_mib)
        self.proc_root = proc_root
        self.kill = kill

    def check(self) -> list[Stopped]:
        """Kill the processes of every pod over its grant on a GPU; what was stopped."""
        granted: dict[tuple[str, str], int] = {}
        pods: dict[str, tuple[str, str]] = {}
        for record in self.records():
            pods[record.pod_uid] = (record.namespace, record.pod)
            for uuid, size in zip(record.gpus, record.memory_bytes, strict=False):
                granted[(record.pod_uid, uuid)] = granted.get((record.pod_uid, uuid), 0) + size
        stopped: list[Stopped] = []
        if not pods:
            return stopped
        for uuid in sorted({uuid for _, uuid in granted}):
            by_pod: dict[str, list[tuple[int, int]]] = {}
            for pid, held in self.backend.processes(uuid) or ():
                uid = pod_uid_of(pid, self.proc_root)
                if uid in pods:
                    by_pod.setdefault(uid, []).append((pid, held))
            for uid, holders in sorted(by_pod.items()):
                held = sum(size for _, size in holders)
                allowed = granted.get((uid, uuid), 0) + self.allowance * len(holders)
                if held > allowed:
                    stopped.append(Stopped(*pods[uid], uid, uuid, held, allowed, self._kill(pid for pid, _ in holders)))
        return stopped

    def _kill(self, pids: Iterable[int]) -> tuple[int, ...]:
        killed = []
        for pid in pids:
            try:
                self.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                continue
            except OSError as exc:
                log.error("event=memory_guard_kill_failed pid=%d error=%s", pid, exc)
        return tuple(killed)
