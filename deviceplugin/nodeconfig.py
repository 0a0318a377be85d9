"""Per-node configuration of the device plugin: one file for the whole cluster, one entry per node name.

The chart renders `devicePlugin.nodeConfiguration` into a ConfigMap that every device-plugin pod mounts, and the
plugin is pointed at it with `--node-config` (`NODE_CONFIG_FILE`, `flags.vgpu.nodeConfigFile`). The file:

    nodeConfig:
      - name: gpu-node-1          # the node's name, as --node-name
        splitCount: 4             # vgpu-number devices per GPU on this node (sharing.split_count)
        filterDevices:            # GPUs this node's plugin leaves alone: not advertised, never granted
          uuid: [GPU-0c9b...]
          index: [3]
        memoryScaling: 1          # only 1: device memory is never oversubscribed (anything else is refused)

HAMi's lower-case spellings (`nodeconfig`, `devicesplitcount`, `devicememoryscaling`, `filterdevices`) are read
too, so an entry copied from HAMi's device-plugin ConfigMap carries over.

Only the entry whose name is this node's applies; it wins over every other source (it is the most specific).
A problem in this node's entry stops the plugin with one line naming the node and the field; a malformed entry
of another node is logged and skipped, so that one typo does not take every node's plugin down.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpu.configfile import read_yaml_mapping
from vgpu.errors import ConfigError
from vgpu.node.backends import GPUInfo

__all__ = ["NodeEntry", "excluded", "node_entry", "parse_entry", "read_node_config"]

log = logging.getLogger(__name__)

LABEL = "--node-config"
_SPLIT_MAX = 1000  # vgpu.resources.SharingConfig.split_count's bound
# key as written -> canonical key (ours, camelCase; HAMi's, lower case)
_ENTRY_KEYS = {
    "name": "name",
    "splitCount": "splitCount", "devicesplitcount": "splitCount",
    "memoryScaling": "memoryScaling", "devicememoryscaling": "memoryScaling",
    "filterDevices": "filterDevices", "filterdevices": "filterDevices",
}
_FILTER_KEYS = ("uuid", "index")


@dataclass(frozen=True, slots=True)
class NodeEntry:
    """The settings one node's entry gives (None / empty: not given)."""

    name: str
    split_count: int | None = None
    exclude_uuids: tuple[str, ...] = ()
    exclude_indices: tuple[int, ...] = ()
    keys: tuple[str, ...] = field(default=())  # the canonical keys the entry set, for the start-up log

    def exclude_devices(self) -> list[str]:
        """The excluded GPUs as PluginConfig.exclude_devices holds them: UUIDs, then indices as text."""
        return [*self.exclude_uuids, *(str(i) for i in self.exclude_indices)]


