"""Device order in the simulated driver, as CUDA and NVML document it: CUDA enumerates fastest first (the
simulator's heuristic: more SMs first) unless CUDA_DEVICE_ORDER=PCI_BUS_ID, then applies CUDA_VISIBLE_DEVICES
(indices into that order, or UUIDs and unique UUID prefixes; the first entry naming no GPU ends the list); NVML
enumerates by PCI bus id and ignores CUDA_VISIBLE_DEVICES.  SIMGPU_DEVICES's `busN` flag sets a GPU's bus (default:
its 1-based position), which CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, cuDeviceGetPCIBusId and nvmlDeviceGetPciInfo report."""
from __future__ import annotations

import pytest

MIXED = "Tesla T4:15360:40,NVIDIA A100:40960:108"


@pytest.fixture
def devices(sim_programs, tmp_path):
    def run(spec: str, **extra: str) -> dict:
        out = sim_programs.run("sim_devices", state=tmp_path / "sim.state", devices=spec, nvml=True, **extra)
        cuda = [out[f"cuda{i}"].split("|") for i in range(int(out["cuda_count"]))]
        nvml = [out[f"nvml{i}"].split("|") for i in range(int(out["nvml_count"]))]
        return {"cuda": cuda, "nvml": nvml, "raw": out}
    return run


def test_cuda_enumerates_fastest_first_and_nvml_by_pci_bus(devices):
    out = devices(MIXED)
    assert [d[0] for d in out["cuda"]] == ["NVIDIA A100", "Tesla T4"]
    assert [d[0] for d in out["nvml"]] == ["Tesla T4", "NVIDIA A100"]
    # the bus ids are the devices', whatever the order: the default bus is the 1-based position in the list
    assert [(d[0], d[1], d[2]) for d in out["cuda"]] == [("NVIDIA A100", "2", "0000:02:00.0"),
                                                         ("Tesla T4", "1", "0000:01:00.0")]
    assert [(d[1], d[2]) for d in out["nvml"]] == [("1", "00000000:01:00.0"), ("2", "00000000:02:00.0")]
    assert [d[4] for d in out["cuda"]] == ["0", "1"]   # cuDeviceGetByPCIBusId finds each
    assert [d[4] for d in out["nvml"]] == ["1", "1"]   # nvmlDeviceGetHandleByPciBusId_v2 too


def test_pci_bus_id_order(devices):
    out = devices(MIXED, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    assert [d[0] for d in out["cuda"]] == ["Tesla T4", "NVIDIA A100"]
    out = devices(MIXED, CUDA_DEVICE_ORDER="FASTEST_FIRST")
    assert [d[0] for d in out["cuda"]] == ["NVIDIA A100", "Tesla T4"]


def test_identical_gpus_keep_their_listed_order_everywhere(devices):
    out = devices("G0:40960:108,G1:40960:108,G2:40960:108")
    assert [d[0] for d in out["cuda"]] == ["G0", "G1", "G2"] == [d[0] for d in out["nvml"]]
    assert [d[1] for d in out["cuda"]] == ["1", "2", "3"]


def test_bus_flag_orders_nvml_and_breaks_cuda_ties(devices):
    out = devices("A:1024:80::bus9,B:1024:80::bus3+numa1,C:1024:100::bus0x20")
    assert [(d[0], d[1]) for d in out["nvml"]] == [("B", "3"), ("A", "9"), ("C", "32")]
    assert [d[0] for d in out["cuda"]] == ["C", "B", "A"]   # most SMs first; equal SMs by bus


def test_cuda_visible_devices_indexes_the_cuda_order(devices):
    spec = "A:1024:80::bus9,B:1024:80::bus3,C:1024:100::bus0x20"   # CUDA order: C, B, A
    out = devices(spec, CUDA_VISIBLE_DEVICES="2,0")
    assert [d[0] for d in out["cuda"]] == ["A", "C"]
    assert len(out["nvml"]) == 3   # NVML ignores it
    out = devices(spec, CUDA_VISIBLE_DEVICES="1,7,0")   # an invalid index ends the list
    assert [d[0] for d in out["cuda"]] == ["B"]
    out = devices(spec, CUDA_VISIBLE_DEVICES="0,0")   # a repeat too
    assert [d[0] for d in out["cuda"]] == ["C"]
    out = devices(spec, CUDA_VISIBLE_DEVICES="")
    assert out["raw"]["cuda_init"] == "100"   # CUDA_ERROR_NO_DEVICE


def test_cuda_visible_devices_takes_uuids_and_unique_prefixes(devices):
    a = "GPU-6c9e5dc0-97da-5a9c-bc1b-a8a290a25129"
    b = "GPU-6c9e5dc0-1111-4a9c-bc1b-a8a290a25129"
    c = "GPU-7d000000-1111-4a9c-bc1b-a8a290a25129"
    spec = f"A:1024:80:{a},B:1024:80:{b},C:1024:80:{c}"
    out = devices(spec, CUDA_VISIBLE_DEVICES=f"{c},{a}")
    assert [d[0] for d in out["cuda"]] == ["C", "A"]
    out = devices(spec, CUDA_VISIBLE_DEVICES="GPU-7d,GPU-6c9e5dc0-97")
    assert [d[0] for d in out["cuda"]] == ["C", "A"]
    out = devices(spec, CUDA_VISIBLE_DEVICES="GPU-7d,GPU-6c9e5dc0,1")   # ambiguous prefix: the list ends there
    assert [d[0] for d in out["cuda"]] == ["C"]
