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
    # the node's Lease, which the kubelet stand-in keeps renewed in kube-node-lease
    assert "Failed to get lease" not in out
    assert "HolderIdentity:  node-0" in out and "RenewTime:" in out


def test_logs_are_what_the_container_wrote(cluster):
    out = kubectl(cluster, "logs", "-n", NS, "finished")
    assert '"result"' in out and '"argv"' not in out   # the workload's report, not what the test bed started
    last = kubectl(cluster, "logs", "-n", NS, "finished", "-c", "main", "--tail", "1")
    assert last.strip() == out.strip().splitlines()[-1]


def test_logs_of_a_pod_without_a_node_are_empty_and_a_container_must_be_named(cluster):
    two = pod("two", [container("a", ["true"]), container("b", ["true"])], namespace=NS)
    two["spec"]["schedulerName"] = "nobody"   # never placed
    cluster.create_pod(two)
    assert kubectl(cluster, "logs", "-n", NS, "two", "-c", "a") == ""
    res = subprocess.run([KUBECTL, "--kubeconfig", cluster.kubeconfig, "get", "--raw",
                          f"/api/v1/namespaces/{NS}/pods/two/log"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert "a container name must be specified for pod two, choose one of: [a b]" in res.stderr
    res = subprocess.run([KUBECTL, "--kubeconfig", cluster.kubeconfig, "logs", "-n", NS, "two", "-c", "c"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "container c is not valid for pod two" in res.stderr


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
