"""TEST INFRASTRUCTURE: the Container Device Interface as a container runtime applies it (spec registry + edits).

Written from the published CDI specification (container-orchestrated-devices/container-device-interface), not from
any code of ours that writes specs. `CDIRegistry(dirs)` reads every `*.json` / `*.yaml` spec in its directories
(in the order given, a later directory has the higher priority: `/etc/cdi` then `/var/run/cdi` by default) and
resolves fully qualified device IDs `vendor/class=name`:

* a spec is checked as the runtime does: a `cdiVersion` its CDI library knows (`known_versions`: all of today's,
  or `CDI_0_5_VERSIONS` for a runtime built with CDI v0.5.x, which knows none past 0.5.0: `pkg/cdi/version.go` at
  tag v0.5.4) and at least the version the spec's content requires (`specs-go/version.go` `requiredVersion`: 0.4.0
  for a mount `type`, 0.5.0 for a device name starting with a digit or a device node `hostPath`, 0.6.0 for
  annotations or a dot in the kind's class, 0.7.0 for `intelRdt` or `additionalGids`, 1.1.0 for `netDevices` or
  RDT `schemata` / `enableMonitoring`), a valid `kind` (`vendor/class`), valid container
  edits (env entries `NAME=VALUE`, mounts with host and container paths, device nodes with a path, hooks with a
  known name and a path), at least one device, unique device names, each with non-empty edits. An invalid spec is
  left out (its error is kept and reported when one of its devices is asked for);
* the same device in two specs: the higher-priority directory wins; within one priority both are dropped;
* `resolve(ids)` merges the edits of the devices in the order asked for, each spec's own `containerEdits` once,
  before the first of its devices, then the device's; an ID that is not qualified or not found raises CDIError.

`ContainerEdits.apply_env` / `apply_mounts` apply merged edits to a container's env and mounts as the OCI spec
editor does: a variable of the same name is replaced, a mount on the same container path is replaced, mounts
are ordered by the depth of their container path.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "CDI_0_5_VERSIONS",
    "DEFAULT_SPEC_DIRS",
    "CDIError",
    "CDIRegistry",
    "ContainerEdits",
    "DeviceNode",
    "Hook",
    "Mount",
    "parse_qualified_name",
    "required_version",
]

log = logging.getLogger(__name__)

DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
"""The runtime's default spec directories, lowest priority first."""
SPEC_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
CDI_0_5_VERSIONS = SPEC_VERSIONS[:5]
"""The spec versions a runtime built with the CDI library v0.5.x knows (tag v0.5.4, pkg/cdi/version.go)."""
HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
_SEPARATORS_KIND = "_-."
_SEPARATORS_DEVICE = "_-.:"


class CDIError(Exception):
    """A CDI spec or device ID that a runtime would refuse."""


def _alnum(c: str) -> bool:
    return c.isascii() and c.isalnum()


def _check_vendor_or_class(what: str, name: str) -> None:
    if not name:
        raise CDIError(f"invalid {what}: empty name")
    if not (name[0].isascii() and name[0].isalpha()):
        raise CDIError(f"invalid {what} {name!r}: should start with a letter")
    for c in name[1:-1]:
        if not (_alnum(c) or c in _SEPARATORS_KIND):
            raise CDIError(f"invalid {what} {name!r}: invalid character {c!r}")
    if not _alnum(name[-1]):
        raise CDIError(f"invalid {what} {name!r}: should end with a letter or digit")


def _check_device_name(name: str) -> None:
    if not name:
        raise CDIError("invalid device name: empty")
    if not _alnum(name[0]) or not _alnum(name[-1]):
        raise CDIError(f"invalid device name {name!r}: should start and end with a letter or digit")
    for c in name[1:-1]:
        if not (_alnum(c) or c in _SEPARATORS_DEVICE):
            raise CDIError(f"invalid device name {name!r}: invalid character {c!r}")


