"""Fixtures of the device-plugin tests: `cluster` (dp_helpers.Cluster) is torn down after each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from dp_helpers import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()
