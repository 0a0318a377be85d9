"""DRA mode's shared vocabulary: the driver's name, its devices' capacities and attributes, and their readers.

The DRA kubelet plugin (`vgpu.draplugin`) publishes one ResourceSlice device per GPU with these names; the
scheduler and the replay read slices and allocated claims back through `slice_devices` and `claim_consumption`.
`resource.k8s.io/v1` objects are dicts in the API's JSON form. Readers are strict where a wrong value would
mis-place or mis-limit a pod (a capacity that does not parse raises CodecError), and skip what belongs to other
drivers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vgpu.errors import CodecError
from vgpu.quantity import parse_quantity
from vgpu.units import MIB

__all__ = [
    "CAPACITY_CORES",
    "CAPACITY_MEMORY",
    "CDI_KIND",
    "DEVICE_CLASS",
    "DRIVER",
    "EXTENDED_DEVICE_CLASS",
    "ISLAND_ATTRIBUTE",
    "MIB",
    "NUMA_ATTRIBUTE",
    "ClaimShare",
    "SliceDevice",
    "claim_consumption",
    "cores_of",
    "device_name",
    "mib_of",
    "slice_devices",
]

DRIVER = "gpu.vgpu-sharing.io"
"""The DRA driver name: ResourceSlices' spec.driver, allocation results' driver, the registration name."""
DEVICE_CLASS = "vgpu.gpu.vgpu-sharing.io"
"""DeviceClass for claims that share GPUs by amounts of memory and cores."""
EXTENDED_DEVICE_CLASS = "vgpu-number.gpu.vgpu-sharing.io"
"""DeviceClass whose extendedResourceName serves plain `resources.limits` with DRA."""
CAPACITY_MEMORY = "memory"
"""Capacity of each device: GPU memory, a quantity of bytes published in whole MiB."""
CAPACITY_CORES = "cores"
"""Capacity of each device: percent of the GPU's streaming multiprocessors, 0..100."""
CDI_KIND = "vgpu-sharing.io/gpu"
"""CDI vendor/class of the specs the plugin writes; device IDs are `vgpu-sharing.io/gpu=<name>`."""
ISLAND_ATTRIBUTE = "nvlinkIsland"
"""Attribute (int) of a GPU with NVLink: its island in the node, the lowest NVML index of the GPUs NVLink joins."""
NUMA_ATTRIBUTE = "resource.kubernetes.io/numaNode"
"""Standard attribute (int): the GPU's NUMA node, where known."""


def device_name(index: int) -> str:
    """The slice's name for the GPU with this NVML index (a DNS label)."""
    return f"gpu-{index}"


def mib_of(value: object, what: str) -> int:
    """A memory quantity ("10Gi", "10240Mi", "10737418240") in MiB, rounded up; CodecError when it does not
    parse or is negative."""
    try:
        amount = parse_quantity(value)
    except ValueError as exc:
        raise CodecError(f"{what}: {exc}") from None
    if amount < 0:
        raise CodecError(f"{what}: {value!r} is negative")
    return math.ceil(amount / MIB)


def cores_of(value: object, what: str) -> int:
    """A cores quantity (percent of one GPU) as an integer 0..100, rounded up; CodecError otherwise."""
    try:
        amount = parse_quantity(value)
    except ValueError as exc:
        raise CodecError(f"{what}: {exc}") from None
    cores = math.ceil(amount)
    if not 0 <= cores <= 100:
        raise CodecError(f"{what}: {value!r} is not between 0 and 100")
    return cores


def _attribute(device: Mapping[str, Any], name: str) -> Any:
    attributes = device.get("attributes") or {}
    entry = attributes.get(name) if isinstance(attributes, Mapping) else None
    if not isinstance(entry, Mapping):
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in entry:
            return entry[kind]
    return None


