"""The fitting engine: can this node's GPUs hold this pod, and on which GPUs?

Pure functions over the node's published devices, their current usage and the pod's requests; the extender's
/filter and the trace replay both call `fit`. Containers are placed in admission order and each one's choice counts
for the next. A container with `count: n` takes n distinct GPUs of the node. Each container first takes the GPUs
the order puts first; when a later container then fits nowhere, earlier ones try their other choices (depth
first, in the order's order, as Kubernetes' structured DRA allocator backtracks), so a node is refused only when
no choice at all places the pod (or the search has tried `SEARCH_BUDGET` choices).

Topology (`topology=True`, where the node publishes NVLink islands: `GPUDevice.island` not all -1): a container
that needs n >= 2 GPUs takes n GPUs of one island when some island has them, else of one NUMA node, else any
(`_choices`); without islands, or with `topology=False`, the choice is the order's first n GPUs.
"""

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from vgpu import keys
from vgpu.assignment import Assignment, DeviceGrant
from vgpu.inventory import GPUDevice
from vgpu.requests import ContainerRequest, Selectors

__all__ = [
    "GPU_ORDERS", "SEARCH_BUDGET", "FitResult", "GPUOrder", "GPUUsage", "Reason", "binpack_order", "fit",
    "gpu_takes", "grants_on", "spread_order", "topology_known", "topology_tier",
]

SEARCH_BUDGET = 20_000  # choices of GPUs for one container tried before a node is given up


@dataclass(slots=True)
class GPUUsage:
    """What is already allocated on one GPU: containers (shares), memory units and cores."""

    shares: int = 0
    memory: int = 0
    cores: int = 0

    def add(self, memory: int, cores: int) -> None:
        """Charge one container."""
        self.shares += 1
        self.memory += memory
        self.cores += cores

    def sub(self, memory: int, cores: int) -> None:
        """Release one container."""
        self.shares -= 1
        self.memory -= memory
        self.cores -= cores


class Reason:
    """Why a GPU was rejected for a container (the words appear in FailedNodes messages)."""

    UNHEALTHY = "unhealthy"
    MODE = "sharing mode mismatch"
    TYPE = "type not allowed"
    UUID = "uuid not allowed"
    SHARES = "no free share"
    MEMORY = "insufficient memory"
    CORES = "insufficient cores"
    EXCLUSIVE = "exclusive conflict"
    TOO_SMALL = "card smaller than request"


@dataclass(slots=True)
class FitResult:
    """The outcome of fitting one pod on one node.

    On success `placement` holds, per requesting container, the indices of its GPUs in the node's device list, and
    `assignment` the grants to encode. On failure `reason` explains it and `unresolvable` says no amount of freed
    usage would help (wrong type, too few GPUs, cards too small).
    """

    ok: bool
    placement: tuple[tuple[int, ...], ...] = ()
    assignment: Assignment = ()
    reason: str = ""
    unresolvable: bool = False


# Given devices, the tentative usage, the request and the GPU indices that fit, return them best first.
GPUOrder = Callable[[Sequence[GPUDevice], Sequence[GPUUsage], ContainerRequest, list[int]], list[int]]


def binpack_order(
    devices: Sequence[GPUDevice], usage: Sequence[GPUUsage], request: ContainerRequest, candidates: list[int]
) -> list[int]:
    """Fullest GPUs first: least free memory after placement, then most used cores, then lowest index."""

    def key(i: int) -> tuple[int, int, int]:
        free = devices[i].memory - usage[i].memory - request.memory_on(devices[i].memory)
        return (free, -usage[i].cores, i)

    return sorted(candidates, key=key)


def spread_order(
    devices: Sequence[GPUDevice], usage: Sequence[GPUUsage], request: ContainerRequest, candidates: list[int]
) -> list[int]:
    """Emptiest GPUs first: fewest containers, then most free memory, then lowest index."""

    def key(i: int) -> tuple[int, int, int]:
        return (usage[i].shares, usage[i].memory - devices[i].memory, i)

    return sorted(candidates, key=key)


GPU_ORDERS: dict[str, GPUOrder] = {"binpack": binpack_order, "spread": spread_order}

_STATIC = (Reason.MODE, Reason.TYPE, Reason.UUID, Reason.TOO_SMALL)


_DEVICE_TYPE = keys.DEVICE_TYPE.lower()
_MEMO_LIMIT = 4096  # entries of the memos below before they start over
# (card type, use types, nouse types) -> whether the card may take the pod's containers; fits ask it for every node
_TYPE_OK: dict[tuple[str, tuple[str, ...], tuple[str, ...]], bool] = {}
# (container, GPUs asked, GPUs of the node, *(reason, GPUs)) -> the failure message `_summary` makes of it
_SUMMARIES: dict[tuple[object, ...], str] = {}


