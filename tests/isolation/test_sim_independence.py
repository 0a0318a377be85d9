"""The simulated GPU shares no code, header or build input with the isolation library it tests.

A simulator that includes the library's headers or reuses its code agrees with it by construction, so a test over
it proves nothing. Allowed in common: NVIDIA's headers (cuda.h, nvml.h) and the C library. API signatures are facts
and idioms recur, so shared code is looked for as runs of 20 tokens (comments and preprocessor lines left out).
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from vgpu.testbed.build import nvml_include_dir

ROOT = Path(__file__).resolve().parents[2]
LIB_SRC = ROOT / "isolation" / "src"
SIM_SRC = ROOT / "testbed" / "simgpu"
RUN = 20


def c_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in (".c", ".h"))


def tokens(text: str) -> list[str]:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"^\s*#[^\n]*", " ", text, flags=re.M)
    return re.findall(r'[A-Za-z_]\w*|\d+\w*|"(?:\\.|[^"\\])*"|\S', text)


def runs(files: list[Path]) -> dict[tuple[str, ...], Path]:
    out: dict[tuple[str, ...], Path] = {}
    for f in files:
        t = tokens(f.read_text())
        for i in range(len(t) - RUN + 1):
            out.setdefault(tuple(t[i:i + RUN]), f)
    return out


def test_simulator_includes_only_its_own_and_nvidia_headers():
    lib_headers = {p.name for p in LIB_SRC.glob("*.h")}
    for f in c_files(SIM_SRC):
        for name in re.findall(r'#\s*include\s*"([^"]+)"', f.read_text()):
            assert (SIM_SRC / name).is_file(), f"{f.name} includes {name}, which is not in testbed/simgpu"
        for name in re.findall(r"#\s*include\s*<([^>]+)>", f.read_text()):
            assert Path(name).name not in lib_headers, f"{f.name} includes the library's {name}"
    assert not {p.name for p in SIM_SRC.glob("*.h")} & lib_headers


def test_simulator_build_has_no_isolation_input(libs):
    makefile = (ROOT / "testbed" / "Makefile").read_text()
    assert "isolation" not in makefile
    dry = subprocess.run(["make", "-n", "-B", "-C", str(ROOT / "testbed"), "BUILD=/nonexistent",
                          f"NVML_INCLUDE={nvml_include_dir()}"], capture_output=True, text=True, check=True).stdout
    compiles = [line for line in dry.splitlines() if " -o " in line]
    assert len(compiles) == 2
    for line in compiles:
        assert "isolation" not in line, line
        assert "simgpu/sim" in line


def test_simulator_and_library_share_no_code():
    common = set(runs(c_files(LIB_SRC))) & set(runs(c_files(SIM_SRC)))
    assert not common, "shared code: " + " | ".join(" ".join(r) for r in sorted(common)[:3])


def test_the_simulated_nvml_is_compiled_against_nvidias_header():
    text = (SIM_SRC / "simnvml.c").read_text()
    assert "#include <nvml.h>" in text
    assert "NVIDIA Corporation" in (nvml_include_dir() / "nvml.h").read_text()[:4000]
