"""`vgpu device-plugin --backend nvml` over the simulated NVML (testbed/simgpu, compiled against NVIDIA's nvml.h):
inventory from NVML, Xid events making a GPU unhealthy and its recovery, a GPU that stops answering, MIG refusal,
usage in the metrics."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
import urllib.request

from dp_helpers import NODE

from vgpu.testbed.build import ensure_sim_built
from vgpu.testbed.cluster import free_port

A100 = "GPU-0a7d2c1e-5b9f-4c3d-8e21-6f4a9b0c1d2e"
T4 = "GPU-1b8e3d2f-6c0a-4d4e-9f32-7a5b0c1d2e3f"
DEVICES = f"NVIDIA A100-PCIE-40GB:40960:108:{A100}:numa1,Tesla T4:15360:40:{T4}"


def start_nvml_plugin(cluster, devices: str = DEVICES, *extra: str, wait: bool = True) -> dict[str, str]:
    """Run the plugin with --backend nvml over the simulated NVML; returns the simulator's environment."""
    sim = ensure_sim_built()
    sim_env = {"LD_LIBRARY_PATH": str(sim.sim_dir), "SIMGPU_DEVICES": devices,
               "SIMGPU_STATE": str(cluster.tmp / "node.state")}
    cluster.metrics_port = free_port()
    cluster.plugin_args = [
        sys.executable, "-m", "vgpu.cli", "--log-level", "INFO", "device-plugin", "--node-name", NODE,
        "--kubeconfig", cluster.kubeconfig, "--backend", "nvml", "--kubelet-dir", str(cluster.plugin_dir),
        "--hook-path", str(cluster.hook), "--lock-dir", str(cluster.lock),
        "--metrics-listen", f"127.0.0.1:{cluster.metrics_port}", "--resource-mode", "devices",
        "--xid-recovery-seconds", "1", *extra,
    ]
    cluster.plugin_env = sim_env
    cluster._spawn(wait)
    return sim_env


def fault(sim_env: dict[str, str], uuid: str, what: str, code: int = 0) -> None:
    """Inject a fault through the simulated NVML's test helper."""
    os.environ["SIMGPU_STATE"] = sim_env["SIMGPU_STATE"]
    lib = ctypes.CDLL(str(ensure_sim_built().sim_libnvml))
    lib.simgpu_fault.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint]
    assert lib.simgpu_fault(uuid.encode(), what.encode(), code) == 0


def health(cluster, uuid: str) -> set[str]:
    devices = cluster.kubelet.resources["volcano.sh/vgpu-number"].devices
    return {h for d, h in devices.items() if d.startswith(uuid)}


def test_inventory_comes_from_nvml(cluster):
    start_nvml_plugin(cluster)
    assert cluster.wait_inventory() == [A100, T4]
    value = cluster.node_annotations()["volcano.sh/node-vgpu-register"]
    assert value == (f"{A100},10,40960,NVIDIA-NVIDIA A100-PCIE-40GB,true,hami-core:"
                     f"{T4},10,15360,NVIDIA-Tesla T4,true,hami-core:")
    assert len(cluster.kubelet.devices("volcano.sh/vgpu-memory")) == 40960 + 15360
    assert "event=enforcement gpu=" + A100 + " memory=libvgpu compute=libvgpu" in cluster.log()


def test_xid_makes_a_gpu_unhealthy_until_it_recovers(cluster):
    env = start_nvml_plugin(cluster)
    cluster.wait_inventory()
    fault(env, T4, "xid", 43)  # ignored by default: nothing changes
    fault(env, T4, "xid", 79)
    assert cluster.kubelet.wait_for(lambda: health(cluster, T4) == {"Unhealthy"}, 5), cluster.log()
    assert health(cluster, A100) == {"Healthy"}
    deadline = time.monotonic() + 5
    while "Tesla T4,false" not in cluster.node_annotations()["volcano.sh/node-vgpu-register"]:
        assert time.monotonic() < deadline, "annotation not updated on the Xid"
        time.sleep(0.05)
    # no further Xid for --xid-recovery-seconds and the GPU answers: healthy again at the next probe (5 s)
    assert cluster.kubelet.wait_for(lambda: health(cluster, T4) == {"Healthy"}, 12), cluster.log()
    assert "xid 79" in cluster.log()


def test_a_gpu_that_stops_answering_is_unhealthy_until_it_answers(cluster):
    env = start_nvml_plugin(cluster)
    cluster.wait_inventory()
    fault(env, A100, "lost")
    assert cluster.kubelet.wait_for(lambda: health(cluster, A100) == {"Unhealthy"}, 12), cluster.log()
    assert health(cluster, T4) == {"Healthy"}
    fault(env, A100, "recover")
    assert cluster.kubelet.wait_for(lambda: health(cluster, A100) == {"Healthy"}, 12), cluster.log()


def test_mig_enabled_gpu_is_refused_at_start(cluster):
    start_nvml_plugin(cluster, f"NVIDIA A100-PCIE-40GB:40960:108:{A100}:mig", wait=False)
    assert cluster.proc is not None
    assert cluster.proc.wait(30) != 0
    assert "has MIG mode enabled" in cluster.log()


def test_memory_in_use_shows_in_the_metrics(cluster, tmp_path):
    env = start_nvml_plugin(cluster)
    cluster.wait_inventory()
    holder = tmp_path / "hold.py"
    holder.write_text(
        "import ctypes, sys, time\n"
        "cu = ctypes.CDLL('libcuda.so.1'); c = ctypes.c_void_p(); p = ctypes.c_uint64()\n"
        "assert cu.cuInit(0) == 0 and cu.cuDevicePrimaryCtxRetain(ctypes.byref(c), 1) == 0\n"
        "assert cu.cuCtxSetCurrent(c) == 0 and cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(3 << 30)) == 0\n"
        "print('held', flush=True); time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, str(holder)], env=dict(os.environ, **env), stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        url = f"http://127.0.0.1:{cluster.metrics_port}/metrics"
        deadline = time.monotonic() + 10
        while True:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
            lines = [ln for ln in text.splitlines() if ln.startswith("vgpu_device_memory_used_bytes{") and T4 in ln]
            if lines and float(lines[0].split()[-1]) >= 3 << 30:
                break
            assert time.monotonic() < deadline, lines
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait()


def test_the_nvml_backend_reads_what_nvidia_attributes_need(tmp_path):
    # in a process of its own: pynvml finds libnvidia-ml.so.1 through LD_LIBRARY_PATH at load
    sim = ensure_sim_built()
    env = {**os.environ, "LD_LIBRARY_PATH": str(sim.sim_dir), "SIMGPU_DEVICES": DEVICES,
           "SIMGPU_STATE": str(tmp_path / "node.state")}
    code = ("import json; from vgpu.node.backends.nvml import NVMLBackend; b = NVMLBackend(); "
            "print(json.dumps([[g.compute_capability, g.driver_version, g.cuda_driver_version, g.pci_bus_id] "
            "for g in b.devices()])); b.close()")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert len(found) == 2
    for capability, driver, cuda, bus in found:
        assert (capability, driver, cuda) == ("8.0", "580.95.05", "13.0")
        assert len(bus) == 12 and bus[4] == ":" and bus.endswith(".0")