def _type_ok(device_type: str, selectors: Selectors) -> bool:
    key = (device_type, selectors.use_types, selectors.nouse_types)
    ok = _TYPE_OK.get(key)
    if ok is None:
        if len(_TYPE_OK) >= _MEMO_LIMIT:
            _TYPE_OK.clear()
        ok = _TYPE_OK[key] = _DEVICE_TYPE in device_type.lower() and selectors.type_allowed(device_type)
    return ok


def _reject(
    device: GPUDevice, used: GPUUsage, request: ContainerRequest, memory: int, selectors: Selectors, type_ok: bool
) -> str | None:
    """The first reason this GPU cannot take the container now, or None if it can."""
    if selectors.mode and selectors.mode != device.mode:
        return Reason.MODE
    if not type_ok:
        return Reason.TYPE
    if not selectors.uuid_allowed(device.uuid):
        return Reason.UUID
    if memory > device.memory:
        return Reason.TOO_SMALL
    if not device.healthy:
        return Reason.UNHEALTHY
    if used.shares >= device.split:
        return Reason.SHARES
    if device.memory - used.memory < memory:
        return Reason.MEMORY
    if used.cores + request.cores > 100:
        return Reason.CORES
    if request.cores == 100 and used.shares > 0:
        return Reason.EXCLUSIVE
    if used.cores >= 100 and request.cores == 0:
        return Reason.EXCLUSIVE
    return None


def gpu_takes(device: GPUDevice, used: GPUUsage, request: ContainerRequest, selectors: Selectors) -> bool:
    """Whether this GPU, so used, can take one more container of the request (one of its GPUs)."""
    return _reject(device, used, request, request.memory_on(device.memory), selectors,
                   _type_ok(device.type, selectors)) is None


def _summary(container: str, count: int, total: int, rejected: dict[str, int]) -> str:
    key = (container, count, total, *rejected.items())
    text = _SUMMARIES.get(key)
    if text is None:
        parts = ", ".join(f"{n} {why}" for why, n in sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0])))
        detail = f" ({parts})" if parts else ""
        text = f"container {container!r} needs {count} GPU(s): {total - sum(rejected.values())}/{total} fit{detail}"
        if len(_SUMMARIES) >= _MEMO_LIMIT:
            _SUMMARIES.clear()
        _SUMMARIES[key] = text
    return text


_NO_SELECTORS = Selectors()


def grants_on(devices: Sequence[GPUDevice], requests: Sequence[ContainerRequest],
              placement: Sequence[Sequence[int]]) -> Assignment:
    """The grants of a placement (GPU indices per requesting container) on these devices."""
    return tuple(
        tuple(DeviceGrant(devices[i].uuid, request.memory_on(devices[i].memory), request.cores) for i in indices)
        for request, indices in zip(requests, placement)
    )


def _candidates(devices: Sequence[GPUDevice], usage: Sequence[GPUUsage], request: ContainerRequest,
                selectors: Selectors, type_ok: dict[str, bool]) -> list[int]:
    return [i for i, device in enumerate(devices)
            if _reject(device, usage[i], request, request.memory_on(device.memory), selectors,
                       type_ok[device.type]) is None]


def _charge(devices: Sequence[GPUDevice], tentative: list[GPUUsage], request: ContainerRequest,
            chosen: Sequence[int]) -> None:
    """Charge the request on the chosen GPUs of `tentative` (a private list): the chosen entries are replaced by new
    GPUUsage objects, so the objects the caller passed in are never changed."""
    for i in chosen:
        used = tentative[i]
        tentative[i] = taken = GPUUsage(used.shares, used.memory, used.cores)
        taken.add(request.memory_on(devices[i].memory), request.cores)


def topology_known(devices: Sequence[GPUDevice]) -> bool:
    """Whether the node says which NVLink island its GPUs are in."""
    return any(device.island >= 0 for device in devices)


def topology_tier(devices: Sequence[GPUDevice], placement: Sequence[Sequence[int]]) -> int:
    """How local a placement's worst container is: 0 when its GPUs share an NVLink island (or it has one GPU, or
    the node's islands are unknown), 1 when they share a NUMA node, 2 otherwise."""
    if not topology_known(devices):
        return 0
    tier = 0
    for indices in placement:
        if len(indices) > 1:
            first = devices[indices[0]]
            if first.island < 0 or any(devices[i].island != first.island for i in indices):
                tier = max(tier, 1 if all(devices[i].numa == first.numa for i in indices) else 2)
    return tier


def _groups(devices: Sequence[GPUDevice], ordered: list[int], count: int, attr: str) -> list[list[int]]:
    """Positions in `ordered` of the GPUs of each island or NUMA node (`attr`) that has `count` of them, the group
    with the fewest first (the tightest fit keeps larger groups whole), then by first position."""
    groups: dict[int, list[int]] = {}
    for position, i in enumerate(ordered):
        value = getattr(devices[i], attr)
        if value >= 0:
            groups.setdefault(value, []).append(position)
    return sorted((g for g in groups.values() if len(g) >= count), key=lambda g: (len(g), g[0]))


