"""TEST INFRASTRUCTURE: Kubernetes' own arithmetic for the stand-ins, written from upstream, sharing nothing with
the product (an import-linter contract keeps the stand-ins off the product's quantities and request arithmetic).

* `parse_quantity`: a resource quantity as kubernetes/apimachinery `pkg/api/resource/quantity.go` reads it
  (`ParseQuantity`: an optionally signed decimal number, then a binary-SI suffix Ki..Ei, a decimal-SI suffix
  n, u, m, k, M, G, T, P, E, or a decimal exponent e<n> / E<n>), exactly, as a Fraction.
* `pod_requests`: what a pod takes from its node, as kubernetes/component-helpers `resource/helpers.go`
  `PodRequests` computes it for scheduling (commit 1961876, 2026-07-24): containers summed; an init container with
  `restartPolicy: Always` (a sidecar) added to the sum and to the sidecars running; an ordinary init container
  needing its own requests plus the sidecars started before it, the largest of those taken when above the sum;
  pod-level requests (`spec.resources.requests`) replacing CPU, memory and hugepages; the overhead added.
  A container's absent requests take its limits, as the API server's defaulting does (`pkg/apis/core/v1/defaults.go`
  `defaultContainerRequests`; the API stand-in does not default pod-level requests, so a test writes them).
* `resource_amount`: the unit kube-scheduler counts in (`pkg/scheduler/framework/types.go` `Resource`: CPU in
  milli-cores, everything else in its own unit).
* `Quantity` / `format_quantity`: a quantity that keeps its format and prints in apimachinery's canonical form
  (`quantity.go` `CanonicalizeBytes`), for messages that print quantities as kube-apiserver does (the ResourceQuota
  stand-in's); `pod_resource_lists`: a pod's requests and limits in such quantities (component-helpers `PodRequests`,
  `PodLimits`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

__all__ = ["BINARY_SI", "DECIMAL_EXPONENT", "DECIMAL_SI", "Quantity", "QuantityError", "ResourceList",
           "format_quantity", "parse_quantity", "pod_requests", "pod_resource_lists", "resource_amount"]

_QUANTITY = re.compile(r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                       r"(?:(?P<binary>[KMGTPE]i)|(?P<exponent>[eE][+-]?[0-9]+)|(?P<decimal>[numkMGTPE]?))$")
_BINARY = {p: Fraction(1024) ** (i + 1) for i, p in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))}
_DECIMAL = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
            "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
            "P": Fraction(10**15), "E": Fraction(10**18)}
_POD_LEVEL = ("cpu", "memory")  # and hugepages-*: component-helpers `IsSupportedPodLevelResource`


class QuantityError(ValueError):
    """Not a Kubernetes quantity."""


def parse_quantity(value: object) -> Fraction:
    """The exact value of a quantity (a string, or an int as JSON carries small ones); QuantityError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        return Fraction(value)
    match = _QUANTITY.match(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise QuantityError(f"quantities must match the regular expression of apimachinery: {value!r}")
    number = Fraction(match["number"])
    if match["binary"]:
        return number * _BINARY[match["binary"]]
    if match["exponent"]:
        return number * Fraction(10) ** int(match["exponent"][1:])
    return number * _DECIMAL[match["decimal"]]


def resource_amount(name: str, raw: object) -> Fraction:
    """A quantity in kube-scheduler's unit for `name` (CPU in milli-cores); 0 when it does not parse."""
    try:
        value = parse_quantity(raw)
    except QuantityError:
        return Fraction(0)
    return value * 1000 if name == "cpu" else value


def _requests(resources: object) -> dict[str, Fraction]:
    if not isinstance(resources, Mapping):
        return {}
    merged = dict(resources.get("limits") or {})
    merged.update(resources.get("requests") or {})
    return {str(name): resource_amount(str(name), raw) for name, raw in merged.items()}


def _add(into: dict[str, Fraction], more: Mapping[str, Fraction]) -> None:
    for name, value in more.items():
        into[name] = into.get(name, Fraction(0)) + value


def _raise_to(into: dict[str, Fraction], more: Mapping[str, Fraction]) -> None:
    for name, value in more.items():
        if value > into.get(name, Fraction(0)):
            into[name] = value


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Fraction]:
    """What the pod takes from its node per resource, in `resource_amount` units (see the module docstring)."""
    spec = pod.get("spec") or {}
    result: dict[str, Fraction] = {}
    for container in spec.get("containers") or ():
        if isinstance(container, Mapping):
            _add(result, _requests(container.get("resources")))
    running_sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for container in spec.get("initContainers") or ():
        if not isinstance(container, Mapping):
            continue
        own = _requests(container.get("resources"))
        if container.get("restartPolicy") == "Always":
            _add(result, own)
            _add(running_sidecars, own)
            _raise_to(init_peak, running_sidecars)
        else:
            _add(own, running_sidecars)
            _raise_to(init_peak, own)
    _raise_to(result, init_peak)
    pod_level = spec.get("resources")
    if isinstance(pod_level, Mapping) and pod_level.get("requests"):
        for name, value in _requests({"requests": pod_level.get("requests")}).items():
            if name in _POD_LEVEL or name.startswith("hugepages-"):
                result[name] = value
    overhead = spec.get("overhead")
    if isinstance(overhead, Mapping):
        _add(result, {str(n): resource_amount(str(n), raw) for n, raw in overhead.items()})
    return result


