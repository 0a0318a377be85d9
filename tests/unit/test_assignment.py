"""Assignment codec (`vgpu-ids-new` / `devices-to-allocate`): vectors, round trips, strict and salvage decoding."""

import pytest

from vgpu.assignment import DeviceGrant, decode, encode, salvage
from vgpu.errors import CodecError


def test_contract_example():
    value = "GPU-aaaa,NVIDIA,10000,30:GPU-bbbb,NVIDIA,10000,30:"
    assignment = ((DeviceGrant("GPU-aaaa", 10000, 30), DeviceGrant("GPU-bbbb", 10000, 30)),)
    assert decode(value) == assignment
    assert encode(assignment) == value


def test_segments_join_without_trailing_separator():
    assignment = ((DeviceGrant("GPU-a", 2000, 0),), (DeviceGrant("GPU-b", 2000, 0),))
    assert encode(assignment) == "GPU-a,NVIDIA,2000,0:;GPU-b,NVIDIA,2000,0:"
    assert decode("GPU-a,NVIDIA,2000,0:;GPU-b,NVIDIA,2000,0:") == assignment


def test_exclusive_multi_card_vector_with_empty_uuids_is_rejected_strictly():
    # Volcano's Test_FilterNode writes empty UUIDs; a real assignment always has them.
    with pytest.raises(CodecError, match="uuid"):
        decode(",NVIDIA,30000,100:,NVIDIA,20000,100:,NVIDIA,30000,100:")


def test_empty_segments_keep_positions():
    # What the Volcano plugin leaves behind after consuming the first container.
    assert decode(";GPU-b,NVIDIA,2000,0:") == ((), (DeviceGrant("GPU-b", 2000, 0),))
    assert decode("") == ()


def test_volcano_salvage_vector_skips_invalid_usage():
    assert salvage("GPU-0,NVIDIA,-5,30:GPU-1,NVIDIA,2048,10:") == ((DeviceGrant("GPU-1", 2048, 10),),)
    assert salvage("GPU-0,NVIDIA:") == ((),)
    assert salvage(None) == ()


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("GPU-0,NVIDIA,-5,30:", "memory"),
        ("GPU-0,NVIDIA:", "4 comma-separated fields"),
        ("GPU-0,NVIDIA,10,30", "end with ':'"),
        ("GPU-0,NVIDIA,10,101:", "above 100"),
        ("GPU-0,NVIDIA,99999999999,1:", "out of range"),
        ("GPU-0,,10,1:", "empty type"),
        ("GPU-0,NVIDIA,1.5,1:", "memory"),
        ([], "expected a string"),
    ],
)
def test_strict_decoder_rejects_with_clear_reason(value, fragment):
    with pytest.raises(CodecError, match=fragment):
        decode(value)
