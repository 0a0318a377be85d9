"""`vgpu dra-plugin` registers with kubelet's plugin watcher: GetInfo and NotifyRegistrationStatus over the real
registration socket; its sockets are replaced at start and removed at stop; bad options are one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
import pytest
from dra_helpers import DRIVER, ROOT, DRABed, eventually

from vgpu.proto.dra.v1 import api_pb2 as dra_v1


def test_get_info_names_the_driver_its_socket_both_versions_and_the_health_services(bed: DRABed) -> None:
    bed.start()
    info = bed.get_info()
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(bed.dra_socket)
    assert os.path.isabs(info.endpoint)
    # the DRAPlugin versions first (kubelet takes the first it speaks), then the optional health service in both
    # packages: kubelets with kubernetes/kubernetes#139477 open the stream only for a plugin that lists it
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
                                             "v1alpha1.DRAResourceHealth"]
    # the endpoint is a live DRA service: an empty batch is answered with an empty map
    with grpc.insecure_channel(f"unix://{info.endpoint}") as channel:
        call = channel.unary_unary("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
                                   request_serializer=dra_v1.NodePrepareResourcesRequest.SerializeToString,
                                   response_deserializer=dra_v1.NodePrepareResourcesResponse.FromString)
        assert dict(call(dra_v1.NodePrepareResourcesRequest(), timeout=5).claims) == {}


def test_registration_status_is_logged_an_error_when_refused(bed: DRABed) -> None:
    bed.start()
    bed.notify(True)
    eventually(lambda: "event=registered_with_kubelet" in bed.log(), what="the registered line")
    bed.notify(False, "version v9 not supported")
    line = eventually(lambda: next((x for x in bed.log().splitlines() if "event=registration_refused" in x), None),
                      what="the refused line")
    assert " ERROR " in line and "version v9 not supported" in line


def test_stale_sockets_are_replaced_and_own_sockets_removed_at_stop(bed: DRABed) -> None:
    for path in (bed.dra_socket, bed.registration_socket):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("left by a killed plugin")
    bed.start()
    assert bed.get_info().name == DRIVER
    assert bed.stop() == 0, bed.log()
    assert not bed.dra_socket.exists()
    assert not bed.registration_socket.exists()
    # the slice stays: a restarting plugin does not make its devices vanish (kubelet removes an unregistered
    # driver's slices itself)
    assert bed.read_slice() is not None


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "HOOK_PATH")}
    environ.update(env or {}, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "vgpu.cli", "dra-plugin", *args], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args,message", [
    ((), "--node-name: required"),
    (("--node-name", "n", "--backend", "gpu"), "--backend: unknown value 'gpu'"),
    (("--node-name", "n", "--backend", "sim"), "--sim-gpus: required with --backend sim"),
    (("--node-name", "n", "--backend", "sim", "--sim-gpus", "2xB999"), "--sim-gpus 2xB999: unknown model 'B999'"),
    (("--node-name", "n", "--sim-gpus", "1xT4"), "--sim-gpus: only meaningful with --backend sim"),
    (("--node-name", "n", "--plugins-dir", "relative/dir"), "--plugins-dir: must be an absolute path"),
    (("--node-name", "n", "--registry-dir", "/" + "r" * 120), "--registry-dir: socket path"),
    # 106 bytes with the socket's name: sun_path would hold it, gRPC's server does not bind it
    (("--node-name", "n", "--registry-dir", "/" + "r" * 76), "--registry-dir: socket path"),
    (("--node-name", "n", "--isolation-fail-open", "maybe"), "--isolation-fail-open: expected true or false"),
    (("--node-name", "n", "--xid-recovery-seconds", "0"), "--xid-recovery-seconds: must be above 0"),
])
def test_bad_options_are_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    res = _run(*args)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vgpu dra-plugin: ") and message in lines[0], res.stderr


def test_node_name_and_hook_path_come_from_the_environment(bed: DRABed) -> None:
    args = bed.command()
    i = args.index("--node-name")
    del args[i:i + 2]
    j = args.index("--hook-path")
    del args[j:j + 2]
    bed.args = args
    bed.env = {"NODE_NAME": "node-a", "HOOK_PATH": str(bed.tmp / "from-env")}
    bed._spawn()
    assert (bed.tmp / "from-env" / "vgpu" / "libvgpu.so").is_file()
    assert bed.read_slice()["spec"]["nodeName"] == "node-a"
