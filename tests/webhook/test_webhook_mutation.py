"""The webhook's pod mutation: which pods are opted in, HAMi's names translated, quota totals, the scheduler name;
each patch applied with the `jsonpatch` library (RFC 6902, not our code) and the result read back."""

import jsonpatch
import pytest

from vgpu.errors import RequestError
from vgpu.quota import check_quota_totals
from vgpu.requests import pod_requests
from vgpu.resources import QUOTA_CORES, QUOTA_MEMORY, SharingConfig
from vgpu.webhook.mutation import MutationSettings, mutate_pod

SETTINGS = MutationSettings()


def pod(*containers, init=(), scheduler="default-scheduler"):
    def make(spec):
        name, limits = spec
        return {"name": name, "image": "cuda", "resources": {"limits": dict(limits), "requests": dict(limits)}}

    spec = {"containers": [make(c) for c in containers], "initContainers": [make(c) for c in init]}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team"}, "spec": spec}


def mutated(p, settings=SETTINGS):
    return jsonpatch.apply_patch(p, mutate_pod(p, settings))


def limits(p, index=0, field="containers"):
    return p["spec"][field][index]["resources"]["limits"]


def test_a_volcano_pod_gets_the_scheduler_and_totals_over_all_its_gpus():
    out = mutated(pod(("train", {"volcano.sh/vgpu-number": 4, "volcano.sh/vgpu-memory": 10000,
                                 "volcano.sh/vgpu-cores": 30})))
    assert out["spec"]["schedulerName"] == "vgpu-scheduler"
    for table in ("limits", "requests"):
        got = out["spec"]["containers"][0]["resources"][table]
        assert (got[QUOTA_MEMORY], got[QUOTA_CORES]) == ("40000", "120")
    check_quota_totals(out, pod_requests(out, SharingConfig()), SharingConfig(), required=True)


def test_an_unedited_hami_pod_is_translated_to_our_names():
    out = mutated(pod(("infer", {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 25,
                                 "cpu": "1"})))
    assert limits(out) == {"volcano.sh/vgpu-number": 2, "volcano.sh/vgpu-memory": 3000, "volcano.sh/vgpu-cores": 25,
                           "cpu": "1", QUOTA_MEMORY: "6000", QUOTA_CORES: "50"}
    assert out["spec"]["schedulerName"] == "vgpu-scheduler"


def test_a_whole_gpu_pod_of_nvidias_plugin_is_left_alone():
    p = pod(("cuda", {"nvidia.com/gpu": 1}))
    assert mutate_pod(p, SETTINGS) == []
    assert mutate_pod(pod(("web", {"cpu": "1"})), SETTINGS) == []


def test_under_hami_names_all_every_nvidia_gpu_is_ours():
    settings = MutationSettings(sharing=SharingConfig(hami_names="all"))
    out = mutated(pod(("cuda", {"nvidia.com/gpu": 2})), settings)
    assert limits(out) == {"volcano.sh/vgpu-number": 2, QUOTA_MEMORY: str(2 * 81920), QUOTA_CORES: "200"}


