"""The memory guard (node/guard.py) in the real `vgpu device-plugin --backend nvml` over the simulated NVML, whose
running processes report what each process truly holds: a pod whose process allocates past its grant through a
private copy of the driver (dlmopen, which the preloaded library does not interpose) is stopped within a few
rounds, with an event, a metric and a log line; a pod within its grant, and a process of no pod of ours, are left
alone. Each process is
put in a cgroup named as kubelet names pod cgroups (`.../pod<uid>/...`), which is how the guard tells whose it is."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from dp_helpers import gpu_container
from test_dp_nvml import A100, DEVICES, start_nvml_plugin

from vgpu.isolation.build import ensure_built
from vgpu.isolation.cuda_include import cuda_include_dir
from vgpu.kube.client import read_json
from vgpu.testbed.build import ensure_sim_built

CSRC = Path(__file__).resolve().parents[1] / "isolation" / "csrc"


@pytest.fixture(scope="module")
def holder(tmp_path_factory) -> Path:
    """sim_holder (tests/isolation/csrc): allocates MiB on GPU 0 through the simulated driver, no library, and waits."""
    sim = ensure_sim_built()
    exe = tmp_path_factory.mktemp("guard") / "sim_holder"
    subprocess.run(["gcc", "-O2", f"-I{cuda_include_dir()}", "-o", str(exe), str(CSRC / "sim_holder.c"),
                    f"-L{sim.sim_dir}", "-lcuda", "-ldl"], check=True)
    return exe


def _hold(holder: Path, sim_env: dict[str, str], cgroup: Path, mib: int, how: str = "hold",
          **env: str) -> subprocess.Popen:
    """A process that joins `cgroup`, then holds `mib` MiB of the A100 (the simulator's GPU 0)."""
    proc = subprocess.Popen(["sh", "-c", f'echo $$ > "{cgroup}/cgroup.procs" && exec "$0" {how} {mib}', str(holder)],
                            env={**sim_env, "SIMGPU_DEVICES": DEVICES, **env}, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("ready"), "the holder did not allocate"
    return proc


def _admitted(cluster, name: str, mib: int) -> dict:
    pod = cluster.create_pod(name, [gpu_container("c", number=1, memory=mib)], f"{A100},NVIDIA,{mib},0:")
    cluster.kubelet.admit(pod)
    return pod


def test_a_pod_over_its_grant_by_any_path_is_stopped_and_the_others_are_not(cluster, holder, cgroups):
    sim_env = start_nvml_plugin(cluster, DEVICES, "--resource-mode", "mib", "--memory-guard-seconds", "0.3",
                                "--memory-guard-allowance-mib", "256", wait=False)
    assert cluster.kubelet.wait_registered(("volcano.sh/vgpu-number",), 20), cluster.log()
    greedy, modest = _admitted(cluster, "greedy", 1000), _admitted(cluster, "modest", 1000)
    within = _hold(holder, sim_env, cgroups(modest["metadata"]["uid"]), 900)
    foreign = _hold(holder, sim_env, cgroups(None), 5000)  # a process of no pod of ours: not the guard's
    # the library preloaded with the pod's 1000 MiB limit, and bypassed: 3000 > 1000 granted + 256
    limited = {"LD_PRELOAD": str(ensure_built().libvgpu), "CUDA_DEVICE_MEMORY_LIMIT_0": "1000m",
               "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cluster.tmp / "greedy.cache")}
    plain = subprocess.run([str(holder), "hold", "3000"], env={**sim_env, "SIMGPU_DEVICES": DEVICES, **limited},
                           capture_output=True, text=True, timeout=30)
    assert plain.returncode == 3 and "error=alloc" in plain.stdout  # through the library: refused
    over = _hold(holder, sim_env, cgroups(greedy["metadata"]["uid"]), 3000, "privatehold", **limited)
    try:
        assert over.wait(30) == -9, cluster.log()
        time.sleep(1.0)  # more rounds: nothing else is stopped
        assert within.poll() is None and foreign.poll() is None, cluster.log()
    finally:
        for proc in (over, within, foreign):
            proc.kill()
            proc.wait(10)
    events = read_json(cluster.core.list_namespaced_event("default", _preload_content=False))["items"]
    (told,) = [e for e in events if e["reason"] == "VGPUMemoryExceeded"]
    assert told["involvedObject"]["name"] == "greedy" and told["type"] == "Warning"
    assert told["message"].startswith(f"its processes held 3000 MiB of GPU {A100}, over the 1256 MiB allowed"), told
    assert f"killed process(es) {over.pid}" in told["message"]
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=5).read().decode()
    assert f'vgpu_memory_guard_kills_total{{device_uuid="{A100}",node="node-a"}} 1.0' in metrics, metrics
    assert "event=memory_guard_kill pod=default/greedy" in cluster.log()
