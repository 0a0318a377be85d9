"""Fixtures of the doctor's tests: the simulated driver and libvgpu.so, built once."""
from __future__ import annotations

from pathlib import Path

import pytest

from vgpu.isolation.build import ensure_built
from vgpu.testbed.build import ensure_sim_built


@pytest.fixture(scope="session")
def sim_dir() -> Path:
    """The simulated libcuda.so.1 / libnvidia-ml.so.1."""
    return ensure_sim_built().sim_dir


@pytest.fixture(scope="session")
def libvgpu() -> Path:
    """This checkout's libvgpu.so."""
    return ensure_built().libvgpu
