"""The scheduler's decision for a pod and its Volcano annotation codec.

The scheduler encodes an Assignment into `volcano.sh/vgpu-ids-new` and `volcano.sh/devices-to-allocate`; the
scheduler's ledger decodes `vgpu-ids-new` of every placed pod; the device plugin decodes `devices-to-allocate`.
Format: one segment per GPU-requesting container, in admission order, joined by `;` (no trailing `;`); each
device `<UUID>,NVIDIA,<memory units>,<cores>` followed by `:`. Example:
`GPU-aaaa,NVIDIA,10000,30:GPU-bbbb,NVIDIA,10000,30:`.
"""

from dataclasses import dataclass

from vgpu import keys
from vgpu.errors import CodecError
from vgpu.units import KIB

__all__ = ["MAX_ASSIGNMENT_BYTES", "Assignment", "DeviceGrant", "decode", "encode", "salvage"]

MAX_ASSIGNMENT_BYTES = 256 * KIB
_MAX_INT32 = 2**31 - 1


@dataclass(frozen=True, slots=True)
class DeviceGrant:
    """One GPU given to one container: how much memory (memory units) and cores (percent) it holds."""

    uuid: str
    memory: int
    cores: int
    type: str = keys.DEVICE_TYPE


Assignment = tuple[tuple[DeviceGrant, ...], ...]


def encode(assignment: Assignment) -> str:
    """Encode per-container grants in the Volcano device-list format."""
    return ";".join("".join(f"{g.uuid},{g.type},{g.memory},{g.cores}:" for g in segment) for segment in assignment)


def _check(value: object) -> str:
    if not isinstance(value, str):
        raise CodecError(f"assignment: expected a string, got {type(value).__name__}")
    if len(value) > MAX_ASSIGNMENT_BYTES:
        raise CodecError(f"assignment: value of {len(value)} bytes is over the limit")
    return value


def _number(text: str, where: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise CodecError(f"{where}: {text!r} is not a non-negative integer")
    value = int(text)
    if value > _MAX_INT32:
        raise CodecError(f"{where}: {value} is out of range")
    return value


def _grant(entry: str, where: str) -> DeviceGrant:
    fields = entry.split(",")
    if len(fields) != 4:
        raise CodecError(f"{where}: expected 4 comma-separated fields, got {len(fields)}")
    uuid, kind, memory, cores = fields
    if not uuid or uuid != uuid.strip():
        raise CodecError(f"{where}: empty or padded uuid {uuid!r}")
    if not kind:
        raise CodecError(f"{where}: empty type")
    grant_cores = _number(cores, f"{where} cores")
    if grant_cores > 100:
        raise CodecError(f"{where} cores: {grant_cores} is above 100")
    return DeviceGrant(uuid=uuid, memory=_number(memory, f"{where} memory"), cores=grant_cores, type=kind)


def decode(value: object) -> Assignment:
    """Strictly decode a device list; any malformed entry raises CodecError."""
    text = _check(value)
    if text == "":
        return ()
    segments = []
    for index, segment in enumerate(text.split(";")):
        grants = []
        if segment:
            if not segment.endswith(":"):
                raise CodecError(f"assignment container {index}: every device must end with ':'")
            for position, entry in enumerate(segment[:-1].split(":")):
                grants.append(_grant(entry, f"assignment container {index} device {position}"))
        segments.append(tuple(grants))
    return tuple(segments)


def salvage(value: object) -> Assignment:
    """Decode like Volcano does: skip entries that do not parse, keep the segment structure.

    Used where a record must be read even if partly corrupt (usage accounting), never to make a decision.
    """
    if not isinstance(value, str):
        return ()
    segments = []
    for segment in value[:MAX_ASSIGNMENT_BYTES].split(";"):
        grants = []
        for entry in segment.split(":"):
            if "," not in entry:
                continue
            try:
                grants.append(_grant(entry, "assignment"))
            except CodecError:
                continue
        segments.append(tuple(grants))
    return tuple(segments) if value else ()
