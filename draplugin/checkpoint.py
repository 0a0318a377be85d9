"""The plugin's record of prepared claims, so that a restarted plugin answers a repeated NodePrepareResources the
same way and a NodeUnprepareResources still removes what was made.

One JSON file beside the DRA socket, `{"version": 1, "claims": {<claim UID>: {...}}}`, replaced atomically after
every change. A file of another version, or one that does not parse, is refused with a ConfigError naming it:
starting empty would leave prepared claims' files behind without a trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from vgpu.draplugin.cdi import CDIDevice
from vgpu.draplugin.files import write_atomic
from vgpu.errors import ConfigError

__all__ = ["CHECKPOINT_VERSION", "Checkpoint", "PreparedClaim", "PreparedDevice"]

CHECKPOINT_VERSION = 1


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a NodePrepareResources answer."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """What preparing one claim made and answered: the devices, the CDI devices written to its spec and the
    (claim UID, request) keys of the host directories created for it."""

    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    cdi_devices: tuple[CDIDevice, ...]
    requests: tuple[str, ...]
    consumers: tuple[str, ...] = ()   # UIDs of the pods the claim is reserved for; () when not known

    def to_json(self) -> dict[str, Any]:
        """The claim as the checkpoint stores it."""
        return {
            "namespace": self.namespace,
            "name": self.name,
            "devices": [{"requestNames": list(d.request_names), "pool": d.pool, "device": d.device,
                         "cdiDeviceIDs": list(d.cdi_device_ids), "shareID": d.share_id} for d in self.devices],
            "cdiDevices": [{"name": c.name, "env": dict(c.env), "mounts": [list(m) for m in c.mounts]}
                           for c in self.cdi_devices],
            "requests": list(self.requests),
            "consumers": list(self.consumers),
        }

    @classmethod
    def from_json(cls, uid: str, data: Mapping[str, Any]) -> PreparedClaim:
        """Inverse of `to_json`; KeyError / TypeError / ValueError on a malformed entry."""
        devices = tuple(
            PreparedDevice(tuple(str(r) for r in d["requestNames"]), str(d["pool"]), str(d["device"]),
                           tuple(str(i) for i in d["cdiDeviceIDs"]),
                           None if d["shareID"] is None else str(d["shareID"]))
            for d in data["devices"]
        )
        cdi = tuple(
            CDIDevice(str(c["name"]), {str(k): str(v) for k, v in c["env"].items()},
                      tuple((str(m[0]), str(m[1]), bool(m[2])) for m in c["mounts"]))
            for c in data["cdiDevices"]
        )
        return cls(uid, str(data["namespace"]), str(data["name"]), devices, cdi,
                   tuple(str(r) for r in data["requests"]), tuple(str(c) for c in data.get("consumers") or ()))


class Checkpoint:
    """The checkpoint file: `load` once at start, `save` the whole set after each change."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, PreparedClaim]:
        """The prepared claims by UID ({} when there is no file); raises ConfigError when it cannot be read."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ConfigError(f"checkpoint {self.path}: {exc}") from None
        try:
            doc = orjson.loads(raw)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            version = doc.get("version")
            if version != CHECKPOINT_VERSION:
                raise ConfigError(f"checkpoint {self.path}: version {version!r} is not {CHECKPOINT_VERSION}, the "
                                  "one this plugin writes; move the file away only after unpreparing its claims")
            return {str(uid): PreparedClaim.from_json(str(uid), entry) for uid, entry in doc["claims"].items()}
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise ConfigError(f"checkpoint {self.path}: malformed ({type(exc).__name__}: {exc})") from None

    def save(self, claims: Mapping[str, PreparedClaim]) -> None:
        """Replace the file with these claims."""
        doc = {"version": CHECKPOINT_VERSION, "claims": {uid: c.to_json() for uid, c in sorted(claims.items())}}
        write_atomic(self.path, orjson.dumps(doc, option=orjson.OPT_INDENT_2), mode=0o600)
