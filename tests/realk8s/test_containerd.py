"""containerd as the real-Kubernetes tier runs it (testbed/containerd.py), driven over CRI by crictl the way kubelet
drives it: pod sandboxes of the pinned pause image, on the pod network and on the host's, and containers of the local
base image with the host's /usr mounted read-only and a CDI device resolved from a spec in the runtime's directory."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from capabilities import missing

from vgpu.testbed.containerd import BASE_IMAGE, POD_SUBNET, Containerd, unavailable
from vgpu.testbed.realcluster import upstream_dir

pytestmark = [pytest.mark.realk8s]

CAPABILITY = "real-kubernetes"
HOST_READ_ONLY = ("/usr/bin", "/usr/lib", "/usr/lib64", "/etc/alternatives")
CDI_SPEC = {"cdiVersion": "0.6.0", "kind": "example.com/gpu",
            "devices": [{"name": "d0", "containerEdits": {"env": ["FOO=bar"]}}]}
HELLO = ["/bin/sh", "-c", "echo hello; /usr/bin/python3 -c 'print(\"python\", 3)'; env"]


def _programs() -> Path:
    """build.sh's folder (bin/, images/); the test skips where it is not built or containerd cannot run."""
    found = upstream_dir()
    if found is None:
        missing(CAPABILITY, "the upstream programs are not built (testbed/upstream/build.sh)")
    reason = unavailable(found / "bin")
    if reason:
        missing(CAPABILITY, reason)
    return found


def _containerd(root: Path) -> Containerd:
    found = _programs()
    cdi = root / "cdi"
    cdi.mkdir(parents=True)
    (cdi / "example.json").write_text(json.dumps(CDI_SPEC))
    return Containerd(root / "containerd", found / "bin", found / "images", cdi_dirs=[cdi])


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    """A started containerd with the example CDI spec (a short root: unix socket paths are limited)."""
    containerd = _containerd(tmp_path_factory.mktemp("ctd"))
    try:
        containerd.start()
        yield containerd
    finally:
        containerd.stop()


def _crictl(runtime: Containerd, *args: str) -> str:
    done = runtime.crictl(*args)
    assert done.returncode == 0, f"crictl {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def run_pod(runtime: Containerd, name: str, host_network: bool) -> tuple[str, Path]:
    """Start a pod sandbox; its ID and its config file (crictl create wants it again)."""
    linux = {"security_context": {"namespace_options": {"network": 2}}} if host_network else {}  # 2: NODE
    config = {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "attempt": 0},
              "log_directory": str(runtime.root / "pods" / name), "linux": linux}
    path = runtime.root / f"pod-{name}.json"
    path.write_text(json.dumps(config))
    return _crictl(runtime, "runp", str(path)), path


def run_container(runtime: Containerd, pod: tuple[str, Path], name: str, command: list[str],
                  cdi_devices: Sequence[str] = (), annotations: dict[str, str] | None = None) -> str:
    """Create and start a container of the base image with the host's /usr read-only in the pod; its ID."""
    config = {"metadata": {"name": name}, "image": {"image": BASE_IMAGE}, "command": command,
              "log_path": f"{name}.log", "linux": {}, "annotations": annotations or {},
              "mounts": [{"container_path": path, "host_path": path, "readonly": True} for path in HOST_READ_ONLY
                         if Path(path).exists()],
              "CDI_devices": [{"name": device} for device in cdi_devices]}
    path = runtime.root / f"container-{name}.json"
    path.write_text(json.dumps(config))
    container = _crictl(runtime, "create", pod[0], str(path), str(pod[1]))
    _crictl(runtime, "start", container)
    return container


def finished_log(runtime: Containerd, container: str, timeout: float = 30) -> str:
    """The container's log once it has exited with status 0."""
    deadline = time.monotonic() + timeout
    while (status := json.loads(_crictl(runtime, "inspect", container))["status"])["state"] != "CONTAINER_EXITED":
        assert time.monotonic() < deadline, f"container {container} still {status['state']}"
        time.sleep(0.2)
    log = _crictl(runtime, "logs", container)
    assert status["exitCode"] == 0, log
    return log


def test_a_container_on_the_pod_network_runs_the_hosts_python_with_its_cdi_device(runtime):
    pod = run_pod(runtime, "pod-network", host_network=False)
    log = finished_log(runtime, run_container(runtime, pod, "hello", HELLO, cdi_devices=["example.com/gpu=d0"]))
    assert "hello" in log and "python 3" in log
    assert "FOO=bar" in log.splitlines()
    ip = json.loads(_crictl(runtime, "inspectp", pod[0]))["status"]["network"]["ip"]
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(POD_SUBNET), ip


def test_a_container_on_the_host_network_gets_a_cdi_device_named_by_annotation(runtime):
    pod = run_pod(runtime, "host-network", host_network=True)
    container = run_container(runtime, pod, "hello", HELLO, annotations={"cdi.k8s.io/test": "example.com/gpu=d0"})
    log = finished_log(runtime, container)
    assert "hello" in log and "python 3" in log
    assert "FOO=bar" in log.splitlines()


def test_stop_ends_the_containers_and_shims_of_a_containerd_killed_under_them(tmp_path_factory):
    containerd = _containerd(tmp_path_factory.mktemp("ctd"))
    try:
        containerd.start()
        pod = run_pod(containerd, "sleeper", host_network=False)
        # the root in the command line marks the container's process, as the socket path marks the shim's
        run_container(containerd, pod, "sleeper", ["/usr/bin/python3", "-c", "import time; time.sleep(600)",
                                                   str(containerd.root)])
        daemon = _processes(containerd.root / "config.toml")
        assert len(daemon) == 1, daemon
        os.kill(daemon[0], signal.SIGKILL)
    finally:
        containerd.stop()
    assert _processes(containerd.root) == []
    assert str(containerd.root) not in Path("/proc/self/mountinfo").read_text()


def _processes(mark: Path) -> list[int]:
    """The processes with `mark` in their command line."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if str(mark).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found
