"""Consolidation holds: GPUs on a node kept free for one pending pod, and their node annotation codec.

`vgpu consolidate --execute` evicts pods from a node so that a pending pod can have whole GPUs there, and writes a
hold per such pod into the node's `vgpu-sharing.io/consolidation-hold` (`encode_holds`); the scheduler's ledger
reads it (`decode_holds`) and charges the held GPUs to that pod, so the evicted pods' replacements are not placed
back into the room. Only node objects carry it: pod authors cannot write them.

Format: a compact JSON array of at most `MAX_HOLDS` objects, each with exactly the members `uid`, `namespace` and `name`
(the pending pod's, non-empty strings), `until` (Unix time in seconds, integer or fractional; JSON has no
infinities) and `ids` (the pod's planned assignment on that node in the `volcano.sh/vgpu-ids-new` encoding of
vgpu.assignment, at least one device), e.g.
`[{"uid":"5f0c…","namespace":"ml","name":"trainer","until":1765130000.5,"ids":"GPU-aaaa,NVIDIA,40960,100:"}]`.
A UID appears at most once. The decoder is strict: anything else raises CodecError naming the entry and member.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from vgpu import keys
from vgpu.assignment import Assignment, decode, encode
from vgpu.errors import CodecError
from vgpu.inventory import annotation_text, json_document

__all__ = ["MAX_HOLDS", "MAX_HOLD_SECONDS", "Hold", "decode_holds", "encode_holds"]

MAX_HOLDS = 64  # holds one node annotation may carry
MAX_HOLD_SECONDS = 3600.0  # the longest a hold is honoured from the moment the scheduler first reads it

_WHAT = keys.CONSOLIDATION_HOLD
_MEMBERS = ("uid", "namespace", "name", "until", "ids")
_SHOWN = 80  # characters of an offending value an error message quotes


@dataclass(frozen=True, slots=True)
class Hold:
    """Room on one node kept for a pending pod until `until` (Unix time): the GPUs and amounts of `assignment`."""

    uid: str
    namespace: str
    name: str
    until: float
    assignment: Assignment


def encode_holds(holds: list[Hold] | tuple[Hold, ...]) -> str:
    """Encode holds, in the order given, as `vgpu-sharing.io/consolidation-hold`."""
    return orjson.dumps([
        {"uid": h.uid, "namespace": h.namespace, "name": h.name, "until": h.until, "ids": encode(h.assignment)}
        for h in holds
    ]).decode()


def _shown(value: object) -> str:
    """A value for an error message, cut short (messages are logged)."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "…"


def _text(entry: dict[str, Any], member: str, where: str) -> str:
    value = entry[member]
    if not isinstance(value, str) or not value:
        raise CodecError(f"{where} {member}: {_shown(value)} is not a non-empty string")
    return value


def _hold(entry: object, where: str) -> Hold:
    if not isinstance(entry, dict):
        raise CodecError(f"{where}: expected a JSON object")
    missing = [m for m in _MEMBERS if m not in entry]
    if missing:
        raise CodecError(f"{where}: missing {missing}")
    unknown = set(entry) - set(_MEMBERS)
    if unknown:
        raise CodecError(f"{where}: unknown keys {sorted(unknown)}")
    uid, namespace, name = (_text(entry, member, where) for member in ("uid", "namespace", "name"))
    until = entry["until"]
    if isinstance(until, bool) or not isinstance(until, int | float):
        raise CodecError(f"{where} until: {_shown(until)} is not a number")
    try:
        assignment = decode(entry["ids"])
    except CodecError as exc:
        raise CodecError(f"{where} ids: {exc}") from None
    if not any(assignment):
        raise CodecError(f"{where} ids: holds no GPU")
    return Hold(uid=uid, namespace=namespace, name=name, until=float(until), assignment=assignment)


def decode_holds(value: object) -> tuple[Hold, ...]:
    """Strictly decode `vgpu-sharing.io/consolidation-hold`; anything malformed raises CodecError."""
    items = json_document(annotation_text(value, _WHAT), _WHAT, list, "a JSON array", MAX_HOLDS, "holds")
    holds = []
    seen: set[str] = set()
    for position, entry in enumerate(items):
        hold = _hold(entry, f"{_WHAT} entry {position}")
        if hold.uid in seen:
            raise CodecError(f"{_WHAT} entry {position}: duplicate uid {_shown(hold.uid)}")
        seen.add(hold.uid)
        holds.append(hold)
    return tuple(holds)
