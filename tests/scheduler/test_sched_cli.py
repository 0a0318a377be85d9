"""`vgpu scheduler` configuration (file + flags) and `vgpu inspect` against the API-server stand-in."""

import subprocess
import sys

import pytest
from sched_builders import container, gpu, node, pod
from sched_helpers import REPO, ExtenderProcess, wait_until

from vgpu.errors import ConfigError
from vgpu.scheduler.config import load_config


def test_config_file_then_flags_override(tmp_path):
    path = tmp_path / "scheduler.yaml"
    path.write_text("mode: score\ngpu_policy: spread\nlisten: 127.0.0.1:9000\nsharing:\n  split_count: 4\n")
    config = load_config(str(path), {"mode": "decide", "listen": None})
    assert config.mode == "decide" and config.gpu_policy == "spread" and config.listen == "127.0.0.1:9000"
    assert config.sharing.split_count == 4
    assert load_config(None, {}).listen == "127.0.0.1:8888" and load_config(None, {}).metrics_listen == ":9395"


@pytest.mark.parametrize(
    "text, words",
    [("mode: fast\n", ["mode"]), ("nodePolicy: x\n", ["nodePolicy"]), ("- a\n", ["mapping"]), ("a: [\n", ["YAML"])],
)
def test_config_errors_name_the_key(tmp_path, text, words):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(str(path), {})
    for word in words:
        assert word in str(err.value)


def run_vgpu(*args):
    return subprocess.run([sys.executable, "-m", "vgpu.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60)


def test_cli_rejects_unknown_policy_with_one_line(tmp_path, apiserver):
    out = run_vgpu("scheduler", "--kubeconfig", apiserver.kubeconfig, "--node-policy", "pack",
                   "--metrics-listen", "")
    assert out.returncode == 2
    assert "unknown policy 'pack'" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_inspect_table(kube, apiserver, tmp_path):
    kube.create_node(node("n1", [gpu("GPU-a", 8000), gpu("GPU-b", 8000, healthy=False)]))
    kube.create_node(node("n2", register="oops"))
    p = kube.create_pod(pod("train", container(number=1, memory=3000, cores=30)))
    from vgpu.kube import bind_pod

    bind_pod(kube.api, "default", p["metadata"]["name"], "n1",
             {"volcano.sh/vgpu-ids-new": "GPU-a,NVIDIA,3000,30:", "volcano.sh/vgpu-node": "n1"})
    out = run_vgpu("inspect", "--kubeconfig", apiserver.kubeconfig)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["NODE", "GPU", "UUID", "TYPE", "MEMORY", "MiB(alloc/total)", "CORES(alloc/100)",
                                "SHARES(alloc/split)", "HEALTH", "PODS"]
    row_a = next(line for line in lines if "GPU-a" in line)
    assert "3000/8000" in row_a and "30/100" in row_a and "1/10" in row_a and "default/train(3000,30%)" in row_a
    assert "  NVIDIA A100-PCIE-40GB  " in row_a and "NVIDIA-NVIDIA" not in out.stdout  # the card's name, once
    assert "unhealthy" in next(line for line in lines if "GPU-b" in line)
    assert "unschedulable" in next(line for line in lines if line.startswith("n2"))
    assert lines[-1] == "allocated memory: 3000/16000 MiB (18.8%)"
    config = tmp_path / "scheduler.yaml"  # resource_mode devices: units of 4 MiB, shown as MiB
    config.write_text("sharing:\n  gpu_memory_factor: 4\n")
    out = run_vgpu("inspect", "--kubeconfig", apiserver.kubeconfig, "--config", str(config))
    row_a = next(line for line in out.stdout.splitlines() if "GPU-a" in line)
    assert "12000/32000" in row_a and "default/train(12000,30%)" in row_a


def test_sigterm_releases_the_lease_and_exits_0(apiserver):
    """A Deployment stops the extender with SIGTERM: it leaves leadership at once (the Lease's holder is cleared,
    so a new pod need not wait the lease out) and exits 0."""
    import signal

    from kubernetes import client as k8s

    from vgpu.kube.client import make_api_client, read_json

    proc = ExtenderProcess(apiserver.kubeconfig, "--leader-elect", "--lease-namespace", "default").start()
    leases = k8s.CoordinationV1Api(make_api_client(apiserver.kubeconfig))

    def holder() -> str:
        lease = read_json(leases.read_namespaced_lease("vgpu-scheduler", "default", _preload_content=False))
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    wait_until(holder, what="the extender leads")
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.proc.wait(20) == 0
    assert holder() == ""
