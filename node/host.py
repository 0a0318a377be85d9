"""The device plugin's files on the host, under $HOOK_PATH/vgpu: the library, ld.so.preload, per-container dirs.

`install_library` keeps libvgpu.so current; `prepare` creates what one container's mounts need before kubelet
starts it (its accounting directory, and its own lock directory under the lock root: no host directory is shared
writable between containers) and `write_limits` its read-only limits file; `remove_stale` deletes the files and
directories of containers whose pods are gone.
Directories are created, never deleted while their pod exists.

Storage (`storage`).  "tmpfs": each of a container's two directories is a tmpfs of its own, sized up front
(TMPFS_OPTIONS), so what a tenant writes there fills only its own (its pages are charged to its own memory cgroup)
and never the node's disk or another container's files; the plugin needs CAP_SYS_ADMIN and the host directories
mounted with Bidirectional propagation for kubelet to see the mounts.  "directory": plain directories on the node's
filesystem, for plugins that may not mount; a tenant can then fill that filesystem, after which new containers are
refused (ENOSPC, before anything is made) until space is freed.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
import time
from collections.abc import Callable, Collection
from pathlib import Path

from vgpu.node.records import RecordStore
from vgpu.node.response import LIBVGPU_CONTAINER_PATH, limits_file_text
from vgpu.units import bytes_of_mib, mib_floor

__all__ = ["CONTAINER_ROOM", "STORAGE_KINDS", "TMPFS_OPTIONS", "HostFiles"]

log = logging.getLogger(__name__)

# Free bytes a container's files need on the node before they are made: its accounting file (about 2 MiB in
# HAMi-core's layout, written by the library inside the container), its lock files and its allocation record.
CONTAINER_ROOM = bytes_of_mib(8)
STORAGE_KINDS = ("directory", "tmpfs")
# One tmpfs per directory: the accounting file (about 2 MiB) and the lock files fit with room to spare; few inodes.
TMPFS_OPTIONS = "size=8m,nr_inodes=256,mode=0777"
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MNT_DETACH = 2, 4, 8, 2


class HostFiles:
    """$HOOK_PATH/vgpu on the host (`hook_path`) and the root of the per-container lock directories."""

    def __init__(self, hook_path: str | Path, lock_root: str | Path, storage: str = "directory") -> None:
        if storage not in STORAGE_KINDS:
            raise ValueError(f"container storage {storage!r}: expected one of {', '.join(STORAGE_KINDS)}")
        self.hook_path = Path(hook_path)
        self.lock_root = Path(lock_root)
        self.storage = storage
        self.records = RecordStore(self.vgpu_root / "records")

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

    def lock_dir(self, pod_uid: str, container: str) -> Path:
        """Host directory mounted at the container's /tmp/vgpulock (its own, never another container's)."""
        return self.lock_root / f"{pod_uid}_{container}"

    @property
    def limits_root(self) -> Path:
        """Host directory of the containers' limits files (mounted read-only, one file each, in no directory)."""
        return self.vgpu_root / "limits"

    def limits_file(self, pod_uid: str, container: str) -> Path:
        """Host file mounted read-only at the container's LIMITS_CONTAINER_PATH."""
        return self.limits_root / f"{pod_uid}_{container}.env"

    @property
    def pace_root(self) -> Path:
        """Host directory of the containers' pace directories (node.pacing)."""
        return self.vgpu_root / "pace"

    def pace_dir(self, pod_uid: str, container: str) -> Path:
        """Host directory mounted read-only at the container's PACE_CONTAINER_DIR: the pacer replaces its file."""
        return self.pace_root / f"{pod_uid}_{container}"

    def pace_file(self, pod_uid: str, container: str) -> Path:
        """The container's pace file (`pace_file_text`), in its pace directory."""
        return self.pace_dir(pod_uid, container) / "factors"

    def write_limits(self, pod_uid: str, container: str, envs: dict[str, str]) -> None:
        """Write the container's limits file (`limits_file_text` of the variables it is handed), whole or not at all;
        OSError when it cannot be written."""
        target = self.limits_file(pod_uid, container)
        self.limits_root.mkdir(parents=True, exist_ok=True, mode=0o755)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(limits_file_text(envs))
            os.chmod(tmp, 0o444)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

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

    def install_library_logged(self, source: Path) -> None:
        """`install_library`, logging what happened: a failure is logged (containers will not find the library)
        and never stops the caller."""
        target = self.vgpu_root / "libvgpu.so"
        try:
            if self.install_library(source):
                log.info("event=libvgpu_installed source=%s target=%s", source, target)
        except OSError as exc:
            log.error("event=libvgpu_not_installed source=%s target=%s error=%s: containers will not find the "
                      "isolation library", source, target, exc)

    def prepare(self, pod_uid: str, container: str) -> None:
        """Create the container's accounting and lock directories and ld.so.preload. The container's own directories
        are writable by any user (its processes may run as any uid); their roots are not.

        Raises OSError when they cannot be made, with nothing of the container left behind: ENOSPC, before anything
        is made, where less than CONTAINER_ROOM bytes are free for a directory still to be made (with "directory"
        storage; a tmpfs needs no room on the node's filesystem); the mount's error with "tmpfs" storage."""
        directories = (self.cache_dir(pod_uid, container), self.lock_dir(pod_uid, container))
        if self.storage == "directory":
            for directory in directories:
                if not directory.is_dir():
                    _check_room(directory)
        made: list[Path] = []
        try:
            for directory in directories:
                directory.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
                if not directory.is_dir():
                    directory.mkdir()
                    made.append(directory)
                    if self.storage == "tmpfs":
                        _mount_tmpfs(directory)
                os.chmod(directory, 0o777)
            pace = self.pace_dir(pod_uid, container)
            pace.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            pace.mkdir(mode=0o755, exist_ok=True)
            preload = self.vgpu_root / "ld.so.preload"
            if not preload.exists():
                preload.write_text(LIBVGPU_CONTAINER_PATH + "\n")
        except OSError:
            for directory in made:
                _remove(directory)
            raise

    def check_storage(self) -> None:
        """Raise OSError (with what to do) when this storage cannot be made here: with "tmpfs", a trial mount under
        the containers' root."""
        if self.storage != "tmpfs":
            return
        self.containers_root.mkdir(parents=True, exist_ok=True, mode=0o755)
        trial = self.containers_root / f".mount-check-{os.getpid()}"
        trial.mkdir(exist_ok=True)
        try:
            _mount_tmpfs(trial)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot mount a tmpfs under {self.containers_root} ({exc.strerror}): container "
                                     "storage tmpfs needs CAP_SYS_ADMIN, and Bidirectional mount propagation on the "
                                     "host directories for kubelet to see the mounts") from None
        finally:
            _remove(trial)

    def discard(self, pod_uid: str, container: str) -> None:
        """Remove a container's directories and record (a container refused before it started)."""
        for directory in (self.cache_dir(pod_uid, container), self.lock_dir(pod_uid, container),
                          self.pace_dir(pod_uid, container)):
            _remove(directory)
        self.limits_file(pod_uid, container).unlink(missing_ok=True)
        self.records.remove(pod_uid, container)

    def remove_stale(self, live_uids: Collection[str], min_age: float = 300.0,
                     now: Callable[[], float] = time.time) -> list[str]:
        """Remove the records, accounting and lock directories of pods not in `live_uids` (directories once older
        than `min_age` s); the names of the accounting directories removed."""
        self.records.remove_except(live_uids)
        if self.limits_root.is_dir():
            for entry in self.limits_root.iterdir():
                try:
                    if entry.name.split("_", 1)[0] not in live_uids and now() - entry.lstat().st_mtime >= min_age:
                        entry.unlink()
                except OSError as exc:
                    log.warning("event=gc_failed file=%s error=%s", entry, exc)
        removed = []
        for root in (self.containers_root, self.lock_root, self.pace_root):
            if not root.is_dir():
                continue
            for entry in root.iterdir():
                uid = entry.name.split("_", 1)[0]
                if uid in live_uids or entry.is_symlink() or not entry.is_dir():
                    continue
                try:
                    if now() - entry.lstat().st_mtime < min_age:
                        continue
                    if os.path.ismount(entry):
                        _unmount(entry)
                    shutil.rmtree(entry)
                    if root == self.containers_root:
                        removed.append(entry.name)
                except OSError as exc:
                    log.warning("event=gc_failed dir=%s error=%s", entry, exc)
        return removed


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mount_tmpfs(directory: Path) -> None:
    """Mount a tmpfs of TMPFS_OPTIONS on `directory` (nosuid, nodev, noexec); OSError on failure."""
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    if _libc().mount(b"tmpfs", os.fsencode(directory), b"tmpfs", flags, TMPFS_OPTIONS.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {directory}: {os.strerror(err)}")


def _unmount(directory: Path) -> None:
    """Detach the mount on `directory` (lazily: a process still inside keeps it until it leaves)."""
    if _libc().umount2(os.fsencode(directory), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unmount {directory}: {os.strerror(err)}")


def _remove(directory: Path) -> None:
    """Unmount `directory` if something is mounted on it, then delete it; errors are logged, never raised."""
    try:
        if os.path.ismount(directory):
            _unmount(directory)
    except OSError as exc:
        log.warning("event=unmount_failed dir=%s error=%s", directory, exc)
        return
    shutil.rmtree(directory, ignore_errors=True)


def _check_room(path: Path) -> None:
    """Raise ENOSPC when the filesystem that will hold `path` has less than CONTAINER_ROOM bytes free."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    stat = os.statvfs(probe)
    free = stat.f_bavail * stat.f_frsize
    if free < CONTAINER_ROOM:
        raise OSError(errno.ENOSPC, f"{mib_floor(free)} MiB free for container files on the node's storage ({probe}), "
                                    f"{mib_floor(CONTAINER_ROOM)} MiB needed")
