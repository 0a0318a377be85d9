"""Fixtures for the Kubernetes access layer, beside tests/conftest.py's `apiserver` (the stand-in served from a
thread) and `api` (a client for it):

`apiserver_process`  ApiServerProcess, a real subprocess with persistence; `.kill()`, `.restart()`, `.kubeconfig`
`eventually`         eventually(predicate, timeout=10) -> polls until true, fails the test otherwise
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from vgpu.testbed.apiserver import ApiServerProcess


@pytest.fixture
def apiserver_process(tmp_path) -> Iterator[ApiServerProcess]:
    proc = ApiServerProcess(tmp_path / "apiserver").start()
    yield proc
    proc.kill()


@pytest.fixture
def eventually() -> Callable[..., None]:
    def wait(predicate: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.02)
    return wait
