"""The scheduler stand-in's structured-parameters allocator on its own (no API server): quantities as
apimachinery prints them, requestPolicy limits, backtracking across requests, distinctAttribute, pools by
generation and completeness, node selection, the errors that abort a cycle, and the per-release difference in how
one request with `count` > 1 uses shared (allowMultipleAllocations) devices."""

from __future__ import annotations

import pytest

from vgpu.testbed.dra_allocator import (
    DEFAULT_KUBERNETES_VERSION,
    SUPPORTED_KUBERNETES_VERSIONS,
    AllocatedState,
    AllocationError,
    Allocator,
    KubernetesVersion,
    SelectorCache,
    node_selector_matches,
    parse_kubernetes_version,
    parse_quantity,
)

DRIVER = "gpu.test.example"
NODE = {"metadata": {"name": "n1", "labels": {"zone": "a", "rack": "7"}}}
CLASS = {"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}
SELECTORS = SelectorCache()


def _slice(devices: list[dict], name: str = "s", pool: str = "n1", generation: int = 1, count: int = 1,
           **placement: object) -> dict:
    spec = {"driver": DRIVER, "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            "devices": devices, **(placement or {"nodeName": "n1"})}
    return {"metadata": {"name": name}, "spec": spec}


def _dev(name: str, shared: bool = False, **attrs: object) -> dict:
    body: dict = {"name": name, "attributes": {k: {"string" if isinstance(v, str) else "int": v}
                                               for k, v in attrs.items()},
                  "capacity": {"memory": {"value": "10Gi"}}}
    if shared:
        body["allowMultipleAllocations"] = True
    return body


def _claim(*requests: dict, constraints: list | None = None) -> dict:
    devices: dict = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    return {"metadata": {"name": "c", "namespace": "default", "uid": "u"}, "spec": {"devices": devices}}


def _req(name: str = "gpu", **fields: object) -> dict:
    return {"name": name, "exactly": {"deviceClassName": "gpu", **fields}}


def _allocate(claims: list[dict], slices: list[dict], state: AllocatedState | None = None,
              classes: dict | None = None,
              version: KubernetesVersion = DEFAULT_KUBERNETES_VERSION) -> list[dict] | None:
    return Allocator(claims, state or AllocatedState(), classes or {"gpu": CLASS}, slices, SELECTORS,
                     version).allocate(NODE)


def _devices(found: list[dict] | None, claim: int = 0) -> list[str]:
    assert found is not None
    return [r["device"] for r in found[claim]["devices"]["results"]]


V1_34, V1_35, V1_36 = (1, 34), (1, 35), (1, 36)
ALL_VERSIONS = pytest.mark.parametrize("version", SUPPORTED_KUBERNETES_VERSIONS,
                                       ids=lambda v: f"{v[0]}.{v[1]}")


@pytest.mark.parametrize("text,canonical", [
    ("40960Mi", "40Gi"), ("1.5Gi", "1536Mi"), ("1536", "1536"), ("1000", "1k"), ("0.5", "500m"), ("1e3", "1k"),
    ("0", "0"), ("100", "100"), ("2048Ki", "2Mi"),
])
def test_quantities_print_in_canonical_form(text: str, canonical: str) -> None:
    assert str(parse_quantity(text)) == canonical


@pytest.mark.parametrize("text", ["", "ten", "1Zi", "1.2.3", None, True])
def test_a_malformed_quantity_is_refused(text: object) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(text)


def test_two_requests_backtrack_until_both_fit() -> None:
    # "big" wants memory >= 20Gi (only gpu-0 has it); "any" would take gpu-0 first, so the search must move it
    devices = [_dev("gpu-0"), _dev("gpu-1")]
    devices[0]["capacity"]["memory"]["value"] = "40Gi"
    big = _req("big", selectors=[{"cel": {"expression":
                                          f'device.capacity["{DRIVER}"].memory.isGreaterThan(quantity("20Gi"))'}}])
    found = _allocate([_claim(_req("any"), big)], [_slice(devices)])
    assert found is not None
    assert [(r["request"], r["device"]) for r in found[0]["devices"]["results"]] == [("any", "gpu-1"),
                                                                                      ("big", "gpu-0")]


# One ExactCount request, count 2, on devices with allowMultipleAllocations (DRAConsumableCapacity on). Upstream,
# k8s.io/dynamic-resource-allocation (`structured/allocator.go` NewAllocator picks the most stable implementation
# that supports the enabled features; ConsumableCapacity is in `internal/experimental` only up to v0.35.x and in
# `internal/incubating` since v0.36.0):
#   * v0.34.0 / v0.35.0 (kubernetes-1.34.0 / -1.35.0, up to v0.34.9 / v0.35.6),
#     structured/internal/experimental/allocator_experimental.go: `allocateOne` scans every pool, slice and device
#     for each pick; `allocateDevice` adds a device to `allocatingDevices` only when it does not allow multiple
#     allocations, so `deviceInUse` stays false for a shared device and the next pick of the same request may take
#     it again (its capacity counted once per pick through `allocatingCapacity`);
#   * v0.36.0 (kubernetes-1.36.0, commit c44687d; also v0.36.2 and v0.37.0-alpha.2),
#     structured/internal/incubating/allocator_incubating.go and .../experimental/allocator_experimental.go:
#     `allocateOne(r, allocateSubRequest, startLocation deviceLocation)` starts the next pick of the same request
#     after the previous pick's (pool, slice, device) position and resets it for the next request or claim, so one
#     request gets distinct devices. Introduced by commit 4de3db9 "DRA: Avoid unnecessary work in allocator"
#     (kubernetes/kubernetes#133678, Kubernetes-commit 9562aa8), first tagged in v0.36.0-alpha.1.

@pytest.mark.parametrize("version,expected", [
    (V1_34, ["gpu-0", "gpu-0"]),
    (V1_35, ["gpu-0", "gpu-0"]),
    (V1_36, ["gpu-0", "gpu-1"]),
], ids=["1.34", "1.35", "1.36"])
def test_count_two_on_shared_devices_per_release(version: KubernetesVersion, expected: list[str]) -> None:
    """1.34/1.35 (internal/experimental `allocateDevice`: shared devices never enter `allocatingDevices`) give both
    picks of the request to gpu-0, each with its own shareID and consumed capacity; 1.36 (internal/incubating
    `allocateOne` with `startLocation`, v0.36.0) moves the second pick on to gpu-1."""
    devices = [_dev("gpu-0", shared=True, index=0), _dev("gpu-1", shared=True, index=1)]
    found = _allocate([_claim(_req(count=2, capacity={"requests": {"memory": "1Gi"}}))], [_slice(devices)],
                      version=version)
    assert _devices(found) == expected
    assert found is not None
    results = found[0]["devices"]["results"]
    assert len({r["shareID"] for r in results}) == 2
    assert [r["consumedCapacity"] for r in results] == [{"memory": "1Gi"}, {"memory": "1Gi"}]


@pytest.mark.parametrize("version,fits", [(V1_34, True), (V1_35, True), (V1_36, False)], ids=["1.34", "1.35", "1.36"])
def test_count_two_on_one_shared_device_per_release(version: KubernetesVersion, fits: bool) -> None:
    """With a single shared device, count 2 fits on 1.34/1.35 (the same device twice, internal/experimental
    v0.35.0) and does not on 1.36 (one request, distinct devices: `startLocation`, internal/incubating v0.36.0).
    This fails whichever way the stand-in collapses to one behaviour."""
    found = _allocate([_claim(_req(count=2, capacity={"requests": {"memory": "1Gi"}}))],
                      [_slice([_dev("gpu-0", shared=True)])], version=version)
    assert (found is not None) is fits
    if fits:
        assert _devices(found) == ["gpu-0", "gpu-0"]


@ALL_VERSIONS
def test_the_same_shared_device_twice_consumes_its_capacity_twice(version: KubernetesVersion) -> None:
    """Where a request may repeat a device (1.34/1.35), both picks draw on its capacity (`allocatingCapacity` in
    internal/experimental `allocateDevice`): 2 x 6Gi does not fit a 10Gi device, so gpu-1 serves the second pick;
    1.36 takes gpu-1 anyway."""
    devices = [_dev("gpu-0", shared=True), _dev("gpu-1", shared=True)]
    found = _allocate([_claim(_req(count=2, capacity={"requests": {"memory": "6Gi"}}))], [_slice(devices)],
                      version=version)
    assert _devices(found) == ["gpu-0", "gpu-1"]


@ALL_VERSIONS
def test_distinct_attribute_keeps_shared_devices_apart(version: KubernetesVersion) -> None:
    """A distinctAttribute constraint separates the picks on every release."""
    devices = [_dev("gpu-0", shared=True, index=0), _dev("gpu-1", shared=True, index=1)]
    request = _req(count=2, capacity={"requests": {"memory": "1Gi"}})
    found = _allocate([_claim(request, constraints=[{"distinctAttribute": f"{DRIVER}/index"}])], [_slice(devices)],
                      version=version)
    assert _devices(found) == ["gpu-0", "gpu-1"]


@ALL_VERSIONS
def test_two_requests_and_two_claims_may_share_one_device(version: KubernetesVersion) -> None:
    """Only the picks of one request are kept apart on 1.36: the next request and the next claim start again at
    the first device (v0.36.0 internal/incubating `allocateOne` passes an empty deviceLocation to them), as in
    upstream's allocatortesting case `consumable-capacity-with-multi-allocatable-device-backtrack` (v0.36.0
    structured/internal/allocatortesting/allocator_testing.go: req-0 and req-1 of one claim on device-1)."""
    share = {"capacity": {"requests": {"memory": "1Gi"}}}
    claims = [_claim(_req("a", **share), _req("b", **share)), _claim(_req(**share))]
    found = _allocate(claims, [_slice([_dev("gpu-0", shared=True)])], version=version)
    assert _devices(found, 0) == ["gpu-0", "gpu-0"]
    assert _devices(found, 1) == ["gpu-0"]


@ALL_VERSIONS
def test_first_available_falls_back_when_a_request_cannot_repeat_a_device(version: KubernetesVersion) -> None:
    """firstAvailable: "two" (count 2) fits one shared device only where a request may repeat it (1.34/1.35);
    1.36 falls back to "one"."""
    share = {"deviceClassName": "gpu", "capacity": {"requests": {"memory": "1Gi"}}}
    request = {"name": "gpu", "firstAvailable": [{"name": "two", "count": 2, **share}, {"name": "one", **share}]}
    found = _allocate([_claim(request)], [_slice([_dev("gpu-0", shared=True)])], version=version)
    assert found is not None
    chosen = [r["request"] for r in found[0]["devices"]["results"]]
    assert chosen == (["gpu/one"] if version >= V1_36 else ["gpu/two", "gpu/two"])


@ALL_VERSIONS
def test_exclusive_devices_answer_alike_on_every_release(version: KubernetesVersion) -> None:
    """For devices taken whole the 1.36 change only prunes repeated orderings (kubernetes/kubernetes#133678:
    combinations instead of permutations): the same devices, in the same order, come out after backtracking."""
    devices = [_dev("gpu-0", model="A100"), _dev("gpu-1", model="H100"), _dev("gpu-2", model="H100")]
    claim = _claim(_req(count=2), constraints=[{"matchAttribute": f"{DRIVER}/model"}])
    assert _devices(_allocate([claim], [_slice(devices)], version=version)) == ["gpu-1", "gpu-2"]


def test_the_default_is_the_newest_release() -> None:
    assert DEFAULT_KUBERNETES_VERSION == V1_36 == SUPPORTED_KUBERNETES_VERSIONS[-1]
    found = Allocator([_claim(_req(count=2, capacity={"requests": {"memory": "1Gi"}}))], AllocatedState(),
                      {"gpu": CLASS}, [_slice([_dev("gpu-0", shared=True)])], SELECTORS).allocate(NODE)
    assert found is None


@pytest.mark.parametrize("text,version", [("1.35", V1_35), ("v1.34", V1_34), ("1.36.2", V1_36), ((1, 35), V1_35)])
def test_kubernetes_versions_parse(text: str | KubernetesVersion, version: KubernetesVersion) -> None:
    assert parse_kubernetes_version(text) == version


@pytest.mark.parametrize("text", ["1.33", "1.37", "2.0", "136", "latest", (1, 33)])
def test_unmodelled_kubernetes_versions_are_refused(text: str | KubernetesVersion) -> None:
    with pytest.raises(ValueError, match="Kubernetes version"):
        parse_kubernetes_version(text)


def test_the_allocator_refuses_an_unmodelled_version() -> None:
    with pytest.raises(ValueError, match=r"models 1\.34, 1\.35, 1\.36"):
        Allocator([], AllocatedState(), {}, [], SELECTORS, (1, 33))


def test_request_policy_max_and_existing_consumption_bound_a_shared_device() -> None:
    device = _dev("gpu-0", shared=True)
    device["capacity"]["memory"]["requestPolicy"] = {"validRange": {"min": "1Gi", "max": "4Gi", "step": "1Gi"}}
    too_big = _claim(_req(capacity={"requests": {"memory": "5Gi"}}))
    assert _allocate([too_big], [_slice([device])]) is None
    used = AllocatedState.of([{"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0", "shareID": "x",
         "consumedCapacity": {"memory": "7Gi"}}]}}}}])
    fits = _claim(_req(capacity={"requests": {"memory": "2500Mi"}}))  # 3Gi after rounding: 7 + 3 = 10
    found = _allocate([fits], [_slice([device])], used)
    assert found is not None and found[0]["devices"]["results"][0]["consumedCapacity"] == {"memory": "3Gi"}
    assert _allocate([_claim(_req(capacity={"requests": {"memory": "3100Mi"}}))], [_slice([device])], used) is None


