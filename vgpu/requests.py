"""Pod spec -> per-container vGPU requests, with the contract's defaults and validation.

Pods are dicts in the Kubernetes API JSON form. The scheduler calls `pod_requests` on every pod it places and
the device plugin calls it to find which containers take GPUs. Containers are taken in kubelet's admission order
(init containers, then containers); only containers that ask for vGPU resources yield a request, and the i-th
request corresponds to the i-th segment of the assignment annotation.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from vgpu import keys
from vgpu.errors import CodecError, RequestError
from vgpu.quantity import parse_integer_quantity, parse_quantity
from vgpu.resources import ResourceNames, SharingConfig
from vgpu.units import MIB, MemoryUnit

__all__ = [
    "MAX_GPUS_PER_CONTAINER",
    "MAX_MEMORY_UNITS",
    "MAX_NODE_QUANTITY",
    "ContainerRequest",
    "Selectors",
    "cores_ceiling",
    "gpu_containers",
    "pod_cpu_memory",
    "pod_requests",
    "pod_resource_requests",
    "pod_selectors",
    "resource_amount",
]

MAX_GPUS_PER_CONTAINER = 64
MAX_MEMORY_UNITS = 2**31 - 1
# The most CPU (millicores) or memory (MiB) one pod or node is counted with: 2**40 is about a billion cores or an
# exbibyte, more than any node has, and sums of many such values stay far inside int64 wherever they are added up.
MAX_NODE_QUANTITY = 2**40


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """What one container asks of each of its GPUs.

    `memory` is in memory units; when it is 0 the container asked for `memory_percent` of each card.
    """

    container: str
    init: bool
    count: int
    memory: int
    memory_percent: int
    cores: int

    def memory_on(self, card_memory: int) -> int:
        """Memory units this container takes on a card with `card_memory` units."""
        if self.memory:
            return self.memory
        return card_memory * self.memory_percent // 100


@dataclass(frozen=True, slots=True)
class Selectors:
    """User constraints on which GPUs a pod may use (pod annotations of the contract)."""

    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: frozenset[str] = frozenset()
    nouse_uuids: frozenset[str] = frozenset()
    mode: str = ""
    gpu_order: str = ""  # binpack or spread: the pod's own GPU order inside a node; "" = the scheduler's
    node_order: str = ""  # binpack or spread: the pod's own node score; "" = the scheduler's node policy

    def type_allowed(self, card_type: str) -> bool:
        """Case-insensitive substring match of the card type against the use/nouse lists (use wins)."""
        lowered = card_type.lower()
        if self.use_types:
            return any(word in lowered for word in self.use_types)
        return not any(word in lowered for word in self.nouse_types)

    def uuid_allowed(self, uuid: str) -> bool:
        """Exact UUID match against the allow and deny lists (deny wins)."""
        if uuid in self.nouse_uuids:
            return False
        return not self.use_uuids or uuid in self.use_uuids


def _split_list(value: str | None, lower: bool = False) -> list[str]:
    if not value:
        return []
    items = (item.strip() for item in value.split(","))
    return [item.lower() if lower else item for item in items if item]


def pod_selectors(pod: Mapping[str, Any]) -> Selectors:
    """Read the GPU type, UUID and mode selectors and HAMi's GPU and node orders from a pod's annotations (a UUID
    list under Volcano's or HAMi's name, or both: the UUIDs of either)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return Selectors(
        use_types=tuple(_split_list(annotations.get(keys.USE_GPU_TYPE), lower=True)),
        nouse_types=tuple(_split_list(annotations.get(keys.NOUSE_GPU_TYPE), lower=True)),
        use_uuids=frozenset(_split_list(annotations.get(keys.USE_GPU_UUID))
                            + _split_list(annotations.get(keys.HAMI_USE_GPU_UUID))),
        nouse_uuids=frozenset(_split_list(annotations.get(keys.NOUSE_GPU_UUID))
                              + _split_list(annotations.get(keys.HAMI_NOUSE_GPU_UUID))),
        mode=(annotations.get(keys.VGPU_MODE) or "").strip(),
        gpu_order=_order_word(annotations.get(keys.HAMI_GPU_SCHEDULER_POLICY)),
        node_order=_order_word(annotations.get(keys.HAMI_NODE_SCHEDULER_POLICY)),
    )


