"""The consolidation hold annotation (`vgpu-sharing.io/consolidation-hold`): encoding, round trip, strict rejection."""

import orjson
import pytest

from vgpu import keys
from vgpu.assignment import DeviceGrant, decode
from vgpu.errors import CodecError
from vgpu.holds import MAX_HOLDS, Hold, decode_holds, encode_holds

IDS = "GPU-a,NVIDIA,40960,100:GPU-b,NVIDIA,40960,100:;GPU-c,NVIDIA,1000,20:"


def entry(**changes):
    """One hold as the annotation carries it, with members changed (None: left out)."""
    item = {"uid": "u-1", "namespace": "ml", "name": "trainer", "until": 1765130000.5, "ids": IDS}
    item.update(changes)
    return {k: v for k, v in item.items() if v is not None}


def value(*items):
    return orjson.dumps(list(items)).decode()


def test_key_is_ours():
    assert keys.CONSOLIDATION_HOLD == "vgpu-sharing.io/consolidation-hold"


def test_encoding_is_compact_json_in_given_order():
    hold = Hold("u-1", "ml", "trainer", 1765130000.5, ((DeviceGrant("GPU-a", 40960, 100),),))
    assert encode_holds([hold]) == ('[{"uid":"u-1","namespace":"ml","name":"trainer","until":1765130000.5,'
                                    '"ids":"GPU-a,NVIDIA,40960,100:"}]')
    assert encode_holds([]) == "[]"


def test_round_trip():
    holds = tuple(Hold(f"u-{i}", "ml", f"p{i}", 1765130000.0 + i / 4, decode(IDS)) for i in range(MAX_HOLDS))
    assert decode_holds(encode_holds(holds)) == holds
    assert decode_holds("[]") == ()


def test_an_integer_until_is_read_as_seconds():
    (hold,) = decode_holds(value(entry(until=1765130000)))
    assert hold.until == 1765130000.0 and isinstance(hold.until, float)
    assert hold.assignment == decode(IDS)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (None, "expected a string"),
        (7, "expected a string"),
        ("", "invalid JSON"),
        ("[", "invalid JSON"),
        ("[" + " " * 300_000 + "]", "over the"),
        ("{}", "expected a JSON array"),
        ('"u-1"', "expected a JSON array"),
        (value(*[entry(uid=f"u-{i}") for i in range(MAX_HOLDS + 1)]), "more than 64"),
        (value(["u-1"]), "entry 0: expected a JSON object"),
        (value(entry(), entry(uid="u-2", ids=None)), r"entry 1: missing \['ids'\]"),
        (value(entry(until=None, name=None)), r"missing \['name', 'until'\]"),
        (value(entry(node="n1")), "unknown keys"),
        (value(entry(uid="")), "uid: '' is not a non-empty string"),
        (value(entry(uid=5)), "uid: 5 is not"),
        (value(entry(namespace=["ml"])), "namespace"),
        (value(entry(name="")), "name"),
        (value(entry(until="1765130000")), "until: '1765130000' is not a number"),
        (value(entry(until=True)), "until"),
        ('[{"uid":"u","namespace":"ml","name":"p","until":1e999,"ids":"GPU-a,NVIDIA,1,1:"}]', "invalid JSON"),
        ('[{"uid":"u","namespace":"ml","name":"p","until":NaN,"ids":"GPU-a,NVIDIA,1,1:"}]', "invalid JSON"),
        (value(entry(ids=12)), "ids: assignment: expected a string"),
        (value(entry(ids="GPU-a,NVIDIA,1000,20")), "ids: .*must end with ':'"),
        (value(entry(ids="GPU-a,NVIDIA,1000,101:")), "ids: .*above 100"),
        (value(entry(ids="")), "ids: holds no GPU"),
        (value(entry(ids=";")), "ids: holds no GPU"),
        (value(entry(), entry(name="other")), "entry 1: duplicate uid 'u-1'"),
        (value(entry(uid=["x" * 1000])), r"uid: \['x{78}… is not"),  # quoted cut short
    ],
)
def test_malformed_values_are_refused(raw, message):
    with pytest.raises(CodecError, match=message):
        decode_holds(raw)
