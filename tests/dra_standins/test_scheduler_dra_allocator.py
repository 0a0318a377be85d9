"""The scheduler stand-in's structured-parameters allocator on its own (no API server): quantities as
apimachinery prints them, requestPolicy limits, backtracking across requests, distinctAttribute, pools by
generation and completeness, node selection, and the errors that abort a cycle."""

from __future__ import annotations

import pytest

from vgpu.testbed.dra_allocator import (
    AllocatedState,
    AllocationError,
    Allocator,
    SelectorCache,
    node_selector_matches,
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
              classes: dict | None = None) -> list[dict] | None:
    return Allocator(claims, state or AllocatedState(), classes or {"gpu": CLASS}, slices, SELECTORS).allocate(NODE)


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


def test_distinct_attribute_keeps_shared_devices_apart() -> None:
    devices = [_dev("gpu-0", shared=True, index=0), _dev("gpu-1", shared=True, index=1)]
    request = _req(count=2, capacity={"requests": {"memory": "1Gi"}})
    plain = _allocate([_claim(request)], [_slice(devices)])
    assert plain is not None  # a shared device may serve both picks of one request
    assert [r["device"] for r in plain[0]["devices"]["results"]] == ["gpu-0", "gpu-0"]
    distinct = _allocate([_claim(request, constraints=[{"distinctAttribute": f"{DRIVER}/index"}])],
                         [_slice(devices)])
    assert distinct is not None
    assert [r["device"] for r in distinct[0]["devices"]["results"]] == ["gpu-0", "gpu-1"]


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
