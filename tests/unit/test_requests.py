"""Pod spec -> per-container requests: vectors of Volcano and HAMi, defaults, validation messages."""

import pytest

from vgpu.errors import CodecError, RequestError
from vgpu.requests import ContainerRequest, Selectors, cores_ceiling, pod_requests, pod_selectors
from vgpu.resources import SharingConfig

VOLCANO = SharingConfig()
WITH_ALIASES = SharingConfig(hami_aliases=True, exclusive_whole_gpu=False)  # GenerateResourceRequests alone


def pod(*containers, init=(), annotations=None):
    def make(spec):
        name, limits = spec
        return {"name": name, "resources": {"limits": limits}}

    return {
        "metadata": {"name": "p", "namespace": "default", "annotations": annotations or {}},
        "spec": {"initContainers": [make(c) for c in init], "containers": [make(c) for c in containers]},
    }


def test_volcano_get_gpu_memory_of_pod_vector():
    p = pod(
        ("a", {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 3000}),
        ("b", {"volcano.sh/vgpu-number": "3", "volcano.sh/vgpu-memory": "5000"}),
    )
    assert pod_requests(p, VOLCANO) == (
        ContainerRequest("a", False, 1, 3000, 0, 0),
        ContainerRequest("b", False, 3, 5000, 0, 0),
    )


@pytest.mark.parametrize(
    "limits, expected",
    [
        ({"nvidia.com/gpu": 1}, (1, 0, 100, 0)),
        ({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 4096}, (2, 4096, 0, 0)),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50}, (1, 0, 50, 0)),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 50}, (1, 0, 100, 50)),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 0}, (1, 0, 100, 0)),
        ({"nvidia.com/gpumem": "2k"}, (1, 2000, 0, 0)),
    ],
)
def test_hami_generate_resource_requests_vectors_with_aliases(limits, expected):
    (request,) = pod_requests(pod(("c", limits)), WITH_ALIASES)
    assert (request.count, request.memory, request.memory_percent, request.cores) == expected


