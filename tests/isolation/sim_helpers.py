"""Helpers of the simulated driver's own tests (test_sim_*.py; the `sim_programs` fixture is in conftest.py).

Those tests drive the test bed's simulated libcuda.so.1 / libnvidia-ml.so.1 directly, without libvgpu.so: small C
programs (tests/isolation/csrc/sim_*.c) compiled against NVIDIA's headers and the simulated libraries, each
sub-command printing key=value lines.  They check the simulator against NVIDIA's documentation (see
docs/testbed-fidelity.md), so a library tested over it is tested against documented driver behaviour.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from vgpu.isolation.cuda_include import cuda_include_dir
from vgpu.testbed.build import SimPaths, nvml_include_dir

CSRC = Path(__file__).resolve().parent / "csrc"
DEFAULT_DEVICES = "Sim-A100-40GB:40960:108"

# CUresult values (cuda.h)
SUCCESS = 0
INVALID_VALUE = 1
OUT_OF_MEMORY = 2
NOT_INITIALIZED = 3
INVALID_DEVICE = 101
INVALID_CONTEXT = 201
INVALID_HANDLE = 400
ILLEGAL_STATE = 401
NOT_FOUND = 500
NOT_READY = 600
NOT_SUPPORTED = 801
STREAM_CAPTURE_UNSUPPORTED = 900
STREAM_CAPTURE_INVALIDATED = 901
STREAM_CAPTURE_MERGE = 902
STREAM_CAPTURE_UNMATCHED = 903
STREAM_CAPTURE_UNJOINED = 904
STREAM_CAPTURE_ISOLATION = 905
STREAM_CAPTURE_IMPLICIT = 906
CAPTURED_EVENT = 907
STREAM_CAPTURE_WRONG_THREAD = 908
INVALID_RESOURCE_CONFIGURATION = 915

MiB = 1 << 20


def kv(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            out[key] = value
    return out


class SimPrograms:
    """The simulated driver, built, and the sim_*.c programs compiled against it (on first use)."""

    def __init__(self, sim: SimPaths, out: Path) -> None:
        self.sim = sim
        self.out = out

    def program(self, name: str, nvml: bool = False) -> Path:
        exe = self.out / name
        if not exe.exists():
            includes = [f"-I{cuda_include_dir()}"] + ([f"-I{nvml_include_dir()}"] if nvml else [])
            libs = ["-lcuda"] + (["-lnvidia-ml"] if nvml else []) + ["-lpthread", "-ldl"]
            subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", *includes, "-o", str(exe),
                            str(CSRC / f"{name}.c"), f"-L{self.sim.sim_dir}", *libs], check=True)
        return exe

    def env(self, state: Path, devices: str = DEFAULT_DEVICES, **extra: str) -> dict[str, str]:
        """A clean environment: only the simulator on the library path, no preload, no CUDA device selection."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SIMGPU_", "VGPU_", "CUDA_", "GPU_CORE_")) and k != "LD_PRELOAD"}
        env.update(LD_LIBRARY_PATH=str(self.sim.sim_dir), SIMGPU_STATE=str(state), SIMGPU_DEVICES=devices)
        env.update(extra)
        return env

    def run(self, name: str, *args: str, state: Path, devices: str = DEFAULT_DEVICES, nvml: bool = False,
            timeout: float = 60, **extra: str) -> dict[str, str]:
        res = subprocess.run([str(self.program(name, nvml)), *args], env=self.env(state, devices, **extra),
                             capture_output=True, text=True, timeout=timeout)
        out = kv(res.stdout)
        out["_rc"] = str(res.returncode)
        out["_stderr"] = res.stderr
        assert "error" not in out, out
        return out