def _int(value: Any, what: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{what}: expected an integer, got {value!r}")
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{what}: expected an integer, got {value!r}") from None
    if number < low or (high is not None and number > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise ValueError(f"{what}: must be {bound}, got {number}")
    return number


def parse_entry(raw: Any) -> NodeEntry:
    """One entry of the file -> NodeEntry; raises ValueError whose text starts with the field."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"expected a mapping with a name, got {raw!r}")
    canonical: dict[str, Any] = {}
    for key, value in raw.items():
        name = _ENTRY_KEYS.get(str(key))
        if name is None:
            raise ValueError(f"{key}: unknown key (expected name, splitCount, filterDevices, memoryScaling)")
        if name in canonical:
            raise ValueError(f"{key}: given twice (in two spellings)")
        canonical[name] = value
    node = canonical.get("name")
    if not isinstance(node, str) or not node.strip():
        raise ValueError(f"name: expected the node's name, got {node!r}")
    split = None
    if canonical.get("splitCount") is not None:
        split = _int(canonical["splitCount"], "splitCount", 1, _SPLIT_MAX)
    scaling = canonical.get("memoryScaling")
    if scaling is not None:
        if isinstance(scaling, bool) or not isinstance(scaling, int | float | str):
            raise ValueError(f"memoryScaling: expected a number, got {scaling!r}")
        try:
            factor = float(str(scaling).strip())
        except ValueError:
            raise ValueError(f"memoryScaling: expected a number, got {scaling!r}") from None
        if factor != 1:
            raise ValueError(
                f"memoryScaling: {scaling} is not supported: vgpu-sharing never oversubscribes device memory "
                "(the grants on a GPU add up to at most its memory); remove the key or set it to 1")
    uuids: list[str] = []
    indices: list[int] = []
    filters = canonical.get("filterDevices")
    if filters is not None:
        if not isinstance(filters, Mapping):
            raise ValueError(f"filterDevices: expected a mapping with uuid and/or index lists, got {filters!r}")
        for key in filters:
            if key not in _FILTER_KEYS:
                raise ValueError(f"filterDevices.{key}: unknown key (expected uuid, index)")
        for position, uuid in enumerate(_list(filters.get("uuid"), "filterDevices.uuid")):
            if not isinstance(uuid, str) or not uuid.strip() or any(c.isspace() or c == "," for c in uuid.strip()):
                raise ValueError(f"filterDevices.uuid[{position}]: expected a GPU UUID, got {uuid!r}")
            uuids.append(uuid.strip())
        for position, index in enumerate(_list(filters.get("index"), "filterDevices.index")):
            indices.append(_int(index, f"filterDevices.index[{position}]", 0))
    return NodeEntry(name=node.strip(), split_count=split, exclude_uuids=tuple(dict.fromkeys(uuids)),
                     exclude_indices=tuple(dict.fromkeys(indices)),
                     keys=tuple(k for k in ("splitCount", "filterDevices", "memoryScaling") if k in canonical))


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{what}: expected a list, got {value!r}")
    return value


def read_node_config(path: str) -> list[Any]:
    """The raw entries of a node-configuration file; raises ConfigError when the file itself is unusable."""
    data = read_yaml_mapping(path, LABEL)
    keys = [k for k in data if k in ("nodeConfig", "nodeconfig")]
    unknown = [k for k in data if k not in ("nodeConfig", "nodeconfig")]
    if unknown:
        raise ConfigError(f"{LABEL} {path}: {unknown[0]}: unknown key (expected nodeConfig)")
    if len(keys) > 1:
        raise ConfigError(f"{LABEL} {path}: nodeConfig: given twice (nodeConfig and nodeconfig)")
    entries = data.get(keys[0]) if keys else []
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise ConfigError(f"{LABEL} {path}: nodeConfig: expected a list of entries, got {type(entries).__name__}")
    return entries


def node_entry(path: str, node_name: str) -> NodeEntry | None:
    """This node's entry of the file at `path` (None: the file has none).

    Raises ConfigError (one line naming the file, the node and the field) when this node's entry is malformed or
    given twice; entries of other nodes that do not parse are logged and skipped."""
    mine: list[NodeEntry] = []
    for position, raw in enumerate(read_node_config(path)):
        name = raw.get("name") if isinstance(raw, Mapping) else None
        try:
            entry = parse_entry(raw)
        except ValueError as exc:
            if isinstance(name, str) and name.strip() == node_name:
                raise ConfigError(f"{LABEL} {path}: node {node_name}: {exc}") from None
            who = f"node {name}" if isinstance(name, str) and name.strip() else f"entry {position}"
            log.warning("event=node_config_entry_ignored file=%s entry=%d: %s: %s", path, position, who, exc)
            continue
        if entry.name == node_name:
            mine.append(entry)
    if len(mine) > 1:
        raise ConfigError(f"{LABEL} {path}: node {node_name}: {len(mine)} entries name this node (expected one)")
    return mine[0] if mine else None


def excluded(gpus: Iterable[GPUInfo], exclude: Iterable[str]) -> tuple[list[GPUInfo], list[GPUInfo], list[str]]:
    """(kept, excluded, unmatched): the GPUs split by `exclude` (UUIDs, or NVML indices as decimal text), and the
    entries of `exclude` that named no GPU of this node."""
    wanted = [str(e).strip() for e in exclude if str(e).strip()]
    kept: list[GPUInfo] = []
    dropped: list[GPUInfo] = []
    matched: set[str] = set()
    for gpu in gpus:
        hits = {e for e in wanted if e == gpu.uuid or (e.isdigit() and int(e) == gpu.nvml_index)}
        if hits:
            dropped.append(gpu)
            matched |= hits
        else:
            kept.append(gpu)
    return kept, dropped, [e for e in wanted if e not in matched]
