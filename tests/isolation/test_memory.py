"""Memory limits of libvgpu.so against the simulated GPU: exact stop at the limit, queries, every path, env."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from capabilities import tool
from iso_helpers import build_probe

from vgpu.isolation.region import Region, parse_size

MiB = 1 << 20
CHUNK = 64 * MiB


def test_chunked_allocation_stops_exactly_at_the_limit(sim):
    kv = sim.run("chunks", str(CHUNK), CUDA_DEVICE_MEMORY_LIMIT="1Gi")
    assert kv["_rc"] == "0", kv
    assert kv["count"] == "16" and kv["err"] == "2"            # CUDA_ERROR_OUT_OF_MEMORY
    assert int(kv["allocated"]) == 1 << 30
    assert int(kv["sim_used"]) == 1 << 30                      # nothing allocated by the failing call
    # every memory query reports the limit as total, free = limit - used
    assert int(kv["before_total"]) == int(kv["before_devtotal"]) == 1 << 30
    assert int(kv["before_free"]) == 1 << 30
    assert int(kv["after_total"]) == 1 << 30 and int(kv["after_free"]) == 0
    for v in ("nvml", "nvml2"):
        assert int(kv[f"{v}_total"]) == 1 << 30
        assert int(kv[f"{v}_used"]) == 1 << 30 and int(kv[f"{v}_free"]) == 0


def test_without_the_library_the_whole_card_is_available(sim):
    kv = sim.run("chunks", str(1 << 30), preload=False)
    assert kv["count"] == "40" and int(kv["before_total"]) == 40 << 30


def test_no_limit_means_pass_through(sim):
    kv = sim.run("chunks", str(1 << 30))
    assert kv["count"] == "40" and int(kv["after_total"]) == 40 << 30
    assert not sim.cache.exists()          # inert: no shared file, no accounting


def test_indexed_limit_wins_over_the_global_one(sim):
    kv = sim.run("chunks", str(CHUNK), CUDA_DEVICE_MEMORY_LIMIT="1g", CUDA_DEVICE_MEMORY_LIMIT_0="256m")
    assert kv["count"] == "4" and int(kv["after_total"]) == 256 * MiB


@pytest.mark.parametrize("value", ["512m", "512M", "512Mi", "512MiB", "512MB", "524288k", "524288Ki",
                                   str(512 * MiB), " 512m ", "0.5g".replace("0.5g", "536870912")])
def test_size_suffixes(sim, value):
    kv = sim.run("chunks", str(CHUNK), CUDA_DEVICE_MEMORY_LIMIT=value)
    assert kv["count"] == "8", (value, kv)
    assert parse_size(value) == 512 * MiB


@pytest.mark.parametrize("value", ["abc", "1.5g", "-1g", "0x100000", "1q", "1 g g", "12mm", "99999999999999999999g"])
def test_garbage_limits_are_rejected_loudly(sim, value):
    kv = sim.run("init", CUDA_DEVICE_MEMORY_LIMIT=value)
    assert kv["init"] == "1", kv                 # CUDA_ERROR_INVALID_VALUE: the program cannot run unlimited
    assert "invalid CUDA_DEVICE_MEMORY_LIMIT" in kv["_stderr"]
    with pytest.raises(ValueError):
        parse_size(value)


@pytest.mark.parametrize("name,value", [("CUDA_DEVICE_SM_LIMIT", "30%"), ("CUDA_DEVICE_SM_LIMIT", "101"),
                                        ("GPU_CORE_UTILIZATION_POLICY", "sometimes")])
def test_garbage_compute_settings_are_rejected(sim, name, value):
    kv = sim.run("init", **{name: value})
    assert kv["init"] == "1" and f"invalid {name}" in kv["_stderr"]


def test_every_allocation_path_is_counted(sim):
    kv = sim.run("paths", CUDA_DEVICE_MEMORY_LIMIT="4g", VGPU_CONTEXT_OVERHEAD="32m")
    assert kv["_rc"] == "0", kv
    u = {k: int(v) for k, v in kv.items() if not k.startswith("_")}
    base = 32 * MiB
    assert u["primary_ctx"] == base                                  # context overhead
    assert u["ctx_create"] == 2 * base and u["ctx_destroy"] == base
    assert u["alloc"] - base == 4 * MiB and u["free"] == base
    assert u["pitch"] - base == 2 * MiB and u["pitch_free"] == base   # 1024 (returned pitch) x 2048 rows
    assert u["managed"] - base == 8 * MiB and u["managed_free"] == base
    assert u["async"] - base == 6 * MiB and u["async_free"] == base
    assert u["pool"] - base == 10 * MiB and u["pool_free"] == base
    # VMM: charged once at create, alive while mapped, given back at the last unmap
    assert u["vmm_create"] - base == 16 * MiB
    assert u["vmm_map"] == u["vmm_release_mapped"] == u["vmm_create"]
    assert u["vmm_unmap"] == base
    assert u["array"] - base == 16384 * 1000 and u["array_free"] == base      # rows padded by the driver
    assert u["array3d"] - base == 512 * 256 * 64 and u["array3d_free"] == base
    assert u["mipmap"] > u["array3d"] and u["mipmap_free"] == base


def test_allocation_paths_are_refused_over_the_limit(sim, tmp_path):
    """A Python program (ctypes) hits the limit on each path and gets error 2 without allocating."""
    prog = tmp_path / "paths.py"
    prog.write_text(textwrap.dedent("""
        import ctypes, sys
        cu = ctypes.CDLL("libcuda.so.1")
        c = ctypes.c_void_p()
        assert cu.cuInit(0) == 0
        assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(c), 0) == 0
        assert cu.cuCtxSetCurrent(c) == 0
        p = ctypes.c_uint64(); pitch = ctypes.c_size_t()
        big = ctypes.c_size_t(200 << 20)
        results = {
            "alloc": cu.cuMemAlloc_v2(ctypes.byref(p), big),
            "managed": cu.cuMemAllocManaged(ctypes.byref(p), big, 1),
            "async": cu.cuMemAllocAsync(ctypes.byref(p), big, None),
            "pitch": cu.cuMemAllocPitch_v2(ctypes.byref(p), ctypes.byref(pitch), ctypes.c_size_t(1 << 20),
                                           ctypes.c_size_t(200), 4),
        }
        used = ctypes.CDLL("libcuda.so.1").simgpu_used_bytes
        used.restype = ctypes.c_uint64
        print(" ".join(f"{k}={v}" for k, v in results.items()), "sim_used=%d" % used(0))
    """))
    res = subprocess.run([sys.executable, str(prog)], env=sim.env(CUDA_DEVICE_MEMORY_LIMIT="128m"),
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["alloc=2", "managed=2", "async=2", "pitch=2", "sim_used=0"]


def test_a_refused_allocation_hands_back_a_null_handle(sim):
    """A caller that frees what a refused call returned (HAMi-core's test programs do) passes 0, not garbage."""
    kv = sim.run("refuse", str(256 << 20), CUDA_DEVICE_MEMORY_LIMIT="128m")
    assert kv["_rc"] == "0", kv
    for path in ("alloc", "pitch", "managed", "async", "vmm", "array"):
        assert kv[path] == "2,0", (path, kv[path])


def test_dlsym_and_cuGetProcAddress_return_the_hooks(sim):
    kv = sim.run("procaddr", CUDA_DEVICE_MEMORY_LIMIT="1g")
    assert kv["_rc"] == "0", kv
    for name in ("cuMemAlloc_v2", "cuMemFree_v2", "cuLaunchKernel", "cuMemGetInfo_v2", "cuGetProcAddress_v2",
                 "cuMemCreate", "cuGraphLaunch"):
        assert kv[f"dlsym_{name}"] == "libvgpu.so", name          # dlsym(dlopen("libcuda.so.1"), name)
        assert kv[f"same_{name}"] == "1", name                    # = RTLD_DEFAULT = RTLD_NEXT
    assert kv["next_twice"] == "1" and kv["unknown_passthrough"] == "1"
    # cuGetProcAddress: version- and flag-aware (the driver picks the variant, we return our wrapper of it)
    assert kv["gpa_cuMemAlloc_12000_0"] == "0,0,libvgpu.so,cuMemAlloc_v2"
    assert kv["gpa_cuMemFree_12000_0"] == "0,0,libvgpu.so,cuMemFree_v2"
    assert kv["gpa_cuLaunchKernel_12000_0"] == "0,0,libvgpu.so,cuLaunchKernel"
    assert kv["gpa_cuLaunchKernel_12000_2"] == "0,0,libvgpu.so,cuLaunchKernel_ptsz"
    assert kv["gpa_cuMemAllocAsync_12000_0"] == "0,0,libvgpu.so,cuMemAllocAsync"
    assert kv["gpa_cuGetProcAddress_12000_0"] == "0,0,libvgpu.so,cuGetProcAddress_v2"
    assert kv["gpa_cuCtxCreate_11040_0"] == "0,0,libvgpu.so,cuCtxCreate_v3"
    assert kv["gpa_cuCtxCreate_12050_0"] == "0,0,libvgpu.so,cuCtxCreate_v4"
    assert kv["gpa_cuDeviceGetCount_12000_0"] == "0,0,libcuda.so.1,cuDeviceGetCount"   # not hooked: untouched
    assert kv["gpa_cuMemAlloc_3000_0"] == "0,0,libvgpu.so,cuMemAlloc"                   # the CUDA 2 ABI, wrapped too
    assert kv["gpa_cuMemAlloc_1000_0"].startswith("500,2,")                             # version not sufficient
    assert kv["gpa_chain"] == "libvgpu.so,cuMemAlloc_v2"


def test_live_limit_change_through_the_region(sim):
    assert sim.run("chunks", str(CHUNK), CUDA_DEVICE_MEMORY_LIMIT="1g")["count"] == "16"
    with Region.open(sim.cache, readonly=False) as r:
        r.set_memory_limit(0, 512 * MiB)
        assert r.limits()[0] == 512 * MiB
    kv = sim.run("chunks", str(CHUNK), CUDA_DEVICE_MEMORY_LIMIT="1g")
    assert kv["count"] == "8" and int(kv["after_total"]) == 512 * MiB


def test_region_shows_a_running_process(sim):
    p = sim.popen("loop", str(CHUNK), "1.5", "1", CUDA_DEVICE_MEMORY_LIMIT="1g")
    try:
        assert p.stdout.readline().startswith("beat=")
        with Region.open(sim.cache) as r:
            procs = r.processes()
            assert [x.pid for x in procs] == [p.pid]
            assert procs[0].status == 1
            with open(f"/proc/{p.pid}/stat") as f:
                assert procs[0].start_time == int(f.read().rsplit(")", 1)[1].split()[19])   # field 22
            assert r.devices()[0].limit == 1 << 30
    finally:
        p.communicate(timeout=30)
    with Region.open(sim.cache) as r:
        assert r.processes() == [] and r.used(0) == 0        # released at exit


def _syscalls(sim, n: int, **env: str) -> int:
    strace = tool("strace", "Debian's strace")
    res = subprocess.run([strace, "-f", "-c", "-o", "/dev/stdout", str(sim.probe), "hot", str(n)],
                         env=sim.env(**env), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    total = [ln for ln in res.stdout.splitlines() if ln.rstrip().endswith("total")]
    return int(total[-1].split()[3]) if total else 0


def test_hot_path_without_limits_makes_no_syscalls(sim):
    """20000 launches + alloc/free pairs cost the same number of syscalls as 200: none per call."""
    few, many = _syscalls(sim, 200), _syscalls(sim, 20000)
    assert few > 0 and many - few < 10, (few, many)


def test_hot_path_with_limits_makes_no_syscalls_either(sim):
    """Also with limits active (while the compute budget is not exhausted, so no launch has to wait)."""
    env = dict(CUDA_DEVICE_MEMORY_LIMIT="8g", CUDA_DEVICE_SM_LIMIT="50", GPU_CORE_UTILIZATION_POLICY="force")
    few, many = _syscalls(sim, 200, **env), _syscalls(sim, 20000, **env)
    assert few > 0 and many - few < 10, (few, many)


def test_the_limits_file_is_read_and_the_environment_is_not(sim, tmp_path):
    """The device plugin hands a container its variables also as a file mounted read-only (VGPU_LIMITS_FILE stands
    for that mount here): where the file exists, what the pod puts in its environment (env, envFrom, a shell prefix,
    setenv) is not read. 80 GiB in the environment, 256 MiB in the file: 256 MiB it is."""
    limits = tmp_path / "limits.env"
    limits.write_text(f"CUDA_DEVICE_MEMORY_LIMIT_0=256m\nCUDA_DEVICE_MEMORY_SHARED_CACHE={sim.cache}\n")
    kv = sim.run("chunks", str(CHUNK), VGPU_LIMITS_FILE=str(limits), CUDA_DEVICE_MEMORY_LIMIT_0="80g",
                 CUDA_DEVICE_MEMORY_LIMIT="80g", GPU_CORE_UTILIZATION_POLICY="disable")
    assert kv["count"] == "4" and int(kv["after_total"]) == 256 * MiB, kv
    # nothing in the environment is read for the file's variables, not even a tighter limit
    limits.write_text(f"CUDA_DEVICE_MEMORY_SHARED_CACHE={sim.cache}\n")
    kv = sim.run("chunks", str(1 << 30), VGPU_LIMITS_FILE=str(limits), CUDA_DEVICE_MEMORY_LIMIT_0="256m")
    assert kv["count"] == "40", kv


@pytest.mark.parametrize("content", ["CUDA_DEVICE_MEMORY_LIMIT_0\n", "=1g\n", f"X={'9' * 600}\n", None])
def test_a_limits_file_that_cannot_be_read_refuses_cuda(sim, tmp_path, content):
    limits = tmp_path / "limits.env"
    if content is not None:
        limits.write_text(content)
    else:
        limits.mkdir()  # not a file
    kv = sim.run("init", VGPU_LIMITS_FILE=str(limits), CUDA_DEVICE_MEMORY_LIMIT_0="1g")
    assert kv["init"] == "1", kv  # CUDA_ERROR_INVALID_VALUE: neither the file nor the environment is trusted
    assert f"the limits file {limits}" in kv["_stderr"], kv["_stderr"]


@pytest.fixture(scope="module")
def tamper(libs, tmp_path_factory):
    return build_probe(libs, tmp_path_factory.mktemp("tamper") / "tamper", "tamper.c")


def test_usage_counters_written_down_by_the_tenant_are_caught(sim, tamper):
    """A process that writes 0 into the file's usage counters after each allocation (4 GiB limit, 256 MiB steps):
    its next allocation finds the file counting less than it alone holds and is refused, with one error line; every
    later allocation is refused too (before: 40 of 40 GiB)."""
    kv = sim.run("zero", "256", program=tamper, CUDA_DEVICE_MEMORY_LIMIT="4Gi")
    assert kv["count"] == "1" and kv["err"] == "2", kv  # CUDA_ERROR_OUT_OF_MEMORY
    assert "the file counts 0 bytes in use, less than this process alone holds (268435456)" in kv["_stderr"]
    assert kv["_stderr"].count("the accounting file was changed") == 1, kv["_stderr"]


def test_a_device_table_rewritten_by_the_tenant_is_caught(sim, tamper):
    """The file's device table filled with other UUIDs (the granted device then has no row), or the granted UUID
    moved to another row than its grant position: every allocation is refused, with one error line (before: the
    device went unaccounted, the whole card)."""
    uuid = sim.run("uuid", program=tamper)["uuid"]
    kv = sim.run("rows", "256", program=tamper, CUDA_DEVICE_MEMORY_LIMIT_0="1Gi", VGPU_DEVICE_UUIDS=uuid)
    assert kv["count"] == "0" and kv["err"] == "2", kv
    assert f"{uuid} has no row in the accounting file" in kv["_stderr"], kv["_stderr"]
    sim.cache.unlink()
    kv = sim.run("moved", "256", program=tamper, CUDA_DEVICE_MEMORY_LIMIT_0="1Gi", VGPU_DEVICE_UUIDS=uuid)
    assert kv["count"] == "0" and kv["err"] == "2", kv
    assert f"{uuid} is granted at position 0 but has row 1 in the accounting file" in kv["_stderr"], kv["_stderr"]
    sim.cache.unlink()
    kv = sim.run("none", "256", program=tamper, CUDA_DEVICE_MEMORY_LIMIT_0="1Gi", VGPU_DEVICE_UUIDS=uuid)
    assert kv["count"] == "4" and "was changed" not in kv["_stderr"], kv  # untouched: the limit, no more, no less
