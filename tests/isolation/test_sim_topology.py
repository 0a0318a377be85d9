"""The simulated NVML's topology queries against nvml.h's contracts: nvmlDeviceGetNvLinkState,
nvmlDeviceGetNvLinkRemotePciInfo_v2, nvmlDeviceGetTopologyCommonAncestor and nvmlDeviceGetNumaNodeId, over
SIMGPU_DEVICES flags `nvl<bus>`, `root<N>` and `numa<N>` (docs/testbed-fidelity.md, "Device enumeration")."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from vgpu.testbed.build import ensure_sim_built
from vgpu.testbed.machine import machine

# nvml.h nvmlReturn_t, nvmlEnableState_t, nvmlGpuTopologyLevel_t
SUCCESS, INVALID_ARGUMENT, NOT_SUPPORTED = 0, 2, 3
DISABLED, ENABLED = 0, 1
INTERNAL, SINGLE, MULTIPLE, HOSTBRIDGE, NODE, SYSTEM = 0, 10, 20, 30, 40, 50

# calls the C entry points with ctypes (nvmlPciInfo_t from nvidia-ml-py, which mirrors nvml.h) and prints the
# return code and value of each query as JSON
_PROGRAM = """
import ctypes, json, sys
from pynvml import nvmlPciInfo_t
lib = ctypes.CDLL(sys.argv[1])
rc0 = lib.nvmlInit_v2(); assert rc0 == 0, rc0
def handle(i):
    h = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0
    return h
out = {}
for query in json.loads(sys.argv[2]):
    kind, args = query[0], query[1:]
    if kind == "state":
        v = ctypes.c_int(-1)
        rc = lib.nvmlDeviceGetNvLinkState(handle(args[0]), ctypes.c_uint(args[1]), ctypes.byref(v))
        out[json.dumps(query)] = [rc, v.value]
    elif kind == "state-null":
        out[json.dumps(query)] = [lib.nvmlDeviceGetNvLinkState(handle(args[0]), ctypes.c_uint(0), None), None]
    elif kind == "remote":
        pci = nvmlPciInfo_t()
        rc = lib.nvmlDeviceGetNvLinkRemotePciInfo_v2(handle(args[0]), ctypes.c_uint(args[1]), ctypes.byref(pci))
        out[json.dumps(query)] = [rc, pci.busId if rc == 0 else None]
    elif kind == "ancestor":
        v = ctypes.c_int(-1)
        rc = lib.nvmlDeviceGetTopologyCommonAncestor(handle(args[0]), handle(args[1]), ctypes.byref(v))
        out[json.dumps(query)] = [rc, v.value]
    elif kind == "numa":
        v = ctypes.c_uint(0)
        rc = lib.nvmlDeviceGetNumaNodeId(handle(args[0]), ctypes.byref(v))
        out[json.dumps(query)] = [rc, v.value if rc == 0 else None]
print(json.dumps(out))
"""


def ask(devices: str, tmp: Path, *queries: tuple) -> list[list]:
    """[return code, value] of each query, in order, against a simulated NVML configured with `devices`."""
    libnvml = ensure_sim_built().sim_libnvml
    tmp.mkdir(parents=True, exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "SIMGPU_DEVICES": devices, "SIMGPU_STATE": str(tmp / "sim.state"),
           "PYTHONPATH": ":".join(sys.path)}
    res = subprocess.run([sys.executable, "-c", _PROGRAM, str(libnvml), json.dumps(queries)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    answers = json.loads(res.stdout)
    return [answers[json.dumps(list(q))] for q in queries]


def entries(spec: str) -> str:
    return ",".join(g.simgpu_entry() for g in machine(spec, "n"))


def test_nvlink_state_and_remote_ends_of_an_island_of_eight(tmp_path):
    gpus = machine("8xH100-80GB@nvlink8", "n")
    bus = [f"00000000:{g.bus:02X}:00.0" for g in gpus]
    # 7 peers: 18 // 7 = 2 links each (links 0-13), links 14-17 inactive, 18 and up are not links of the GPU
    got = ask(entries("8xH100-80GB@nvlink8"), tmp_path,
              ("state", 0, 0), ("state", 0, 13), ("state", 0, 14), ("state", 0, 17), ("state", 0, 18),
              ("state", 0, 36), ("state", 0, 1 << 20), ("state-null", 0),
              ("remote", 0, 0), ("remote", 0, 1), ("remote", 0, 2), ("remote", 0, 13), ("remote", 5, 0),
              ("remote", 0, 14), ("remote", 0, 18))
    assert got == [
        [SUCCESS, ENABLED], [SUCCESS, ENABLED], [SUCCESS, DISABLED], [SUCCESS, DISABLED], [INVALID_ARGUMENT, -1],
        [INVALID_ARGUMENT, -1], [INVALID_ARGUMENT, -1], [INVALID_ARGUMENT, None],
        [SUCCESS, bus[1]], [SUCCESS, bus[1]], [SUCCESS, bus[2]], [SUCCESS, bus[7]], [SUCCESS, bus[0]],
        [NOT_SUPPORTED, None], [INVALID_ARGUMENT, None]]


def test_a_gpu_without_nvlink_answers_not_supported(tmp_path):
    got = ask(entries("1xT4,2xH100-80GB@nvlink2"), tmp_path,
              ("state", 0, 0), ("remote", 0, 0), ("state", 0, 36), ("state", 1, 17), ("state", 2, 17))
    assert got == [[NOT_SUPPORTED, -1], [NOT_SUPPORTED, None], [INVALID_ARGUMENT, -1], [SUCCESS, ENABLED],
                   [SUCCESS, ENABLED]]


def test_common_ancestor_and_numa_node(tmp_path):
    got = ask(entries("4xH100-80GB@nvlink2/numa2"), tmp_path,
              ("ancestor", 0, 0), ("ancestor", 0, 1), ("ancestor", 1, 2), ("ancestor", 3, 2), ("numa", 0),
              ("numa", 3))
    assert got == [[SUCCESS, INTERNAL], [SUCCESS, HOSTBRIDGE], [SUCCESS, SYSTEM], [SUCCESS, HOSTBRIDGE],
                   [SUCCESS, 0], [SUCCESS, 1]]
    # two root complexes of one NUMA node, written as flags: NODE
    got = ask("A:1024:8::bus0x10+numa0+root0,B:1024:8::bus0x20+numa0+root1,C:1024:8::bus0x30", tmp_path / "x",
              ("ancestor", 0, 1), ("ancestor", 0, 2), ("numa", 2))
    assert got == [[SUCCESS, NODE], [SUCCESS, HOSTBRIDGE], [NOT_SUPPORTED, None]]


def test_no_topology_said_is_one_root_complex_and_no_numa_node(tmp_path):
    got = ask(entries("2xT4"), tmp_path, ("ancestor", 0, 1), ("numa", 0))
    assert got == [[SUCCESS, HOSTBRIDGE], [NOT_SUPPORTED, None]]
