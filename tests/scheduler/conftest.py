"""Fixtures: the API-server stand-in, a kube client on it, and the extender served over real HTTP."""

import pytest
from sched_helpers import Kube, ServedExtender


@pytest.fixture
def apiserver(tmp_path):
    from vgpu.testbed.apiserver import ApiServerStandIn

    server = ApiServerStandIn().start()
    server.write_kubeconfig(tmp_path / "kubeconfig")
    yield server
    server.stop()


@pytest.fixture
def kube(apiserver):
    return Kube(apiserver.kubeconfig)


@pytest.fixture
def served(apiserver):
    started = []

    def start(**overrides):
        ext = ServedExtender(apiserver.kubeconfig, **overrides)
        started.append(ext)
        return ext

    yield start
    for ext in started:
        ext.stop()


