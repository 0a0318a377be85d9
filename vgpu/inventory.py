"""Node GPU inventory and its annotation codecs.

Written by the device plugin (`encode_volcano` into `volcano.sh/node-vgpu-register`) and read by the scheduler
(`decode_volcano`, or `decode_hami` for `hami.io/node-nvidia-register`). Decoders are strict: any value that does
not follow the format raises CodecError naming the entry and field. Encoders reproduce the published formats byte
for byte.

Volcano: one `<UUID>,<split>,<memory units>,<type>,<true|false>,<mode>:` per GPU, sorted by minor number, a `:`
after every entry. HAMi: a JSON array with Go's omitempty field order (id, index, count, devmem, devcore, type,
numa, mode, health), or the legacy `<UUID>,<count>,<devmem>,<devcore>,<type>,<numa>,<health>[,<index>,<mode>]:`.

Topology (`vgpu-sharing.io/node-gpu-topology`, ours: neither format above has room for it; `encode_topology`,
`decode_topology`): compact JSON, one member per GPU with something known, keyed by GPU UUID, in minor order,
e.g. `{"GPU-1c2…":{"island":0,"numa":0},"GPU-a41…":{"numa":1}}`. `island`: the GPU's NVLink island within the
node, numbered by the lowest NVML index in it (absent: no NVLink); `numa`: its NUMA node (absent: unknown).
"""

from dataclasses import dataclass
from typing import Any

import orjson

from vgpu.errors import CodecError
from vgpu.units import KIB

__all__ = [
    "MAX_ANNOTATION_BYTES",
    "GPUDevice",
    "GPUTopology",
    "annotation_text",
    "decode_hami",
    "decode_topology",
    "decode_volcano",
    "encode_hami",
    "encode_hami_legacy",
    "encode_topology",
    "encode_volcano",
    "json_document",
]

MAX_ANNOTATION_BYTES = 256 * KIB
_MAX_GPUS = 1024
_MAX_INT32 = 2**31 - 1


@dataclass(frozen=True, slots=True)
class GPUDevice:
    """One physical GPU as a node publishes it. `memory` is in memory units (MiB with factor 1)."""

    uuid: str
    split: int
    memory: int
    type: str
    healthy: bool = True
    mode: str = "hami-core"
    index: int = 0
    cores: int = 100
    numa: int = 0
    island: int = -1  # NVLink island within the node (GPUs joined by NVLink share one); -1: not known


def annotation_text(value: object, what: str) -> str:
    """An annotation's value, refused (CodecError naming `what`) unless it is a string of at most
    MAX_ANNOTATION_BYTES."""
    if not isinstance(value, str):
        raise CodecError(f"{what}: expected a string, got {type(value).__name__}")
    if len(value) > MAX_ANNOTATION_BYTES:
        raise CodecError(f"{what}: value of {len(value)} bytes is over the {MAX_ANNOTATION_BYTES}-byte limit")
    return value


def _int_field(text: str, what: str, low: int = 0, high: int = _MAX_INT32) -> int:
    if not text.isascii() or not text.isdigit():
        raise CodecError(f"{what}: {text!r} is not a non-negative integer")
    value = int(text)
    if not low <= value <= high:
        raise CodecError(f"{what}: {value} is outside {low}..{high}")
    return value


def _bool_field(text: str, what: str) -> bool:
    if text == "true":
        return True
    if text == "false":
        return False
    raise CodecError(f"{what}: {text!r} is neither 'true' nor 'false'")


def _text_field(text: str, what: str) -> str:
    if not text or text != text.strip() or any(c in text for c in ",:;\n"):
        raise CodecError(f"{what}: {text!r} is empty or holds a separator")
    return text


def _entries(value: str, what: str) -> list[str]:
    if value == "":
        return []
    if not value.endswith(":"):
        raise CodecError(f"{what}: every GPU entry must end with ':'")
    entries = value[:-1].split(":")
    if len(entries) > _MAX_GPUS:
        raise CodecError(f"{what}: more than {_MAX_GPUS} GPUs")
    return entries


def encode_volcano(devices: list[GPUDevice] | tuple[GPUDevice, ...]) -> str:
    """Encode devices (already in minor-number order) as `volcano.sh/node-vgpu-register`."""
    return "".join(
        f"{d.uuid},{d.split},{d.memory},{d.type},{'true' if d.healthy else 'false'},{d.mode}:" for d in devices
    )


