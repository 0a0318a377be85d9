"""The pacer (node/pacing.py) in the real `vgpu device-plugin --backend nvml` over the simulated NVML, on a GPU that
time-slices between contexts (SIMGPU_TIMESLICE_NS, 2 ms): two pods granted 30 % and 50 % of the A100 run 2.7 ms
kernels under libvgpu.so with the environment their Allocate answer gave, each process in its pod's cgroup (which is
how the pacer tells whose it is, as the memory guard does). The plugin reads NVML's per-process utilization and the
pods' accounting files once a second and writes each container's pace file (the directory Allocate mounts read-only
at /usr/local/vgpu/pace; here the processes are pointed at the host file). Each pod gets its limit within 3 points,
where without the pacer they get about two thirds of it (tests/isolation/test_compute_timeslice.py)."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from dp_helpers import gpu_container
from pacing_checks import SEC, WARMUP, WINDOW, assert_paced, build_probe, timeline
from test_dp_matching import the_response
from test_dp_nvml import A100, DEVICES, start_nvml_plugin

from vgpu.isolation.build import ensure_built


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    return build_probe(tmp_path_factory.mktemp("pacing"))


def test_the_plugins_pacer_gives_each_pod_its_limit_on_a_time_sliced_gpu(cluster, probe, cgroups,
                                                                         monkeypatch):
    sim_env = start_nvml_plugin(cluster, DEVICES, "--resource-mode", "mib", "--pace-seconds", "1", wait=False)
    assert cluster.kubelet.wait_registered(("volcano.sh/vgpu-number",), 20), cluster.log()
    monkeypatch.setenv("SIMGPU_STATE", sim_env["SIMGPU_STATE"])   # the simulator's helpers read this node's GPUs
    monkeypatch.setenv("SIMGPU_DEVICES", DEVICES)
    sim = timeline()
    seconds = WARMUP + WINDOW + 0.5
    procs = []
    for name, cores in (("thirty", 30), ("fifty", 50)):
        pod = cluster.create_pod(name, [gpu_container("c", number=1, memory=4000, cores=cores)],
                                 f"{A100},NVIDIA,4000,{cores}:")
        (container,) = cluster.kubelet.admit(pod)
        response = the_response(container)
        uid = pod["metadata"]["uid"]
        mounts = {m.container_path: m.host_path for m in response.mounts}
        assert mounts["/usr/local/vgpu/pace"] == str(cluster.hook / "vgpu" / "pace" / f"{uid}_c")
        cache = Path(mounts["/tmp/vgpu"]) / Path(response.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"]).name
        env = {**sim_env, **response.envs, "SIMGPU_DEVICES": DEVICES, "SIMGPU_TIMESLICE_NS": "2000000",
               "LD_PRELOAD": str(ensure_built().libvgpu), "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cache),
               "VGPU_PACE_FILE": str(Path(mounts["/usr/local/vgpu/pace"]) / "factors")}
        cgroup = cgroups(uid)
        procs.append(subprocess.Popen(
            ["sh", "-c", f'echo $$ > "{cgroup}/cgroup.procs" && exec "$0" mix long {seconds} 1', str(probe)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    t0 = sim.simgpu_now_ns()
    time.sleep(WARMUP + WINDOW / 2)   # while both run: what the pacer wrote and exports
    factors = [(cluster.hook / "vgpu" / "pace" / f"{u}_c" / "factors").read_text() for u in
               (cluster.pod(n)["metadata"]["uid"] for n in ("thirty", "fifty"))]
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=5).read().decode()
    assert_paced(sim, procs, t0, factors, A100, seconds, cluster.log())
    assert f'vgpu_pace_factor{{device_uuid="{A100}",namespace="default",node="node-a",pod="thirty"}}' in metrics


def test_with_idle_share_a_pod_alone_runs_up_to_the_ceiling_it_names(cluster, probe, cgroups, monkeypatch):
    """`--idle-share`: a pod granted 30 % that names `vgpu-sharing.io/cores-ceiling: 80` runs at its ceiling while
    nothing else runs on its GPU; a second pod that names a ceiling it may not have ("lots") is held to its limit,
    with a warning in the plugin's log."""
    sim_env = start_nvml_plugin(cluster, DEVICES, "--resource-mode", "mib", "--pace-seconds", "1", "--idle-share",
                                wait=False)
    assert cluster.kubelet.wait_registered(("volcano.sh/vgpu-number",), 20), cluster.log()
    monkeypatch.setenv("SIMGPU_STATE", sim_env["SIMGPU_STATE"])
    monkeypatch.setenv("SIMGPU_DEVICES", DEVICES)
    sim = timeline()
    shares = {}
    for name, ceiling in (("lender", "80"), ("greedy", "lots")):
        pod = cluster.create_pod(name, [gpu_container("c", number=1, memory=4000, cores=30)],
                                 f"{A100},NVIDIA,4000,30:", annotations={"vgpu-sharing.io/cores-ceiling": ceiling})
        (container,) = cluster.kubelet.admit(pod)
        response = the_response(container)
        uid = pod["metadata"]["uid"]
        mounts = {m.container_path: m.host_path for m in response.mounts}
        cache = Path(mounts["/tmp/vgpu"]) / Path(response.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"]).name
        env = {**sim_env, **response.envs, "SIMGPU_DEVICES": DEVICES, "LD_PRELOAD": str(ensure_built().libvgpu),
               "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cache),
               "VGPU_PACE_FILE": str(Path(mounts["/usr/local/vgpu/pace"]) / "factors")}
        cgroup = cgroups(uid)
        seconds = 8.0
        proc = subprocess.Popen(
            ["sh", "-c", f'echo $$ > "{cgroup}/cgroup.procs" && exec "$0" mix varied {seconds} 1', str(probe)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        t0 = sim.simgpu_now_ns()
        assert proc.wait(seconds + 30) == 0, proc.stderr.read() if proc.stderr else ""
        a, b = t0 + int(4.5 * SEC), t0 + int(7.5 * SEC)
        shares[name] = sim.simgpu_busy_ns(0, proc.pid, a, b) / (b - a) * 100
    assert shares["lender"] == pytest.approx(80, abs=3), (shares, cluster.log())
    assert shares["greedy"] == pytest.approx(30, abs=3), shares
    assert "event=cores_ceiling_ignored pod=default/greedy" in cluster.log()
