"""The real-Kubernetes tier: upstream kube-apiserver, kube-controller-manager, kube-scheduler, kubelets and
containerd (testbed/upstream/build.sh) around our extender and plugins (testbed/realcluster.py).

Without the built programs these tests skip, unless VGPU_REQUIRE names `real-kubernetes`, where they fail (.ci/run
builds the programs and names it)."""

from __future__ import annotations

import pytest
from capabilities import missing

from vgpu.testbed.realcluster import UpstreamCluster, unavailable

CAPABILITY = "real-kubernetes"


@pytest.fixture(scope="module")
def make_real_cluster(tmp_path_factory):
    """Start an UpstreamCluster (keyword arguments as its constructor's); stopped at the module's end."""
    started: list[UpstreamCluster] = []

    def make(**kwargs) -> UpstreamCluster:
        reason = unavailable()
        if reason:
            missing(CAPABILITY, reason)
        cluster = UpstreamCluster(tmp_path_factory.mktemp("realk8s"), **kwargs)
        started.append(cluster)
        try:
            return cluster.start()
        except Exception as exc:
            raise RuntimeError(f"{exc}\n{cluster.describe()}") from exc

    yield make
    for cluster in started:
        cluster.stop()
