"""The kubelet-side runner of the e2e harness: how a device plugin's answer becomes a process's environment.

Pure translation checks (mounts -> host paths, /etc/ld.so.preload -> LD_PRELOAD, NVIDIA_VISIBLE_DEVICES ->
simulated devices) and one real process run under the isolation library with the translated environment.
"""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from vgpu.testbed.podrunner import ContainerAllocation, isolation_paths, map_to_host, translate_env

UUID_A, UUID_B = "GPU-aaaaaaaa-0000-5000-8000-00000000000a", "GPU-bbbbbbbb-0000-5000-8000-00000000000b"
INVENTORY = {UUID_A: ("NVIDIA A100-PCIE-40GB", 10240), UUID_B: ("Tesla T4", 3840)}


def _allocation(tmp_path, preload: bool = True, lib: bytes = b"") -> ContainerAllocation:
    """The plugin's answer for one container, with its hook directory as the plugin leaves it (library installed)."""
    hook = tmp_path / "hook" / "vgpu"
    (hook / "containers" / "uid_main").mkdir(parents=True)
    (hook / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")
    (hook / "libvgpu.so").write_bytes(lib)
    mounts = [
        {"container_path": "/usr/local/vgpu/libvgpu.so", "host_path": str(hook / "libvgpu.so"), "read_only": True},
        {"container_path": "/tmp/vgpu", "host_path": str(hook / "containers" / "uid_main"), "read_only": False},
        {"container_path": "/tmp/vgpulock", "host_path": str(tmp_path / "lock"), "read_only": False},
    ]
    if preload:
        mounts.append({"container_path": "/etc/ld.so.preload", "host_path": str(hook / "ld.so.preload"),
                       "read_only": True})
    alloc = ContainerAllocation()
    alloc.merge({"envs": {"NVIDIA_VISIBLE_DEVICES": f"{UUID_B},{UUID_A}", "CUDA_DEVICE_MEMORY_LIMIT_0": "1000m",
                          "CUDA_DEVICE_MEMORY_LIMIT_1": "2000m", "CUDA_DEVICE_SM_LIMIT": "30",
                          "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/vgpu/abc.cache"}, "mounts": mounts})
    alloc.merge({"envs": {}, "mounts": []})  # the counting resources answer empty
    return alloc


POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "uid"}, "spec": {"nodeName": "n1"}}
CONTAINER = {"name": "main", "env": [{"name": "A", "value": "1"},
                                     {"name": "ME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}


def test_mount_lookup_takes_the_longest_prefix():
    mounts = [("/tmp", "/h/tmp", False), ("/tmp/vgpu", "/h/vgpu", False)]
    assert map_to_host("/tmp/vgpu/x.cache", mounts) == "/h/vgpu/x.cache"
    assert map_to_host("/tmp/vgpux", mounts) == "/h/tmp/vgpux"
    assert map_to_host("/etc/passwd", mounts) is None


def test_translation_maps_paths_preload_and_devices(tmp_path):
    env = translate_env(POD, CONTAINER, _allocation(tmp_path), tmp_path / "sim", INVENTORY,
                        tmp_path / "state", memory_factor=4)
    assert env["A"] == "1" and env["ME"] == "p"
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == str(tmp_path / "hook/vgpu/containers/uid_main/abc.cache")
    assert env["LD_PRELOAD"] == str(tmp_path / "hook/vgpu/libvgpu.so")  # the library the plugin installed
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(tmp_path / "sim")
    # devices in NVIDIA_VISIBLE_DEVICES order, memory units x factor = MiB
    assert env["SIMGPU_DEVICES"] == f"Tesla T4:15360:40:{UUID_B},NVIDIA A100-PCIE-40GB:40960:108:{UUID_A}"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"


def test_no_preload_mount_means_no_preload(tmp_path):
    env = translate_env(POD, CONTAINER, _allocation(tmp_path, preload=False), None, INVENTORY, tmp_path / "state")
    assert "LD_PRELOAD" not in env


def test_a_library_nobody_installed_fails_the_start(tmp_path):
    alloc = _allocation(tmp_path)
    (tmp_path / "hook" / "vgpu" / "libvgpu.so").unlink()
    with pytest.raises(FileNotFoundError, match=r"mount /usr/local/vgpu/libvgpu.so: host path .*/hook/vgpu/libvgpu.so"):
        translate_env(POD, CONTAINER, alloc, None, INVENTORY, tmp_path / "state")


def test_processes_of_a_node_share_the_simulated_gpu_state(tmp_path):
    one = translate_env(POD, CONTAINER, ContainerAllocation(envs={"NVIDIA_VISIBLE_DEVICES": UUID_A}), None,
                        INVENTORY, tmp_path)
    two = translate_env(POD, {"name": "other"}, ContainerAllocation(envs={"NVIDIA_VISIBLE_DEVICES": UUID_B}), None,
                        INVENTORY, tmp_path)
    assert one["SIMGPU_STATE"] == two["SIMGPU_STATE"] == str(tmp_path / "node.state")


def test_a_process_with_the_translated_env_is_limited(tmp_path):
    lib, sim = isolation_paths()
    env = translate_env(POD, CONTAINER, _allocation(tmp_path, lib=lib.read_bytes()), sim, INVENTORY,
                        tmp_path / "state")
    out = subprocess.run([sys.executable, "-m", "vgpu.testbed.workload", "--mib", "1500", "--chunk", "250",
                          "--expect-oom", "--kernels", "2"], env=env, capture_output=True, text=True, timeout=60)
    report = orjson.loads(out.stdout.split("VGPU-WORKLOAD ", 1)[1])
    assert out.returncode == 0, out.stdout + out.stderr
    assert report["nvml_uuids"] == [UUID_B, UUID_A]  # NVML names the GPUs as the plugin advertised them
    # CUDA numbers the A100 first (fastest first); each limit still reaches the GPU it was granted for
    assert [d["uuid"] for d in report["devices"]] == [UUID_A, UUID_B]
    a100, t4 = report["devices"]
    assert t4["total_mib"] == 1000 and t4["allocated_mib"] == 1000 and t4["oom_at_mib"] == 1250
    assert a100["total_mib"] == 2000 and a100["allocated_mib"] == 1500 and a100["oom_at_mib"] is None
