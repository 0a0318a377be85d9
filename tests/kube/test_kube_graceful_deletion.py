"""Graceful deletion of pods: the API-server stand-in with `graceful_deletion=True` (testbed/graceful.py) held to
kube-apiserver's pkg/registry/core/pod/strategy.go (CheckGracefulDelete), staging/.../registry/rest/delete.go
(BeforeDelete) and staging/.../registry/generic/registry/store.go (Delete, updateForGracefulDeletionAndFinalizers,
ShouldDeleteDuringUpdate), and the kubelet stand-in's side of it (testbed/podrunner.py: SIGTERM, SIGKILL after the
grace period, final status, the final DELETE with the UID precondition), with the `kubernetes` client, its watch
and `kubectl delete` as the judges.

The kubelet's final DELETE is sent by the test where no kubelet runs (`kubelet_delete`), as
pkg/kubelet/status/status_manager.go sends it: gracePeriodSeconds 0 and Preconditions{UID}.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from capabilities import tool
from kubernetes import client as k8s
from kubernetes import config, watch
from kubernetes.client.exceptions import ApiException

from vgpu.testbed.apiserver import ApiServerStandIn

NODE = "n1"


class Bed:
    """One stand-in with graceful deletion and plain `kubernetes` clients (no retries) on it."""

    def __init__(self, srv: ApiServerStandIn) -> None:
        self.srv, self.kubeconfig = srv, str(srv.kubeconfig)
        self.api = config.new_client_from_config(self.kubeconfig)
        self.core, self.policy = k8s.CoreV1Api(self.api), k8s.PolicyV1Api(self.api)

    def pod(self, name: str, node: str | None = NODE, phase: str | None = "Running", grace: int | None = None,
            finalizers: list[str] | None = None, command: list[str] | None = None) -> dict[str, Any]:
        """A pod (bound to `node`), its status written as a kubelet would unless `phase` is None."""
        spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox", **({"command": command}
                                                                                    if command else {})}]}
        if node:
            spec["nodeName"] = node
        if grace is not None:
            spec["terminationGracePeriodSeconds"] = grace
        made = self.json(self.core.create_namespaced_pod("default", {
            "metadata": {"name": name, "finalizers": finalizers or []}, "spec": spec}, _preload_content=False))
        if phase is not None:
            self.core.patch_namespaced_pod_status(name, "default", {"status": {"phase": phase}})
        return made

    @staticmethod
    def json(resp: Any) -> dict[str, Any]:
        return dict(orjson.loads(resp.data))

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            return self.json(self.core.read_namespaced_pod(name, "default", _preload_content=False))
        except ApiException as exc:
            assert exc.status == 404, exc
            return None

    def delete(self, name: str, **options: Any) -> dict[str, Any]:
        """DELETE with these DeleteOptions; the answer's body (the pod, as kube-apiserver answers for pods)."""
        resp = self.core.delete_namespaced_pod(name, "default", body=options, _preload_content=False)
        assert resp.status == 200
        return self.json(resp)

    def kubelet_delete(self, pod: dict[str, Any]) -> dict[str, Any]:
        """The kubelet's final DELETE (status_manager.go syncPod)."""
        return self.delete(pod["metadata"]["name"], grace_period_seconds=0,
                           preconditions={"uid": pod["metadata"]["uid"]})

    def kubectl(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([tool("kubectl", "https://kubernetes.io/docs/tasks/tools/"), "--kubeconfig",
                                 self.kubeconfig, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _bed(tmp_path: Path, graceful: bool, record: bool = False) -> Iterator[Bed]:
    srv = ApiServerStandIn(graceful_deletion=graceful, record_requests=record).start()
    srv.write_kubeconfig(tmp_path / "kubeconfig")
    bed = Bed(srv)
    yield bed
    bed.api.close()
    srv.stop()


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[Bed]:
    yield from _bed(tmp_path, graceful=True, record=True)


def _seconds_from_now(stamp: str) -> float:
    return (datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) - datetime.now(UTC)).total_seconds()


def _events(bed: Bed, since: str, count: int) -> list[tuple[str, dict[str, Any]]]:
    """The pod events after resourceVersion `since` (raw objects), up to the `count`th or the first DELETED."""
    seen: list[tuple[str, dict[str, Any]]] = []
    w = watch.Watch()
    for ev in w.stream(bed.core.list_namespaced_pod, "default", resource_version=since, timeout_seconds=10,
                       _preload_content=False):
        seen.append((ev["type"], ev["raw_object"]))
        if len(seen) == count or ev["type"] == "DELETED":
            w.stop()
    return seen


def test_without_the_option_a_delete_removes_the_pod_at_once(tmp_path: Path):
    for bed in _bed(tmp_path, graceful=False):
        bed.pod("p")
        bed.delete("p")
        assert bed.get("p") is None


def test_a_bound_pod_gets_its_deletion_timestamp_and_grace_period_and_stays(bed: Bed):
    bed.pod("default-grace")
    bed.pod("own-grace", grace=7)
    bed.pod("asked-grace", grace=7)
    answered = bed.delete("default-grace")  # no gracePeriodSeconds: the spec's, 30 when unset
    assert answered["metadata"]["deletionGracePeriodSeconds"] == 30
    assert 28 <= _seconds_from_now(answered["metadata"]["deletionTimestamp"]) <= 31
    assert bed.get("default-grace") == answered
    assert bed.delete("own-grace")["metadata"]["deletionGracePeriodSeconds"] == 7
    assert bed.delete("asked-grace", grace_period_seconds=12)["metadata"]["deletionGracePeriodSeconds"] == 12
    # the typed client reads it too
    pod = bed.core.read_namespaced_pod("asked-grace", "default")
    assert pod.metadata.deletion_grace_period_seconds == 12 and pod.metadata.deletion_timestamp is not None


def test_the_watch_sees_the_deletion_as_an_update_and_the_kubelets_delete_as_the_removal(bed: Bed):
    pod = bed.pod("p", grace=5)
    since = bed.get("p")["metadata"]["resourceVersion"]  # type: ignore[index]
    got: list[list[tuple[str, dict[str, Any]]]] = []
    reader = threading.Thread(target=lambda: got.append(_events(bed, since, 3)))
    reader.start()
    bed.delete("p")
    assert bed.get("p") is not None
    bed.kubelet_delete(pod)
    reader.join(15)
    events = got[0]
    assert [t for t, _ in events] == ["MODIFIED", "MODIFIED", "DELETED"]
    assert [o["metadata"]["deletionGracePeriodSeconds"] for _, o in events] == [5, 0, 0]
    assert bed.get("p") is None


def test_a_second_delete_may_shorten_the_grace_period_never_lengthen_it(bed: Bed):
    bed.pod("p")
    first = bed.delete("p")["metadata"]
    assert bed.delete("p", grace_period_seconds=60)["metadata"] == first  # longer: nothing changes
    assert bed.delete("p")["metadata"] == first  # none given: nothing changes
    shorter = bed.delete("p", grace_period_seconds=10)["metadata"]
    assert shorter["deletionGracePeriodSeconds"] == 10
    moved = (datetime.strptime(first["deletionTimestamp"], "%Y-%m-%dT%H:%M:%SZ")
             - datetime.strptime(shorter["deletionTimestamp"], "%Y-%m-%dT%H:%M:%SZ")).total_seconds()
    assert moved == 20  # the timestamp moves back by the difference
    assert int(shorter["resourceVersion"]) > int(first["resourceVersion"])


def test_an_unscheduled_pod_and_a_finished_pod_are_removed_at_once(bed: Bed):
    bed.pod("pending", node=None, phase=None, grace=30)
    bed.pod("done", phase="Succeeded")
    bed.pod("failed", phase="Failed")
    for name in ("pending", "done", "failed"):
        assert bed.delete(name)["metadata"]["deletionGracePeriodSeconds"] == 0
        assert bed.get(name) is None, name


def test_grace_period_zero_removes_at_once_and_is_what_kubectl_force_sends(bed: Bed):
    bed.pod("by-client")
    bed.delete("by-client", grace_period_seconds=0)
    assert bed.get("by-client") is None
    bed.pod("by-kubectl")
    out, _ = bed.kubectl("delete", "pod", "by-kubectl", "--grace-period=0", "--force", "--timeout=5s").communicate(
        timeout=30)
    assert 'pod "by-kubectl" force deleted' in out
    assert bed.get("by-kubectl") is None
    sent = [orjson.loads(r.body) for r in bed.srv.requests("") if r.method == "DELETE" and "by-kubectl" in r.target]
    assert sent and sent[0]["gracePeriodSeconds"] == 0


def test_kubectl_delete_waits_until_the_kubelet_has_removed_the_pod(bed: Bed):
    pod = bed.pod("p")
    kubectl = bed.kubectl("delete", "pod", "p", "--timeout=30s")
    deadline = time.monotonic() + 10
    while not (bed.get("p") or {}).get("metadata", {}).get("deletionTimestamp"):
        assert time.monotonic() < deadline, "no deletionTimestamp"
        time.sleep(0.05)
    time.sleep(1)
    assert kubectl.poll() is None, "kubectl returned while the pod was still there"
    bed.kubelet_delete(pod)
    out, _ = kubectl.communicate(timeout=20)
    assert kubectl.returncode == 0 and 'pod "p" deleted' in out, out


def test_the_kubelets_delete_of_a_replaced_pod_is_refused(bed: Bed):
    old = bed.pod("p")
    bed.delete("p", grace_period_seconds=0)
    bed.pod("p")
    with pytest.raises(ApiException) as refused:
        bed.kubelet_delete(old)
    assert refused.value.status == 409
    assert bed.get("p") is not None and not bed.get("p")["metadata"].get("deletionTimestamp")  # type: ignore[index]


def test_finalizers_keep_a_deleted_pod_until_an_update_empties_them(bed: Bed):
    pod = bed.pod("p", finalizers=["example.com/hold"])
    bed.delete("p", grace_period_seconds=3)
    bed.kubelet_delete(pod)
    kept = bed.get("p")
    assert kept is not None and kept["metadata"]["deletionGracePeriodSeconds"] == 0
    # an update can neither remove nor change the deletion fields
    bed.core.patch_namespaced_pod("p", "default", {"metadata": {"deletionTimestamp": None, "labels": {"a": "b"}}})
    assert bed.get("p")["metadata"]["deletionTimestamp"] == kept["metadata"]["deletionTimestamp"]  # type: ignore[index]
    bed.core.patch_namespaced_pod("p", "default", {"metadata": {"finalizers": None}})
    assert bed.get("p") is None
    # grace 0 at once: the finalizer holds it all the same
    bed.pod("q", finalizers=["example.com/hold"])
    bed.delete("q", grace_period_seconds=0)
    assert bed.get("q")["metadata"]["finalizers"] == ["example.com/hold"]  # type: ignore[index]


def test_an_eviction_deletes_gracefully_with_its_delete_options(bed: Bed):
    bed.pod("default-grace")
    bed.pod("asked-grace")
    for name, options in (("default-grace", {}), ("asked-grace", {"deleteOptions": {"gracePeriodSeconds": 3}})):
        bed.core.create_namespaced_pod_eviction(name, "default", {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}, **options})
    for name, grace in (("default-grace", 30), ("asked-grace", 3)):
        pod = bed.get(name)
        assert pod is not None, f"{name} removed at once"
        assert pod["metadata"]["deletionGracePeriodSeconds"] == grace
        assert [c["reason"] for c in pod["status"]["conditions"] if c["type"] == "DisruptionTarget"] == [
            "EvictionByEvictionAPI"]


# ------------------------------------------------------------------------------------- with a kubelet stand-in

class Node:
    """The kubelet stand-in of node n1 (`python -m vgpu.testbed.podrunner`, no device plugins) as a process."""

    def __init__(self, bed: Bed, tmp_path: Path) -> None:
        self.workdir, self.log = tmp_path / "node", tmp_path / "kubelet.log"
        self.argv = [sys.executable, "-m", "vgpu.testbed.podrunner", "--node-name", NODE, "--kubelet-dir",
                     str(tmp_path / "dp"), "--kubeconfig", bed.kubeconfig, "--workdir", str(self.workdir),
                     "--admit-grace", "0", "--log-level", "INFO"]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=log)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().startswith(b"ready"), self.log.read_text()[-2000:]

    def kill(self) -> None:
        """SIGKILL, as a crash: the pods' processes (sessions of their own) live on."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def node(bed: Bed, tmp_path: Path) -> Iterator[Node]:
    kubelet = Node(bed, tmp_path)
    kubelet.start()
    yield kubelet
    assert kubelet.proc is not None
    kubelet.proc.terminate()
    kubelet.proc.wait(10)


PROGRAM = """import signal, sys, time
def stop(*_):
    time.sleep({linger})
    sys.exit(0)
