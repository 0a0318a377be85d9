"""What a pod may hold: its assignment checked against its own spec, and the scheduler's signature of it.

Pod authors can write any annotation on their pods, so an assignment (`volcano.sh/vgpu-ids-new`,
`volcano.sh/devices-to-allocate`) is only a claim. `violations` compares each container's segment with what the
container's own `resources.limits` allow on the cards named (count, memory, cores), reading a grant of 0 as the
isolation library does: no limit, the whole device (so a memory grant is never 0, and a cores grant is 0 only for a
container whose spec asks no cores); the device plugin refuses a grant with violations. Both the plugin and the
scheduler's ledger count what a claim holds at the spec (`spec_charges`), so a claim cannot raise what others see
as used. `sign` / `verify` are a keyed MAC (HMAC-SHA256) over the pod UID, the node and the assignment, written by
the scheduler at bind (`SIGNATURE`) and checked by the device plugin when both share a key (docs/security.md).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from pathlib import Path

from vgpu.assignment import Assignment, DeviceGrant
from vgpu.errors import ConfigError
from vgpu.requests import ContainerRequest

__all__ = ["MIN_KEY_BYTES", "SIGNATURE", "read_key", "shortfalls", "sign", "spec_charges", "verify",
           "violations"]

SIGNATURE = "vgpu-sharing.io/grant-signature"
MIN_KEY_BYTES = 32
_VERSION = "v1"


def violations(assignment: Assignment, requests: Sequence[ContainerRequest],
               card_memory: Mapping[str, int]) -> list[str]:
    """Why this assignment is more than the pod's spec allows (empty: it is within it).

    `requests` are the pod's GPU containers in admission order (segment i belongs to request i); `card_memory` maps
    the node's GPU UUIDs to their memory in memory units. Empty segments (already answered) are not checked."""
    found: list[str] = []
    for index, segment in enumerate(assignment):
        if not segment:
            continue
        if index >= len(requests):
            found.append(f"segment {index} has no GPU container to belong to ({len(requests)} in the spec)")
            continue
        request = requests[index]
        where = f"container {request.container!r}"
        if len(segment) != request.count:
            found.append(f"{where}: {len(segment)} GPUs granted, vgpu-number is {request.count}")
        uuids = [g.uuid for g in segment]
        if len(set(uuids)) != len(uuids):
            found.append(f"{where}: one GPU granted twice")
        for grant in segment:
            card = card_memory.get(grant.uuid.split("[", 1)[0])  # a MIG entry names its physical GPU first
            if card is None:
                found.append(f"{where}: GPU {grant.uuid} is not on this node")
                continue
            allowed = request.memory_on(card)
            if grant.memory <= 0:
                found.append(f"{where}: no memory granted on {grant.uuid}: a limit of 0 leaves the whole GPU's "
                             f"memory to the container")
            elif grant.memory > allowed:
                found.append(f"{where}: {grant.memory} memory units granted on {grant.uuid}, the spec allows "
                             f"{allowed}")
            if grant.cores <= 0 < request.cores:
                found.append(f"{where}: no cores limit granted on {grant.uuid} although the spec asks "
                             f"{request.cores}%: a limit of 0 leaves the whole GPU's compute to the container")
            elif grant.cores > request.cores:
                found.append(f"{where}: {grant.cores}% cores granted on {grant.uuid}, the spec allows "
                             f"{request.cores}%")
    return found


def spec_charges(assignment: Assignment, requests: Sequence[ContainerRequest],
                 card_memory: Mapping[str, int]) -> list[tuple[str, int, int]]:
    """What a pod holds by its claim, counted as its spec allows: (physical GPU UUID, memory units, cores) for each
    GPU the claim names for a container, at most as many as the container asks, at what its spec asks on that
    card, whatever amounts the claim writes; nothing for a segment no GPU container of the spec stands behind.
    `requests` and `card_memory` as for `violations`."""
    return [held for _, _, held in _held(assignment, requests, card_memory)]


def shortfalls(assignment: Assignment, requests: Sequence[ContainerRequest],
               card_memory: Mapping[str, int]) -> list[str]:
    """Where a claim writes less than its container's spec asks (the other way round from `violations`)."""
    return [f"container {request.container!r}: {grant.memory} memory units and {grant.cores}% cores claimed on "
            f"{grant.uuid}, the spec asks {memory} and {cores}%"
            for request, grant, (_, memory, cores) in _held(assignment, requests, card_memory)
            if grant.memory < memory or grant.cores < cores]


def _held(assignment: Assignment, requests: Sequence[ContainerRequest],
          card_memory: Mapping[str, int]) -> list[tuple[ContainerRequest, DeviceGrant, tuple[str, int, int]]]:
    out = []
    for request, segment in zip(requests, assignment):
        for grant in segment[:request.count]:
            uuid = grant.uuid.split("[", 1)[0]  # a MIG entry names its physical GPU first
            card = card_memory.get(uuid)
            memory = request.memory if request.memory else (request.memory_on(card) if card else 0)
            out.append((request, grant, (uuid, memory, request.cores)))
    return out


def _message(pod_uid: str, node: str, assignment_value: str) -> bytes:
    return "\n".join((_VERSION, pod_uid, node, assignment_value)).encode()


def sign(key: bytes, pod_uid: str, node: str, assignment_value: str) -> str:
    """The signature annotation's value for an assignment (its `vgpu-ids-new` text) of pod `pod_uid` on `node`."""
    digest = hmac.new(key, _message(pod_uid, node, assignment_value), hashlib.sha256).hexdigest()
    return f"{_VERSION}:{digest}"


def verify(key: bytes, signature: object, pod_uid: str, node: str, assignment_value: str) -> bool:
    """Whether `signature` is the scheduler's for this pod, node and assignment (constant-time comparison)."""
    if not isinstance(signature, str) or not pod_uid:
        return False
    return hmac.compare_digest(signature, sign(key, pod_uid, node, assignment_value))


def read_key(path: str | Path, option: str) -> bytes:
    """The shared key from a file (a mounted Secret); raises ConfigError naming `option` when it is unusable."""
    try:
        key = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"{option} {path}: {exc.strerror or exc}") from None
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"{option} {path}: the key has {len(key)} bytes, at least {MIN_KEY_BYTES} are needed")
    return key
