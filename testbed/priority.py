"""TEST INFRASTRUCTURE: PriorityClasses and the Priority admission plugin for the API-server stand-in
(testbed/apiserver.py). It imports nothing of the product. Written from kubernetes/kubernetes:

  * `pkg/apis/scheduling/types.go` (HighestUserDefinablePriority 1e9, SystemCriticalPriority 2e9, the `system-`
    prefix) and `pkg/apis/scheduling/v1/helpers.go` (`SystemPriorityClasses`: system-node-critical 2000001000,
    system-cluster-critical 2000000000, their descriptions; `IsKnownSystemPriorityClass`);
  * `pkg/registry/scheduling/rest/storage_scheduling.go` (`AddSystemPriorityClasses`: the system classes are
    created through the API when the server starts, unless they exist);
  * `pkg/apis/scheduling/v1/defaults.go` (`SetDefaults_PriorityClass`: preemptionPolicy PreemptLowerPriority);
  * `pkg/registry/scheduling/priorityclass/strategy.go` (generation 1 on create, validation) and
    `pkg/apis/scheduling/validation/validation.go` (`ValidatePriorityClass`: the name a DNS subdomain; a `system-`
    name must be a system class with its value and globalDefault; any other value at most 1e9; preemptionPolicy
    PreemptLowerPriority or Never. `ValidatePriorityClassUpdate`: value and preemptionPolicy immutable), with
    `pkg/apis/core/validation/validation.go` `ValidatePreemptionPolicy`;
  * `pkg/registry/scheduling/priorityclass/storage/storage.go` (`Delete`: a system class cannot be deleted);
  * `plugin/pkg/admission/priority/admission.go`: `Admit` of a pod CREATE resolves spec.priorityClassName (none:
    the global default class with the lowest value, else priority 0 and PreemptLowerPriority) into spec.priority
    and spec.preemptionPolicy, refusing an unknown class and a priority or policy that the pod sets otherwise; of
    a pod UPDATE keeps the stored priority and policy when the new object leaves them out. `Validate` of a
    PriorityClass CREATE or UPDATE refuses a second globalDefault. Both skip subresources. The plugin runs before
    the mutating webhooks and ValidatingAdmissionPolicy (pkg/kubeapiserver/options/plugins.go AllOrderedPlugins);
  * `pkg/printers/internalversion/printers.go` `printPriorityClass`: kubectl's NAME, VALUE, GLOBAL-DEFAULT, AGE,
    PREEMPTIONPOLICY.

Not done: the Workload half of the plugin (WorkloadAwarePreemption), the DNS-subdomain check of generateName, the
other ObjectMeta checks, and the decoder's exact words for a field of the wrong JSON type (400 BadRequest here too).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from vgpu.testbed.admission import Denied
from vgpu.testbed.discovery import short_age

__all__ = ["admit_pod", "as_table", "check", "check_delete", "default", "keep_pod_priority",
           "system_classes", "validate_class"]

Obj = dict[str, Any]

GROUP = "scheduling.k8s.io"
PLURAL = "priorityclasses"
HIGHEST_USER_DEFINABLE = 1_000_000_000
SYSTEM_CRITICAL = 2 * HIGHEST_USER_DEFINABLE
SYSTEM_PREFIX = "system-"
PREEMPT_LOWER = "PreemptLowerPriority"
_POLICIES = (PREEMPT_LOWER, "Never")
_SYSTEM = {
    "system-node-critical": (SYSTEM_CRITICAL + 1000,
                             "Used for system critical pods that must not be moved from their current node."),
    "system-cluster-critical": (SYSTEM_CRITICAL, "Used for system critical pods that must run in the cluster, but "
                                                 "can be moved to another node if necessary."),
}
_INT32 = (-(2**31), 2**31 - 1)
_DNS_SUBDOMAIN = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"


def system_classes() -> list[Obj]:
    """The classes the bootstrap hook creates, as it sends them."""
    return [{"apiVersion": f"{GROUP}/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value,
             "description": description} for name, (value, description) in _SYSTEM.items()]


def default(pc: Obj) -> None:
    """SetDefaults_PriorityClass."""
    if pc.get("preemptionPolicy") is None:
        pc["preemptionPolicy"] = PREEMPT_LOWER


def _status(code: int, reason: str, message: str, details: Obj) -> Denied:
    return Denied(code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                         "message": message, "reason": reason, "details": details, "code": code})


def _forbidden(group: str, resource: str, name: str, why: str) -> Denied:
    """apierrors.NewForbidden (admission.NewForbidden names the object, or its generateName)."""
    qualified = f"{resource}.{group}" if group else resource
    return _status(403, "Forbidden", f'{qualified} "{name}" is forbidden: {why}',
                   {"name": name, "group": group, "kind": resource})


def _json_type(value: Any, into_int: bool) -> str:
    """How Go's JSON decoder names a value it cannot put in a field (the literal only for an integer field)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return f"number {value}" if into_int else "number"
    return "string" if isinstance(value, str) else "array" if isinstance(value, list) else "object"


