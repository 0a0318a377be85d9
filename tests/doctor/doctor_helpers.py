"""Helpers of the doctor's tests: run `vgpu doctor` as a subprocess over a private simulated GPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vgpu.isolation.doctor.catalog import FRAMEWORKS, PROBES

SIM_DEVICES = "Sim-A100-40GB:40960:108"
FRAMEWORK_MODULE = {p.name: p.name.split("-")[0] for p in PROBES if p.group == FRAMEWORKS}
NON_FRAMEWORK = [p.name for p in PROBES if p.group != FRAMEWORKS]


@dataclass
class Ran:
    """What one doctor run left: exit status, output, the --json document (when written)."""

    returncode: int
    stdout: str
    stderr: str
    doc: dict[str, Any] | None

    def probe(self, name: str) -> dict[str, Any]:
        assert self.doc is not None
        return next(p for p in self.doc["probes"] if p["name"] == name)


def doctor_env(tmp: Path, **extra: str) -> dict[str, str]:
    """This environment less any library configuration, with a private simulated GPU and temporary folder."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUDA_DEVICE_", "GPU_CORE_", "SIMGPU_", "VGPU_")) and k != "LD_PRELOAD"}
    env.update(SIMGPU_STATE=str(tmp / "sim.state"), SIMGPU_DEVICES=SIM_DEVICES, TMPDIR=str(tmp))
    env.update(extra)
    return env


def run_doctor(tmp: Path, *args: str, timeout: float = 240, **extra: str) -> Ran:
    """`vgpu doctor ARGS --json tmp/doctor.json` as a subprocess."""
    out = tmp / "doctor.json"
    res = subprocess.run([sys.executable, "-m", "vgpu.cli", "doctor", *args, "--json", str(out)],
                         env=doctor_env(tmp, **extra), capture_output=True, text=True, timeout=timeout)
    doc = json.loads(out.read_text()) if out.exists() else None
    return Ran(res.returncode, res.stdout, res.stderr, doc)


def leftover_processes(marker: str) -> list[str]:
    """Command lines of running processes that mention `marker` (a test's temporary folder)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (proc / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if marker in cmd or marker in environ:
            found.append(cmd)
    return found
