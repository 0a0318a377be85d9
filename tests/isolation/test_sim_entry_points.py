"""Old and less common entry points of the simulated driver, with the ABIs cudaTypedefs.h gives, so that a library's
hooks on them can be exercised: the v1 (CUDA 2.x) memory API, the old launch API, cooperative multi-device launches,
graph memory nodes, legacy IPC, shareable handles, external memory, green contexts, primary context reset, address
ranges, and cuGetProcAddress's choice of version.  Driven directly (tests/isolation/csrc/sim_entry.c)."""
from __future__ import annotations

import os
import subprocess

import pytest
from sim_helpers import (
    INVALID_CONTEXT,
    INVALID_DEVICE,
    INVALID_RESOURCE_CONFIGURATION,
    INVALID_VALUE,
    NOT_SUPPORTED,
    OUT_OF_MEMORY,
    MiB,
    kv,
)


@pytest.fixture
def entry(sim_programs, tmp_path):
    return lambda *args, **kw: sim_programs.run("sim_entry", *args, state=tmp_path / "sim.state", **kw)


def test_v1_memory_api_uses_32_bit_pointers_and_sizes(entry):
    out = entry("v1")
    assert out["v1_ptr_nonzero"] == "1" and out["v1_used"] == str(4 * MiB)   # 3 MiB in 2 MiB pages
    assert out["v1_range"] == f"1,{3 * MiB}" and out["v2_range_of_v1"] == f"1,{3 * MiB}"
    assert out["v1_freed_used"] == "0"
    assert out["v1_pitch"] == "1024" and out["v1_pitch_used"] == str(100 * 1024)
    # a 40 GiB GPU does not fit in 32 bits: the v1 answers saturate
    assert out["v1_info"] == "4294967295,4294967295,4294967295"
    assert out["v2_info"] == f"{40960 * MiB},{40960 * MiB}"
    assert out["v1_ctx_current"] == "1"
    assert out["ctx_alloc_used"] == str(6 * MiB) and out["ctx_destroyed_used"] == "0"   # cuCtxDestroy frees
    assert out["v1_array_used"] == str(4096 * 10)   # 1000 floats a row, in 512-byte units, 10 rows
    assert out["v1_array3d_used"] == str(4096 * 10 + 512 * 10 * 4)
    assert out["arrays_freed_used"] == "0"


def test_v1_sizes_are_exact_when_they_fit(entry):
    out = entry("v1", devices="Small:1024:10")
    total = 1024 * MiB
    assert out["v1_info"] == f"{total},{total},{total}"


def test_old_launch_api_takes_the_duration_from_cuParamSetv(entry):
    out = entry("oldlaunch")
    assert abs(float(out["launch_busy_ms"]) - 30.0) < 0.5   # "sleep": the first 8 bytes of the parameters
    assert abs(float(out["launch_grid_seti_busy_ms"]) - 10.0) < 0.5
    assert abs(float(out["launch_grid_blocks_busy_ms"]) - 2.0) < 0.5   # 4 x 5 blocks of 100 us
    assert abs(float(out["launch_grid_async_busy_ms"]) - 1.0) < 0.5
    assert out["launches"] == "4"
    assert out["bad_shape"] == out["bad_param"] == out["bad_grid"] == str(INVALID_VALUE)
    assert out["param_f"] == "0"


def test_cooperative_multi_device_launch_runs_one_kernel_per_device(entry):
    out = entry("multidev", devices="A:40960:108,B:40960:108")
    assert out["devices"] == "2" and out["launched"] == "1,1"
    assert out["same_device"] == str(INVALID_DEVICE)
    assert out["null_stream"] == out["grid_mismatch"] == str(INVALID_VALUE)


def test_graph_memory_nodes_take_memory_at_launch_and_give_it_back_on_trim(entry):
    out = entry("graphmem")
    assert out["alloc_addr_nonzero"] == "1" and out["after_add_used"] == "0"
    assert out["free_node_addr"] == "1" and out["alloc_node_params"] == f"1,{10 * MiB}"
    assert out["free_twice"] == out["free_not_graph"] == str(INVALID_VALUE)
    assert out["after_instantiate_used"] == "0"
    assert out["second_instantiation"] == str(INVALID_VALUE)   # one instantiation of a graph with memory nodes
    assert out["after_upload_used"] == str(10 * MiB)   # cuGraphUpload maps it ahead of the first launch
    assert out["after_launch_used"] == str(10 * MiB)   # two launches reuse the pool's memory
    assert out["attr_reserved"] == str(10 * MiB) and out["attr_used"] == "0" and out["attr_used_high"] == str(10 * MiB)
    assert out["after_trim_used"] == "0"
    assert out["auto_free_used"] == str(4 * MiB)   # AUTO_FREE_ON_LAUNCH: the relaunch freed the first allocation
    assert out["graph_gone_allocation_live"] == str(4 * MiB)   # outlives its graph until freed
    assert out["final_used"] == "0"