signal.signal(signal.SIGTERM, {handler})
print("ready", flush=True)
time.sleep(600)
"""


def _armed(bed: Bed, node: Node, name: str, grace: int, handler: str, linger: float = 0) -> None:
    """Run a pod whose program handles SIGTERM with `handler` (after sleeping `linger` s), until the handler is
    installed."""
    bed.pod(name, phase=None, grace=grace, command=["python3", "-c", PROGRAM.format(linger=linger, handler=handler)])
    log = node.workdir / "logs" / f"default_{name}_c.log"
    deadline = time.monotonic() + 20
    while not (log.exists() and b"\nready\n" in b"\n" + log.read_bytes()):
        assert time.monotonic() < deadline, "the pod's program did not start"
        time.sleep(0.05)


def _run_until_deleted(bed: Bed, node: Node, name: str, grace: int, handler: str,
                       linger: float = 0) -> tuple[float, list[tuple[str, dict[str, Any]]]]:
    """Run a pod as `_armed` and delete it: the seconds until it was removed, and the watch events after the
    delete."""
    _armed(bed, node, name, grace, handler, linger)
    since = bed.get(name)["metadata"]["resourceVersion"]  # type: ignore[index]
    got: list[list[tuple[str, dict[str, Any]]]] = []
    reader = threading.Thread(target=lambda: got.append(_events(bed, since, 99)))
    reader.start()
    start = time.monotonic()
    bed.delete(name)
    while bed.get(name) is not None:
        assert time.monotonic() - start < grace + 10, "the pod was not removed"
        time.sleep(0.05)
    took = time.monotonic() - start
    reader.join(15)
    return took, got[0]


def _final_status(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The last status written before the removal, which must be the last event."""
    assert events[-1][0] == "DELETED", [t for t, _ in events]
    return dict(events[-1][1]["status"])


