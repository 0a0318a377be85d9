"""Fixtures of the device-plugin tests: `cluster` (dp_helpers.PluginBed) is torn down after each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from dp_helpers import PluginBed


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[PluginBed]:
    c = PluginBed(tmp_path)
    try:
        yield c
    finally:
        c.close()
