"""Call counters of the simulated driver: every exported cu* entry point counts its calls in the process
(simgpu_calls(name), simgpu_calls_total(), simgpu_calls_reset()), calls through a cuGetProcAddress pointer count
under the symbol the pointer is, and the simulator's calls to itself do not count."""
from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import ctypes, json, subprocess, sys
path = sys.argv[1]
lib = ctypes.CDLL(path)
lib.simgpu_calls.restype = ctypes.c_uint64
lib.simgpu_calls.argtypes = [ctypes.c_char_p]
lib.simgpu_calls_total.restype = ctypes.c_uint64
calls = lambda n: lib.simgpu_calls(n.encode())
out = {}
nm = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
names = sorted({l.split()[-1] for l in nm.splitlines() if l.split()[-2] == "T" and l.split()[-1].startswith("cu")})
out["names"] = names
out["total_before"] = lib.simgpu_calls_total()
# every entry point, called once with zero arguments before cuInit: each returns early, and counts
u64 = [ctypes.c_uint64] * 8
sweep = ctypes.CDLL(path)   # its own function objects: the argument types below stay there
for n in names:
    if n == "cuInit":
        continue
    f = getattr(sweep, n)
    f.restype = ctypes.c_int
    f.argtypes = u64
    f(*([0] * 8))
out["counts"] = {n: calls(n) for n in names}
out["total_after_sweep"] = lib.simgpu_calls_total()
lib.simgpu_calls_reset()
out["total_after_reset"] = lib.simgpu_calls_total()
# the simulator's nested calls do not count: cuInit, a context, a kernel through the _ptsz entry point
assert lib.cuInit(0) == 0
ctx = ctypes.c_void_p()
assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert lib.cuCtxSetCurrent(ctx) == 0
for _ in range(3):
    cur = ctypes.c_void_p()
    lib.cuCtxGetCurrent(ctypes.byref(cur))
uuid = ctypes.create_string_buffer(16)
lib.cuDeviceGetUuid(uuid, 0)
mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
assert lib.cuModuleLoadData(ctypes.byref(mod), b"simgpu-module\nk fixed 1us\n") == 0
assert lib.cuModuleGetFunction(ctypes.byref(fn), mod, b"k") == 0
lib.cuLaunchKernel_ptsz.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
assert lib.cuLaunchKernel_ptsz(fn, 1, 1, 1, 1, 1, 1, 0, None, None, None) == 0
ev = ctypes.c_void_p()
assert lib.cuEventCreate(ctypes.byref(ev), 0) == 0
# through cuGetProcAddress: counted as the symbol the pointer is
pfn = ctypes.c_void_p()
st = ctypes.c_int()
assert lib.cuGetProcAddress_v2(b"cuEventQuery", ctypes.byref(pfn), 12000, 0, ctypes.byref(st)) == 0
query = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(pfn.value)
for _ in range(5):
    query(ev)
assert lib.cuGetProcAddress_v2(b"cuMemGetInfo", ctypes.byref(pfn), 12000, 0, ctypes.byref(st)) == 0
info = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(pfn.value)
free, total = ctypes.c_size_t(), ctypes.c_size_t()
info(ctypes.byref(free), ctypes.byref(total))
lib.cuEventQuery(ev)
for n in ["cuInit", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent", "cuCtxGetCurrent", "cuDeviceGetUuid",
          "cuDeviceGetUuid_v2", "cuModuleLoadData", "cuModuleGetFunction", "cuLaunchKernel_ptsz", "cuLaunchKernel",
          "cuEventCreate", "cuGetProcAddress_v2", "cuGetProcAddress", "cuEventQuery", "cuMemGetInfo_v2",
          "cuMemGetInfo", "nvmlInit_v2", "cuNoSuchFunction"]:
    out[n] = calls(n)
out["total"] = lib.simgpu_calls_total()
print(json.dumps(out))
"""


def run_script(sim_programs, tmp_path) -> dict:
    env = sim_programs.env(tmp_path / "sim.state")
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(sim_programs.sim.sim_libcuda)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_every_exported_entry_point_counts_its_calls(sim_programs, tmp_path):
    out = run_script(sim_programs, tmp_path)
    names = out["names"]
    assert len(names) > 150 and "cuStreamBeginCapture_v2" in names and "cuMemAlloc" in names
    assert out["total_before"] == 0
    uncounted = [n for n, c in out["counts"].items() if n != "cuInit" and c != 1]
    assert not uncounted, uncounted
    assert out["total_after_sweep"] == len(names) - 1
    assert out["total_after_reset"] == 0


def test_nested_calls_do_not_count_and_proc_address_calls_do(sim_programs, tmp_path):
    out = run_script(sim_programs, tmp_path)
    assert out["cuInit"] == 1 and out["cuDevicePrimaryCtxRetain"] == 1 and out["cuCtxSetCurrent"] == 1
    assert out["cuCtxGetCurrent"] == 3
    assert out["cuDeviceGetUuid"] == 1 and out["cuDeviceGetUuid_v2"] == 0
    assert out["cuLaunchKernel_ptsz"] == 1 and out["cuLaunchKernel"] == 0
    assert out["cuModuleLoadData"] == 1 and out["cuModuleGetFunction"] == 1 and out["cuEventCreate"] == 1
    assert out["cuGetProcAddress_v2"] == 2 and out["cuGetProcAddress"] == 0
    assert out["cuEventQuery"] == 6   # 5 through the pointer, 1 by name
    assert out["cuMemGetInfo_v2"] == 1 and out["cuMemGetInfo"] == 0
    assert out["nvmlInit_v2"] == 0 and out["cuNoSuchFunction"] == 0
    assert out["total"] == 1 + 1 + 1 + 3 + 1 + 1 + 1 + 1 + 1 + 2 + 6 + 1
