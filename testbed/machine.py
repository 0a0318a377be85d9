"""TEST INFRASTRUCTURE: the test bed's own description of a node's GPUs: the "hardware" of a simulated node.

A node is described by a spec such as `4xA100-40GB` or `1xT4,1xA100-40GB` (`+mig` after a model: MIG mode on).
From it the test bed, and nothing of the product, decides what each GPU is: its NVML name, memory, SM count,
PCI bus number, UUID and place in the node's topology.

Topology, written into the spec (grammar: `ENTRY[,ENTRY...][/numaN]`, ENTRY `[COUNTx]MODEL[+mig][@nvlinkK]`):

- `@nvlinkK` after an entry: its GPUs, in order, form NVLink islands of K (2..16; the entry's count a multiple
  of K), every two GPUs of an island directly linked (each GPU's 18 links shared out among its K-1 peers, as on
  4-GPU HGX boards). `8xH100-80GB@nvlink4` is two islands of four, `8xH100-80GB@nvlink8` one of eight. GPUs of
  an entry without it have no NVLink (NVML answers NOT_SUPPORTED), as PCIe cards.
- `/numaN` at the end: the node's GPUs, in index order, split into N equal runs (the GPU count a multiple of N),
  run i on NUMA node i and its own PCIe root complex: `8xH100-80GB@nvlink4/numa2` puts GPUs 0-3 on NUMA node 0,
  4-7 on node 1. Without it NVML knows no NUMA node (NOT_SUPPORTED) and all GPUs share one root complex.
 The simulated libnvidia-ml.so.1 and libcuda.so.1 (testbed/simgpu) are configured from this
description (`SIMGPU_DEVICES`), the device plugin and the DRA plugin discover the GPUs through that NVML as they do
on a real node, and the pod runner gives each container the GPUs its `NVIDIA_VISIBLE_DEVICES` names, as the NVIDIA
container runtime does, with the bus numbers they have on the node, so CUDA inside numbers them in its own order
(`CUDA_DEVICE_ORDER`), not in grant order. A UUID the node does not have fails the container's start, as
nvidia-container-cli refuses an unknown device.

Model facts (NVIDIA's product names as NVML reports them, memory as NVML reports it in MiB, SM counts; the table in
node/backends/cards.json, which the product's simulated backend reads too) come from NVIDIA's data sheets and
`nvidia-smi -q` output published for each card; the H100's memory is the figure read on an H100 80GB HBM3 (driver
580) for this project. Bus numbers follow the spec's order (one bus per GPU, from 0x17 in steps of 0x20, a spacing
common on servers; 0x0e on a node of more than 8 GPUs, so that 16 fit in the bus number's byte), so NVML's index
order is the spec's order.
"""

from __future__ import annotations

import json
import re
import uuid as uuidlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MODELS", "MachineGPU", "MachineSpecError", "SpecEntry", "UnknownDevice", "machine",
           "parse_machine_spec", "simgpu_env", "total_memory_mib", "visible"]


@dataclass(frozen=True, slots=True)
class Model:
    """One card as NVML describes it."""

    nvml_name: str
    memory_mib: int
    sms: int


# The card table the product's simulated backend loads too (node/backends/cards.json): read as data, by path (the
# test bed's stand-ins import none of the product), from the package's folder beside this one.
CARDS_FILE = Path(__file__).resolve().parents[1] / "node" / "backends" / "cards.json"

# short name (the spec's vocabulary) -> the card
MODELS: dict[str, Model] = {name: Model(card["nvml_name"], card["memory_mib"], card["sms"])
                            for name, card in json.loads(CARDS_FILE.read_text()).items()}

_ENTRY = re.compile(r"^(?:(\d+)x)?([A-Za-z0-9-]+?)(\+mig)?(?:@nvlink(\d+))?$")
_NUMA = re.compile(r"^(.*)/numa(\d+)$")
_MAX_ISLAND = 16  # the simulated library's GPUs per node
_UUID_NAMESPACE = uuidlib.UUID("0b6c3f8e-2d4a-5e71-9c08-7a1f3b5d9e24")  # the test bed's; any fixed UUID would do
_FIRST_BUS, _BUS_STEP, _BUS_STEP_MANY = 0x17, 0x20, 0x0e


class MachineSpecError(ValueError):
    """A node spec the test bed cannot build."""


class UnknownDevice(LookupError):
    """A container was given a GPU UUID its node does not have."""


@dataclass(frozen=True, slots=True)
class MachineGPU:
    """One GPU of a simulated node."""

    index: int  # NVML's index (bus order)
    uuid: str
    name: str
    memory_mib: int
    sms: int
    bus: int
    mig: bool = False
    numa: int | None = None  # NUMA node (also the PCIe root complex); None: not known to NVML
    nvlink_peers: tuple[int, ...] = ()  # PCI buses of the GPUs it has NVLinks to

    def simgpu_entry(self) -> str:
        """This GPU as one `SIMGPU_DEVICES` item (`NAME:MIB:SMS:UUID:FLAGS`)."""
        flags = [f"bus{self.bus:#x}"] + (["mig"] if self.mig else [])
        if self.numa is not None:
            flags += [f"numa{self.numa}", f"root{self.numa}"]
        flags += [f"nvl{peer:#x}" for peer in self.nvlink_peers]
        name = self.name.replace(",", " ").replace(":", " ")
        return f"{name}:{self.memory_mib}:{self.sms}:{self.uuid}:{'+'.join(flags)}"