def _small_int(value: object) -> int:
    """A topology attribute's value: an integer 0..1023, else -1 (absent or not ours to trust)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1023 else -1


def _capacity(device: Mapping[str, Any], name: str) -> object:
    capacity = device.get("capacity") or {}
    entry = capacity.get(name) if isinstance(capacity, Mapping) else None
    if not isinstance(entry, Mapping) or "value" not in entry:
        raise CodecError(f"device {device.get('name')!r}: capacity {name!r} is missing")
    return entry["value"]


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """One GPU as a ResourceSlice of our driver publishes it."""

    pool: str
    name: str
    uuid: str
    model: str
    index: int
    memory_mib: int
    cores: int
    shared: bool  # allowMultipleAllocations
    island: int = -1  # ISLAND_ATTRIBUTE; -1 where absent
    numa: int = -1  # NUMA_ATTRIBUTE; -1 where absent


def slice_devices(resource_slice: Mapping[str, Any]) -> list[SliceDevice]:
    """The devices of one ResourceSlice of our driver, in slice order ([] for another driver's slice).

    CodecError names the device when one of ours lacks a capacity or carries one that does not parse."""
    spec = resource_slice.get("spec") or {}
    if not isinstance(spec, Mapping) or spec.get("driver") != DRIVER:
        return []
    pool = str((spec.get("pool") or {}).get("name") or "")
    found: list[SliceDevice] = []
    for device in spec.get("devices") or ():
        if not isinstance(device, Mapping):
            raise CodecError(f"pool {pool!r}: a device is not an object")
        name = str(device.get("name") or "")
        where = f"pool {pool!r} device {name!r}"
        index = _attribute(device, "index")
        found.append(SliceDevice(
            pool=pool,
            name=name,
            uuid=str(_attribute(device, "uuid") or ""),
            model=str(_attribute(device, "model") or ""),
            index=index if isinstance(index, int) and not isinstance(index, bool) else -1,
            memory_mib=mib_of(_capacity(device, CAPACITY_MEMORY), f"{where} capacity memory"),
            cores=cores_of(_capacity(device, CAPACITY_CORES), f"{where} capacity cores"),
            shared=bool(device.get("allowMultipleAllocations")),
            island=_small_int(_attribute(device, ISLAND_ATTRIBUTE)),
            numa=_small_int(_attribute(device, NUMA_ATTRIBUTE)),
        ))
    return found


@dataclass(frozen=True, slots=True)
class ClaimShare:
    """What one allocation result of our driver takes from one device."""

    request: str
    pool: str
    device: str
    memory_mib: int
    cores: int
    share_id: str


def claim_consumption(claim: Mapping[str, Any], whole: Mapping[tuple[str, str], SliceDevice] | None = None,
                      ) -> list[ClaimShare]:
    """The shares an allocated ResourceClaim holds on our driver's devices ([] when it is not allocated).

    A result without consumedCapacity (a device allocated whole) takes the device's full capacity when the device
    is known from `whole` (keyed by (pool, device)), else nothing of it can be known and CodecError is raised."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = ((allocation.get("devices") or {}).get("results") or ()) if isinstance(allocation, Mapping) else ()
    uid = (claim.get("metadata") or {}).get("uid", "")
    shares: list[ClaimShare] = []
    for result in results:
        if not isinstance(result, Mapping) or result.get("driver") != DRIVER:
            continue
        pool, device = str(result.get("pool") or ""), str(result.get("device") or "")
        where = f"claim {uid} result {result.get('request')!r} device {pool}/{device}"
        consumed = result.get("consumedCapacity")
        if isinstance(consumed, Mapping) and consumed:
            memory = mib_of(consumed.get(CAPACITY_MEMORY, 0), f"{where} consumed memory")
            cores = cores_of(consumed.get(CAPACITY_CORES, 0), f"{where} consumed cores")
        else:
            known = (whole or {}).get((pool, device))
            if known is None:
                raise CodecError(f"{where}: no consumedCapacity and the device is not published")
            memory, cores = known.memory_mib, known.cores
        shares.append(ClaimShare(str(result.get("request") or ""), pool, device, memory, cores,
                                 str(result.get("shareID") or "")))
    return shares
