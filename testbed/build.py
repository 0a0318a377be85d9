"""Builds the test bed's simulated GPU driver (C, via make) on demand: `libcuda.so.1` and `libnvidia-ml.so.1`.

Called by the pod runner, `vgpu demo` and the tests. Output: $VGPU_TESTBED_BUILD_DIR or testbed/build/simgpu.
The simulator is compiled from testbed/simgpu and NVIDIA's headers only: `cuda.h` (where
vgpu.isolation.cuda_include finds it) and `nvml.h`, which the `nvidia-nvml-dev` package installs (or
$VGPU_NVML_INCLUDE).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from vgpu.isolation.build import BuildError, c_sources, ensure_made

__all__ = ["SimPaths", "ensure_sim_built", "nvml_include_dir", "sim_paths"]

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


def nvml_include_dir() -> Path:
    """The directory of NVIDIA's nvml.h: $VGPU_NVML_INCLUDE, the nvidia-nvml-dev package, or the CUDA toolkit."""
    env = os.environ.get("VGPU_NVML_INCLUDE")
    candidates = [Path(env)] if env else []
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidates += sorted(Path(root).glob("*/include"), reverse=True)
    candidates += [Path("/usr/local/cuda/include"), Path("/usr/include")]
    for directory in candidates:
        if (directory / "nvml.h").is_file():
            return directory
    raise BuildError("nvml.h not found: install the nvidia-nvml-dev package (or set VGPU_NVML_INCLUDE)")


def ensure_sim_built(force: bool = False) -> SimPaths:
    """Build the simulated libcuda.so.1 and libnvidia-ml.so.1 if needed; raises BuildError."""
    p = sim_paths()
    ensure_made(PACKAGE_DIR, p.build_dir, [p.sim_libcuda, p.sim_libnvml], c_sources(PACKAGE_DIR, ["simgpu"]), force,
                make_vars=[f"NVML_INCLUDE={nvml_include_dir()}"])
    return p