def _decode(pc: Obj) -> None:
    """What the JSON decoder refuses of a PriorityClass: a field of another type, a value beyond int32 (400)."""
    fields = (("value", int, "int32"), ("globalDefault", bool, "bool"), ("description", str, "string"),
              ("preemptionPolicy", str, "v1.PreemptionPolicy"))
    for field, kind, go_type in fields:
        value = pc.get(field)
        if value is None:
            continue
        fits = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if fits and (kind is not int or _INT32[0] <= value <= _INT32[1]):
            continue
        raise _status(400, "BadRequest", 'PriorityClass in version "v1" cannot be handled as a PriorityClass: json: '
                                         f"cannot unmarshal {_json_type(value, kind is int)} into Go struct field "
                                         f"PriorityClass.{field} of type {go_type}", {})


def _invalid(name: str, errors: list[tuple[str, str, str]]) -> Denied:
    """apierrors.NewInvalid: 422 naming each field error (field, reason, body)."""
    texts = [f"{f}: {body}" for f, _, body in errors]
    shown = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    causes = [{"reason": reason, "message": body, "field": f} for f, reason, body in errors]
    return _status(422, "Invalid", f'PriorityClass.{GROUP} "{name}" is invalid: {shown}',
                   {"name": name, "group": GROUP, "kind": "PriorityClass", "causes": causes})


def _validate(pc: Obj, name: str) -> list[tuple[str, str, str]]:
    """ValidatePriorityClass."""
    errors = []
    if len(name) > 253:
        errors.append(("metadata.name", "FieldValueInvalid",
                       f'Invalid value: "{name}": must be no more than 253 characters'))
    elif not re.fullmatch(_DNS_SUBDOMAIN, name):
        errors.append(("metadata.name", "FieldValueInvalid",
                       f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case '
                       "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character "
                       f"(e.g. 'example.com', regex used for validation is '{_DNS_SUBDOMAIN}')"))
    value, global_default = pc.get("value") or 0, bool(pc.get("globalDefault"))
    if name.startswith(SYSTEM_PREFIX):
        known = _SYSTEM.get(name)
        if known is None:
            why = f"{name} is not a known system priority class"
        elif value != known[0]:
            why = f"value of {name} PriorityClass must be {known[0]}"
        elif global_default:
            why = f"globalDefault of {name} PriorityClass must be false"
        else:
            why = ""
        if why:
            errors.append(("metadata.name", "FieldValueForbidden",
                           f"Forbidden: priority class names with '{SYSTEM_PREFIX}' prefix are reserved for system "
                           f"use only. error: {why}"))
    elif value > HIGHEST_USER_DEFINABLE:
        errors.append(("value", "FieldValueForbidden",
                       f"Forbidden: maximum allowed value of a user defined priority is {HIGHEST_USER_DEFINABLE}"))
    policy = pc.get("preemptionPolicy")
    if policy == "":
        errors.append(("preemptionPolicy", "FieldValueRequired", "Required value"))
    elif policy is not None and policy not in _POLICIES:
        supported = ", ".join(f'"{p}"' for p in _POLICIES)
        errors.append(("preemptionPolicy", "FieldValueNotSupported",
                       f'Unsupported value: "{policy}": supported values: {supported}'))
    return errors


def _validate_update(new: Obj, old: Obj) -> list[tuple[str, str, str]]:
    """ValidatePriorityClassUpdate."""
    errors = []
    if (new.get("value") or 0) != (old.get("value") or 0):
        errors.append(("value", "FieldValueForbidden", "Forbidden: may not be changed in an update."))
    if new.get("preemptionPolicy") != old.get("preemptionPolicy"):
        shown = "null" if new.get("preemptionPolicy") is None else f'"{new["preemptionPolicy"]}"'
        errors.append(("preemptionPolicy", "FieldValueInvalid", f"Invalid value: {shown}: field is immutable"))
    return errors