@dataclass(frozen=True, slots=True)
class SpecEntry:
    """One entry of a node spec: `count` cards of `model`, in NVLink islands of `island` (0: no NVLink)."""

    model: Model
    count: int
    mig: bool = False
    island: int = 0


def parse_machine_spec(spec: str) -> tuple[list[SpecEntry], int]:
    """`8xH100-80GB@nvlink4,1xT4+mig/numa3` -> ([entries], NUMA nodes (0: not said)); raises MachineSpecError
    naming the bad part."""
    numa = 0
    whole = _NUMA.match(spec.strip())
    if whole is not None:
        spec, numa = whole[1], int(whole[2])
        if not 1 <= numa <= 8:
            raise MachineSpecError(f"/numa{numa}: the NUMA node count is outside 1..8")
    out = []
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        match = _ENTRY.match(entry)
        if match is None:
            raise MachineSpecError(f"{entry!r} is not of the form <count>x<model>[+mig][@nvlink<K>]")
        short = next((name for name in MODELS if name.lower() == match[2].lower()), None)
        if short is None:
            raise MachineSpecError(f"unknown model {match[2]!r}; known: {', '.join(MODELS)}")
        count = int(match[1]) if match[1] else 1
        if not 1 <= count <= 64:
            raise MachineSpecError(f"count {count} in {entry!r} is outside 1..64")
        island = int(match[4]) if match[4] else 0
        if match[4] and not (2 <= island <= _MAX_ISLAND and count % island == 0):
            raise MachineSpecError(f"@nvlink{island} in {entry!r}: islands of 2..{_MAX_ISLAND} GPUs that divide "
                                   f"the count")
        out.append(SpecEntry(MODELS[short], count, bool(match[3]), island))
    if not out:
        raise MachineSpecError("no GPUs in the spec")
    total = sum(e.count for e in out)
    if numa and total % numa:
        raise MachineSpecError(f"/numa{numa}: {total} GPUs do not split into {numa} equal NUMA nodes")
    return out, numa


def machine(spec: str, node_name: str) -> list[MachineGPU]:
    """The GPUs of node `node_name` built from `spec`, in NVML (bus) order; UUIDs are stable per node and index."""
    entries, numa = parse_machine_spec(spec)
    total = sum(e.count for e in entries)
    gpus: list[MachineGPU] = []
    for entry in entries:
        first = len(gpus)
        for k in range(entry.count):
            index = first + k
            peers: tuple[int, ...] = ()
            if entry.island:
                start = first + k // entry.island * entry.island
                peers = tuple(_bus(j, total) for j in range(start, start + entry.island) if j != index)
            uid = uuidlib.uuid5(_UUID_NAMESPACE, f"{node_name}#{index}")
            gpus.append(MachineGPU(index=index, uuid=f"GPU-{uid}", name=entry.model.nvml_name,
                                   memory_mib=entry.model.memory_mib, sms=entry.model.sms, bus=_bus(index, total),
                                   mig=entry.mig, numa=index * numa // total if numa else None,
                                   nvlink_peers=peers))
    return gpus


def _bus(index: int, total: int) -> int:
    return _FIRST_BUS + (_BUS_STEP if total <= 8 else _BUS_STEP_MANY) * index


def total_memory_mib(spec: str) -> int:
    """All of a node's GPU memory, MiB."""
    return sum(e.model.memory_mib * e.count for e in parse_machine_spec(spec)[0])


def simgpu_env(gpus: Sequence[MachineGPU], state_dir: Path) -> dict[str, str]:
    """SIMGPU_DEVICES / SIMGPU_STATE for a process that sees `gpus` (one state file per node: the simulator keys
    GPUs by UUID, so every process of the node shares each GPU's memory and timeline)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    env = {"SIMGPU_STATE": str(state_dir / "node.state")}
    if gpus:
        env["SIMGPU_DEVICES"] = ",".join(g.simgpu_entry() for g in gpus)
    return env


def visible(gpus: Iterable[MachineGPU], names: Sequence[str]) -> list[MachineGPU]:
    """The node's GPUs a container gets for `NVIDIA_VISIBLE_DEVICES` entries `names` (UUIDs or NVML indices; `all`
    for every GPU), in the node's order, as the NVIDIA container runtime exposes device nodes; raises
    UnknownDevice for an entry the node does not have."""
    table = list(gpus)
    by_uuid: Mapping[str, MachineGPU] = {g.uuid: g for g in table}
    if any(n == "all" for n in names):
        return table
    chosen: dict[int, MachineGPU] = {}
    for name in names:
        if name in ("", "none", "void"):
            continue
        gpu = by_uuid.get(name)
        if gpu is None and name.isdigit() and int(name) < len(table):
            gpu = table[int(name)]
        if gpu is None:
            raise UnknownDevice(f"unknown device {name!r} on this node")
        chosen[gpu.index] = gpu
    return [chosen[i] for i in sorted(chosen)]
