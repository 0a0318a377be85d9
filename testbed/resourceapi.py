"""TEST INFRASTRUCTURE: what the API-server stand-in checks on `resource.k8s.io/v1` objects (DRA).

Written from the published API (k8s.io/api `resource/v1` and kube-apiserver's validation of it), for the
structural rules a DRA driver and kube-scheduler depend on, each refused as kube-apiserver does: 422 Invalid naming
the field.

  ResourceSlice          spec.driver and spec.pool (name, generation, resourceSliceCount) are required; exactly one
                         of nodeName, nodeSelector, allNodes, perDeviceNodeSelection; each device has a unique name;
                         each capacity has a value; a requestPolicy has either validValues or validRange
  ResourceClaim          spec.devices.requests[] each have a unique name and exactly one of `exactly`,
                         `firstAvailable` (whose alternatives are named); each names a deviceClassName; the spec
                         cannot change after creation
  ResourceClaimTemplate  spec.spec follows the ResourceClaim rules
  DeviceClass            each selector carries cel.expression
"""

from __future__ import annotations

from typing import Any

__all__ = ["DRA_KINDS", "check_create", "check_update"]

DRA_KINDS = ("DeviceClass", "ResourceClaim", "ResourceClaimTemplate", "ResourceSlice")
_NODE_SELECTION = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")


class Invalid(Exception):
    """A field that kube-apiserver would refuse: `field` (a JSON path) and what is wrong with it."""

    def __init__(self, field: str, what: str) -> None:
        super().__init__(f"{field}: {what}")
        self.field, self.what = field, what


def _object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Invalid(field, "Required value" if value is None else "Invalid value: must be an object")
    return value


def _list(value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise Invalid(field, "Invalid value: must be a list")
    return value


def _name(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise Invalid(field, "Required value")
    return value


def _slice(spec: dict[str, Any]) -> None:
    _name(spec.get("driver"), "spec.driver")
    pool = _object(spec.get("pool"), "spec.pool")
    _name(pool.get("name"), "spec.pool.name")
    for key, minimum in (("generation", 0), ("resourceSliceCount", 1)):
        value = pool.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise Invalid(f"spec.pool.{key}",
                          "Required value" if value is None else f"Invalid value: an integer of at least {minimum}")
    chosen = [k for k in _NODE_SELECTION if spec.get(k) not in (None, False, "")]
    if len(chosen) != 1:
        raise Invalid("spec", f"Invalid value: exactly one of {', '.join(_NODE_SELECTION)} is required"
                              + (f" (got {', '.join(chosen)})" if chosen else ""))
    seen: set[str] = set()
    for i, device in enumerate(_list(spec.get("devices"), "spec.devices")):
        where = f"spec.devices[{i}]"
        name = _name(_object(device, where).get("name"), f"{where}.name")
        if name in seen:
            raise Invalid(f"{where}.name", f"Duplicate value: {name!r}")
        seen.add(name)
        capacity = device.get("capacity") or {}
        for key, entry in _object(capacity, f"{where}.capacity").items():
            entry = _object(entry, f"{where}.capacity[{key}]")
            if entry.get("value") in (None, ""):
                raise Invalid(f"{where}.capacity[{key}].value", "Required value")
            policy = entry.get("requestPolicy")
            if policy is not None:
                kinds = [k for k in ("validValues", "validRange") if _object(policy, "requestPolicy").get(k)]
                if len(kinds) > 1:
                    raise Invalid(f"{where}.capacity[{key}].requestPolicy",
                                  "Invalid value: validValues and validRange are exclusive")


def _claim_spec(spec: dict[str, Any], prefix: str) -> None:
    devices = _object(spec.get("devices") or {}, f"{prefix}.devices")
    seen: set[str] = set()
    for i, request in enumerate(_list(devices.get("requests"), f"{prefix}.devices.requests")):
        where = f"{prefix}.devices.requests[{i}]"
        name = _name(_object(request, where).get("name"), f"{where}.name")
        if name in seen:
            raise Invalid(f"{where}.name", f"Duplicate value: {name!r}")
        seen.add(name)
        forms = [k for k in ("exactly", "firstAvailable") if request.get(k)]
        if len(forms) != 1:
            raise Invalid(where, "Invalid value: exactly one of exactly, firstAvailable is required")
        alternatives = [request["exactly"]] if forms[0] == "exactly" else _list(request["firstAvailable"],
                                                                               f"{where}.firstAvailable")
        for j, alternative in enumerate(alternatives):
            at = f"{where}.exactly" if forms[0] == "exactly" else f"{where}.firstAvailable[{j}]"
            if forms[0] == "firstAvailable":
                _name(_object(alternative, at).get("name"), f"{at}.name")
            _name(_object(alternative, at).get("deviceClassName"), f"{at}.deviceClassName")


def _device_class(spec: dict[str, Any]) -> None:
    for i, selector in enumerate(_list(spec.get("selectors"), "spec.selectors")):
        cel = _object(_object(selector, f"spec.selectors[{i}]").get("cel"), f"spec.selectors[{i}].cel")
        _name(cel.get("expression"), f"spec.selectors[{i}].cel.expression")


def check_create(kind: str, obj: dict[str, Any]) -> None:
    """Raise Invalid when a new object of `kind` breaks the rules above (other kinds pass)."""
    if kind not in DRA_KINDS:
        return
    spec = _object(obj.get("spec"), "spec")
    if kind == "ResourceSlice":
        _slice(spec)
    elif kind == "ResourceClaim":
        _claim_spec(spec, "spec")
    elif kind == "ResourceClaimTemplate":
        _claim_spec(_object(spec.get("spec"), "spec.spec"), "spec.spec")
    else:
        _device_class(spec)


def check_update(kind: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Raise Invalid when an update of `kind` breaks the rules (a claim's spec is immutable)."""
    if kind not in DRA_KINDS:
        return
    if kind == "ResourceClaim" and new.get("spec") != old.get("spec"):
        raise Invalid("spec", "Invalid value: field is immutable")
    check_create(kind, new)
