"""The shared accounting file keeps HAMi-core's v1.2 layout byte for byte (figures from research/hami-core.md)."""
from __future__ import annotations

import struct

from vgpu.isolation import region
from vgpu.isolation.region import Region

# offsets as listed in the research report, section 3.1
REGION_V1 = {
    "initialized_flag": 0, "major_version": 4, "minor_version": 8, "sm_init_flag": 12, "owner_pid": 16,
    "sem": 24, "device_num": 56, "uuids": 64, "limit": 1600, "sm_limit": 1728, "procs": 1856,
    "proc_num": 2008896, "utilization_switch": 2008900, "recent_kernel": 2008904, "priority": 2008908,
    "last_kernel_time": 2008912, "sem_postinit": 2008920,
}
SLOT_V1 = {"pid": 0, "hostpid": 4, "used": 8, "monitorused": 1032, "device_util": 1160, "status": 1928,
           "seqlock": 1936, "unused": 1944}
DEVMEM = {"context_size": 0, "module_size": 8, "data_size": 16, "offset": 24, "total": 32, "unused": 40}
DEVUTIL = {"dec_util": 0, "enc_util": 8, "sm_util": 16, "unused": 24}


def test_every_v1_offset_matches_the_report():
    off = region.offsets()
    for name, want in REGION_V1.items():
        assert off[f"region.{name}"] == want, name
    for name, want in SLOT_V1.items():
        assert off[f"slot.{name}"] == want, name
    for name, want in DEVMEM.items():
        assert off[f"devmem.{name}"] == want, name
    for name, want in DEVUTIL.items():
        assert off[f"devutil.{name}"] == want, name


def test_sizes_and_counts():
    ffi = region.ffi
    assert ffi.sizeof("vgpu_region_t") == 2_008_952
    assert ffi.sizeof("vgpu_proc_slot_t") == 1960
    assert ffi.sizeof("vgpu_devmem_t") == 64
    assert ffi.sizeof("vgpu_devutil_t") == 48
    assert region.MAGIC == 19920718
    fields = dict(ffi.typeof("vgpu_region_t").fields)
    assert fields["procs"].type.length == 1024
    assert fields["limit"].type.length == 16 and fields["sm_limit"].type.length == 16
    assert fields["uuids"].type.length == 16 and fields["uuids"].type.item.length == 96
    assert dict(ffi.typeof("vgpu_proc_slot_t").fields)["used"].type.length == 16
    assert region.MAX_PROCS == 1024 and region.MAX_DEVICES == 16
    assert region.EXT_OFFSET >= 2_008_952


def test_file_written_by_the_library_decodes_at_the_report_offsets(sim):
    kv = sim.run("chunks", str(64 << 20), CUDA_DEVICE_MEMORY_LIMIT="256m", CUDA_DEVICE_SM_LIMIT="40",
                 CUDA_TASK_PRIORITY="0")
    assert kv["count"] == "4", kv
    raw = sim.cache.read_bytes()
    assert len(raw) >= 2_008_952
    magic, major, minor = struct.unpack_from("<iII", raw, 0)
    assert (magic, major, minor) == (19920718, 1, 2)
    assert struct.unpack_from("<Q", raw, 56)[0] == 1                      # device_num
    assert raw[64:68] == b"GPU-"                                            # uuids[0]
    assert struct.unpack_from("<Q", raw, 1600)[0] == 256 << 20             # limit[0]
    assert struct.unpack_from("<Q", raw, 1728)[0] == 40                    # sm_limit[0]
    assert struct.unpack_from("<iiii", raw, 2008896)[1:] == (1, 2, 0)      # switch, recent_kernel, priority
    with Region.open(sim.cache) as r:
        snap = r.snapshot()
    assert snap.devices[0].limit == 256 << 20 and snap.devices[0].sm_limit == 40
    assert snap.devices[0].uuid.startswith("GPU-")
    assert snap.priority == 0 and snap.extended


def test_region_reads_a_file_with_only_the_v1_part(tmp_path):
    """A file created by HAMi-core (v1 only, 2,008,953 bytes) is readable; usage is summed over the slots."""
    ffi = region.ffi
    buf = bytearray(2_008_953)
    r = ffi.cast("vgpu_region_t *", ffi.from_buffer(buf))
    r.initialized_flag, r.major_version, r.minor_version = 19920718, 1, 2
    r.device_num = 1
    r.limit[0] = 1 << 30
    r.proc_num = 2
    for i, (pid, used) in enumerate([(101, 3 << 20), (102, 5 << 20)]):
        r.procs[i].pid, r.procs[i].status = pid, 1
        r.procs[i].used[0].total = used
    p = tmp_path / "hami.cache"
    p.write_bytes(buf)
    with Region.open(p) as reg:
        snap = reg.snapshot()
    assert not snap.extended
    assert snap.devices[0].used == 8 << 20
    assert [pr.pid for pr in snap.processes] == [101, 102]
