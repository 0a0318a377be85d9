"""Fixtures: a kube client on the API-server stand-in (tests/conftest.py `apiserver`), and the extender served over
real HTTP."""

import pytest
from sched_helpers import Kube, ServedExtender


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


