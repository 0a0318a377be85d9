"""GPU topology in the node's ResourceSlice: `nvlinkIsland` (int) where the GPU has NVLink, beside the standard
`resource.kubernetes.io/numaNode`, and the shared reader the scheduler uses reading both back."""

from __future__ import annotations

from dra_helpers import DRABed

from vgpu.dra import ISLAND_ATTRIBUTE, NUMA_ATTRIBUTE, slice_devices
from vgpu.draplugin.slices import slice_spec
from vgpu.node.backends import GPUInfo


def test_the_island_attribute_is_published_only_where_known() -> None:
    gpus = [GPUInfo("GPU-a", "NVIDIA H100 80GB HBM3", 81559, minor=0, index=0, numa=0, nvlink_island=0),
            GPUInfo("GPU-b", "NVIDIA H100 80GB HBM3", 81559, minor=1, index=1, numa=0, nvlink_island=0),
            GPUInfo("GPU-c", "Tesla T4", 15360, minor=2, index=2)]
    devices = slice_spec("n1", gpus, 1)["devices"]
    assert ISLAND_ATTRIBUTE == "nvlinkIsland"
    assert [d["attributes"].get(ISLAND_ATTRIBUTE) for d in devices] == [{"int": 0}, {"int": 0}, None]
    assert [d["attributes"].get(NUMA_ATTRIBUTE) for d in devices] == [{"int": 0}, {"int": 0}, None]
    assert len(devices[0]["attributes"]) + len(devices[0]["capacity"]) <= 32  # the API's limit per device


def test_the_sim_plugin_publishes_islands_and_numa_nodes(bed: DRABed) -> None:
    bed.start(gpus="4xH100-80GB@nvlink2,2xT4/numa2")
    published = bed.read_slice()
    devices = published["spec"]["devices"]
    assert [d["attributes"].get(ISLAND_ATTRIBUTE) for d in devices] == [{"int": 0}, {"int": 0}, {"int": 2},
                                                                        {"int": 2}, None, None]
    assert [d["attributes"][NUMA_ATTRIBUTE]["int"] for d in devices] == [0, 0, 0, 1, 1, 1]
    read = slice_devices(published)
    assert [(d.name, d.island, d.numa) for d in read] == [("gpu-0", 0, 0), ("gpu-1", 0, 0), ("gpu-2", 2, 0),
                                                          ("gpu-3", 2, 1), ("gpu-4", -1, 1), ("gpu-5", -1, 1)]
