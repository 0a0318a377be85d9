"""Fixtures of the DRA-plugin tests: `bed` (dra_helpers.DRABed), torn down after each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dra_helpers import DRABed


@pytest.fixture
def bed() -> Iterator[DRABed]:
    b = DRABed()
    try:
        yield b
    finally:
        b.close()
