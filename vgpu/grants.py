"""What a pod may hold: its assignment checked against its own spec, and the scheduler's signature of it.

Pod authors can write any annotation on their pods, so an assignment (`volcano.sh/vgpu-ids-new`,
`volcano.sh/devices-to-allocate`) is only a claim. `violations` compares each container's segment with what the
container's own `resources.limits` allow on the cards named (count, memory, cores), reading a grant of 0 as the
isolation library does: no limit, the whole device (so a memory grant is never 0, and a cores grant is 0 only for a
container whose spec asks no cores); the device plugin refuses a grant with violations. Both the plugin and the
scheduler's ledger count what a claim holds at the spec (`spec_charges`), so a claim cannot raise what others see
as used. `GrantKey` signs the pod UID, the node and the assignment at bind (`SIGNATURE`, the scheduler, Ed25519
private key) and checks it (the device plugin, the scheduler's public keys; docs/security.md).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from vgpu.assignment import Assignment, DeviceGrant
from vgpu.errors import ConfigError
from vgpu.requests import ContainerRequest

__all__ = ["MIN_KEY_BYTES", "SIGNATURE", "GrantKey", "read_key", "shortfalls", "spec_charges", "violations"]

SIGNATURE = "vgpu-sharing.io/grant-signature"
MIN_KEY_BYTES = 32
_HMAC, _ED25519 = "v1", "v2"  # the signature's version prefix: shared-secret HMAC-SHA256, Ed25519
_PEM_BLOCK = re.compile(rb"(-----BEGIN ([A-Z ]+)-----\r?\n.*?-----END \2-----)", re.S)


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


def _message(version: str, pod_uid: str, node: str, assignment_value: str) -> bytes:
    return "\n".join((version, pod_uid, node, assignment_value)).encode()


class GrantKey:
    """The keys one component holds to sign or check assignments.

    Ed25519 (signatures `v2:<base64>`): the scheduler holds the private key and signs; nodes hold only public keys
    and check, so a node cannot sign for another. Several public keys are accepted at once (a rotation). A shared
    secret (HMAC-SHA256, signatures `v1:<hex>`) is still read for deployments made before, where every holder can
    sign (docs/security.md)."""

    def __init__(self, private: Ed25519PrivateKey | None = None, public: Sequence[Ed25519PublicKey] = (),
                 shared: bytes | None = None) -> None:
        self._private = private
        self._public = list(public) + ([private.public_key()] if private is not None else [])
        self._shared = shared

    @classmethod
    def from_shared(cls, secret: bytes) -> GrantKey:
        """A shared-secret (HMAC) key."""
        return cls(shared=secret)

    @property
    def can_sign(self) -> bool:
        """Whether this holder can sign (the scheduler's private key, or a shared secret)."""
        return self._private is not None or self._shared is not None

    def sign(self, pod_uid: str, node: str, assignment_value: str) -> str:
        """The signature annotation's value for an assignment (its `vgpu-ids-new` text) of pod `pod_uid` on
        `node`; raises ValueError when this holder has only public keys."""
        if self._private is not None:
            raw = self._private.sign(_message(_ED25519, pod_uid, node, assignment_value))
            return f"{_ED25519}:{base64.b64encode(raw).decode()}"
        if self._shared is not None:
            return f"{_HMAC}:{self._mac(pod_uid, node, assignment_value)}"
        raise ValueError("only public keys: this holder cannot sign")

    def _mac(self, pod_uid: str, node: str, assignment_value: str) -> str:
        assert self._shared is not None
        return hmac.new(self._shared, _message(_HMAC, pod_uid, node, assignment_value), hashlib.sha256).hexdigest()

    def verify(self, signature: object, pod_uid: str, node: str, assignment_value: str) -> bool:
        """Whether `signature` is the scheduler's for this pod, node and assignment."""
        if not isinstance(signature, str) or not pod_uid:
            return False
        version, _, value = signature.partition(":")
        if version == _HMAC and self._shared is not None:
            return hmac.compare_digest(value, self._mac(pod_uid, node, assignment_value))
        if version != _ED25519 or not self._public:
            return False
        try:
            raw = base64.b64decode(value, validate=True)
        except (ValueError, binascii.Error):
            return False
        message = _message(_ED25519, pod_uid, node, assignment_value)
        for public in self._public:
            try:
                public.verify(raw, message)
                return True
            except InvalidSignature:
                continue
        return False


def read_key(path: str | Path, option: str, private_allowed: bool = True) -> GrantKey:
    """The key file of a component (a mounted Secret or ConfigMap): PEM blocks (at most one Ed25519 private key,
    any number of Ed25519 public keys) or, without PEM, a shared secret of at least MIN_KEY_BYTES bytes. A node
    (`private_allowed=False`) is refused a private key. Raises ConfigError naming `option` when it is unusable."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{option} {path}: {exc.strerror or exc}") from None
    blocks = _PEM_BLOCK.findall(data)
    if not blocks:
        secret = data.strip()
        if len(secret) < MIN_KEY_BYTES:
            raise ConfigError(f"{option} {path}: the key has {len(secret)} bytes, at least {MIN_KEY_BYTES} are "
                              f"needed (or PEM Ed25519 keys)")
        return GrantKey.from_shared(secret)
    private: Ed25519PrivateKey | None = None
    public: list[Ed25519PublicKey] = []
    for n, (block, label) in enumerate(blocks, 1):
        try:
            if label == b"PRIVATE KEY":
                loaded: object = serialization.load_pem_private_key(block, password=None)
            elif label == b"PUBLIC KEY":
                loaded = serialization.load_pem_public_key(block)
            else:
                raise ConfigError(f"{option} {path}: PEM block {n} is a {label.decode(errors='replace')}, "
                                  f"not a PRIVATE KEY or PUBLIC KEY")
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise ConfigError(f"{option} {path}: PEM block {n} does not load: {exc}") from None
        if isinstance(loaded, Ed25519PrivateKey):
            if not private_allowed:
                raise ConfigError(f"{option} {path}: holds a private key; a node needs only the scheduler's public "
                                  f"key (a node holding the private key could sign grants for any pod)")
            if private is not None:
                raise ConfigError(f"{option} {path}: more than one private key")
            private = loaded
        elif isinstance(loaded, Ed25519PublicKey):
            public.append(loaded)
        else:
            raise ConfigError(f"{option} {path}: PEM block {n} is not an Ed25519 key")
    return GrantKey(private=private, public=public)
