"""Builds libvgpu.so (C, via make) on demand.

Called by the device plugin (to install the library on the host), `vgpu run` and the tests: `ensure_built()` runs
`make` when the library is missing or older than any source, under a file lock so that concurrent callers
(parallel test workers, installers) are safe. `ensure_made` is the same for any folder with a Makefile (the test
bed builds its simulated driver through it); it passes make the folder of cuda.h (`cuda_include.py`).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vgpu.errors import VGPUError
from vgpu.isolation.cuda_include import cuda_include_dir

__all__ = ["BuildError", "Paths", "build_dir", "c_sources", "ensure_built", "ensure_made", "paths"]

PACKAGE_DIR = Path(__file__).resolve().parent


class BuildError(VGPUError):
    """`make` failed or no C compiler is available."""


@dataclass(slots=True, frozen=True)
class Paths:
    """Where the isolation library is built."""

    build_dir: Path
    libvgpu: Path


def build_dir() -> Path:
    """Output directory: $VGPU_ISOLATION_BUILD_DIR or isolation/build."""
    env = os.environ.get("VGPU_ISOLATION_BUILD_DIR")
    return Path(env).resolve() if env else PACKAGE_DIR / "build"


def paths() -> Paths:
    """The paths `ensure_built` produces (they may not exist yet)."""
    out = build_dir()
    return Paths(out, out / "libvgpu.so")


def c_sources(folder: Path, subdirs: Sequence[str]) -> list[Path]:
    files = [folder / "Makefile"]
    for sub in subdirs:
        files += sorted(p for p in (folder / sub).iterdir() if p.suffix in (".c", ".h"))
    return files


def _stale(outputs: Sequence[Path], sources: Sequence[Path]) -> bool:
    if not all(o.exists() for o in outputs):
        return True
    existing = [s for s in sources if s.exists()]
    if not existing:  # an installed wheel without sources: the shipped outputs are what there is
        return False
    newest = max(s.stat().st_mtime for s in existing)
    return min(o.stat().st_mtime for o in outputs) < newest


def ensure_made(folder: Path, out: Path, outputs: Sequence[Path], sources: Sequence[Path],
                force: bool = False, make_vars: Sequence[str] = ()) -> None:
    """Run `make -C folder BUILD=out CUDA_INCLUDE=<cuda.h's folder> [make_vars]` when an output is missing or older
    than a source; raises BuildError."""
    if not force and not _stale(outputs, sources):
        return
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if force or _stale(outputs, sources):
            try:
                cmd = ["make", "-s", "-C", str(folder), f"BUILD={out}", f"CUDA_INCLUDE={cuda_include_dir()}",
                       *make_vars]
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            except FileNotFoundError as exc:  # no cuda.h, or no `make`
                raise BuildError(f"C build in {folder}: {exc}") from exc
            if res.returncode != 0:
                raise BuildError(f"C build in {folder} failed (make exit {res.returncode}):\n{res.stdout}{res.stderr}")


def ensure_built(force: bool = False) -> Paths:
    """Build libvgpu.so if needed and return its paths."""
    p = paths()
    ensure_made(PACKAGE_DIR, p.build_dir, [p.libvgpu], c_sources(PACKAGE_DIR, ["src"]), force)
    return p
