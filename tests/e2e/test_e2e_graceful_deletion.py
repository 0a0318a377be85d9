"""A whole cluster whose API server deletes pods gracefully (`LocalCluster(graceful_deletion=True)`): a deleted GPU
pod stays, terminating, while its process handles SIGTERM, then its kubelet stand-in writes its final status,
releases its devices and removes it, after which the GPU memory it held can be granted again.

The API server's and kubelet's rules themselves are pinned in tests/kube/test_kube_graceful_deletion.py.
"""

from __future__ import annotations

import time

import pytest
from e2e_helpers import container, phase, pod

PROGRAM = """import signal, sys, time
def stop(*_):
    print("stopping", flush=True)
    time.sleep(3)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture(scope="module")
def cluster(make_cluster):
    return make_cluster(nodes=1, gpus="1xA100-40GB", graceful_deletion=True)


def _get(cluster, name: str) -> dict | None:
    return cluster.api_get(f"/api/v1/namespaces/e2e/pods/{name}")


def _gpu_pod(name: str) -> dict:
    return pod(name, [container("c", ["python3", "-c", PROGRAM], memory=30000)])


def test_a_deleted_gpu_pod_ends_through_its_kubelet_and_frees_its_share(cluster, request):
    request.node._e2e_cluster = cluster
    cluster.create_pod(_gpu_pod("first"))
    cluster.wait("first running", lambda: phase(_get(cluster, "first") or {}) == "Running", 120)
    log = cluster.nodes[0].dir / "logs" / "e2e_first_c.log"
    cluster.wait("first's program armed", lambda: log.exists() and b"\nready\n" in b"\n" + log.read_bytes(), 60)
    cluster.delete_pod("e2e", "first")
    start = time.monotonic()
    terminating = _get(cluster, "first")
    assert terminating is not None and terminating["metadata"]["deletionGracePeriodSeconds"] == 30
    cluster.wait("first gone", lambda: _get(cluster, "first") is None, 30, interval=0.05)
    assert time.monotonic() - start >= 2.5, "removed before its process had ended"
    assert b"\nstopping\n" in log.read_bytes()
    # the 30000 MiB it held fit once more: only granted again if its share was released
    cluster.create_pod(_gpu_pod("second"))
    cluster.wait("second running", lambda: phase(_get(cluster, "second") or {}) == "Running", 120)