def test_ipc_maps_another_process_allocation_without_new_memory(sim_programs, tmp_path):
    env = sim_programs.env(tmp_path / "sim.state")
    exe = sim_programs.program("sim_entry")
    exporter = subprocess.Popen([str(exe), "ipc_export"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
    try:
        got: dict[str, str] = {}
        while "used" not in got:
            got.update(kv(exporter.stdout.readline()))
        assert got["async_handle"] == str(INVALID_VALUE)   # only cuMemAlloc buffers have IPC handles
        assert got["open_own"] == str(INVALID_CONTEXT)   # not in the exporting process
        assert got["used"] == str((6 + 2) * MiB)
        out = sim_programs.run("sim_entry", "ipc_import", got["handle"], state=tmp_path / "sim.state")
        assert out["flags_zero"] == str(INVALID_VALUE)
        assert out["same_address"] == "1"   # opened twice by one context: one mapping, counted
        assert out["used_delta"] == "0"
        assert out["range"] == f"1,{6 * MiB}"
        assert out["close_again"] == str(INVALID_VALUE)
        exporter.stdin.write("\n")
        exporter.stdin.flush()
        while "freed" not in got:
            got.update(kv(exporter.stdout.readline()))
        stale = sim_programs.run("sim_entry", "ipc_stale", got["handle"], state=tmp_path / "sim.state")
        assert stale["open_stale"] == str(INVALID_VALUE)
        exporter.stdin.write("\n")
        exporter.stdin.flush()
        assert exporter.wait(timeout=30) == 0
    finally:
        if exporter.poll() is None:
            exporter.kill()


def test_shareable_file_descriptors_import_without_new_memory(sim_programs, tmp_path):
    env = sim_programs.env(tmp_path / "sim.state")
    exe = sim_programs.program("sim_entry")
    exporter = subprocess.Popen([str(exe), "share_export"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
    try:
        got: dict[str, str] = {}
        while "used" not in got:
            got.update(kv(exporter.stdout.readline()))
        assert got["not_requested"] == str(INVALID_VALUE)   # made without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        assert got["fabric"] == str(NOT_SUPPORTED)
        assert got["own_import_same"] == "1"
        assert got["used"] == str(10 * MiB)
        # hand the descriptor over, as SCM_RIGHTS would: reopen the exporter's
        fd = os.open(f"/proc/{got['pid']}/fd/{got['fd']}", os.O_RDONLY)
        try:
            res = subprocess.run([str(exe), "share_import", str(fd)], env=env, pass_fds=[fd], capture_output=True,
                                 text=True, timeout=60)
        finally:
            os.close(fd)
        out = kv(res.stdout)
        assert res.returncode == 0, res.stdout + res.stderr
        assert out["import_used_delta"] == out["mapped_used_delta"] == out["released_used_delta"] == "0"
        assert out["ext_over_export_used_delta"] == "0"   # external memory over a simulator export: same memory
        exporter.stdin.write("\n")
        exporter.stdin.flush()
        while "released" not in got:
            got.update(kv(exporter.stdout.readline()))
        fd = os.open(f"/proc/{got['pid']}/fd/{got['fd']}", os.O_RDONLY)
        try:
            res = subprocess.run([str(exe), "share_stale", str(fd)], env=env, pass_fds=[fd], capture_output=True,
                                 text=True, timeout=60)
        finally:
            os.close(fd)
        assert kv(res.stdout)["import_stale"] == str(INVALID_VALUE)
        exporter.stdin.write("\n")
        exporter.stdin.flush()
        assert exporter.wait(timeout=30) == 0
    finally:
        if exporter.poll() is None:
            exporter.kill()


def test_external_memory_counts_on_the_importing_process_gpu(entry):
    out = entry("extmem")
    assert out["import_used"] == str(8 * MiB)   # 7 MiB in 2 MiB pages
    assert out["fd_closed"] == "1"   # the driver owns the descriptor after a successful import
    assert out["mapped_used"] == str(8 * MiB)   # a mapped buffer is no new memory
    assert out["map_too_big"] == str(INVALID_VALUE)
    assert out["destroyed_used"] == "0"
    assert out["d3d12"] == str(NOT_SUPPORTED)
    assert out["import_too_big"] == str(OUT_OF_MEMORY)


def test_green_contexts_split_sms_and_share_the_primary_context(entry):
    out = entry("green")
    assert out["sms"] == "108,4,2"   # compute capability 8.x: at least 4 SMs, in steps of 2
    assert out["groups_query"] == "6"   # 108 SMs in groups of 16
    assert out["groups"] == "2,16,76"   # 15 rounds up to 16; two asked for; the rest remains
    assert out["too_many_sms"] == str(INVALID_VALUE)
    assert out["mixed_splits"] == str(INVALID_RESOURCE_CONFIGURATION)
    assert out["no_default_stream_flag"] == str(INVALID_VALUE)
    assert out["green_sms"] == "32" and out["green_device"] == "0"
    assert out["green_alloc_used"] == str(4 * MiB)
    assert out["stream_blocking"] == str(INVALID_VALUE)   # CU_STREAM_NON_BLOCKING is required
    assert out["green_launches"] == "1"
    assert out["after_reset_used"] == "0"   # its allocations are the primary context's


def test_primary_context_reset_frees_the_context_allocations(entry):
    out = entry("reset")
    assert out["before_reset"] == str((4 + 2 + 1 + 4 + 8) * MiB)
    assert out["after_reset"] == str(8 * MiB)   # stream-ordered allocations belong to no context
    assert out["still_active"] == "1"   # reset does not release it
    assert out["free_after_reset"] == str(INVALID_VALUE)
    assert out["end"] == "0"


def test_get_proc_address_returns_the_abi_of_each_version(entry):
    out = entry("procaddr")
    assert int(out["procaddr_cases"]) > 50
    assert out["procaddr_bad"] == "0", [k for k in out if k == "mismatch"]