def check(pc: Obj, old: Obj | None = None) -> None:
    """The registry's decoding, defaulting and validation of a PriorityClass created (or updated from `old`):
    Denied with kube-apiserver's 400 or 422."""
    _decode(pc)
    default(pc)
    name = str((pc.get("metadata") or {}).get("name") or "")
    errors = _validate(pc, name) if old is None else _validate_update(pc, old)
    if errors:
        raise _invalid(name, errors)


def check_delete(name: str) -> None:
    """storage.go Delete: the system classes stay."""
    if name in _SYSTEM:
        raise _forbidden(GROUP, PLURAL, name, "this is a system priority class and cannot be deleted")


def _global_default(classes: Iterable[Obj]) -> Obj | None:
    """getDefaultPriorityClass: of the globalDefault classes, the one with the lowest value."""
    defaults = [pc for pc in classes if pc.get("globalDefault")]
    return min(defaults, key=lambda pc: pc.get("value") or 0) if defaults else None


def admit_pod(pod: Obj, classes: Iterable[Obj]) -> None:
    """admitPod of a CREATE: spec.priority, spec.preemptionPolicy (and the default class's name) set in `pod`."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return  # not a pod the decoder would accept: validation refuses it
    meta = pod.get("metadata") or {}
    pod_name = meta.get("name") or meta.get("generateName") or "Unknown"
    name = spec.get("priorityClassName") or ""
    if name:
        pc = next((c for c in classes if c["metadata"]["name"] == name), None)
        if pc is None:
            raise _forbidden("", "pods", pod_name, f"no PriorityClass with name {name} was found")
    else:
        pc = _global_default(classes)
        if pc is not None:
            spec["priorityClassName"] = pc["metadata"]["name"]
        else:
            spec.pop("priorityClassName", None)
    value = (pc.get("value") or 0) if pc is not None else 0
    policy = pc.get("preemptionPolicy") if pc is not None else PREEMPT_LOWER
    if spec.get("priority") is not None and spec["priority"] != value:
        raise _forbidden("", "pods", pod_name, f"the integer value of priority ({spec['priority']}) must not be "
                                               f"provided in pod spec; priority admission controller computed "
                                               f"{value} from the given PriorityClass name")
    spec["priority"] = value
    if policy is not None:
        if spec.get("preemptionPolicy") is not None and spec["preemptionPolicy"] != policy:
            raise _forbidden("", "pods", pod_name, "the string value of PreemptionPolicy "
                                                   f"({spec['preemptionPolicy']}) must not be provided in pod spec; "
                                                   f"priority admission controller computed {policy} from the given "
                                                   "PriorityClass name")
        spec["preemptionPolicy"] = policy


def keep_pod_priority(new: Obj, old: Obj) -> None:
    """admitPod of an UPDATE: the stored priority and preemptionPolicy kept when `new` leaves them out."""
    spec, old_spec = new.get("spec"), old.get("spec") or {}
    if not isinstance(spec, dict):
        return
    for field in ("priority", "preemptionPolicy"):
        if spec.get(field) is None and old_spec.get(field) is not None:
            spec[field] = old_spec[field]


def validate_class(operation: str, pc: Obj, classes: Iterable[Obj]) -> None:
    """validatePriorityClass: one globalDefault class at most."""
    if not pc.get("globalDefault"):
        return
    current = _global_default(classes)
    name = (pc.get("metadata") or {}).get("name") or ""
    if current is not None and (operation == "CREATE" or current["metadata"]["name"] != name):
        raise _forbidden(GROUP, PLURAL, name, f"PriorityClass {current['metadata']['name']} is already marked as "
                                              "default. Only one default can exist")


def as_table(items: Iterable[Obj], resource_version: str, include: str = "Metadata",
             now: datetime | None = None) -> Obj:
    """The meta.k8s.io/v1 Table kubectl prints (printPriorityClass); `include` is the request's includeObject."""
    columns = [{"name": n, "type": t, "format": "name" if n == "Name" else "", "description": n, "priority": 0}
               for n, t in (("Name", "string"), ("Value", "integer"), ("Global-Default", "boolean"),
                            ("Age", "string"), ("PreemptionPolicy", "string"))]
    when = now or datetime.now(UTC)
    rows = []
    for pc in items:
        meta = pc.get("metadata") or {}
        row: Obj = {"cells": [meta.get("name", ""), int(pc.get("value") or 0), bool(pc.get("globalDefault")),
                              short_age(meta.get("creationTimestamp"), when), pc.get("preemptionPolicy") or ""]}
        if include == "Object":
            row["object"] = pc
        elif include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": columns, "rows": rows}
