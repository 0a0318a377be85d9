"""What the doctor checks with: the driver (a directory given, else the loader's choice) and the libvgpu.so."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vgpu.errors import VGPUError
from vgpu.isolation.build import ensure_built
from vgpu.isolation.doctor import envs
from vgpu.isolation.doctor.spawn import Worker

INSTALLED_LIB = Path("/usr/local/vgpu/libvgpu.so")     # where the device plugin installs it (host and pods)
PRELOAD_FILE = Path("/etc/ld.so.preload")
INFO_TIMEOUT_S = 60.0


class DoctorError(VGPUError):
    """Something that stops the doctor before any probe runs (a bad flag, no driver): one line."""


@dataclass(frozen=True, slots=True)
class Library:
    """The libvgpu.so the probes run under, and where it came from."""

    path: str
    source: str


def find_library(arg: str | None) -> Library:
    """`--lib`, else the device plugin's installed copy, else this package's own build (made if needed)."""
    if arg:
        path = Path(arg)
        if not path.is_file():
            raise DoctorError(f"--lib {arg}: no such file")
        return Library(str(path.resolve()), "--lib")
    if INSTALLED_LIB.is_file():
        return Library(str(INSTALLED_LIB), "installed by the device plugin")
    return Library(str(ensure_built().libvgpu), "built from this package")


def check_driver_dir(arg: str | None) -> str | None:
    """The absolute `--driver-dir`, which must hold a libcuda.so.1; None without the flag."""
    if arg is None:
        return None
    path = Path(arg)
    if not path.is_dir():
        raise DoctorError(f"--driver-dir {arg}: not a directory")
    if not (path / "libcuda.so.1").exists():
        raise DoctorError(f"--driver-dir {arg}: no libcuda.so.1 in it")
    return str(path.resolve())


def driver_facts(driver_dir: str | None, workdir: Path) -> dict[str, Any]:
    """The `info` worker's findings, run without the library; DoctorError when no CUDA driver answers."""
    with Worker("info", {}, envs.reference_env(os.environ, driver_dir), workdir, session=True) as info:
        out = info.result(INFO_TIMEOUT_S)
    if not out.ok:
        raise DoctorError(f"no usable CUDA driver: {out.reason}")
    facts = dict(out.figures)
    facts["driver_dir"] = driver_dir
    facts["ld_so_preload"] = preloaded()
    return facts


def preloaded() -> list[str]:
    """The libraries /etc/ld.so.preload loads into every process (runs "without the library" get them too)."""
    try:
        lines = PRELOAD_FILE.read_text().split()
    except OSError:
        return []
    return [w for w in lines if not w.startswith("#")]
