"""The node GPU topology annotation (`vgpu-sharing.io/node-gpu-topology`): encoding, round trip, strict rejection."""

import orjson
import pytest

from vgpu import keys
from vgpu.errors import CodecError
from vgpu.inventory import MAX_ANNOTATION_BYTES, GPUTopology, decode_topology, encode_topology


def test_key_is_ours():
    assert keys.NODE_TOPOLOGY == "vgpu-sharing.io/node-gpu-topology"


def test_encoding_is_compact_in_given_order_and_leaves_out_what_is_unknown():
    value = encode_topology([("GPU-b", 0, 0), ("GPU-a", 0, None), ("GPU-c", None, 1), ("GPU-d", None, None),
                             ("GPU-e", -1, -1)])
    assert value == '{"GPU-b":{"island":0,"numa":0},"GPU-a":{"island":0},"GPU-c":{"numa":1}}'
    assert encode_topology([]) == "{}"


def test_round_trip():
    gpus = [(f"GPU-{i}", i // 4 * 4, i // 4) for i in range(8)] + [("GPU-pcie", None, 1)]
    decoded = decode_topology(encode_topology(gpus))
    assert list(decoded) == [uuid for uuid, _, _ in gpus]
    assert decoded["GPU-5"] == GPUTopology(island=4, numa=1)
    assert decoded["GPU-pcie"] == GPUTopology(island=-1, numa=1)
    assert decode_topology("{}") == {}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "expected a string"),
        (7, "expected a string"),
        ("", "invalid JSON"),
        ("{", "invalid JSON"),
        ("[]", "JSON object keyed by GPU UUID"),
        ('"GPU-a"', "JSON object keyed by GPU UUID"),
        ('{"GPU-a":1}', "expected a JSON object"),
        ('{"GPU-a":[0]}', "expected a JSON object"),
        ('{"GPU-a":{"island":"0"}}', "island"),
        ('{"GPU-a":{"island":-1}}', "island"),
        ('{"GPU-a":{"island":1024}}', "island"),
        ('{"GPU-a":{"island":true}}', "island"),
        ('{"GPU-a":{"island":1.0}}', "island"),
        ('{"GPU-a":{"numa":null}}', "numa"),
        ('{"GPU-a":{"numa":99999999999999999999}}', "numa"),
        ('{"GPU-a":{"nvlink":0}}', "unknown keys"),
        ('{"":{"numa":0}}', "not a GPU UUID"),
        ('{"GPU a":{"numa":0}}', "not a GPU UUID"),
        ('{"GPU-\\n":{"numa":0}}', "not a GPU UUID"),
        ('{"' + "G" * 129 + '":{"numa":0}}', "not a GPU UUID"),
    ],
)
def test_malformed_values_are_refused(value, message):
    with pytest.raises(CodecError, match=message):
        decode_topology(value)


def test_size_limits():
    many = orjson.dumps({f"GPU-{i}": {} for i in range(1025)}).decode()
    with pytest.raises(CodecError, match="more than 1024 GPUs"):
        decode_topology(many)
    huge = '{"GPU-a":{}' + " " * MAX_ANNOTATION_BYTES + "}"
    with pytest.raises(CodecError, match="byte limit"):
        decode_topology(huge)