def decode_volcano(value: object) -> tuple[GPUDevice, ...]:
    """Decode `volcano.sh/node-vgpu-register`; the position in the list becomes `index`."""
    what = "volcano.sh/node-vgpu-register"
    text = annotation_text(value, what)
    devices = []
    seen: set[str] = set()
    for position, entry in enumerate(_entries(text, what)):
        where = f"{what} entry {position}"
        fields = entry.split(",")
        if len(fields) != 6:
            raise CodecError(f"{where}: expected 6 comma-separated fields, got {len(fields)}")
        uuid = _text_field(fields[0], f"{where} uuid")
        if uuid in seen:
            raise CodecError(f"{where}: duplicate uuid {uuid!r}")
        seen.add(uuid)
        devices.append(
            GPUDevice(
                uuid=uuid,
                split=_int_field(fields[1], f"{where} split count", 1, 10_000),
                memory=_int_field(fields[2], f"{where} memory", 1),
                type=_text_field(fields[3], f"{where} type"),
                healthy=_bool_field(fields[4], f"{where} health"),
                mode=_text_field(fields[5], f"{where} mode"),
                index=position,
            )
        )
    return tuple(devices)


def _go_json_escape(text: str) -> str:
    # Go's encoding/json escapes these even inside strings; keep the bytes identical.
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def encode_hami(devices: list[GPUDevice] | tuple[GPUDevice, ...]) -> str:
    """Encode devices as HAMi's JSON `hami.io/node-nvidia-register` (Go omitempty semantics)."""
    items = []
    for d in devices:
        item: dict[str, object] = {}
        for key, value in (
            ("id", d.uuid),
            ("index", d.index),
            ("count", d.split),
            ("devmem", d.memory),
            ("devcore", d.cores),
            ("type", d.type),
            ("numa", d.numa),
            ("mode", d.mode),
            ("health", d.healthy),
        ):
            if value:
                item[key] = value
        items.append(item)
    return _go_json_escape(orjson.dumps(items).decode())


def encode_hami_legacy(devices: list[GPUDevice] | tuple[GPUDevice, ...]) -> str:
    """Encode devices in HAMi's legacy 9-field colon format."""
    return "".join(
        f"{d.uuid},{d.split},{d.memory},{d.cores},{d.type},{d.numa},{'true' if d.healthy else 'false'},"
        f"{d.index},{d.mode}:"
        for d in devices
    )


_HAMI_KEYS = {"id", "index", "count", "devmem", "devcore", "type", "numa", "mode", "health", "migProfiles"}


def _json_int(item: dict[str, Any], key: str, where: str, low: int = 0, high: int = _MAX_INT32) -> int:
    value = item.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CodecError(f"{where} {key}: {value!r} is not an integer in {low}..{high}")
    return value


def _json_str(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key, "")
    if not isinstance(value, str):
        raise CodecError(f"{where} {key}: {value!r} is not a string")
    return value


def json_document(text: str, what: str, kind: type[list[Any]] | type[dict[str, Any]], expected: str,
                  limit: int = _MAX_GPUS, unit: str = "GPUs") -> Any:
    """The JSON value of an annotation, of `kind` (list or dict, `expected` naming it) with at most `limit` entries
    (`unit` naming them); anything else raises CodecError naming `what`."""
    try:
        items: Any = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise CodecError(f"{what}: invalid JSON: {exc}") from None
    if not isinstance(items, kind):
        raise CodecError(f"{what}: expected {expected}")
    if len(items) > limit:
        raise CodecError(f"{what}: more than {limit} {unit}")
    return items


def _decode_hami_json(text: str, what: str) -> tuple[GPUDevice, ...]:
    items = json_document(text, what, list, "a JSON array")
    devices = []
    for position, item in enumerate(items):
        where = f"{what} entry {position}"
        if not isinstance(item, dict):
            raise CodecError(f"{where}: expected a JSON object")
        unknown = set(item) - _HAMI_KEYS
        if unknown:
            raise CodecError(f"{where}: unknown keys {sorted(unknown)}")
        uuid = _json_str(item, "id", where)
        if not uuid:
            raise CodecError(f"{where} id: missing")
        health = item.get("health", False)
        if not isinstance(health, bool):
            raise CodecError(f"{where} health: {health!r} is not a boolean")
        devices.append(
            GPUDevice(
                uuid=uuid,
                split=_json_int(item, "count", where, 1, 10_000),
                memory=_json_int(item, "devmem", where, 1),
                type=_json_str(item, "type", where),
                healthy=health,
                mode=_json_str(item, "mode", where) or "hami-core",
                index=_json_int(item, "index", where),
                cores=_json_int(item, "devcore", where),
                numa=_json_int(item, "numa", where),
            )
        )
    return tuple(devices)


