"""`vgpu demo --real-kubernetes`: the demo's sample pods, live table and summary on upstream Kubernetes.

The cluster is testbed/realcluster.py's `UpstreamCluster` (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler with our extender, per node kubelet, containerd and our device plugin), built by
testbed/upstream/build.sh. The sample pods are testbed/demo.py's, run as that tier's pods are: the local base image
with this machine's software mounted read-only, the workload under this Python, other commands from the host's
/usr/bin; their reports are read back through kube-apiserver from the kubelets (`kubectl logs`).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from vgpu.errors import ConfigError
from vgpu.testbed.cluster import isolation_paths
from vgpu.testbed.demo import NAMESPACE, check_gpus, demo_workdir, drive, report_in
from vgpu.testbed.realcluster import UpstreamCluster, real_pod, unavailable, upstream_dir

__all__ = ["RealCluster", "run_real_demo"]

ENDED = ("Succeeded", "Failed")


class RealCluster(UpstreamCluster):
    """UpstreamCluster as testbed/demo.py's `drive` uses a cluster (what demo.StandIns offers on the stand-ins)."""

    LOGS = ("logs", "node-*/pod-logs")  # in the work directory: the processes' logs, the kubelets' container logs
    memory_factor = 1  # the device plugin advertises memory in MiB

    def __init__(self, workdir: Path, nodes: int, gpus: str, out: TextIO) -> None:
        super().__init__(workdir, nodes=nodes, gpus=gpus)
        self.out = out
        self._reports: dict[str, dict[str, dict]] = {}  # pod UID -> container -> report, read once the pod ended

    @property
    def url(self) -> str:
        """kube-apiserver's address."""
        return self.server

    @property
    def scheduler_metrics_port(self) -> int:
        """The extender's metrics port."""
        return self.extender_metrics_port

    def start(self) -> RealCluster:
        """Start as UpstreamCluster does, printing each process as it starts; then make the demo's namespace."""
        done = threading.Event()
        watcher = threading.Thread(target=self._progress, args=(done, time.monotonic()), daemon=True)
        watcher.start()
        try:
            super().start()
        finally:
            done.set()
            watcher.join()
        self.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        # the ServiceAccount admission refuses pods until kube-controller-manager has made the namespace's default one
        self.wait(f"{NAMESPACE}'s default ServiceAccount",
                  lambda: self.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"), 60)
        return self

    def _progress(self, done: threading.Event, t0: float) -> None:
        """Print each process of `procs` once it has started, until `done`."""
        seen: set[str] = set()
        while True:
            finished = done.wait(0.25)
            for name in list(self.procs):
                if name not in seen:
                    seen.add(name)
                    print(f"vgpu demo:   {time.monotonic() - t0:5.1f}s {name}", file=self.out, flush=True)
            if finished:
                return

    def node_objects(self) -> list[dict]:
        """Every node."""
        return self.get("/api/v1/nodes")["items"]

    def pods(self) -> list[dict]:
        """Every pod."""
        return self.get("/api/v1/pods")["items"]

    def processes(self) -> list[Any]:
        """Every process the cluster started."""
        return list(self.procs.values())

    def create_pod(self, pod: dict) -> dict:
        """Create `pod` as real_pod makes it."""
        return self.post(f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods", real_pod(pod))

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod and wait until it is gone (its name free for the next one)."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        self.http.delete(path)
        self.wait(f"pod {name} deleted", lambda: self.http.get(path).status_code == 404, 60)

    def workload_reports(self, pods: list[dict]) -> dict[tuple[str, str, str], dict]:
        """The workload reports of the ended pods among `pods`, from their logs through kube-apiserver."""
        out: dict[tuple[str, str, str], dict] = {}
        for pod in pods:
            meta = pod["metadata"]
            if (pod.get("status") or {}).get("phase") not in ENDED:
                continue
            if meta["uid"] not in self._reports:
                read = self._read_reports(pod)
                if read is None:
                    continue
                self._reports[meta["uid"]] = read
            for container, report in self._reports[meta["uid"]].items():
                out[(meta["namespace"], meta["name"], container)] = report
        return out

    def _read_reports(self, pod: dict) -> dict[str, dict] | None:
        """container -> the report in its log (as `kubectl logs` reads it); None when a log could not be read."""
        meta = pod["metadata"]
        found = {}
        for container in pod["spec"]["containers"]:
            answer = self.http.get(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/log",
                                   params={"container": container["name"]})
            if not answer.is_success:
                return None
            report = report_in(answer.text)
            if report is not None:
                found[container["name"]] = report
        return found


def run_real_demo(args: argparse.Namespace) -> int:
    """The demo on real Kubernetes; exit 1 with one line when the upstream programs cannot run here."""
    check_gpus(args.gpus)
    reason = unavailable()
    if reason:
        build = "; run `bash testbed/upstream/build.sh` first" if upstream_dir() is None else ""
        print(f"vgpu demo: --real-kubernetes cannot run here: {reason}{build}", file=sys.stderr)
        return 1
    isolation_paths()  # builds libvgpu.so and the simulated driver now, or fails with BuildError
    workdir = demo_workdir(args)
    if workdir is None:
        return 2
    try:
        cluster = RealCluster(workdir, args.nodes, args.gpus, sys.stdout)
    except ValueError as exc:  # a folder too deep for the unix sockets below it
        raise ConfigError(f"--workdir {exc}") from None
    return drive(args, cluster, None)
