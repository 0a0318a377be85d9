"""Fixtures of the end-to-end tests: whole clusters in a box (vgpu/standins/cluster.py) as real processes."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable, Iterator

import pytest

from vgpu.standins.cluster import Cluster


def _missing() -> str | None:
    for module in ("deviceplugin.cli", "scheduler.cli", "vgpu.standins.kubelet", "vgpu.standins.apiserver"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not in this tree"
    from vgpu.standins.podrunner import isolation_paths

    lib, sim = isolation_paths()
    if lib is None or sim is None:
        return "isolation/build (libvgpu.so, simulated libcuda.so.1) could not be built"
    return None


@pytest.fixture(scope="session")
def components() -> None:
    """Skip when a piece of the system is missing from this tree (never the case in CI)."""
    why = _missing()
    if why:
        pytest.skip(why)


def _dump_logs(cluster: Cluster, lines: int = 15) -> str:
    parts = []
    for proc in cluster.processes():
        parts.append(f"==== {proc.name} ({'alive' if proc.alive else 'dead'})\n{proc.tail(lines)}")
    return "\n".join(parts)


@pytest.fixture(scope="module")
def make_cluster(tmp_path_factory: pytest.TempPathFactory, components: None,
                 request: pytest.FixtureRequest) -> Iterator[Callable[..., Cluster]]:
    """Start clusters for a test module; every one is stopped when the module ends, whatever happened."""
    started: list[Cluster] = []

    def make(**kwargs: object) -> Cluster:
        workdir = Path(tmp_path_factory.mktemp("cluster"))
        # metrics on free ports (tests never take :9394 / :9395)
        cluster = Cluster(workdir, metrics_port=0, scheduler_metrics_port=0, **kwargs)  # type: ignore[arg-type]
        started.append(cluster)
        cluster.start()
        return cluster

    yield make
    for cluster in started:
        cluster.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """On failure, attach the tail of every cluster process's log to the report."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        cluster = getattr(item, "_e2e_cluster", None)
        if cluster is not None:
            report.sections.append(("cluster logs", _dump_logs(cluster)))