def parse_kind(kind: str) -> tuple[str, str]:
    """`vendor/class` -> (vendor, class); CDIError when either part is invalid."""
    vendor, sep, cls = kind.partition("/")
    if not sep or not vendor or not cls:
        raise CDIError(f"invalid kind {kind!r}: want vendor/class")
    _check_vendor_or_class("vendor", vendor)
    _check_vendor_or_class("class", cls)
    return vendor, cls


def parse_qualified_name(device: str) -> tuple[str, str, str]:
    """`vendor/class=name` -> (vendor, class, name); CDIError for an unqualified or invalid ID."""
    qualifier, sep, name = device.partition("=")
    if not sep or not qualifier or not name or device.startswith("/"):
        raise CDIError(f"unqualified device {device!r}: want vendor/class=name")
    vendor, cls = parse_kind(qualifier)
    _check_device_name(name)
    return vendor, cls, name


@dataclass(frozen=True, slots=True)
class Mount:
    """A mount edit: host path, container path, mount options (`ro` makes it read-only), filesystem type."""

    host_path: str
    container_path: str
    options: tuple[str, ...] = ()
    type: str = ""

    @property
    def read_only(self) -> bool:
        """Whether the options make the mount read-only."""
        return "ro" in self.options


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A device node edit: the path in the container and, when it differs, on the host."""

    path: str
    host_path: str = ""
    type: str = ""
    permissions: str = ""


@dataclass(frozen=True, slots=True)
class Hook:
    """An OCI hook edit: when (hook name) and what to run."""

    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()


@dataclass(slots=True)
class ContainerEdits:
    """Edits of a container's OCI spec, in the order they apply."""

    env: list[str] = field(default_factory=list)
    mounts: list[Mount] = field(default_factory=list)
    device_nodes: list[DeviceNode] = field(default_factory=list)
    hooks: list[Hook] = field(default_factory=list)

    def empty(self) -> bool:
        """Whether there is nothing to apply."""
        return not (self.env or self.mounts or self.device_nodes or self.hooks)

    def append(self, other: ContainerEdits) -> None:
        """Add `other`'s edits after these."""
        self.env.extend(other.env)
        self.mounts.extend(other.mounts)
        self.device_nodes.extend(other.device_nodes)
        self.hooks.extend(other.hooks)

    def apply_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """`env` with these variables set (a later entry of a name replaces an earlier one)."""
        out = dict(env)
        for entry in self.env:
            name, _, value = entry.partition("=")
            out[name] = value
        return out

    def apply_mounts(self, mounts: Iterable[Mount]) -> list[Mount]:
        """`mounts` with these added (one on the same container path is replaced), by container path depth."""
        out = list(mounts)
        for mount in self.mounts:
            out = [m for m in out if m.container_path != mount.container_path]
            out.append(mount)
        return sorted(out, key=lambda m: len(Path(m.container_path).parts))

    def as_dict(self) -> dict[str, Any]:
        """The edits in CDI's JSON field names (for status output)."""
        return {
            "env": list(self.env),
            "mounts": [{"hostPath": m.host_path, "containerPath": m.container_path, "options": list(m.options)}
                       for m in self.mounts],
            "deviceNodes": [{"path": d.path, "hostPath": d.host_path} for d in self.device_nodes],
            "hooks": [{"hookName": h.hook_name, "path": h.path, "args": list(h.args)} for h in self.hooks],
        }


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CDIError(f"{where}: want a list of strings")
    return list(value)


