"""Node inventory codecs: golden vectors of the research reports, round trips, strict rejection."""

import pytest

from vgpu.errors import CodecError
from vgpu.inventory import GPUDevice, decode_hami, decode_volcano, encode_hami, encode_hami_legacy, encode_volcano

A100 = "NVIDIA-NVIDIA A100-PCIE-40GB"
CONTRACT_EXAMPLE = (
    f"GPU-aaaa,10,40960,{A100},true,hami-core:"
    f"GPU-bbbb,10,40960,{A100},true,hami-core:"
)


def test_contract_example_decodes_with_positions_as_index():
    devices = decode_volcano(CONTRACT_EXAMPLE)
    assert devices == (
        GPUDevice("GPU-aaaa", 10, 40960, A100, True, "hami-core", index=0),
        GPUDevice("GPU-bbbb", 10, 40960, A100, True, "hami-core", index=1),
    )


def test_contract_example_encodes_byte_for_byte():
    devices = [
        GPUDevice("GPU-aaaa", 10, 40960, A100),
        GPUDevice("GPU-bbbb", 10, 40960, A100),
    ]
    assert encode_volcano(devices) == CONTRACT_EXAMPLE


def test_unhealthy_and_mig_mode_round_trip():
    value = "GPU-68e53c11-902e-fb97-ea05-c0d62322efe2,4,32768,NVIDIA-Tesla V100-SXM2-32GB,false,mig:"
    devices = decode_volcano(value)
    assert devices[0].healthy is False and devices[0].mode == "mig" and devices[0].memory == 32768
    assert encode_volcano(devices) == value


def test_empty_annotation_is_no_gpus():
    assert decode_volcano("") == ()


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("GPU-a,10,40960,NVIDIA-T4,true,hami-core", "end with ':'"),
        ("GPU-a,10,40960,NVIDIA-T4,true:", "6 comma-separated fields"),  # pre-v1.9 five-field form
        ("GPU-a,10,40960,NVIDIA-T4,true,hami-core,100:", "6 comma-separated fields"),
        ("GPU-a,ten,40960,NVIDIA-T4,true,hami-core:", "split count"),
        ("GPU-a,10,-1,NVIDIA-T4,true,hami-core:", "memory"),
        ("GPU-a,10,0,NVIDIA-T4,true,hami-core:", "memory"),
        ("GPU-a,10,40960,NVIDIA-T4,yes,hami-core:", "health"),
        (",10,40960,NVIDIA-T4,true,hami-core:", "uuid"),
        ("GPU-a,10,1,T,true,m:GPU-a,10,1,T,true,m:", "duplicate uuid"),
        ("GPU-a,10,1,T,true,m::", "6 comma-separated fields"),
        (42, "expected a string"),
    ],
)
def test_volcano_decoder_rejects_with_clear_reason(value, fragment):
    with pytest.raises(CodecError, match=fragment):
        decode_volcano(value)


def test_hami_legacy_seven_fields():
    devices = decode_hami("GPU-ebe7c3f7-303d-558d-435e-99a160631fe4,10,7680,100,NVIDIA-Tesla P4,0,true:")
    assert devices == (
        GPUDevice(
            "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4", 10, 7680, "NVIDIA-Tesla P4", True, "hami-core", 0, 100, 0
        ),
    )


def test_hami_legacy_nine_fields_round_trip():
    value = "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4,10,7680,100,NVIDIA-Tesla P4,0,true,1,hami-core:"
    devices = decode_hami(value)
    assert devices[0].index == 1
    assert encode_hami_legacy(devices) == value


def test_hami_json_and_legacy_decode_to_same_fields():
    json_value = (
        '[{"id":"GPU-0","count":5,"devmem":8192,"devcore":100,"type":"NVIDIA-Tesla P4",'
        '"numa":0,"health":true,"index":0}]'
    )
    legacy = "GPU-0,5,8192,100,NVIDIA-Tesla P4,0,true:"
    assert decode_hami(json_value) == decode_hami(legacy)


def test_hami_json_encoder_matches_go_omitempty_order():
    devices = [GPUDevice("GPU-0fc3eda5", 10, 32768, "NVIDIA-Tesla V100-PCIE-32GB", True, "hami-core", 1, 100, 0)]
    assert encode_hami(devices) == (
        '[{"id":"GPU-0fc3eda5","index":1,"count":10,"devmem":32768,"devcore":100,'
        '"type":"NVIDIA-Tesla V100-PCIE-32GB","mode":"hami-core","health":true}]'
    )


def test_hami_json_missing_health_means_unhealthy():
    devices = decode_hami('[{"id":"GPU-1","count":10,"devmem":8000,"devcore":100,"type":"NVIDIA-T4"}]')
    assert devices[0].healthy is False and devices[0].index == 0 and devices[0].numa == 0
    assert encode_hami(devices) == (
        '[{"id":"GPU-1","count":10,"devmem":8000,"devcore":100,"type":"NVIDIA-T4","mode":"hami-core"}]'
    )


def test_hami_json_escapes_like_go():
    devices = [GPUDevice("GPU-<1>", 1, 1, "A&B")]
    assert '"id":"GPU-\\u003c1\\u003e"' in encode_hami(devices)
    assert '"type":"A\\u0026B"' in encode_hami(devices)


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("[", "invalid JSON"),
        ('{"id":"x"}', "invalid JSON|JSON array"),
        ('[{"id":"GPU-0","count":"5","devmem":1}]', "count"),
        ('[{"count":5,"devmem":1}]', "id"),
        ('[{"id":"GPU-0","count":5,"devmem":1,"surprise":1}]', "unknown keys"),
        ('[{"id":"GPU-0","count":5,"devmem":1,"health":"true"}]', "health"),
        ("uuid,type,100:", "7 or 9"),
        ("no separators here", "':'"),
    ],
)
def test_hami_decoder_rejects_with_clear_reason(value, fragment):
    with pytest.raises(CodecError, match=fragment):
        decode_hami(value)
