"""Pod builders and readers for the real-Kubernetes tier: pods that run the sample GPU workload, made into the
tier's pods by `real_pod` (the local base image, this machine's Python mounted in), and what the workload printed,
read back through `kubectl logs`."""

from __future__ import annotations

import json
from typing import Any

from vgpu.testbed.realcluster import UpstreamCluster, real_pod
from vgpu.testbed.workload import MARKER

WORKLOAD = ["python3", "-m", "vgpu.testbed.workload"]
TERMINAL = ("Succeeded", "Failed")


def gpu_container(name: str, args: list[str], number: int = 1, memory: int | None = None,
                  cores: int | None = None) -> dict:
    """A container running the workload with `args`, asking our resources in limits."""
    limits = {"volcano.sh/vgpu-number": str(number)}
    if memory is not None:
        limits["volcano.sh/vgpu-memory"] = str(memory)
    if cores is not None:
        limits["volcano.sh/vgpu-cores"] = str(cores)
    return {"name": name, "command": [*WORKLOAD, *args],
            "resources": {"limits": limits, "requests": {"cpu": "10m", "memory": "32Mi"}}}


def gpu_pod(name: str, containers: list[dict], namespace: str = "default", scheduler: str = "vgpu-scheduler",
            **spec: Any) -> dict:
    """A pod of the tier (`real_pod`) that runs once, for `scheduler`."""
    body = {"schedulerName": scheduler, "restartPolicy": "Never", "containers": containers, **spec}
    return real_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
                     "spec": body})


def create(cluster: UpstreamCluster, pod: dict) -> dict:
    """Create the pod through kube-apiserver."""
    namespace = pod["metadata"]["namespace"]
    return cluster.post(f"/api/v1/namespaces/{namespace}/pods", pod)


def get_pod(cluster: UpstreamCluster, name: str, namespace: str = "default") -> dict:
    """The pod as stored now."""
    return cluster.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def phase(pod: dict) -> str:
    """status.phase (Pending when absent)."""
    return (pod.get("status") or {}).get("phase") or "Pending"


def wait_finished(cluster: UpstreamCluster, name: str, namespace: str = "default", timeout: float = 120) -> dict:
    """Wait until the pod has Succeeded or Failed; the pod (TimeoutError with the cluster's state otherwise)."""
    try:
        return cluster.wait(f"pod {name} finished", lambda: (p := get_pod(cluster, name, namespace))
                            and phase(p) in TERMINAL and p, timeout)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}\n{cluster.describe()}") from exc


def report(cluster: UpstreamCluster, name: str, container: str, namespace: str = "default") -> dict:
    """The JSON line the workload printed, read with `kubectl logs` (kube-apiserver asks the kubelet)."""
    for line in cluster.pod_logs(namespace, name, container).splitlines():
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    raise AssertionError(f"{namespace}/{name}/{container} printed no report")
