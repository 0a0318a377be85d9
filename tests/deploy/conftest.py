"""Fixtures of the deploy/ and docs/ checks."""

import socket

import pytest


@pytest.fixture
def no_network(monkeypatch):
    """Any socket connection attempt fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture(scope="session")
def cluster_round(tmp_path_factory):
    """One scheduling round of the shipped extender and device plugin (cluster_scenario.run_round)."""
    from cluster_scenario import run_round

    done = run_round(tmp_path_factory.mktemp("round"))
    yield done
    done.apiserver.stop()


@pytest.fixture(scope="session")
def consolidation_round(tmp_path_factory):
    """The chart's consolidation controller through one move (cluster_scenario.run_consolidation)."""
    from cluster_scenario import run_consolidation

    done = run_consolidation(tmp_path_factory.mktemp("consolidation"))
    yield done
    done.apiserver.stop()
