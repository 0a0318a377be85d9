"""The device plugin's files on the host, under $HOOK_PATH/vgpu: the library, ld.so.preload, per-container dirs.

`install_library` keeps libvgpu.so current; `prepare` creates what one container's mounts need before kubelet
starts it; `remove_stale` deletes the directories of containers whose pods are gone. Directories are created,
never deleted while their pod exists.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Collection
from pathlib import Path

from vgpu.deviceplugin.response import LIBVGPU_CONTAINER_PATH

__all__ = ["HostFiles"]

log = logging.getLogger(__name__)


class HostFiles:
    """$HOOK_PATH/vgpu on the host (`hook_path`) and the lock directory."""

    def __init__(self, hook_path: str | Path, lock_dir: str) -> None:
        self.hook_path = Path(hook_path)
        self.lock_dir = lock_dir

    @property
    def vgpu_root(self) -> Path:
        """$HOOK_PATH/vgpu on the host."""
        return self.hook_path / "vgpu"

    @property
    def containers_root(self) -> Path:
        """Host directory holding one accounting directory per container."""
        return self.vgpu_root / "containers"

    def cache_dir(self, pod_uid: str, container: str) -> Path:
        """Host accounting directory of one container."""
        return self.containers_root / f"{pod_uid}_{container}"

    def install_library(self, source: Path) -> bool:
        """Copy libvgpu.so to $HOOK_PATH/vgpu/libvgpu.so when the content differs; True if it was written.

        Written to a temporary file and renamed over the old one: containers that bind-mounted the old file keep
        its inode, so a library in use is never changed under a running process."""
        data = source.read_bytes()
        target = self.vgpu_root / "libvgpu.so"
        try:
            if target.read_bytes() == data:
                return False
        except FileNotFoundError:
            pass
        self.vgpu_root.mkdir(parents=True, exist_ok=True)
        tmp = self.vgpu_root / f".libvgpu.so.{os.getpid()}.tmp"
        try:
            tmp.write_bytes(data)
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return True

    def prepare(self, pod_uid: str, container: str) -> None:
        """Create the container's accounting directory, the lock directory and ld.so.preload (never deletes)."""
        directory = self.cache_dir(pod_uid, container)
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o777)
        Path(self.lock_dir).mkdir(parents=True, exist_ok=True)
        try:
            os.chmod(self.lock_dir, 0o777)
        except PermissionError:
            pass
        preload = self.vgpu_root / "ld.so.preload"
        if not preload.exists():
            preload.write_text(LIBVGPU_CONTAINER_PATH + "\n")

    def remove_stale(self, live_uids: Collection[str], min_age: float = 300.0,
                     now: Callable[[], float] = time.time) -> list[str]:
        """Remove accounting directories of pods not in `live_uids` (older than `min_age` s); their names."""
        root = self.containers_root
        if not root.is_dir():
            return []
        removed = []
        for entry in root.iterdir():
            uid = entry.name.split("_", 1)[0]
            if uid in live_uids or not entry.is_dir():
                continue
            try:
                if now() - entry.stat().st_mtime < min_age:
                    continue
                shutil.rmtree(entry)
                removed.append(entry.name)
            except OSError as exc:
                log.warning("event=gc_failed dir=%s error=%s", entry, exc)
        return removed