def _decode_hami_legacy(text: str, what: str) -> tuple[GPUDevice, ...]:
    if ":" not in text:
        raise CodecError(f"{what}: legacy format needs ':' after every GPU entry")
    devices = []
    for position, entry in enumerate(_entries(text, what)):
        where = f"{what} entry {position}"
        fields = entry.split(",")
        if len(fields) not in (7, 9):
            raise CodecError(f"{where}: expected 7 or 9 comma-separated fields, got {len(fields)}")
        devices.append(
            GPUDevice(
                uuid=_text_field(fields[0], f"{where} uuid"),
                split=_int_field(fields[1], f"{where} count", 1, 10_000),
                memory=_int_field(fields[2], f"{where} devmem", 1),
                cores=_int_field(fields[3], f"{where} devcore"),
                type=_text_field(fields[4], f"{where} type"),
                numa=_int_field(fields[5], f"{where} numa"),
                healthy=_bool_field(fields[6], f"{where} health"),
                index=_int_field(fields[7], f"{where} index") if len(fields) == 9 else 0,
                mode=_text_field(fields[8], f"{where} mode") if len(fields) == 9 else "hami-core",
            )
        )
    return tuple(devices)


def decode_hami(value: object) -> tuple[GPUDevice, ...]:
    """Decode `hami.io/node-nvidia-register`: JSON when it starts with '[' (or '{'), else the legacy format."""
    what = "hami.io/node-nvidia-register"
    text = annotation_text(value, what)
    if text.lstrip()[:1] in ("[", "{"):
        return _decode_hami_json(text, what)
    return _decode_hami_legacy(text, what)


@dataclass(frozen=True, slots=True)
class GPUTopology:
    """Where one GPU sits in its node; -1 where unknown."""

    island: int = -1
    numa: int = -1


_TOPOLOGY_KEYS = ("island", "numa")
_MAX_TOPOLOGY_ID = _MAX_GPUS - 1  # islands are NVML indices; Linux numbers at most 1024 NUMA nodes
_MAX_UUID = 128


def encode_topology(gpus: list[tuple[str, int | None, int | None]]) -> str:
    """(uuid, island, numa) per GPU, in minor order, as `vgpu-sharing.io/node-gpu-topology` (None or negative:
    unknown, left out)."""
    out: dict[str, dict[str, int]] = {}
    for uuid, island, numa in gpus:
        known = {k: v for k, v in zip(_TOPOLOGY_KEYS, (island, numa)) if v is not None and v >= 0}
        if known:
            out[uuid] = known
    return orjson.dumps(out).decode()


def _topology_id(entry: dict[str, Any], key: str, where: str) -> int:
    if key not in entry:
        return -1
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_TOPOLOGY_ID:
        raise CodecError(f"{where} {key}: {value!r} is not an integer in 0..{_MAX_TOPOLOGY_ID}")
    return value


def decode_topology(value: object) -> dict[str, GPUTopology]:
    """Decode `vgpu-sharing.io/node-gpu-topology` into {uuid: GPUTopology}."""
    what = "vgpu-sharing.io/node-gpu-topology"
    items = json_document(annotation_text(value, what), what, dict, "a JSON object keyed by GPU UUID")
    found: dict[str, GPUTopology] = {}
    for uuid, entry in items.items():
        where = f"{what} GPU {uuid[:_MAX_UUID]!r}"
        if not uuid or len(uuid) > _MAX_UUID or not uuid.isprintable() or any(c.isspace() for c in uuid):
            raise CodecError(f"{where}: not a GPU UUID")
        if not isinstance(entry, dict):
            raise CodecError(f"{where}: expected a JSON object")
        unknown = set(entry) - set(_TOPOLOGY_KEYS)
        if unknown:
            raise CodecError(f"{where}: unknown keys {sorted(unknown)}")
        found[uuid] = GPUTopology(island=_topology_id(entry, "island", where), numa=_topology_id(entry, "numa", where))
    return found
