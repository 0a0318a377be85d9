"""Builds the isolation library and the simulated GPU (C, via make) on demand.

Called by the package install step and by the tests: `ensure_built()` runs `make` when an output is missing or
older than any source, under a file lock so concurrent callers (parallel test workers, installers) are safe.
"""
from __future__ import annotations

import fcntl
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


class BuildError(RuntimeError):
    """`make` failed or no C compiler is available."""


@dataclass(slots=True, frozen=True)
class Paths:
    """Locations of the built libraries."""

    build_dir: Path
    libvgpu: Path
    sim_dir: Path
    sim_libcuda: Path
    sim_libnvml: Path


def build_dir() -> Path:
    """Output directory: $VGPU_ISOLATION_BUILD_DIR or isolation/build."""
    env = os.environ.get("VGPU_ISOLATION_BUILD_DIR")
    return Path(env).resolve() if env else PACKAGE_DIR / "build"


def paths() -> Paths:
    """The paths `ensure_built` produces (they may not exist yet)."""
    out = build_dir()
    sim = out / "simgpu"
    return Paths(out, out / "libvgpu.so", sim, sim / "libcuda.so.1", sim / "libnvidia-ml.so.1")


def _sources() -> list[Path]:
    files = [PACKAGE_DIR / "Makefile"]
    for sub in ("src", "simgpu"):
        files += sorted(p for p in (PACKAGE_DIR / sub).iterdir() if p.suffix in (".c", ".h"))
    return files


def _stale(p: Paths) -> bool:
    outputs = [p.libvgpu, p.sim_libcuda, p.sim_libnvml]
    if not all(o.exists() for o in outputs):
        return True
    newest_src = max(s.stat().st_mtime for s in _sources())
    return min(o.stat().st_mtime for o in outputs) < newest_src


def ensure_built(force: bool = False) -> Paths:
    """Build (if needed) and return the paths of libvgpu.so and the simulated libcuda/libnvidia-ml."""
    p = paths()
    if not force and not _stale(p):
        return p
    p.build_dir.mkdir(parents=True, exist_ok=True)
    with open(p.build_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if force or _stale(p):
            cmd = ["make", "-s", "-C", str(PACKAGE_DIR), f"BUILD={p.build_dir}"]
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            except FileNotFoundError as exc:
                raise BuildError(f"isolation build: `make` not found ({exc})") from exc
            if res.returncode != 0:
                raise BuildError(f"isolation build failed (make exit {res.returncode}):\n{res.stdout}{res.stderr}")
    return p
