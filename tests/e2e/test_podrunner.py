"""The kubelet-side runner of the e2e harness: how a device plugin's answer becomes a process's environment.

Pure translation checks (mounts -> host paths, /etc/ld.so.preload -> LD_PRELOAD, NVIDIA_VISIBLE_DEVICES -> the
node's simulated devices, as the test bed describes the node) and real processes run under the isolation library
with the translated environment.
"""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from vgpu.testbed.cluster import isolation_paths
from vgpu.testbed.machine import MachineGPU, UnknownDevice, machine
from vgpu.testbed.podrunner import ContainerAllocation, map_to_host, translate_env

UUID_A, UUID_B = "GPU-aaaaaaaa-0000-5000-8000-00000000000a", "GPU-bbbbbbbb-0000-5000-8000-00000000000b"
# the node: a T4 on the lower PCI bus (NVML index 0), an A100 above it, and a third GPU nobody is granted
NODE = [MachineGPU(0, UUID_B, "Tesla T4", 15360, 40, 0x17), MachineGPU(1, UUID_A, "NVIDIA A100-PCIE-40GB", 40960, 108,
                                                                       0x37),
        MachineGPU(2, "GPU-cccccccc-0000-5000-8000-00000000000c", "Tesla T4", 15360, 40, 0x57)]


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
    env = translate_env(POD, CONTAINER, _allocation(tmp_path), tmp_path / "sim", NODE, tmp_path / "state")
    assert env["A"] == "1" and env["ME"] == "p"
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == str(tmp_path / "hook/vgpu/containers/uid_main/abc.cache")
    assert env["LD_PRELOAD"] == str(tmp_path / "hook/vgpu/libvgpu.so")  # the library the plugin installed
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(tmp_path / "sim")
    # the granted GPUs as the node has them (whole memory, bus numbers), whatever order the grant lists them in
    assert env["SIMGPU_DEVICES"] == (f"Tesla T4:15360:40:{UUID_B}:bus0x17,"
                                     f"NVIDIA A100-PCIE-40GB:40960:108:{UUID_A}:bus0x37")
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"


def test_no_preload_mount_means_no_preload(tmp_path):
    env = translate_env(POD, CONTAINER, _allocation(tmp_path, preload=False), None, NODE, tmp_path / "state")
    assert "LD_PRELOAD" not in env


def test_a_library_nobody_installed_fails_the_start(tmp_path):
    alloc = _allocation(tmp_path)
    (tmp_path / "hook" / "vgpu" / "libvgpu.so").unlink()
    with pytest.raises(FileNotFoundError, match=r"mount /usr/local/vgpu/libvgpu.so: host path .*/hook/vgpu/libvgpu.so"):
        translate_env(POD, CONTAINER, alloc, None, NODE, tmp_path / "state")


def test_processes_of_a_node_share_the_simulated_gpu_state(tmp_path):
    one = translate_env(POD, CONTAINER, ContainerAllocation(envs={"NVIDIA_VISIBLE_DEVICES": UUID_A}), None,
                        NODE, tmp_path)
    two = translate_env(POD, {"name": "other"}, ContainerAllocation(envs={"NVIDIA_VISIBLE_DEVICES": UUID_B}), None,
                        NODE, tmp_path)
    assert one["SIMGPU_STATE"] == two["SIMGPU_STATE"] == str(tmp_path / "node.state")


def test_a_process_with_the_translated_env_is_limited(tmp_path):
    lib, sim = isolation_paths()
    env = translate_env(POD, CONTAINER, _allocation(tmp_path, lib=lib.read_bytes()), sim, NODE, tmp_path / "state")
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


def test_a_gpu_the_node_does_not_have_fails_the_start(tmp_path):
    """The runner gives a container only GPUs of its node's description: a UUID that no GPU of the node has (a
    plugin advertising devices it invented) fails the start, as nvidia-container-cli refuses an unknown device."""
    alloc = ContainerAllocation(envs={"NVIDIA_VISIBLE_DEVICES": f"{UUID_A},GPU-dddddddd-0000-5000-8000-00000000000d"})
    with pytest.raises(UnknownDevice, match="GPU-dddddddd"):
        translate_env(POD, CONTAINER, alloc, None, NODE, tmp_path / "state")


def test_the_machine_is_the_test_beds_own_description():
    """Sizes, SM counts and NVML order come from the node spec; UUIDs are stable per node and differ between nodes."""
    one = machine("1xT4,2xA100-80GB", "node-0")
    assert [(g.index, g.name, g.memory_mib, g.sms) for g in one] == [
        (0, "Tesla T4", 15360, 40), (1, "NVIDIA A100-SXM4-80GB", 81920, 108), (2, "NVIDIA A100-SXM4-80GB", 81920, 108)]
    assert [g.bus for g in one] == sorted(g.bus for g in one)  # NVML's index order is the bus order
    assert [g.uuid for g in one] == [g.uuid for g in machine("1xT4,2xA100-80GB", "node-0")]
    assert not {g.uuid for g in one} & {g.uuid for g in machine("1xT4,2xA100-80GB", "node-1")}