# ------------------------------------------------------------------------- quantities that print as apimachinery's

DECIMAL_SI, BINARY_SI, DECIMAL_EXPONENT = "DecimalSI", "BinarySI", "DecimalExponent"
_NANO = Fraction(1, 10**9)
_DECIMAL_SUFFIXES = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


@dataclass(frozen=True, slots=True)
class Quantity:
    """A resource quantity that remembers its format, as apimachinery's `resource.Quantity` does, and prints in its
    canonical form (`String()` / `CanonicalizeBytes` of kubernetes/apimachinery `pkg/api/resource/quantity.go`):

    * the format is the suffix's kind when parsed (`Ki`..`Ei`: BinarySI, `e<n>`: DecimalExponent, else DecimalSI;
      a BinarySI value strictly between 0 and 1 becomes DecimalSI, as `ParseQuantity` does); a value is rounded up
      (away from zero) to a whole nano when parsed;
    * zero prints `0`; DecimalSI and DecimalExponent print the integer mantissa with the largest exponent that is a
      multiple of 3 and loses nothing (`AsCanonicalBytes`: 1.5 -> `1500m`, 2000 -> `2k`, 1e3 -> `1e3`); BinarySI
      prints the largest power of 1024 that divides the value (`AsCanonicalBase1024Bytes`: 1.5Gi -> `1536Mi`), unless
      the value is within (-1024, 1024) or not whole, which print as DecimalSI;
    * `a + b` and `a - b` keep `a`'s format unless `a` is zero, which takes `b`'s (`Quantity.Add` / `Sub`).
    """

    value: Fraction
    format: str = DECIMAL_SI

    @classmethod
    def parse(cls, raw: object) -> Quantity:
        """`resource.ParseQuantity` (an int, as JSON carries small ones, reads as its decimal string)."""
        text = str(raw).strip() if isinstance(raw, int) and not isinstance(raw, bool) else raw
        value = parse_quantity(text)
        match = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
        assert match is not None
        fmt = BINARY_SI if match["binary"] else DECIMAL_EXPONENT if match["exponent"] else DECIMAL_SI
        value = _round_up_to_nano(value)
        if fmt == BINARY_SI and 0 < abs(value) < 1:
            fmt = DECIMAL_SI
        return cls(value, fmt)

    def __add__(self, other: Quantity) -> Quantity:
        return Quantity(self.value + other.value, other.format if self.value == 0 else self.format)

    def __sub__(self, other: Quantity) -> Quantity:
        return Quantity(self.value - other.value, other.format if self.value == 0 else self.format)

    def __str__(self) -> str:
        return format_quantity(self.value, self.format)