def test_a_pod_that_exits_on_sigterm_is_removed_when_it_has_exited(bed: Bed, node: Node):
    took, events = _run_until_deleted(bed, node, "polite", grace=30, handler="stop", linger=2)
    assert 1.8 <= took < 8, took
    status = _final_status(events)
    assert status["phase"] == "Succeeded"
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


def test_a_pod_that_ignores_sigterm_is_killed_after_its_grace_period(bed: Bed, node: Node):
    took, events = _run_until_deleted(bed, node, "stubborn", grace=3, handler="signal.SIG_IGN")
    assert 2.8 <= took < 9, took
    status = _final_status(events)
    assert status["phase"] == "Failed"
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    assert next(o for _, o in events if o["metadata"].get("deletionTimestamp"))["metadata"][
        "deletionGracePeriodSeconds"] == 3


def test_a_restarted_kubelet_ends_the_processes_of_a_pod_deleted_meanwhile(bed: Bed, node: Node):
    _armed(bed, node, "orphan", grace=30, handler="stop", linger=1)
    pid = int(bed.get("orphan")["status"]["containerStatuses"][0]["containerID"].split("//")[1])  # type: ignore[index]
    node.kill()
    bed.delete("orphan")
    time.sleep(1)
    assert bed.get("orphan") is not None, "removed without a kubelet"
    node.start()
    deadline = time.monotonic() + 15
    while bed.get("orphan") is not None:
        assert time.monotonic() < deadline, "the pod was not removed"
        time.sleep(0.05)
    assert not _running(pid), "its process outlived the pod"


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie left to a reaper has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False
