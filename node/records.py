"""The device plugin's own record of every container it answered: which pod, which GPUs, which accounting file.

Written by the allocator on the call that settles a container (one small JSON file per container under
$HOOK_PATH/vgpu/records, a directory no container mounts), read by the node monitor, which therefore never takes a
container's identity, its GPUs or its file's name from anything a container can write, and kept across restarts
of the plugin. Records of pods no longer on the node are removed with their directories (node.host).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

__all__ = ["AllocationRecord", "RecordStore"]

log = logging.getLogger(__name__)

_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True, slots=True)
class AllocationRecord:
    """One answered container: its pod, its GPUs in the order of its CUDA devices with the memory (bytes) and cores
    (percent) granted on each, and its accounting file's name."""

    pod_uid: str
    namespace: str
    pod: str
    container: str
    gpus: tuple[str, ...]
    memory_bytes: tuple[int, ...]
    cores: int
    cache_file: str  # the file name inside the container's accounting directory

    @property
    def key(self) -> str:
        """`<podUID>_<container>`: the name of the container's directories and of its record."""
        return f"{self.pod_uid}_{self.container}"


class RecordStore:
    """The records directory; thread-safe writes (each record is written to a temporary file and renamed)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, record: AllocationRecord) -> None:
        """Store (or replace) one container's record."""
        for part in (record.pod_uid, record.container, record.cache_file):
            if not _SAFE.match(part):
                raise ValueError(f"allocation record: {part!r} is not a safe file name part")
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        target = self.root / f"{record.key}.json"
        tmp = self.root / f".{record.key}.{os.getpid()}.tmp"
        try:
            tmp.write_bytes(orjson.dumps(asdict(record)))
            os.chmod(tmp, 0o600)
            os.replace(tmp, target)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def remove(self, pod_uid: str, container: str) -> None:
        """Remove one container's record, if there is one."""
        if _SAFE.match(pod_uid) and _SAFE.match(container):
            (self.root / f"{pod_uid}_{container}.json").unlink(missing_ok=True)

    def all(self) -> list[AllocationRecord]:
        """Every stored record, sorted by key; unreadable ones are logged and skipped."""
        return [record for record, _ in self._read()]

    def current(self) -> list[AllocationRecord]:
        """One record per container name (namespace, pod, container), sorted by key: where a pod was re-created
        under the same name and the old pod's record is not cleaned up yet, the one written last."""
        newest: dict[tuple[str, str, str], tuple[int, AllocationRecord]] = {}
        for record, written in self._read():
            name = (record.namespace, record.pod, record.container)
            if name not in newest or written > newest[name][0]:
                newest[name] = (written, record)
        return sorted((record for _, record in newest.values()), key=lambda r: r.key)

    def _read(self) -> list[tuple[AllocationRecord, int]]:
        """Every readable record with the time its file was written (ns), sorted by key."""
        if not self.root.is_dir():
            return []
        found = []
        for path in sorted(self.root.glob("*.json")):
            try:
                written = path.stat().st_mtime_ns
                data = orjson.loads(path.read_bytes())
                record = AllocationRecord(
                    pod_uid=str(data["pod_uid"]), namespace=str(data["namespace"]), pod=str(data["pod"]),
                    container=str(data["container"]), gpus=tuple(str(g) for g in data["gpus"]),
                    memory_bytes=tuple(int(m) for m in data["memory_bytes"]), cores=int(data["cores"]),
                    cache_file=str(data["cache_file"]),
                )
            except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                log.warning("event=record_unreadable path=%s error=%s", path, exc)
                continue
            found.append((record, written))
        return found

    def remove_except(self, live_uids: Collection[str]) -> list[str]:
        """Remove the records of pods not in `live_uids`; their keys."""
        removed = []
        for record in self.all():
            if record.pod_uid not in live_uids:
                (self.root / f"{record.key}.json").unlink(missing_ok=True)
                removed.append(record.key)
        return removed