def test_translation_can_be_turned_off_and_totals_still_count():
    settings = MutationSettings(translate_hami_names=False)
    out = mutated(pod(("infer", {"nvidia.com/gpu": 2, "nvidia.com/gpumem-percentage": 50})), settings)
    assert limits(out) == {"nvidia.com/gpu": 2, "nvidia.com/gpumem-percentage": 50,
                           QUOTA_MEMORY: str(2 * 81920 // 2), QUOTA_CORES: "0"}


def test_totals_written_by_the_author_are_replaced_and_stripped_from_other_containers():
    p = pod(("gpu", {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 8000, QUOTA_MEMORY: "1"}),
            ("log", {"cpu": "100m", QUOTA_MEMORY: "5", QUOTA_CORES: "5"}))
    out = mutated(p)
    assert limits(out)[QUOTA_MEMORY] == "8000"
    assert limits(out, 1) == {"cpu": "100m"}
    assert out["spec"]["containers"][1]["resources"]["requests"] == {"cpu": "100m"}


def test_init_containers_and_percentages_use_the_configured_card_size():
    settings = MutationSettings(sharing=SharingConfig(quota_card_mib=40960))
    out = mutated(pod(("main", {"volcano.sh/vgpu-number": 1}),
                      init=[("warm", {"volcano.sh/vgpu-memory-percentage": 25, "volcano.sh/vgpu-number": 2})]),
                  settings)
    assert (limits(out, 0, "initContainers")[QUOTA_MEMORY], limits(out, 0, "initContainers")[QUOTA_CORES]) == \
        ("20480", "0")
    assert (limits(out)[QUOTA_MEMORY], limits(out)[QUOTA_CORES]) == ("40960", "100")  # whole card, exclusive


def test_only_the_listed_scheduler_names_are_replaced():
    assert mutated(pod(("g", {"volcano.sh/vgpu-number": 1}), scheduler=None))["spec"]["schedulerName"] == \
        "vgpu-scheduler"
    for other in ("volcano", "hami-scheduler"):  # another scheduler's pod is not touched at all
        assert mutate_pod(pod(("g", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100}), scheduler=other), SETTINGS) == []
    ours = mutated(pod(("g", {"volcano.sh/vgpu-number": 1}), scheduler="vgpu-scheduler"))
    assert limits(ours)[QUOTA_CORES] == "100" and ours["spec"]["schedulerName"] == "vgpu-scheduler"
    settings = MutationSettings(replace_scheduler_names=frozenset({"default-scheduler", "volcano"}),
                                scheduler_name="gpu-sched")
    assert mutated(pod(("g", {"volcano.sh/vgpu-number": 1}), scheduler="volcano"), settings)["spec"][
        "schedulerName"] == "gpu-sched"


def test_a_memory_factor_counts_in_mib():
    settings = MutationSettings(sharing=SharingConfig(gpu_memory_factor=4))
    out = mutated(pod(("g", {"volcano.sh/vgpu-number": 2, "volcano.sh/vgpu-memory": 1000})), settings)
    assert limits(out)[QUOTA_MEMORY] == "8000"


@pytest.mark.parametrize("asked, fragment", [
    ({"volcano.sh/vgpu-memory": "lots"}, "not a quantity"),
    ({"nvidia.com/gpumem": 1000, "volcano.sh/vgpu-memory": 1000}, "asked together with volcano.sh/vgpu-memory"),
    ({"volcano.sh/vgpu-cores": 150}, "above 100"),
])
def test_unreadable_requests_raise_naming_the_container(asked, fragment):
    with pytest.raises(RequestError, match=fragment) as info:
        mutate_pod(pod(("bad", asked)), SETTINGS)
    assert info.value.container == "bad"


def test_the_scheduler_refuses_totals_that_do_not_match():
    config = SharingConfig()
    out = mutated(pod(("g", {"volcano.sh/vgpu-number": 2, "volcano.sh/vgpu-memory": 1000})))
    out["spec"]["containers"][0]["resources"]["limits"][QUOTA_MEMORY] = "1000"
    with pytest.raises(RequestError, match="but the container's requests make 2000"):
        check_quota_totals(out, pod_requests(out, config), config)
    bare = pod(("g", {"volcano.sh/vgpu-number": 1}))
    check_quota_totals(bare, pod_requests(bare, config), config)  # absent: allowed unless required
    with pytest.raises(RequestError, match="did not see this pod"):
        check_quota_totals(bare, pod_requests(bare, config), config, required=True)


def test_memory_or_cores_without_a_count_get_the_count_kubelet_allocates():
    out = mutated(pod(("g", {"nvidia.com/gpumem": 2000})))
    assert limits(out) == {"volcano.sh/vgpu-memory": 2000, "volcano.sh/vgpu-number": "1",
                           QUOTA_MEMORY: "2000", QUOTA_CORES: "0"}
    assert out["spec"]["containers"][0]["resources"]["requests"]["volcano.sh/vgpu-number"] == "1"
