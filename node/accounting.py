"""Reading a container's accounting file on the node without trusting it.

The file lives in a directory the container writes, so it may be a FIFO, a symlink to a host file, a hard link, a
file being truncated, or garbage. `read_snapshot` opens it relative to the plugin's own directories without
following links (O_NOFOLLOW on every component, O_NONBLOCK so a FIFO cannot block), accepts only a regular file
with one link and an accounting file's size, copies at most one file's worth of bytes with `pread` (no mapping,
so truncation cannot raise SIGBUS in the plugin) and parses the copy. The file's name comes from the plugin's
allocation record, never from a directory listing. Used by the node monitor (deviceplugin.monitor).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from vgpu.isolation.region import FILE_SIZE, V1_SIZE, Region, RegionError, RegionSnapshot
from vgpu.node.records import AllocationRecord

__all__ = ["UntrustedFile", "read_snapshot"]

log = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class UntrustedFile(Exception):
    """The container's accounting file is not one the monitor reads (what it is instead is the message)."""


def _read(containers_root: Path, record: AllocationRecord) -> bytes:
    root = os.open(containers_root, _DIR_FLAGS)
    try:
        directory = os.open(record.key, _DIR_FLAGS, dir_fd=root)
    finally:
        os.close(root)
    try:
        if os.fstat(directory).st_uid != os.geteuid():
            raise UntrustedFile("the container's directory is not the plugin's")
        fd = os.open(record.cache_file, _FILE_FLAGS, dir_fd=directory)
    finally:
        os.close(directory)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedFile("not a regular file")
        if info.st_nlink != 1:
            raise UntrustedFile(f"{info.st_nlink} links (a hard link to another file)")
        if info.st_size not in (V1_SIZE, FILE_SIZE):
            raise UntrustedFile(f"{info.st_size} bytes, not an accounting file's {FILE_SIZE}")
        return os.pread(fd, FILE_SIZE, 0)
    finally:
        os.close(fd)


def read_snapshot(containers_root: Path, record: AllocationRecord) -> RegionSnapshot | None:
    """The container's accounting snapshot, or None when its file is absent, unsafe or not an accounting file."""
    label = f"{record.key}/{record.cache_file}"
    try:
        data = _read(containers_root, record)
        region = Region.from_bytes(label, data)
        try:
            return region.snapshot()
        finally:
            region.close()
    except FileNotFoundError:
        return None  # the container has not started a CUDA process yet
    except (OSError, UntrustedFile, RegionError) as exc:
        log.info("event=accounting_file_skipped file=%s reason=%s", label, exc)
        return None
