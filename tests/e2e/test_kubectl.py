"""The real `kubectl` against the cluster in a box (what `vgpu demo` runs): discovery, server-side printing, YAML,
describe, events, leases. kubectl is the judge of the API-server stand-in here: it was not written by us.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest
from capabilities import tool
from e2e_helpers import TERMINAL, WORKLOAD, container, phase, pod, wait_until

from vgpu.testbed.cluster import LocalCluster

KUBECTL = shutil.which("kubectl")
NS = "kubectl"


@pytest.fixture(scope="module")
def cluster(make_cluster) -> Iterator[LocalCluster]:
    tool("kubectl", "https://kubernetes.io/docs/tasks/tools/")
    c = make_cluster(nodes=2, gpus="2xA100-40GB", scheduler_args=["--leader-elect", "--lease-namespace", "vgpu-system"])
    c.create_pod(pod("finished", [container("main", WORKLOAD + ["--mib", "500"], memory=1000, cores=10)],
                     namespace=NS))
    c.create_pod(pod("running", [container("main", ["sleep", "600"], memory=1000, cores=10)], namespace=NS))
    wait_until("pods placed", lambda: phase(c.api_get(f"/api/v1/namespaces/{NS}/pods/finished") or {}) in TERMINAL
               and phase(c.api_get(f"/api/v1/namespaces/{NS}/pods/running") or {}) == "Running", 120)
    yield c


def kubectl(cluster: LocalCluster, *args: str) -> str:
    assert KUBECTL is not None
    res = subprocess.run([KUBECTL, "--kubeconfig", cluster.kubeconfig, *args], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, f"kubectl {' '.join(args)}: {res.stderr}"
    assert "error" not in res.stderr.lower(), res.stderr
    return res.stdout


def test_get_nodes(cluster):
    lines = kubectl(cluster, "get", "nodes").splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert {line.split()[0]: line.split()[1] for line in lines[1:]} == {"node-0": "Ready", "node-1": "Ready"}


def test_get_pods_all_namespaces_wide(cluster):
    out = kubectl(cluster, "get", "pods", "-A", "-o", "wide")
    header, *rows = out.splitlines()
    assert header.split()[:6] == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert "NODE" in header
    by_name = {row.split()[1]: row.split() for row in rows}
    assert by_name["running"][0] == NS and by_name["running"][3] == "Running"
    assert by_name["running"][7] in ("node-0", "node-1")
    assert by_name["finished"][3] in ("Completed", "Succeeded")


def test_get_pods_yaml_shows_the_assignment(cluster):
    out = kubectl(cluster, "get", "pods", "-n", NS, "running", "-o", "yaml")
    assert "volcano.sh/vgpu-ids-new:" in out and "nodeName: node-" in out


def test_describe_node(cluster):
    out = kubectl(cluster, "describe", "node", "node-0")
    assert "Name:               node-0" in out
    assert "volcano.sh/vgpu-number:" in out and "volcano.sh/node-vgpu-register:" in out
    assert "Kubelet Version:" in out and "v1.31.0-vgpu-testbed" in out


def test_get_events(cluster):
    out = kubectl(cluster, "get", "events", "-A")
    assert out.splitlines()[0].split()[:4] == ["NAMESPACE", "LAST", "SEEN", "TYPE"]
    assert "Scheduled" in out


def test_api_resources(cluster):
    out = kubectl(cluster, "api-resources")
    names = {line.split()[0] for line in out.splitlines()[1:]}
    assert {"pods", "nodes", "events", "leases"} <= names


def test_get_leases(cluster):
    out = kubectl(cluster, "get", "lease", "-A")
    assert "vgpu-scheduler" in out
