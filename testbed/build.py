"""Builds the test bed's simulated GPU driver (C, via make) on demand: `libcuda.so.1` and `libnvidia-ml.so.1`.

Called by the pod runner, `vgpu demo` and the tests. Output: $VGPU_TESTBED_BUILD_DIR or testbed/build/simgpu.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from vgpu.isolation.build import PACKAGE_DIR as ISOLATION_DIR
from vgpu.isolation.build import c_sources, ensure_made

__all__ = ["SimPaths", "ensure_sim_built", "sim_paths"]

PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(slots=True, frozen=True)
class SimPaths:
    """Where the simulated driver is built: put `sim_dir` first on LD_LIBRARY_PATH."""

    build_dir: Path
    sim_dir: Path
    sim_libcuda: Path
    sim_libnvml: Path


def sim_paths() -> SimPaths:
    """The paths `ensure_sim_built` produces (they may not exist yet)."""
    env = os.environ.get("VGPU_TESTBED_BUILD_DIR")
    out = Path(env).resolve() if env else PACKAGE_DIR / "build"
    sim = out / "simgpu"
    return SimPaths(out, sim, sim / "libcuda.so.1", sim / "libnvidia-ml.so.1")


def ensure_sim_built(force: bool = False) -> SimPaths:
    """Build the simulated libcuda.so.1 and libnvidia-ml.so.1 if needed; raises BuildError."""
    p = sim_paths()
    sources = [*c_sources(PACKAGE_DIR, ["simgpu"]), *(ISOLATION_DIR / "src" / h for h in ("vgpu_map.h", "vgpu_nvml.h"))]
    ensure_made(PACKAGE_DIR, p.build_dir, [p.sim_libcuda, p.sim_libnvml], sources, force)
    return p
