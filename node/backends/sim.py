"""Simulated GPUs for tests and the demo, described by a spec such as `4xA100-40GB,2xT4`.

A `+mig` suffix on an entry (`1xA100-40GB+mig`) marks those cards as having MIG mode enabled, which the plugin
refuses under `--mig-strategy none` (as it does for real cards). Topology: `@nvlinkK` after an entry groups its
GPUs, in order, into NVLink islands of K (2..16, dividing the count; `8xH100-80GB@nvlink4`: two islands of four,
numbered by their first GPU's index); `/numaN` after the whole spec puts the node's GPUs, in index order, on N
NUMA nodes in equal runs (`8xH100-80GB@nvlink4/numa2`). Without them GPUs have no NVLink and no NUMA node.

Names and memory sizes follow what NVML reports for each model; UUIDs are derived from the node name so they are
the same on every start. Faults can be injected in-process (`inject_xid`, `lose`, `recover`, `set_usage`) or
from outside through a control file: each appended line is one command,

    xid <gpu> <code>        an Xid event (ignored Xids change nothing)
    lost <gpu>              the GPU stops answering (unhealthy)
    recover <gpu>           the GPU is healthy again
    usage <gpu> <MiB> <%>   memory used and utilisation reported to the monitor

where <gpu> is an index or a UUID. Commands take effect within one health poll (about 0.2 s).
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
import uuid as uuidlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from vgpu.errors import ConfigError
from vgpu.node.backends import GPUInfo, GPUReading, HealthEvent
from vgpu.units import bytes_of_mib

__all__ = ["CARDS_FILE", "MODELS", "Card", "SimBackend", "load_cards", "parse_sim_layout", "parse_sim_spec",
           "parse_sim_spec_full"]

CARDS_FILE = Path(__file__).with_name("cards.json")
"""The card table (short model name -> NVML's facts), which the test bed's machine (testbed/machine.py) loads too."""


@dataclass(frozen=True, slots=True)
class Card:
    """One card model as NVML describes it."""

    nvml_name: str
    memory_mib: int         # as NVML reports it
    sms: int
    architecture: str
    compute_capability: str


def load_cards(path: Path = CARDS_FILE) -> dict[str, Card]:
    """The card table, by short model name (the spec's vocabulary: `A100-40GB`, `T4`, ...)."""
    return {name: Card(**facts) for name, facts in json.loads(path.read_text()).items()}


MODELS: dict[str, Card] = load_cards()
_NAMESPACE = uuidlib.UUID("6f1d7a52-3c1e-4f7b-9a55-0e2b8f6d9c41")
_ENTRY = re.compile(r"^(?:(\d+)x)?([A-Za-z0-9-]+?)(\+mig)?(?:@nvlink(\d+))?$")
_NUMA_SUFFIX = re.compile(r"^(.*)/numa(\d+)$")


def parse_sim_spec(spec: str) -> list[tuple[str, int]]:
    """`4xA100-40GB,2xT4` -> [("A100-40GB", 4), ("T4", 2)]; raises ConfigError naming the bad entry.

    A `+mig` suffix (`1xA100-40GB+mig`) simulates cards with MIG mode enabled; see `parse_sim_spec_full`."""
    return [(model, count) for model, count, _ in parse_sim_spec_full(spec)]


def parse_sim_spec_full(spec: str) -> list[tuple[str, int, bool]]:
    """Like parse_sim_spec, with a third item: MIG mode enabled."""
    return [(model, count, mig) for model, count, mig, _ in parse_sim_layout(spec)[0]]


def parse_sim_layout(spec: str) -> tuple[list[tuple[str, int, bool, int]], int]:
    """The spec as [(model, count, MIG, NVLink island size or 0), ...] and its NUMA node count (0: none)."""
    numa = 0
    suffix = _NUMA_SUFFIX.match(spec.strip())
    if suffix is not None:
        spec, numa = suffix[1], int(suffix[2])
        if not 1 <= numa <= 8:
            raise ConfigError(f"sim_gpus: /numa{numa} is outside /numa1../numa8")
    result = []
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        match = _ENTRY.match(entry)
        if match is None:
            raise ConfigError(f"sim_gpus: {entry!r} is not of the form <count>x<model>[+mig][@nvlink<K>]")
        count = int(match[1]) if match[1] else 1
        model = next((name for name in MODELS if name.lower() == match[2].lower()), None)
        if model is None:
            raise ConfigError(f"sim_gpus: unknown model {match[2]!r}; known: {', '.join(MODELS)}")
        if not 1 <= count <= 64:
            raise ConfigError(f"sim_gpus: count {count} in {entry!r} is outside 1..64")
        island = int(match[4]) if match[4] else 0
        if match[4] and not (2 <= island <= 16 and count % island == 0):
            raise ConfigError(f"sim_gpus: @nvlink{island} in {entry!r} needs islands of 2..16 that divide the count")
        result.append((model, count, bool(match[3]), island))
    total = sum(count for _, count, _, _ in result)
    if numa and total % numa:
        raise ConfigError(f"sim_gpus: {total} GPUs do not split into {numa} equal NUMA nodes")
    return result, numa


@dataclass(slots=True)
class _State:
    healthy: bool = True
    lost: bool = False
    memory_used_mib: int = 0
    utilization: int = 0


class SimBackend:
    """Simulated GPUs with injectable faults; thread-safe."""

    init_error: str | None = None

    def __init__(self, gpus: list[GPUInfo], control_file: str | None = None, ignored_xids: Iterable[int] = ()) -> None:
        self._gpus = gpus
        self._state = {g.uuid: _State() for g in gpus}
        self._events: queue.Queue[HealthEvent] = queue.Queue()
        self._lock = threading.Lock()
        self._ignored = set(ignored_xids)
        self._control = control_file
        self._control_offset = 0
        if control_file and os.path.exists(control_file):
            self._control_offset = os.path.getsize(control_file)

    @classmethod
    def from_spec(cls, spec: str, node_name: str, control_file: str | None = None,
                  ignored_xids: Iterable[int] = ()) -> SimBackend:
        """Build the GPUs of `spec` with UUIDs derived from `node_name`."""
        gpus: list[GPUInfo] = []
        entries, numa = parse_sim_layout(spec)
        total = sum(count for _, count, _, _ in entries)
        for model, count, mig, island in entries:
            card = MODELS[model]
            first = len(gpus)
            for k in range(count):
                index = first + k
                uid = uuidlib.uuid5(_NAMESPACE, f"{node_name}/{index}")
                gpus.append(GPUInfo(uuid=f"GPU-{uid}", name=card.nvml_name, memory_mib=card.memory_mib, minor=index,
                                    numa=index * numa // total if numa else None, index=index, mig_enabled=mig,
                                    architecture=card.architecture, compute_capability=card.compute_capability,
                                    nvlink_island=first + k // island * island if island else None))
        return cls(gpus, control_file=control_file, ignored_xids=ignored_xids)

    def devices(self) -> list[GPUInfo]:
        """The simulated GPUs in minor order."""
        return list(self._gpus)

    def _resolve(self, gpu: str | int) -> str:
        if isinstance(gpu, int) or (isinstance(gpu, str) and gpu.isdigit()):
            return self._gpus[int(gpu)].uuid
        if gpu not in self._state:
            raise KeyError(f"no simulated GPU {gpu!r}")
        return gpu

    def _set_health(self, uid: str, healthy: bool, reason: str, xid: int | None = None) -> None:
        with self._lock:
            state = self._state[uid]
            changed = state.healthy != healthy
            state.healthy = healthy
        if changed:
            self._events.put(HealthEvent(uid, healthy, reason, xid))

    def inject_xid(self, gpu: str | int, xid: int) -> None:
        """Simulate an Xid event; non-ignored Xids make the GPU unhealthy."""
        uid = self._resolve(gpu)
        if xid not in self._ignored:
            self._set_health(uid, False, f"xid {xid}", xid)

    def lose(self, gpu: str | int) -> None:
        """Simulate a GPU that fell off the bus."""
        uid = self._resolve(gpu)
        with self._lock:
            self._state[uid].lost = True
        self._set_health(uid, False, "lost")

    def recover(self, gpu: str | int) -> None:
        """The GPU answers again and is healthy."""
        uid = self._resolve(gpu)
        with self._lock:
            self._state[uid].lost = False
        self._set_health(uid, True, "recovered")

    def set_usage(self, gpu: str | int, memory_used_mib: int, utilization: int) -> None:
        """Set the usage the monitor reports for a GPU."""
        uid = self._resolve(gpu)
        with self._lock:
            self._state[uid].memory_used_mib = memory_used_mib
            self._state[uid].utilization = utilization

    def _read_control(self) -> None:
        if not self._control:
            return
        try:
            with open(self._control, "rb") as handle:
                handle.seek(self._control_offset)
                data = handle.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self._control_offset += end
        for line in data[:end].decode(errors="replace").splitlines():
            words = line.split()
            try:
                if words[:1] == ["xid"] and len(words) == 3:
                    self.inject_xid(words[1], int(words[2]))
                elif words[:1] == ["lost"] and len(words) == 2:
                    self.lose(words[1])
                elif words[:1] == ["recover"] and len(words) == 2:
                    self.recover(words[1])
                elif words[:1] == ["usage"] and len(words) == 4:
                    self.set_usage(words[1], int(words[2]), int(words[3]))
            except (KeyError, ValueError, IndexError):
                continue

    def poll_health(self, timeout: float) -> list[HealthEvent]:
        """Health changes injected since the last call; waits at most `timeout` (checks the control file)."""
        step = min(timeout, 0.1)
        waited = 0.0
        while True:
            self._read_control()
            events = []
            while True:
                try:
                    events.append(self._events.get_nowait())
                except queue.Empty:
                    break
            if events or waited >= timeout:
                return events
            try:
                events.append(self._events.get(timeout=step))
                continue_events = []
                while True:
                    try:
                        continue_events.append(self._events.get_nowait())
                    except queue.Empty:
                        break
                return events + continue_events
            except queue.Empty:
                waited += step

    def usage(self) -> dict[str, GPUReading]:
        """Usage as set by `set_usage`; lost GPUs are left out."""
        with self._lock:
            return {
                uid: GPUReading(bytes_of_mib(s.memory_used_mib), s.utilization)
                for uid, s in self._state.items()
                if not s.lost
            }

    def close(self) -> None:
        """Nothing to release."""