def _edits(raw: Any, where: str) -> ContainerEdits:
    if raw is None:
        return ContainerEdits()
    if not isinstance(raw, dict):
        raise CDIError(f"{where}: want an object")
    edits = ContainerEdits(env=_strings(raw.get("env"), f"{where}.env"))
    for entry in edits.env:
        if entry.find("=") <= 0:
            raise CDIError(f"{where}.env: invalid environment variable {entry!r}")
    for i, m in enumerate(raw.get("mounts") or ()):
        if not isinstance(m, dict) or not m.get("hostPath") or not m.get("containerPath"):
            raise CDIError(f"{where}.mounts[{i}]: hostPath and containerPath are required")
        edits.mounts.append(Mount(str(m["hostPath"]), str(m["containerPath"]),
                                  tuple(_strings(m.get("options"), f"{where}.mounts[{i}].options")),
                                  str(m.get("type") or "")))
    for i, d in enumerate(raw.get("deviceNodes") or ()):
        if not isinstance(d, dict) or not d.get("path"):
            raise CDIError(f"{where}.deviceNodes[{i}]: path is required")
        if d.get("type") not in (None, "", "b", "c", "u", "p"):
            raise CDIError(f"{where}.deviceNodes[{i}]: invalid type {d.get('type')!r}")
        permissions = str(d.get("permissions") or "")
        if any(c not in "rwm" for c in permissions):
            raise CDIError(f"{where}.deviceNodes[{i}]: invalid permissions {permissions!r}")
        edits.device_nodes.append(DeviceNode(str(d["path"]), str(d.get("hostPath") or ""), str(d.get("type") or ""),
                                             permissions))
    for i, h in enumerate(raw.get("hooks") or ()):
        if not isinstance(h, dict) or h.get("hookName") not in HOOK_NAMES:
            raise CDIError(f"{where}.hooks[{i}]: invalid hook name {(h or {}).get('hookName')!r}")
        if not h.get("path"):
            raise CDIError(f"{where}.hooks[{i}]: empty path")
        edits.hooks.append(Hook(str(h["hookName"]), str(h["path"]), tuple(_strings(h.get("args"), "args")),
                                tuple(_strings(h.get("env"), "env"))))
    return edits


@dataclass(slots=True)
class Spec:
    """One parsed spec file."""

    path: Path
    priority: int
    kind: str
    edits: ContainerEdits
    devices: dict[str, ContainerEdits]


def required_version(data: dict[str, Any]) -> str:
    """The lowest spec version the content needs (cncf-tags/container-device-interface specs-go/version.go,
    `requiredVersion` and the `requiresV0x0` functions)."""
    devices = [d for d in data.get("devices") or () if isinstance(d, dict)]
    edits = [e for e in [data.get("containerEdits"), *(d.get("containerEdits") for d in devices)]
             if isinstance(e, dict)]
    _, _, kind_class = str(data.get("kind") or "").partition("/")
    rdt = [e["intelRdt"] for e in edits if isinstance(e.get("intelRdt"), dict)]
    if any(e.get("netDevices") for e in edits) or any(r.get("schemata") is not None or r.get("enableMonitoring")
                                                       for r in rdt):
        return "1.1.0"
    if any(e.get("intelRdt") is not None or e.get("additionalGids") for e in edits):
        return "0.7.0"
    if data.get("annotations") or any(d.get("annotations") for d in devices) or "." in kind_class:
        return "0.6.0"
    if (any(str(d.get("name") or "")[:1].isdigit() for d in devices)
            or any(isinstance(n, dict) and n.get("hostPath") for e in edits for n in e.get("deviceNodes") or ())):
        return "0.5.0"
    if any(isinstance(m, dict) and m.get("type") for e in edits for m in e.get("mounts") or ()):
        return "0.4.0"
    return "0.3.0"


