"""Fixtures for the Kubernetes access layer: the API-server stand-in (in-process or as a subprocess) and clients.

`apiserver`          ApiServerStandIn served from a thread (fast); `.url`, `.kubeconfig`, `.store`
`apiserver_process`  ApiServerProcess, a real subprocess with persistence; `.kill()`, `.restart()`, `.kubeconfig`
`api`                a rate-limited kubernetes ApiClient for `apiserver`
`eventually`         eventually(predicate, timeout=10) -> polls until true, fails the test otherwise
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client as k8s

from vgpu.kube.client import make_api_client
from vgpu.testbed.apiserver import ApiServerProcess, ApiServerStandIn


@pytest.fixture
def apiserver(tmp_path) -> Iterator[ApiServerStandIn]:
    srv = ApiServerStandIn().start()
    srv.write_kubeconfig(tmp_path / "kubeconfig")
    yield srv
    srv.stop()


@pytest.fixture
def api(apiserver: ApiServerStandIn) -> Iterator[k8s.ApiClient]:
    client = make_api_client(apiserver.kubeconfig)
    yield client
    client.close()


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
