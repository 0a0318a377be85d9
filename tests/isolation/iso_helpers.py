"""Helpers of the isolation tests (and of the hostile-tenant suite): the built libraries, the probe program
(tests/isolation/csrc/probe.c) and `Sim`, a private simulated GPU with a private shared accounting file."""
from __future__ import annotations

import ctypes
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from vgpu.isolation.build import ensure_built
from vgpu.isolation.cuda_include import cuda_include_dir
from vgpu.testbed.build import ensure_sim_built

CSRC = Path(__file__).resolve().parent / "csrc"
SRC = Path(__file__).resolve().parents[2] / "isolation" / "src"


@dataclass(frozen=True)
class Libs:
    """libvgpu.so and the test bed's simulated driver, built."""

    libvgpu: Path
    sim_dir: Path
    sim_libcuda: Path


def build_libs() -> Libs:
    """Build (if needed) libvgpu.so and the simulated driver; a failed build raises.  VGPU_TEST_LIBVGPU names
    another build of the library to test instead (an older version, to see a test fail on it)."""
    sim = ensure_sim_built()
    other = os.environ.get("VGPU_TEST_LIBVGPU")
    return Libs(Path(other) if other else ensure_built().libvgpu, sim.sim_dir, sim.sim_libcuda)


def build_probe(libs: Libs, out: Path, source: str = "probe.c") -> Path:
    """Compile a probe program of tests/isolation/csrc against the simulated libcuda into `out`."""
    subprocess.run(
        ["gcc", "-O2", "-pthread", f"-I{cuda_include_dir()}", f"-I{SRC}", "-o", str(out), str(CSRC / source),
         f"-L{libs.sim_dir}", "-lcuda", "-ldl"],
        check=True,
    )
    return out


def parse_kv(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


@dataclass
class Sim:
    """A private simulated GPU plus a private shared accounting file."""

    libs: Libs
    probe: Path
    state: Path
    cache: Path

    parse = staticmethod(parse_kv)

    def env(self, preload: bool = True, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CUDA_DEVICE_", "GPU_CORE_", "SIMGPU_", "VGPU_"))}
        env.update(SIMGPU_STATE=str(self.state), LD_LIBRARY_PATH=str(self.libs.sim_dir),
                   CUDA_DEVICE_MEMORY_SHARED_CACHE=str(self.cache), SIMGPU_DEVICES="Sim-A100-40GB:40960:108")
        if preload:
            env["LD_PRELOAD"] = str(self.libs.libvgpu)
        env.update(extra)
        return env

    def run(self, *args: str, preload: bool = True, timeout: float = 60, program: Path | None = None,
            **extra: str) -> dict[str, str]:
        """Run a probe program (probe.c's by default) to its end; its key=value lines, _rc and _stderr."""
        res = subprocess.run([str(program or self.probe), *args], env=self.env(preload, **extra), capture_output=True,
                             text=True, timeout=timeout)
        kv = parse_kv(res.stdout)
        kv["_rc"] = str(res.returncode)
        kv["_stderr"] = res.stderr
        return kv

    def popen(self, *args: str, preload: bool = True, program: Path | None = None, **extra: str) -> subprocess.Popen:
        return subprocess.Popen([str(program or self.probe), *args], env=self.env(preload, **extra),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def helpers(self) -> ctypes.CDLL:
        """The simulated driver's test helpers (timeline and memory of the private state file)."""
        os.environ["SIMGPU_STATE"] = str(self.state)
        lib = ctypes.CDLL(str(self.libs.sim_libcuda))
        lib.simgpu_busy_ns.restype = ctypes.c_uint64
        lib.simgpu_busy_ns.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
        lib.simgpu_now_ns.restype = ctypes.c_uint64
        lib.simgpu_used_bytes.restype = ctypes.c_uint64
        lib.simgpu_used_bytes.argtypes = [ctypes.c_int]
        return lib