def cores_ceiling(pod: Mapping[str, Any]) -> int:
    """The pod's idle-share ceiling (`vgpu-sharing.io/cores-ceiling`, a whole percent 1..100 of each GPU); 0 when
    absent. Raises CodecError naming the annotation for any other value."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.CORES_CEILING)
    if raw is None:
        return 0
    text = str(raw).strip()
    if not text.isdigit() or not 1 <= int(text) <= 100:
        raise CodecError(f"annotation {keys.CORES_CEILING}: {raw!r} is not a whole percent of a GPU, 1 to 100")
    return int(text)


def _order_word(value: str | None) -> str:
    """HAMi's hami.io/gpu-scheduler-policy and node-scheduler-policy: binpack or spread (any case); anything else is
    not an order and leaves the scheduler's."""
    word = (value or "").strip().lower()
    return word if word in keys.GPU_ORDER_NAMES else ""


def gpu_containers(pod: Mapping[str, Any]) -> list[tuple[dict[str, Any], bool]]:
    """All containers of a pod in kubelet's admission order, each with whether it is an init container."""
    spec = pod.get("spec") or {}
    ordered: list[tuple[dict[str, Any], bool]] = []
    for field, is_init in (("initContainers", True), ("containers", False)):
        for container in spec.get(field) or ():
            if isinstance(container, dict):
                ordered.append((container, is_init))
    return ordered


def resource_amount(name: str, raw: Any) -> Fraction:
    """A resource quantity as kube-scheduler counts it: CPU in milli, the rest in its own unit; 0 when it does not
    parse."""
    try:
        value = parse_quantity(raw)
    except ValueError:
        return Fraction(0)
    return value * 1000 if name == "cpu" else value


def _container_requests(container: Mapping[str, Any]) -> dict[str, Fraction]:
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        return {}
    requests = dict(resources.get("limits") or {})  # the API server defaults absent requests to the limits
    requests.update(resources.get("requests") or {})
    return {str(name): resource_amount(str(name), raw) for name, raw in requests.items()}


def pod_resource_requests(pod: Mapping[str, Any]) -> dict[str, Fraction]:
    """kube-scheduler's view of what a pod takes from its node, per resource (CPU in milli, the rest in its own
    unit), as k8s.io/component-helpers resource/helpers.go `PodRequests` computes it: the sum over its containers
    and its sidecars (init containers with `restartPolicy: Always`, which keep running), or, if larger, what each
    ordinary init container needs beside the sidecars started before it; pod-level requests
    (`spec.resources.requests`, which the API server fills in where only pod-level limits were written) replace the
    sum for CPU, memory and hugepages; then the pod overhead is added. Values that do not parse count as 0."""
    spec = pod.get("spec") or {}
    total: dict[str, Fraction] = {}
    for container in spec.get("containers") or ():
        if isinstance(container, Mapping):
            _add(total, _container_requests(container))
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for container in spec.get("initContainers") or ():
        if not isinstance(container, Mapping):
            continue
        own = _container_requests(container)
        if container.get("restartPolicy") == "Always":
            _add(total, own)
            _add(sidecars, own)
            during = sidecars
        else:
            during = dict(own)
            _add(during, sidecars)
        for name, value in during.items():
            if value > init_peak.get(name, Fraction(0)):
                init_peak[name] = value
    for name, value in init_peak.items():
        if value > total.get(name, Fraction(0)):
            total[name] = value
    pod_level = spec.get("resources")
    if isinstance(pod_level, Mapping) and isinstance(pod_level.get("requests"), Mapping):
        for name, raw in pod_level["requests"].items():
            if name in ("cpu", "memory") or str(name).startswith("hugepages-"):
                total[str(name)] = resource_amount(str(name), raw)
    overhead = spec.get("overhead")
    if isinstance(overhead, Mapping):
        _add(total, {str(name): resource_amount(str(name), raw) for name, raw in overhead.items()})
    return total


def _add(total: dict[str, Fraction], more: Mapping[str, Fraction]) -> None:
    for name, value in more.items():
        total[name] = total.get(name, Fraction(0)) + value


def pod_cpu_memory(pod: Mapping[str, Any]) -> tuple[int, int]:
    """The CPU (milli) and memory (MiB) a pod takes from its node (`pod_resource_requests`), rounded up and at most
    MAX_NODE_QUANTITY each."""
    total = pod_resource_requests(pod)
    cpu = math.ceil(total.get("cpu", Fraction(0)))
    memory = math.ceil(total.get("memory", Fraction(0)) / MIB)
    return min(max(0, cpu), MAX_NODE_QUANTITY), min(max(0, memory), MAX_NODE_QUANTITY)