def _choices(devices: Sequence[GPUDevice], ordered: list[int], count: int,
             topology: bool) -> Iterator[tuple[int, ...]]:
    """The choices of `count` GPUs among `ordered` (best first), in the order they are tried: the order's
    combinations; with topology on a node that knows its islands, those inside one island first, then those inside
    one NUMA node, then the rest (in each group, and among the rest, in the order's order)."""
    if count < 2 or not topology or not topology_known(devices):
        yield from itertools.combinations(ordered, count)
        return
    island = [devices[i].island for i in ordered]
    numa = [devices[i].numa for i in ordered]

    def local(values: list[int], chosen: tuple[int, ...]) -> bool:
        return values[chosen[0]] >= 0 and all(values[p] == values[chosen[0]] for p in chosen)

    for group in _groups(devices, ordered, count, "island"):
        for chosen in itertools.combinations(group, count):
            yield tuple(ordered[p] for p in chosen)
    for group in _groups(devices, ordered, count, "numa"):
        for chosen in itertools.combinations(group, count):
            if not local(island, chosen):
                yield tuple(ordered[p] for p in chosen)
    for chosen in itertools.combinations(range(len(ordered)), count):
        if not local(numa, chosen) and not local(island, chosen):
            yield tuple(ordered[p] for p in chosen)


def _search(devices: Sequence[GPUDevice], usage: Sequence[GPUUsage], requests: Sequence[ContainerRequest],
            selectors: Selectors, type_ok: dict[str, bool], order: GPUOrder,
            topology: bool) -> list[tuple[int, ...]] | None:
    """A placement of every request, trying each one's choices depth first in the order `_choices` gives; None when
    there is none or the budget ran out."""
    budget = SEARCH_BUDGET

    def place(k: int, tentative: list[GPUUsage]) -> list[tuple[int, ...]] | None:
        nonlocal budget
        if k == len(requests):
            return []
        request = requests[k]
        candidates = _candidates(devices, tentative, request, selectors, type_ok)
        if len(candidates) < request.count:
            return None
        for chosen in _choices(devices, order(devices, tentative, request, candidates), request.count, topology):
            budget -= 1
            if budget < 0:
                return None
            after = list(tentative)
            _charge(devices, after, request, chosen)
            rest = place(k + 1, after)
            if rest is not None:
                return [tuple(chosen), *rest]
        return None

    return place(0, list(usage))


def fit(
    devices: Sequence[GPUDevice],
    usage: Sequence[GPUUsage],
    requests: Sequence[ContainerRequest],
    selectors: Selectors = _NO_SELECTORS,
    order: GPUOrder = binpack_order,
    topology: bool = False,
) -> FitResult:
    """Place every requesting container of a pod on this node's GPUs, or say why not; with `topology`, a
    multi-GPU container's GPUs are chosen island first, then NUMA node (module docstring).

    `usage` is not modified; the tentative charges of earlier containers are applied to a copy of the list.
    """
    if not requests:
        return FitResult(ok=True)
    if not devices:
        return FitResult(ok=False, reason="node has no vGPU devices", unresolvable=True)
    tentative = list(usage)  # a GPU a container takes gets a new GPUUsage: the caller's objects are never changed
    type_ok: dict[str, bool] = {}  # per card type: nodes usually have one
    for device in devices:
        if device.type not in type_ok:
            type_ok[device.type] = _type_ok(device.type, selectors)
    placement: list[tuple[int, ...]] = []
    for request in requests:
        if request.count > len(devices):
            return FitResult(
                ok=False,
                reason=f"container {request.container!r} needs {request.count} GPUs, node has {len(devices)}",
                unresolvable=True,
            )
        candidates: list[int] = []
        rejected: dict[str, int] = {}
        static_ok = 0
        for i, device in enumerate(devices):
            why = _reject(
                device, tentative[i], request, request.memory_on(device.memory), selectors, type_ok[device.type]
            )
            if why is None:
                candidates.append(i)
                static_ok += 1
            else:
                rejected[why] = rejected.get(why, 0) + 1
                if why not in _STATIC:
                    static_ok += 1
        if len(candidates) < request.count:
            found = _search(devices, usage, requests, selectors, type_ok, order, topology) if placement else None
            if found is not None:
                placement = found
                break
            return FitResult(
                ok=False,
                reason=_summary(request.container, request.count, len(devices), rejected),
                unresolvable=static_ok < request.count,
            )
        ordered = order(devices, tentative, request, candidates)
        chosen = (next(_choices(devices, ordered, request.count, topology)) if topology and request.count > 1
                  else ordered[: request.count])
        _charge(devices, tentative, request, chosen)
        placement.append(tuple(chosen))
    return FitResult(ok=True, placement=tuple(placement), assignment=grants_on(devices, requests, placement))