def test_whole_gpu_mode_makes_number_only_containers_exclusive():
    (request,) = pod_requests(pod(("c", {"volcano.sh/vgpu-number": 2})), VOLCANO)
    assert (request.count, request.memory_percent, request.cores) == (2, 100, 100)
    (aliased,) = pod_requests(pod(("c", {"nvidia.com/gpu": 1})), SharingConfig(hami_aliases=True))
    assert aliased.cores == 100
    (shared,) = pod_requests(pod(("c", {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-cores": 0})), VOLCANO)
    assert shared.cores == 0  # an explicit 0 stays best effort


def test_by_default_hami_names_are_read_where_they_ask_for_a_share():
    """hami_names: shared (the default): a container asking nvidia.com/gpu alone is NVIDIA's device plugin's whole
    GPU, not ours; with any of HAMi's share names beside it, the whole HAMi request is ours."""
    assert pod_requests(pod(("c", {"nvidia.com/gpu": 1})), VOLCANO) == ()
    (shared,) = pod_requests(pod(("c", {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 3000})), VOLCANO)
    assert (shared.count, shared.memory, shared.cores) == (2, 3000, 0)
    (cores,) = pod_requests(pod(("c", {"nvidia.com/gpu": 3, "nvidia.com/gpucores": 30})), VOLCANO)
    assert (cores.count, cores.memory_percent, cores.cores) == (3, 100, 30)
    # two containers of one pod: the whole-GPU one is left to NVIDIA's plugin
    mixed = pod(("whole", {"nvidia.com/gpu": 1}), ("share", {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25}))
    assert [(r.container, r.memory_percent) for r in pod_requests(mixed, VOLCANO)] == [("share", 25)]


def test_hami_names_off_and_all():
    hami = pod(("c", {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 3000}))
    assert pod_requests(hami, SharingConfig(hami_names="off")) == ()
    (whole,) = pod_requests(pod(("c", {"nvidia.com/gpu": 1})), SharingConfig(hami_names="all"))
    assert (whole.count, whole.memory_percent, whole.cores) == (1, 100, 100)
    assert SharingConfig(hami_aliases=True).hami_mode() == "all"  # the older switch


def test_memory_or_cores_alone_mean_one_gpu():
    assert pod_requests(pod(("c", {"volcano.sh/vgpu-memory": 1024})), VOLCANO)[0].count == 1
    assert pod_requests(pod(("c", {"volcano.sh/vgpu-cores": 30})), VOLCANO)[0] == ContainerRequest(
        "c", False, 1, 0, 100, 30
    )


def test_requests_used_when_limits_absent_and_limits_win():
    p = {
        "spec": {
            "containers": [
                {"name": "r", "resources": {"requests": {"volcano.sh/vgpu-memory": "100"}}},
                {
                    "name": "both",
                    "resources": {
                        "requests": {"volcano.sh/vgpu-memory": "100"},
                        "limits": {"volcano.sh/vgpu-memory": "200"},
                    },
                },
            ]
        }
    }
    assert [r.memory for r in pod_requests(p, VOLCANO)] == [100, 200]


def test_memory_wins_over_percentage():
    (request,) = pod_requests(
        pod(("c", {"volcano.sh/vgpu-memory": 1000, "volcano.sh/vgpu-memory-percentage": 50})), VOLCANO
    )
    assert (request.memory, request.memory_percent) == (1000, 0)
    assert request.memory_on(40960) == 1000


def test_percentage_is_a_floor_share_of_the_card():
    (request,) = pod_requests(pod(("c", {"volcano.sh/vgpu-memory-percentage": 33})), VOLCANO)
    assert request.memory_on(15109) == 15109 * 33 // 100


def test_default_memory_from_configuration():
    (request,) = pod_requests(pod(("c", {"volcano.sh/vgpu-number": 1})), SharingConfig(default_memory=2048))
    assert (request.memory, request.memory_percent) == (2048, 0)


def test_init_containers_come_first_and_plain_containers_are_skipped():
    p = pod(
        ("sidecar", {"cpu": "1"}),
        ("worker", {"volcano.sh/vgpu-number": 2}),
        init=[("prepare", {"volcano.sh/vgpu-memory": 500})],
    )
    requests = pod_requests(p, VOLCANO)
    assert [(r.container, r.init) for r in requests] == [("prepare", True), ("worker", False)]


@pytest.mark.parametrize(
    "limits, resource, fragment",
    [
        ({"volcano.sh/vgpu-memory": -1}, "volcano.sh/vgpu-memory", "below 0"),
        ({"volcano.sh/vgpu-memory": "1.5"}, "volcano.sh/vgpu-memory", "whole number"),
        ({"volcano.sh/vgpu-memory": "4Gi"}, "volcano.sh/vgpu-memory", "above"),
        ({"volcano.sh/vgpu-memory": "lots"}, "volcano.sh/vgpu-memory", "not a quantity"),
        ({"volcano.sh/vgpu-cores": 101}, "volcano.sh/vgpu-cores", "above 100"),
        ({"volcano.sh/vgpu-memory-percentage": 150}, "volcano.sh/vgpu-memory-percentage", "above 100"),
        ({"volcano.sh/vgpu-number": 1000}, "volcano.sh/vgpu-number", "above 64"),
        ({"volcano.sh/vgpu-number": -2}, "volcano.sh/vgpu-number", "below 0"),
        ({"volcano.sh/vgpu-number": 0, "volcano.sh/vgpu-memory": 10}, "volcano.sh/vgpu-number", "is 0"),
        ({"volcano.sh/vgpu-number": True}, "volcano.sh/vgpu-number", "not a quantity"),
    ],
)
def test_invalid_values_name_container_and_resource(limits, resource, fragment):
    with pytest.raises(RequestError, match=fragment) as info:
        pod_requests(pod(("trainer", limits)), VOLCANO)
    assert info.value.container == "trainer"
    assert info.value.resource == resource
    assert "'trainer'" in str(info.value) and resource in str(info.value)


def test_memory_written_in_bytes_is_told_what_the_number_counts():
    """`vgpu-memory: 4Gi` is 4,294,967,296 MiB: the refusal says the number counts MiB per GPU and what to write."""
    with pytest.raises(RequestError) as info:
        pod_requests(pod(("trainer", {"volcano.sh/vgpu-memory": "4Gi"})), VOLCANO)
    assert str(info.value) == (
        "container 'trainer': volcano.sh/vgpu-memory: '4Gi' is above 2147483647: it counts MiB per GPU, not bytes, "
        "so '4Gi' asks 4294967296 of them; for 4Gi of memory write 4096")
    with pytest.raises(RequestError, match=r"it counts units of 4 MiB per GPU.* write 1024$"):
        pod_requests(pod(("trainer", {"volcano.sh/vgpu-memory": "4Gi"})), SharingConfig(gpu_memory_factor=4))


def test_zero_gpus_and_nothing_else_is_no_request():
    assert pod_requests(pod(("c", {"volcano.sh/vgpu-number": 0})), VOLCANO) == ()


def test_garbage_pod_shapes_give_no_requests():
    assert pod_requests({}, VOLCANO) == ()
    assert pod_requests({"spec": {"containers": ["x", None, {"name": "c", "resources": "bad"}]}}, VOLCANO) == ()


def test_selectors_from_annotations():
    p = pod(
        ("c", {}),
        annotations={
            "nvidia.com/use-gputype": "A100, h100",
            "volcano.sh/vgpu-use-gpuuuid": "GPU-0, GPU-1",
            "volcano.sh/vgpu-nouse-gpuuuid": "GPU-1",
            "volcano.sh/vgpu-mode": "hami-core",
        },
    )
    selectors = pod_selectors(p)
    assert selectors.use_types == ("a100", "h100")
    assert selectors.uuid_allowed("GPU-0") and not selectors.uuid_allowed("GPU-1")
    assert selectors.mode == "hami-core"


@pytest.mark.parametrize(
    "use, nouse, uuid, expected",
    [
        ("GPU-0, GPU-1", None, "GPU-1", True),
        ("GPU-10", None, "GPU-1", False),
        (", ,", None, "GPU-1", True),
        ("GPU-0,", None, "", False),
        ("GPU-1", "GPU-1", "GPU-1", False),
    ],
)
def test_volcano_check_gpu_uuid_vectors(use, nouse, uuid, expected):
    annotations = {"volcano.sh/vgpu-use-gpuuuid": use}
    if nouse:
        annotations["volcano.sh/vgpu-nouse-gpuuuid"] = nouse
    assert pod_selectors(pod(("c", {}), annotations=annotations)).uuid_allowed(uuid) is expected


@pytest.mark.parametrize(
    "annotations, expected",
    [
        ({"nvidia.com/use-gputype": "nvidia"}, True),
        ({"nvidia.com/use-gputype": "AMD,INTEL,MLU"}, False),
        ({"nvidia.com/nouse-gputype": "AMD,NVIDIA,INTEL"}, False),
        ({}, True),
    ],
)
def test_volcano_check_gpu_type_vectors(annotations, expected):
    assert pod_selectors(pod(("c", {}), annotations=annotations)).type_allowed("NVIDIA") is expected
    assert Selectors().type_allowed("NVIDIA")


@pytest.mark.parametrize(("value", "expected"), [(None, 0), ("80", 80), (" 100 ", 100), ("1", 1)])
def test_the_cores_ceiling_is_a_whole_percent(value, expected):
    annotations = {} if value is None else {"vgpu-sharing.io/cores-ceiling": value}
    assert cores_ceiling({"metadata": {"annotations": annotations}}) == expected


@pytest.mark.parametrize("value", ["0", "101", "80%", "lots", "-5", "", "7.5"])
def test_a_cores_ceiling_that_is_not_a_whole_percent_is_refused_naming_it(value):
    with pytest.raises(CodecError, match=r"vgpu-sharing\.io/cores-ceiling"):
        cores_ceiling({"metadata": {"annotations": {"vgpu-sharing.io/cores-ceiling": value}}})