def _lookup(resources: Mapping[str, Any], names: tuple[ResourceNames, ...], attr: str) -> tuple[str, Any]:
    """Find a resource value in limits, then requests, under the first name set that has it."""
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    for name_set in names:
        name = getattr(name_set, attr)
        for table in (limits, requests):
            if isinstance(table, Mapping) and name in table:
                return name, table[name]
    return getattr(names[0], attr), None


def _name_sets(resources: Mapping[str, Any], config: SharingConfig) -> tuple[ResourceNames, ...]:
    """The name sets to read for one container: under `hami_names: shared`, HAMi's set only where the container asks
    for one of HAMi's share names (nvidia.com/gpu alone is a whole GPU of NVIDIA's device plugin, not ours)."""
    names = config.name_sets()
    if len(names) < 2 or config.hami_mode() != "shared":
        return names
    tables = [t for t in (resources.get("limits"), resources.get("requests")) if isinstance(t, Mapping)]
    if any(name in table for name in names[1].shares() for table in tables):
        return names
    return names[:1]


def _integer(container: str, resource: str, raw: Any, low: int, high: int, mib_per_unit: int = 0) -> int:
    """A whole quantity within [low, high]; `mib_per_unit` (memory) makes the message of a quantity written in bytes
    (`4Gi`) say what the number counts and what to write instead."""
    try:
        value = parse_integer_quantity(raw)
    except ValueError as exc:
        raise RequestError(container, resource, f"{exc}; expected a whole number") from None
    if value < low:
        raise RequestError(container, resource, f"{raw!r} is below {low}")
    if value > high:
        hint = ""
        per_unit = MemoryUnit(mib_per_unit).bytes(1) if mib_per_unit else 0
        if per_unit and value % per_unit == 0:
            unit = "MiB" if mib_per_unit == 1 else f"units of {mib_per_unit} MiB"
            hint = (f": it counts {unit} per GPU, not bytes, so {raw!r} asks {value} of them; "
                    f"for {raw} of memory write {value // per_unit}")
        raise RequestError(container, resource, f"{raw!r} is above {high}{hint}")
    return value


def _container_request(
    container: Mapping[str, Any], is_init: bool, config: SharingConfig
) -> ContainerRequest | None:
    name = str(container.get("name") or "")
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        return None
    names = _name_sets(resources, config)
    n_name, n_raw = _lookup(resources, names, "number")
    m_name, m_raw = _lookup(resources, names, "memory")
    p_name, p_raw = _lookup(resources, names, "memory_percentage")
    c_name, c_raw = _lookup(resources, names, "cores")
    if n_raw is None and m_raw is None and p_raw is None and c_raw is None:
        return None

    memory = 0 if m_raw is None else _integer(name, m_name, m_raw, 0, MAX_MEMORY_UNITS, config.gpu_memory_factor)
    percent = 0 if p_raw is None else _integer(name, p_name, p_raw, 0, 100)
    cores = config.default_cores if c_raw is None else _integer(name, c_name, c_raw, 0, 100)
    if n_raw is None:
        count = 1
    else:
        count = _integer(name, n_name, n_raw, 0, MAX_GPUS_PER_CONTAINER)
        if count == 0:
            if memory or percent or (c_raw is not None and cores):
                raise RequestError(name, n_name, "is 0 while memory or cores are requested")
            return None
    if memory == 0 and percent == 0 and c_raw is None and config.exclusive_whole_gpu and not config.default_memory:
        cores = 100  # whole-GPU mode: what users of nvidia.com/gpu: 1 expect
    if memory == 0 and percent == 0:
        if config.default_memory:
            memory = config.default_memory
        else:
            percent = 100
    if memory:
        percent = 0
    return ContainerRequest(name, is_init, count, memory, percent, cores)


def pod_requests(pod: Mapping[str, Any], config: SharingConfig) -> tuple[ContainerRequest, ...]:
    """Per-container vGPU requests of a pod, in admission order; raises RequestError on invalid values."""
    requests = []
    for container, is_init in gpu_containers(pod):
        request = _container_request(container, is_init, config)
        if request is not None:
            requests.append(request)
    return tuple(requests)
