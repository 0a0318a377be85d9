"""Fixtures for the isolation tests: the built libraries, the probe program, a private simulated GPU."""
from __future__ import annotations

from pathlib import Path

import pytest
from iso_helpers import Libs, Sim, build_libs, build_probe


@pytest.fixture(scope="session")
def libs() -> Libs:
    return build_libs()


@pytest.fixture(scope="session")
def probe(libs: Libs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/isolation/csrc/probe.c compiled against the simulated libcuda."""
    return build_probe(libs, tmp_path_factory.mktemp("bin") / "probe")


@pytest.fixture
def sim(libs: Libs, probe: Path, tmp_path: Path) -> Sim:
    return Sim(libs, probe, tmp_path / "sim.state", tmp_path / "vgpu.cache")
