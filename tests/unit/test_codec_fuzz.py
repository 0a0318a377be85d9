"""Property tests: decoders raise nothing but CodecError on arbitrary input, and encoders round-trip."""

from hypothesis import given, settings
from hypothesis import strategies as st

from vgpu import assignment, inventory
from vgpu.errors import CodecError

_alphabet = st.sampled_from(list("GPU-abc0123456789,:;[]{}\"' NVIDIAtruefalsehami-core.\\x\n"))
_noise = st.one_of(st.text(_alphabet, max_size=200), st.text(max_size=100), st.binary(max_size=50), st.integers())


@settings(max_examples=400, deadline=None)
@given(_noise)
def test_decoders_only_raise_codec_error(value):
    for decoder in (inventory.decode_volcano, inventory.decode_hami, assignment.decode):
        try:
            decoder(value)
        except CodecError:
            pass
    assignment.salvage(value)  # never raises at all


_uuid = st.from_regex(r"GPU-[0-9a-f]{1,12}", fullmatch=True)
_type = st.from_regex(r"NVIDIA-[A-Za-z0-9 \-]{1,20}[A-Za-z0-9]", fullmatch=True)


@st.composite
def _devices(draw):
    uuids = draw(st.lists(_uuid, min_size=0, max_size=8, unique=True))
    return [
        inventory.GPUDevice(
            uuid=u,
            split=draw(st.integers(1, 100)),
            memory=draw(st.integers(1, 200_000)),
            type=draw(_type),
            healthy=draw(st.booleans()),
            mode=draw(st.sampled_from(["hami-core", "mig"])),
            index=i,
        )
        for i, u in enumerate(uuids)
    ]


@settings(max_examples=200, deadline=None)
@given(_devices())
def test_inventory_round_trips(devices):
    assert list(inventory.decode_volcano(inventory.encode_volcano(devices))) == devices
    assert list(inventory.decode_hami(inventory.encode_hami(devices))) == devices
    if devices:  # the legacy format has no way to say "no GPUs"
        assert list(inventory.decode_hami(inventory.encode_hami_legacy(devices))) == devices


_grant = st.builds(assignment.DeviceGrant, _uuid, st.integers(0, 2**31 - 1), st.integers(0, 100))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_grant, min_size=1, max_size=4).map(tuple), min_size=1, max_size=5).map(tuple))
def test_assignment_round_trips(value):
    assert assignment.decode(assignment.encode(value)) == value
    assert assignment.salvage(assignment.encode(value)) == value
