"""Fixtures of the hostile-tenant suite: each test plays a pod author who is not trusted, against the real peers
(the API-server stand-in over HTTP with the official client, the device plugin over gRPC, real processes with
libvgpu.so), and shows the attack refused or harmless.

The peers come from the device-plugin, scheduler and isolation test folders (dp_helpers, sched_helpers,
iso_helpers).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[1]
for folder in ("deviceplugin", "scheduler", "isolation", "e2e"):
    if str(TESTS / folder) not in sys.path:
        sys.path.insert(0, str(TESTS / folder))

from dp_helpers import PluginBed  # noqa: E402
from sched_helpers import Kube, ServedExtender  # noqa: E402


@pytest.fixture
def node(tmp_path: Path) -> Iterator[PluginBed]:
    """One node: API-server stand-in, kubelet stand-in, and `start_plugin(...)` for the real device plugin."""
    bed = PluginBed(tmp_path)
    try:
        yield bed
    finally:
        bed.close()


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[Any]:
    from vgpu.testbed.apiserver import ApiServerStandIn

    server = ApiServerStandIn().start()
    server.write_kubeconfig(tmp_path / "kubeconfig")
    yield server
    server.stop()


@pytest.fixture
def kube(apiserver: Any) -> Kube:
    return Kube(apiserver.kubeconfig)


@pytest.fixture
def extender(apiserver: Any) -> Iterator[Callable[..., ServedExtender]]:
    """Start the extender (SchedulerRuntime served by uvicorn in this process) with config overrides."""
    started: list[ServedExtender] = []

    def start(**overrides: Any) -> ServedExtender:
        served = ServedExtender(apiserver.kubeconfig, **overrides)
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop()
