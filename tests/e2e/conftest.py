"""Fixtures of the end-to-end tests: whole clusters in a box (testbed/cluster.py) as real processes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from vgpu.testbed.cluster import LocalCluster, isolation_paths


@pytest.fixture(scope="session")
def components() -> None:
    """Build libvgpu.so and the simulated driver once; a failed C build fails every end-to-end test."""
    isolation_paths()


def _dump_logs(cluster: LocalCluster, lines: int = 15) -> str:
    parts = []
    for proc in cluster.processes():
        parts.append(f"==== {proc.name} ({'alive' if proc.alive else 'dead'})\n{proc.tail(lines)}")
    return "\n".join(parts)


@pytest.fixture(scope="module")
def make_cluster(tmp_path_factory: pytest.TempPathFactory, components: None,
                 request: pytest.FixtureRequest) -> Iterator[Callable[..., LocalCluster]]:
    """Start clusters for a test module; every one is stopped when the module ends, whatever happened."""
    started: list[LocalCluster] = []

    def make(**kwargs: object) -> LocalCluster:
        workdir = Path(tmp_path_factory.mktemp("cluster"))
        # metrics on free ports (tests never take :9394 / :9395)
        cluster = LocalCluster(workdir, metrics_port=0, scheduler_metrics_port=0, **kwargs)  # type: ignore[arg-type]
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
