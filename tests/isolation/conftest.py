"""Fixtures for the isolation tests: the built libraries, the probe program, a private simulated GPU."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from capabilities import missing, tool
from iso_helpers import Libs, Sim, build_libs, build_probe
from sim_helpers import SimPrograms

from vgpu.testbed.build import ensure_sim_built


@pytest.fixture(scope="session")
def libs() -> Libs:
    return build_libs()


@pytest.fixture(scope="session")
def probe(libs: Libs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/isolation/csrc/probe.c compiled against the simulated libcuda."""
    return build_probe(libs, tmp_path_factory.mktemp("bin") / "probe")


@pytest.fixture(scope="session")
def probe_api(libs: Libs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/isolation/csrc/probe_api.c compiled against the simulated libcuda."""
    return build_probe(libs, tmp_path_factory.mktemp("bin") / "probe_api", "probe_api.c")


@pytest.fixture(scope="session")
def sim_programs(tmp_path_factory: pytest.TempPathFactory) -> SimPrograms:
    """The simulated driver and the sim_*.c programs of its own tests."""
    return SimPrograms(ensure_sim_built(), tmp_path_factory.mktemp("simbin"))


@pytest.fixture(scope="session")
def unshare_pid() -> None:
    """PID namespaces can be made here (unshare --pid, as root): tests start processes as a container runtime would."""
    unshare = tool("unshare", "util-linux")
    probe = subprocess.run([unshare, "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    if probe.returncode != 0:
        missing("pid-namespace", f"unshare --pid: {probe.stderr.decode().strip()}")


@pytest.fixture
def sim(libs: Libs, probe: Path, tmp_path: Path) -> Sim:
    return Sim(libs, probe, tmp_path / "sim.state", tmp_path / "vgpu.cache")