def _round_up_to_nano(value: Fraction) -> Fraction:
    scaled = value / _NANO
    if scaled.denominator == 1:
        return value
    whole = -((-abs(scaled.numerator)) // scaled.denominator)  # ceil of |scaled|
    return Fraction(whole if value > 0 else -whole) * _NANO


def format_quantity(value: Fraction, fmt: str = DECIMAL_SI) -> str:
    """The canonical text of `value` in format `fmt` (see `Quantity`)."""
    value = _round_up_to_nano(Fraction(value))
    if value == 0:
        return "0"
    if fmt == BINARY_SI and (-1024 < value < 1024 or value.denominator != 1):
        fmt = DECIMAL_SI
    if fmt == BINARY_SI:
        mantissa, power = int(value), 0
        while power < len(_BINARY_SUFFIXES) - 1 and mantissa % 1024 == 0:
            mantissa //= 1024
            power += 1
        return f"{mantissa}{_BINARY_SUFFIXES[power]}"
    mantissa, exponent = int(value / _NANO), -9
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    while exponent % 3:
        mantissa *= 10
        exponent -= 1
    if fmt == DECIMAL_SI and exponent in _DECIMAL_SUFFIXES:
        return f"{mantissa}{_DECIMAL_SUFFIXES[exponent]}"
    return f"{mantissa}e{exponent}" if exponent else str(mantissa)


ResourceList = dict[str, Quantity]


def _quantities(resources: object, kind: str) -> ResourceList:
    """A container's `resources.requests` or `resources.limits` as quantities (unreadable values left out)."""
    if not isinstance(resources, Mapping) or not isinstance(resources.get(kind), Mapping):
        return {}
    out: ResourceList = {}
    for name, raw in resources[kind].items():
        try:
            out[str(name)] = Quantity.parse(raw)
        except QuantityError:
            continue
    return out


def _add_list(into: ResourceList, more: Mapping[str, Quantity]) -> None:
    for name, quantity in more.items():
        into[name] = into[name] + quantity if name in into else quantity


def _max_list(into: ResourceList, more: Mapping[str, Quantity]) -> None:
    for name, quantity in more.items():
        if name not in into or quantity.value > into[name].value:
            into[name] = quantity


def _pod_level(name: str) -> bool:
    return name in _POD_LEVEL or name.startswith("hugepages-")


def pod_resource_lists(pod: Mapping[str, Any]) -> tuple[ResourceList, ResourceList]:
    """The pod's requests and limits as component-helpers `resource/helpers.go` `PodRequests` and `PodLimits`
    compute them from the spec (the algorithm of `pod_requests`, over each container's own requests or limits, in
    quantities that keep their format): containers summed, sidecars added, the largest init-container need taken,
    pod-level values for CPU, memory and hugepages; the overhead added to every request and to the limits that are
    set and non-zero. Requests are read as stored, after the API server's defaulting (no limit is copied here)."""
    spec = pod.get("spec") or {}
    pod_level = spec.get("resources") if isinstance(spec.get("resources"), Mapping) else {}
    overhead = _quantities({"overhead": spec.get("overhead")}, "overhead")
    out: list[ResourceList] = []
    for kind in ("requests", "limits"):
        total: ResourceList = {}
        for container in spec.get("containers") or ():
            if isinstance(container, Mapping):
                _add_list(total, _quantities(container.get("resources"), kind))
        sidecars: ResourceList = {}
        init_peak: ResourceList = {}
        for container in spec.get("initContainers") or ():
            if not isinstance(container, Mapping):
                continue
            own = _quantities(container.get("resources"), kind)
            if container.get("restartPolicy") == "Always":
                _add_list(total, own)
                _add_list(sidecars, own)
                need = sidecars
            else:
                need = dict(own)
                _add_list(need, sidecars)
            _max_list(init_peak, need)
        _max_list(total, init_peak)
        level = _quantities(pod_level, kind)
        if kind == "requests":
            if any(_pod_level(n) for n in level):
                total.update({n: q for n, q in level.items() if _pod_level(n)})
            _add_list(total, overhead)
        else:
            if any(_pod_level(n) for n in {**_quantities(pod_level, "requests"), **level}):
                total.update({n: q for n, q in level.items() if _pod_level(n)})
            for name, quantity in overhead.items():
                if name in total and total[name].value != 0:
                    total[name] = total[name] + quantity
        out.append(total)
    return out[0], out[1]
