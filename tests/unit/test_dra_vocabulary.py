"""vgpu.dra: capacities as quantities, our driver's slices and allocated claims read back."""

import pytest

from vgpu.dra import (
    DRIVER,
    SliceDevice,
    claim_consumption,
    cores_of,
    device_name,
    mib_of,
    slice_devices,
)
from vgpu.errors import CodecError


@pytest.mark.parametrize("value, mib", [
    ("10Gi", 10240), ("10240Mi", 10240), (str(10 * 2**30), 10240), ("1", 1), ("1500Ki", 2), (0, 0), ("40960Mi", 40960),
])
def test_memory_quantities_in_mib_round_up(value, mib):
    assert mib_of(value, "x") == mib


@pytest.mark.parametrize("value", ["-1Mi", "ten", "", None, "1Zi"])
def test_memory_quantities_that_are_not_amounts_are_refused(value):
    with pytest.raises(CodecError, match=r"^consumed memory: "):
        mib_of(value, "consumed memory")


@pytest.mark.parametrize("value, cores", [("30", 30), (0, 0), ("100", 100), ("250m", 1), ("29.5", 30)])
def test_cores(value, cores):
    assert cores_of(value, "x") == cores


@pytest.mark.parametrize("value", ["101", "-1", "1k", "x"])
def test_cores_outside_0_to_100_are_refused(value):
    with pytest.raises(CodecError):
        cores_of(value, "cores")


def _device(index, memory="40960Mi", cores="100", **extra):
    return {
        "name": device_name(index),
        "attributes": {"uuid": {"string": f"GPU-{index}"}, "model": {"string": "A100-40GB"}, "index": {"int": index}},
        "capacity": {"memory": {"value": memory}, "cores": {"value": cores}},
        "allowMultipleAllocations": True,
        **extra,
    }


def _slice(devices, driver=DRIVER, pool="node-a"):
    return {"spec": {"driver": driver, "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                     "nodeName": pool, "devices": devices}}


def test_slice_devices_in_slice_order():
    found = slice_devices(_slice([_device(1), _device(0, memory="16Gi")]))
    assert [d.name for d in found] == ["gpu-1", "gpu-0"]
    assert found[1] == SliceDevice("node-a", "gpu-0", "GPU-0", "A100-40GB", 0, 16384, 100, True)


def test_another_drivers_slice_is_not_ours():
    assert slice_devices(_slice([{"name": "x"}], driver="gpu.nvidia.com")) == []


def test_a_device_without_memory_capacity_is_named():
    device = _device(3)
    del device["capacity"]["memory"]
    with pytest.raises(CodecError, match=r"gpu-3.*memory"):
        slice_devices(_slice([device]))


def test_a_device_with_unparsable_cores_is_named():
    with pytest.raises(CodecError, match="pool 'node-a' device 'gpu-0' capacity cores"):
        slice_devices(_slice([_device(0, cores="lots")]))


def _claim(results):
    return {"metadata": {"uid": "u1"}, "status": {"allocation": {"devices": {"results": results}}}}


def test_claim_consumption_reads_consumed_capacity_of_our_results_only():
    claim = _claim([
        {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0", "shareID": "s1",
         "consumedCapacity": {"memory": "10Gi", "cores": "30"}},
        {"request": "nic", "driver": "other.example.com", "pool": "node-a", "device": "nic-0"},
    ])
    [share] = claim_consumption(claim)
    assert (share.request, share.pool, share.device, share.memory_mib, share.cores, share.share_id) == \
        ("gpu", "node-a", "gpu-0", 10240, 30, "s1")


def test_a_result_without_consumed_capacity_takes_the_whole_known_device():
    whole = {("node-a", "gpu-0"): slice_devices(_slice([_device(0)]))[0]}
    claim = _claim([{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}])
    [share] = claim_consumption(claim, whole)
    assert (share.memory_mib, share.cores) == (40960, 100)
    with pytest.raises(CodecError, match="not published"):
        claim_consumption(claim)


def test_an_unallocated_claim_holds_nothing():
    assert claim_consumption({"metadata": {"uid": "u"}, "status": {}}) == []
    assert claim_consumption({}) == []


def test_consumed_capacity_that_does_not_parse_is_refused():
    claim = _claim([{"request": "gpu", "driver": DRIVER, "pool": "p", "device": "gpu-0",
                     "consumedCapacity": {"memory": "a lot"}}])
    with pytest.raises(CodecError, match="claim u1 result 'gpu' device p/gpu-0 consumed memory"):
        claim_consumption(claim)
