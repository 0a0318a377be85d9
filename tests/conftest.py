"""Settings for the whole suite."""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid as uuidlib
from pathlib import Path

import pytest

from vgpu.testbed.realcluster import cgroup_mounts, remove_cgroup

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
    """Remove the base directory at the end: a run's clusters, images and containers take gigabytes, and runs that
    kept them filled the disk until kubelet's eviction manager tainted the real-Kubernetes tier's nodes. A red run
    keeps it for a look only when VGPU_KEEP_TMP is set."""
    keep = exitstatus != 0 and os.environ.get("VGPU_KEEP_TMP")
    if not keep and _MADE and not hasattr(session.config, "workerinput"):
        shutil.rmtree(_MADE.pop(), ignore_errors=True)


@pytest.fixture()
def cgroups():
    """Makes cgroups named like a pod's (`.../kubepods/pod<uid>/ctr`, how the node agents tell a process's pod) under
    the first cgroup hierarchy; removes them afterwards."""
    mounts = cgroup_mounts()
    if not mounts:
        pytest.skip("no cgroup hierarchy is mounted here")
    top = mounts[0] / f"vgpu-guard-{uuidlib.uuid4().hex[:8]}"

    def make(pod_uid: str | None) -> Path:
        path = top / "kubepods" / (f"pod{pod_uid}" if pod_uid else "system") / "ctr"
        path.mkdir(parents=True)
        return path

    yield make
    remove_cgroup([top])


@pytest.fixture
def apiserver(tmp_path):
    """The API-server stand-in served from a thread, with a kubeconfig for it (`.url`, `.kubeconfig`, `.store`)."""
    from vgpu.testbed.apiserver import ApiServerStandIn

    server = ApiServerStandIn().start()
    server.write_kubeconfig(tmp_path / "kubeconfig")
    yield server
    server.stop()


@pytest.fixture
def api(apiserver):
    """A rate-limited kubernetes ApiClient for `apiserver`."""
    from vgpu.kube.client import make_api_client

    client = make_api_client(apiserver.kubeconfig)
    yield client
    client.close()
