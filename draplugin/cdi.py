"""CDI spec files of prepared claims: one JSON file per claim in the CDI directory, one CDI device per request.

The container runtime reads every spec in the directory; kubelet hands it the fully qualified device IDs
(`vgpu-sharing.io/gpu=<name>`) that NodePrepareResources returned. A device's container edits are the limits'
environment (`KEY=VALUE`) and the bind mounts of the isolation library and the claim's own directories.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from vgpu.dra import CDI_KIND
from vgpu.draplugin.files import write_atomic

__all__ = ["CDI_VERSION", "CDIDevice", "CDISpecs", "cdi_device_name", "qualified_id"]

CDI_VERSION = "0.5.0"
"""The lowest spec version our specs need: device names start with the claim's UID, often a digit, which needs
0.5.0 (cncf-tags/container-device-interface specs-go/version.go `requiresV050`); env and mounts without `type` need
nothing later. Runtimes built with the CDI library v0.5.x (containerd 1.7 before 1.7.12) know no version past it."""
_SPEC_PREFIX = CDI_KIND.replace("/", "-")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


def cdi_device_name(claim_uid: str, request: str) -> str:
    """The CDI device of one request of a claim: `<claim UID>-<request>`, a subrequest's `/` as `_` (request names
    are DNS labels, so this never collides with another request)."""
    return _UNSAFE.sub("_", f"{claim_uid}-{request}")


def qualified_id(name: str) -> str:
    """`vgpu-sharing.io/gpu=<name>`, the ID the container runtime resolves in the specs."""
    return f"{CDI_KIND}={name}"


@dataclass(frozen=True, slots=True)
class CDIDevice:
    """One CDI device: its name, environment and bind mounts (container path, host path, read-only)."""

    name: str
    env: Mapping[str, str]
    mounts: Sequence[tuple[str, str, bool]]

    def to_spec(self) -> dict[str, Any]:
        """The device as it appears in a spec's `devices[]`."""
        return {
            "name": self.name,
            "containerEdits": {
                "env": [f"{key}={value}" for key, value in self.env.items()],
                "mounts": [
                    {"hostPath": host, "containerPath": container,
                     "options": ["ro" if read_only else "rw", "nosuid", "nodev", "bind"]}
                    for container, host, read_only in self.mounts
                ],
            },
        }


class CDISpecs:
    """The CDI directory: write and remove the spec of one claim."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, claim_uid: str) -> Path:
        """The spec file of a claim."""
        return self.directory / f"{_SPEC_PREFIX}-{_UNSAFE.sub('_', claim_uid)}.json"

    def write(self, claim_uid: str, devices: Sequence[CDIDevice]) -> Path:
        """Write (atomically replace) the claim's spec; its path."""
        spec = {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": [d.to_spec() for d in devices]}
        path = self.path(claim_uid)
        write_atomic(path, orjson.dumps(spec, option=orjson.OPT_INDENT_2))
        return path

    def exists(self, claim_uid: str) -> bool:
        """Whether the claim's spec is on disk."""
        return self.path(claim_uid).exists()

    def remove(self, claim_uid: str) -> bool:
        """Delete the claim's spec; False when there was none."""
        try:
            self.path(claim_uid).unlink()
        except FileNotFoundError:
            return False
        return True