def test_an_exclusively_allocated_device_is_skipped() -> None:
    used = AllocatedState.of([{"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}]}}}}])
    found = _allocate([_claim(_req())], [_slice([_dev("gpu-0"), _dev("gpu-1")])], used)
    assert found is not None and found[0]["devices"]["results"][0]["device"] == "gpu-1"


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    old = _slice([_dev("gpu-0")], name="old", generation=1)
    new = _slice([_dev("gpu-9")], name="new", generation=2)
    found = _allocate([_claim(_req())], [old, new])
    assert found is not None and found[0]["devices"]["results"][0]["device"] == "gpu-9"


def test_all_mode_refuses_an_incomplete_pool() -> None:
    with pytest.raises(AllocationError, match="currently being updated"):
        _allocate([_claim(_req(allocationMode="All"))], [_slice([_dev("gpu-0")], count=2)])
    assert _allocate([_claim(_req())], [_slice([_dev("gpu-0")], count=2)]) is not None  # ExactCount may use it


def test_a_pool_with_a_device_twice_is_an_error_once_reached() -> None:
    slices = [_slice([_dev("gpu-0")], name="a", count=2), _slice([_dev("gpu-0")], name="b", count=2)]
    with pytest.raises(AllocationError, match="invalid"):
        _allocate([_claim(_req())], slices)


def test_node_selector_slices_and_the_allocation_selector() -> None:
    selector = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}
    found = _allocate([_claim(_req())], [_slice([_dev("gpu-0")], nodeSelector=selector)])
    assert found is not None and found[0]["nodeSelector"] == selector
    other = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}
    assert _allocate([_claim(_req())], [_slice([_dev("gpu-0")], nodeSelector=other)]) is None


@pytest.mark.parametrize("selector,matches", [
    ({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}, True),
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "Gt", "values": ["5"]}]}]}, True),
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}, False),
    ({"nodeSelectorTerms": [{}]}, False),
])
def test_node_selector_operators(selector: dict, matches: bool) -> None:
    assert node_selector_matches(selector, NODE) is matches


@pytest.mark.parametrize("expression,error", [
    ("device.attributes[", "CEL compile error"),
    (f'device.attributes["{DRIVER}"].missing == "x"', "CEL runtime error"),
    ("1 + 1", "CEL runtime error: expression must evaluate to bool"),
])
def test_broken_selectors_abort_with_the_class_named(expression: str, error: str) -> None:
    broken = {"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": expression}}]}}
    with pytest.raises(AllocationError, match=f"class gpu: selector #0: {error}"):
        _allocate([_claim(_req())], [_slice([_dev("gpu-0")])], classes={"gpu": broken})


def test_an_unknown_domain_is_an_empty_map_not_an_error() -> None:
    klass = {"metadata": {"name": "gpu"}, "spec": {"selectors": [
        {"cel": {"expression": '"model" in device.attributes["other.example"]'}}]}}
    assert _allocate([_claim(_req())], [_slice([_dev("gpu-0", model="x")])], classes={"gpu": klass}) is None
