"""libvgpu.so's dlsym entry is written in assembly per architecture: checked natively (x86-64) and, built with a
cross compiler, on aarch64 under qemu-user (what Grace Hopper nodes run)."""
from __future__ import annotations

import subprocess
from pathlib import Path

from capabilities import tool
from iso_helpers import CSRC

from vgpu.isolation.build import PACKAGE_DIR
from vgpu.isolation.cuda_include import cuda_include_dir

SOURCE = CSRC / "dlsym_next.c"


def _check(run: list[str], libvgpu: Path, program: Path) -> dict[str, str]:
    res = subprocess.run([*run, str(program)], env={"LD_PRELOAD": str(libvgpu), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, (res.stdout, res.stderr)
    return dict(line.split("=", 1) for line in res.stdout.split())


def test_dlsym_entry_native(libs, tmp_path):
    program = tmp_path / "dlsym_next"
    subprocess.run(["gcc", "-O2", "-o", str(program), str(SOURCE), "-ldl"], check=True)
    assert _check([], libs.libvgpu, program) == {"next": "1", "handle": "1"}


def test_dlsym_entry_aarch64(tmp_path):
    cc = tool("aarch64-linux-gnu-gcc", "Debian's gcc-aarch64-linux-gnu")
    qemu = tool("qemu-aarch64", "Debian's qemu-user")
    build = tmp_path / "build"
    subprocess.run(["make", "-s", "-C", str(PACKAGE_DIR), f"BUILD={build}", f"CC={cc}",
                    f"CUDA_INCLUDE={cuda_include_dir()}"], check=True)
    program = tmp_path / "dlsym_next"
    subprocess.run([cc, "-O2", "-o", str(program), str(SOURCE), "-ldl"], check=True)
    sysroot = "/usr/aarch64-linux-gnu"
    assert _check([qemu, "-L", sysroot], build / "libvgpu.so", program) == {"next": "1", "handle": "1"}
