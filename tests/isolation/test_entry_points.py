"""Every way a program comes to hold device memory is counted against the limit: the CUDA 2 ABI, graph memory
nodes, memory imported from other processes or other APIs.  Driven by tests/isolation/csrc/probe_api.c."""
from __future__ import annotations

import pytest

from vgpu.isolation.region import Region

MiB = 1 << 20
LIMIT = 1000 * MiB
OOM = "2"


def test_the_cuda2_abi_is_limited(sim, probe_api):
    """cuMemAlloc, cuMemAllocPitch, cuArrayCreate and cuArray3DCreate under their first names (32-bit pointers and
    sizes), cuMemGetInfo and cuDeviceTotalMem too."""
    out = sim.run("legacy", "64", program=probe_api, CUDA_DEVICE_MEMORY_LIMIT="1000m", VGPU_CONTEXT_OVERHEAD="8m")
    assert out["_rc"] == "0", out
    assert int(out["meminfo_total"]) == int(out["devtotal"]) == LIMIT
    for path in ("alloc", "pitch", "array", "array3d"):
        assert LIMIT - 64 * MiB < int(out[f"{path}_bytes"]) <= LIMIT, (path, out)
        assert out[f"{path}_err"] == OOM, (path, out)
    assert out["ctx_create"] == "0"
    with Region.open(sim.cache) as r:
        assert r.used(0) == 0


def test_graph_memory_nodes_are_limited_and_given_back_with_the_graph(sim, probe_api):
    out = sim.run("graphmem", "64", program=probe_api, CUDA_DEVICE_MEMORY_LIMIT="1000m")
    assert out["_rc"] == "0", out
    for rnd in ("round0", "round1"):     # the second graph gets everything back the first one held
        assert LIMIT - 64 * MiB < int(out[f"{rnd}_bytes"]) <= LIMIT, out
        assert out[f"{rnd}_err"] == OOM, out


@pytest.mark.parametrize("mib,admitted", [(600, True), (2000, False)])
def test_external_memory_is_charged_to_the_importer(sim, probe_api, mib, admitted):
    out = sim.run("extmem", str(mib), program=probe_api, CUDA_DEVICE_MEMORY_LIMIT="1000m")
    assert out["_rc"] == "0", out
    assert out["import"] == ("0" if admitted else OOM), out
    if admitted:
        assert int(out["used_while_imported"]) == mib * MiB
    assert out["used_after"] == "0"


@pytest.mark.parametrize("same_container", [True, False])
def test_ipc_memory_counts_once_per_container(sim, probe_api, tmp_path, same_container):
    """Another container's memory mapped in by IPC is charged to the importer (nothing else limits it); memory a
    process of the same container exported was charged there already and is not charged twice."""
    handle = tmp_path / "ipc.handle"
    exporter_cache = sim.cache if same_container else tmp_path / "other.cache"
    exporter = sim.popen("ipc_export", "400", str(handle), "30", program=probe_api, CUDA_DEVICE_MEMORY_LIMIT="1000m",
                         CUDA_DEVICE_MEMORY_SHARED_CACHE=str(exporter_cache))
    try:
        assert exporter.stdout is not None
        assert exporter.stdout.readline().strip() == "exported=1"
        out = sim.run("ipc_import", str(handle), "50", program=probe_api, CUDA_DEVICE_MEMORY_LIMIT="1000m")
    finally:
        exporter.kill()
        exporter.communicate(timeout=30)
    assert out["_rc"] == "0", out
    assert out["open"] == "0" and out["close"] == "0", out
    # 1000 MiB less the 400 MiB held in this container, either by the exporter or by the import itself
    assert int(out["after_open_bytes"]) == 600 * MiB, out
    # closing the mapping gives back what the import was charged (nothing when the exporter paid)
    assert out["after_close"] == (OOM if same_container else "0")


@pytest.mark.parametrize("same_container", [True, False])
def test_shareable_handles_count_once_per_container(sim, probe_api, tmp_path, same_container):
    """VMM memory passed to a new process as a file descriptor: charged to the importer's container when mapped,
    unless its own container exported it.  Each process's primary context costs 64 MiB here."""
    cache = "same" if same_container else str(tmp_path / "other.cache")
    out = sim.run("shareable", "400", cache, program=probe_api, CUDA_DEVICE_MEMORY_LIMIT="1000m",
                  VGPU_CONTEXT_OVERHEAD="64m")
    assert out["_rc"] == "0" and out["child_status"] == "0", out
    assert out["map"] == "0", out
    # same container: 1000 - (exporter's 400 + 64) - importer's 64; another: 1000 - 64 - the mapped 400
    assert int(out["beside_bytes"]) == (450 if same_container else 500) * MiB, out


def test_a_green_context_costs_what_a_context_costs(sim, probe_api):
    out = sim.run("green", program=probe_api, CUDA_DEVICE_MEMORY_LIMIT="1000m", VGPU_CONTEXT_OVERHEAD="64m")
    assert out["_rc"] == "0" and out["create"] == "0", out
    assert int(out["used_with_green"]) - int(out["used_before"]) == 64 * MiB
    assert out["used_after"] == out["used_before"]


@pytest.mark.parametrize("limit,expected", [("30", "801"), ("100", "0")])
def test_multi_device_cooperative_launches_are_refused_under_a_compute_limit(sim, probe_api, limit, expected):
    """One launch over several devices cannot be timed against one device's budget: CUDA_ERROR_NOT_SUPPORTED (801)
    while a compute limit applies, passed through otherwise."""
    out = sim.run("multidev", program=probe_api, CUDA_DEVICE_MEMORY_LIMIT="1000m", CUDA_DEVICE_SM_LIMIT=limit,
                  GPU_CORE_UTILIZATION_POLICY="force")
    assert out["_rc"] == "0" and out["launch"] == expected, out
