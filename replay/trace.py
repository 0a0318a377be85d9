"""A GPU-cluster trace: the node and pod lists of the Alibaba openb trace, read and mapped to our resources.

Trace rows map to our resources as `vgpu-number = num_gpu`, `vgpu-cores = gpu_milli / 10` (rounded down; the exact
share is carried by memory) and `vgpu-memory = card MiB * gpu_milli / 1000`. Memory is counted in units of 1/1000
MiB (`MEMORY_UNITS_PER_MIB`) so that this product is exact and fit enforces exactly the trace's milli-GPU.
Qos and phase are not read; creation and deletion times are kept for the departures replay (`replay.events`) and
ignored by the FGD protocol, as in the published experiments.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vgpu.errors import ConfigError
from vgpu.requests import ContainerRequest, Selectors
from vgpu.scheduler.policies.base import PodContext

__all__ = [
    "CARD_MIB",
    "DEFAULT_CARD_MIB",
    "DEVICE_PREFIX",
    "MEMORY_UNITS_PER_MIB",
    "SPLIT",
    "ShareRequest",
    "Trace",
    "TraceNode",
    "TracePod",
    "load_nodes",
    "load_pods",
]


# GPU model -> card memory in MiB. G2/G3 are undisclosed Alibaba models; 32 GiB is our assumption. Only the
# absolute memory figures depend on it: every trace request is a share of whichever card it lands on.
CARD_MIB: dict[str, int] = {
    "G2": 32768,
    "G3": 32768,
    "T4": 16384,
    "P100": 16384,
    "V100M16": 16384,
    "V100M32": 32768,
    "A10": 24576,
}
DEFAULT_CARD_MIB = 16384
MEMORY_UNITS_PER_MIB = 1000
SPLIT = 1000  # containers per GPU; gpu_milli >= 50 means at most 20 share a GPU, so this never binds
DEVICE_PREFIX = "NVIDIA-"


@dataclass(frozen=True, slots=True)
class ShareRequest(ContainerRequest):
    """A container request whose memory is `permille`/1000 of whichever card it lands on."""

    permille: int = 0

    def memory_on(self, card_memory: int) -> int:
        """Memory units taken on a card of `card_memory` units (exact when the card is a multiple of 1000)."""
        return card_memory * self.permille // 1000


@dataclass(frozen=True, slots=True)
class TraceNode:
    """One row of the node list; `islands`, the NVLink islands its GPUs form (equal runs of consecutive GPUs, each
    its own NUMA node), is not in the trace (0: not known; a topology variant sets it, replay/variants.py)."""

    name: str
    cpu: int
    memory: int
    gpus: int
    model: str
    islands: int = 0


@dataclass(frozen=True, slots=True)
class TracePod:
    """One row of a pod list (qos and phase are ignored; `created` and `deleted` are the trace's times in seconds,
    -1 when absent)."""

    name: str
    cpu: int
    memory: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()
    created: int = -1
    deleted: int = -1

    @property
    def gpu_total(self) -> int:
        """Milli-GPU requested over all its GPUs."""
        return self.num_gpu * self.gpu_milli

    def requests(self) -> tuple[ContainerRequest, ...]:
        """The pod's vGPU requests in our resources (empty for a CPU-only pod)."""
        if self.num_gpu == 0:
            return ()
        return (
            ShareRequest(
                container="main",
                init=False,
                count=self.num_gpu,
                memory=0,
                memory_percent=0,
                cores=self.gpu_milli // 10,
                permille=self.gpu_milli,
            ),
        )

    def selectors(self) -> Selectors:
        """The GPU-model allow list as a type selector."""
        return Selectors(use_types=tuple(s.lower() for s in self.gpu_spec))

    def context(self) -> PodContext:
        """CPU, memory and selectors for the policies."""
        return PodContext(cpu=self.cpu, memory=self.memory, selectors=self.selectors())


def _int(row: dict[str, str], column: str, where: str) -> int:
    try:
        return int(float(row[column] or 0))
    except (KeyError, ValueError):
        raise ConfigError(f"{where}: column {column!r} is missing or not a number") from None


def _time(row: dict[str, str], column: str, where: str) -> int:
    """An optional time column: -1 when the column is absent or empty."""
    if not row.get(column):
        return -1
    return _int(row, column, where)


def _rows(path: str | Path, flag: str) -> Iterator[tuple[str, dict[str, str]]]:
    """(where, row) of each data row of a CSV file; an unreadable or non-text file is a ConfigError naming `flag`."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            for line, row in enumerate(csv.DictReader(fh), start=2):
                yield f"{path} line {line}", row
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot read {path}: {exc.strerror}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"{flag}: {path} is not a CSV text file ({exc.__class__.__name__})") from None


def load_nodes(path: str | Path) -> list[TraceNode]:
    """Read `sn,cpu_milli,memory_mib,gpu,model`, sorted by name."""
    nodes: list[TraceNode] = []
    for where, row in _rows(path, "--nodes"):
        nodes.append(
            TraceNode(
                name=row.get("sn") or row.get("name") or f"node-{len(nodes) + 1}",
                cpu=_int(row, "cpu_milli", where),
                memory=_int(row, "memory_mib", where),
                gpus=_int(row, "gpu", where),
                model=(row.get("model") or "").strip(),
            )
        )
    if not nodes:
        raise ConfigError(f"--nodes: {path} has no nodes")
    return sorted(nodes, key=lambda n: n.name)


def load_pods(path: str | Path) -> list[TracePod]:
    """Read a pod list, sorted by name; CPU-only rows get gpu_milli 0."""
    pods: list[TracePod] = []
    for where, row in _rows(path, "--pods"):
        num_gpu = _int(row, "num_gpu", where)
        milli = _int(row, "gpu_milli", where) if num_gpu else 0
        if num_gpu and not 0 < milli <= 1000:
            raise ConfigError(f"{where}: gpu_milli {milli} is outside 1..1000")
        spec = tuple(s for s in (row.get("gpu_spec") or "").split("|") if s.strip()) if num_gpu else ()
        if not row.get("name"):
            raise ConfigError(f"{where}: no name")
        pods.append(
            TracePod(
                name=row["name"],
                cpu=_int(row, "cpu_milli", where),
                memory=_int(row, "memory_mib", where),
                num_gpu=num_gpu,
                gpu_milli=milli,
                gpu_spec=spec,
                created=_time(row, "creation_time", where),
                deleted=_time(row, "deletion_time", where),
            )
        )
    if not pods:
        raise ConfigError(f"--pods: {path} has no pods")
    return sorted(pods, key=lambda p: p.name)


@dataclass(slots=True)
class Trace:
    """A loaded trace: nodes and pods."""

    nodes: list[TraceNode]
    pods: list[TracePod]

    @classmethod
    def load(cls, nodes: str | Path, pods: str | Path) -> Trace:
        return cls(load_nodes(nodes), load_pods(pods))
