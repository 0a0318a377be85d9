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
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

__all__ = ["QuantityError", "parse_quantity", "pod_requests", "resource_amount"]

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