def parse_spec(data: Any, path: Path, priority: int, known_versions: Sequence[str] = SPEC_VERSIONS) -> Spec:
    """Check a spec's content (already decoded) as a runtime whose CDI library knows `known_versions` does;
    CDIError naming what is wrong."""
    if not isinstance(data, dict):
        raise CDIError(f"{path}: no spec data")
    version = str(data.get("cdiVersion") or "").removeprefix("v")
    if version not in known_versions:
        raise CDIError(f"{path}: unsupported cdiVersion {data.get('cdiVersion')!r}")
    needed = required_version(data)
    if SPEC_VERSIONS.index(version) < SPEC_VERSIONS.index(needed):
        raise CDIError(f"{path}: the spec version must be at least v{needed}")
    kind = data.get("kind")
    if not isinstance(kind, str):
        raise CDIError(f"{path}: kind is required")
    try:
        parse_kind(kind)
    except CDIError as exc:
        raise CDIError(f"{path}: {exc}") from None
    try:
        edits = _edits(data.get("containerEdits"), "containerEdits")
        devices: dict[str, ContainerEdits] = {}
        for i, device in enumerate(data.get("devices") or ()):
            name = device.get("name") if isinstance(device, dict) else None
            if not isinstance(name, str):
                raise CDIError(f"devices[{i}]: name is required")
            _check_device_name(name)
            if name in devices:
                raise CDIError(f"devices[{i}]: multiple devices named {name!r}")
            device_edits = _edits(device.get("containerEdits"), f"devices[{i}].containerEdits")
            if device_edits.empty():
                raise CDIError(f"devices[{i}] ({name}): empty device edits")
            devices[name] = device_edits
        if not devices:
            raise CDIError("no devices")
    except CDIError as exc:
        raise CDIError(f"{path}: invalid spec: {exc}") from None
    return Spec(path=path, priority=priority, kind=kind, edits=edits, devices=devices)


class CDIRegistry:
    """The CDI specs of a set of directories, read again on each `refresh()` (see the module docstring)."""

    def __init__(self, dirs: Sequence[str | Path] = DEFAULT_SPEC_DIRS,
                 known_versions: Sequence[str] = SPEC_VERSIONS) -> None:
        self.dirs = [Path(d) for d in dirs]
        self.known_versions = tuple(known_versions)
        self.devices: dict[str, tuple[Spec, ContainerEdits]] = {}  # qualified ID -> (spec, device edits)
        self.errors: dict[str, str] = {}  # spec path -> why it was left out

    def refresh(self) -> None:
        """Read every spec file again."""
        devices: dict[str, tuple[Spec, ContainerEdits]] = {}
        conflicts: set[str] = set()
        errors: dict[str, str] = {}
        for priority, directory in enumerate(self.dirs):
            try:
                entries = sorted(directory.iterdir())
            except OSError:
                continue
            for path in entries:
                if path.suffix not in (".json", ".yaml") or not path.is_file():
                    continue
                try:
                    text = path.read_text()
                    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
                    spec = parse_spec(data, path, priority, self.known_versions)
                except (OSError, ValueError, yaml.YAMLError, CDIError) as exc:
                    errors[str(path)] = str(exc)
                    log.info("event=cdi-spec-invalid path=%s error=%s", path, exc)
                    continue
                for name, edits in spec.devices.items():
                    qualified = f"{spec.kind}={name}"
                    old = devices.get(qualified)
                    if old is not None and old[0].priority == priority:
                        conflicts.add(qualified)
                        errors[str(path)] = f"conflicting device {qualified!r} (specs {old[0].path}, {path})"
                    devices[qualified] = (spec, edits)
        for qualified in conflicts:
            devices.pop(qualified, None)
        self.devices, self.errors = devices, errors

    def resolve(self, ids: Sequence[str]) -> ContainerEdits:
        """The merged edits of these device IDs (read from disk now); CDIError for an invalid or unknown ID."""
        self.refresh()
        merged = ContainerEdits()
        seen_specs: set[int] = set()
        unresolved = []
        for device in ids:
            parse_qualified_name(device)
            found = self.devices.get(device)
            if found is None:
                unresolved.append(device)
                continue
            spec, edits = found
            if id(spec) not in seen_specs:
                seen_specs.add(id(spec))
                merged.append(spec.edits)
            merged.append(edits)
        if unresolved:
            detail = "; ".join(f"{p}: {e}" for p, e in sorted(self.errors.items()))
            raise CDIError(f"unresolvable CDI devices {', '.join(unresolved)}"
                           + (f" (invalid specs: {detail})" if detail else ""))
        return merged
