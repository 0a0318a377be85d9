"""Settings for the whole suite."""
from __future__ import annotations

import shutil
import tempfile

import pytest

_MADE: list[str] = []


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """A short base directory for tmp_path. The test bed puts kubelet's socket directories under tmp_path and a unix
    socket's path is limited to 107 bytes: pytest's default base (/tmp/pytest-of-<user>/pytest-<n>) plus the
    per-worker folder of parallel runs (popen-gw<n>) leaves too little of it."""
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        _MADE.append(tempfile.mkdtemp(prefix="vt-", dir="/tmp"))
        config.option.basetemp = _MADE[-1]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the base directory after a green run (a red one keeps it for a look)."""
    if exitstatus == 0 and _MADE and not hasattr(session.config, "workerinput"):
        shutil.rmtree(_MADE.pop(), ignore_errors=True)
