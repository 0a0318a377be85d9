"""The probes the doctor runs, in order, and the settings they share (limits, chunk size, timed windows)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vgpu.units import GIB, MIB

MiB, GiB = MIB, GIB

MEMORY, COMPUTE, FRAMEWORKS = "memory", "compute", "frameworks"
LIMITED, REFERENCE = "limited", "reference"

# spin lengths (ns) of the compute probes' kernels
LONG_NS = 2_000_000       # long kernels
NODE_NS = 500_000         # each of the 4 kernels of the captured graph
SHORT_NS = 20_000         # a launch-bound loop
TINY_NS = 0               # launch overhead: as short as a kernel gets
SPINS = (LONG_NS, NODE_NS, SHORT_NS, TINY_NS)
CHUNK = 64 * MiB          # allocation step of the memory probes


@dataclass(frozen=True, slots=True)
class Settings:
    """What every probe of one run shares."""

    quick: bool
    limit: int                 # memory limit per device, bytes
    devices: int               # CUDA devices, each given the limit
    chunk: int = CHUNK
    warmup: float = 1.0        # seconds launched before a timed window
    window: float = 3.0        # seconds of a timed window
    reps: int = 5              # launch-overhead: runs with and without the library, alternating

    @classmethod
    def choose(cls, quick: bool, device_total: int, devices: int) -> Settings:
        """1 GiB per device (a quarter of a device smaller than 4 GiB); --quick shortens the timed windows."""
        limit = GiB if device_total >= 4 * GiB else max(2 * CHUNK, device_total // 4 // CHUNK * CHUNK)
        if quick:
            return cls(True, limit, devices, warmup=0.5, window=1.0, reps=3)
        return cls(False, limit, devices)

    def params(self) -> dict[str, Any]:
        """The part of every worker's parameters that comes from the settings."""
        return {"limit": self.limit, "chunk": self.chunk, "warmup": self.warmup, "window": self.window,
                "reps": self.reps, "quick": self.quick, "device": 0}


@dataclass(frozen=True, slots=True)
class Probe:
    """One probe: its worker action and arguments, the environment and limits it runs under, its time box."""

    name: str
    group: str
    what: str
    action: str = ""                                  # worker action; the name when empty
    args: dict[str, Any] = field(default_factory=dict)
    env: str = LIMITED                                # LIMITED: under libvgpu.so; REFERENCE: without it
    cores: int | None = None                          # CUDA_DEVICE_SM_LIMIT of a LIMITED probe
    needs_clock: bool = False                         # cannot run without the kernel timings of `kernel-clock`
    fixed_s: float = 45.0                             # time box, plus...
    windows: int = 0                                  # ...this many timed windows (warm-up + window each)

    def timebox(self, s: Settings) -> float:
        """Seconds the probe may take before it is killed."""
        return self.fixed_s + self.windows * (s.warmup + s.window)


def _share(name: str, spin: int, cores: int, what: str) -> Probe:
    return Probe(name, COMPUTE, what, action="share", args={"spin": spin}, cores=cores, needs_clock=True,
                 fixed_s=30, windows=1)


PROBES: tuple[Probe, ...] = (
    Probe("mem-alloc", MEMORY, "cuMemAlloc_v2 in chunks until refused", args={"path": "alloc"}, action="fill"),
    Probe("mem-alloc-v1", MEMORY, "cuMemAlloc, the v1 ABI (32-bit pointer and size), until refused"),
    Probe("mem-pitch", MEMORY, "cuMemAllocPitch_v2 until refused", args={"path": "pitch"}, action="fill"),
    Probe("mem-managed", MEMORY, "cuMemAllocManaged until refused", args={"path": "managed"}, action="fill"),
    Probe("mem-async", MEMORY, "cuMemAllocAsync (default pool) until refused", args={"path": "async"},
          action="fill"),
    Probe("mem-pool", MEMORY, "cuMemAllocFromPoolAsync (own pool) until refused", args={"path": "pool"},
          action="fill"),
    Probe("mem-vmm", MEMORY, "cuMemCreate (virtual memory management) until refused", args={"path": "vmm"},
          action="fill"),
    Probe("mem-array", MEMORY, "cuArrayCreate_v2 until refused", args={"path": "array"}, action="fill"),
    Probe("meminfo-cuda", MEMORY, "cuMemGetInfo_v2 and cuDeviceTotalMem_v2 report the limit"),
    Probe("meminfo-nvml", MEMORY, "nvmlDeviceGetMemoryInfo(_v2) of the device (by UUID) reports the limit"),
    Probe("mem-reclaim", MEMORY, "memory of a holder killed with SIGKILL can be allocated again"),
    Probe("mem-shared", MEMORY, "two processes allocating at once on one limit stay within it together"),
    Probe("kernel-clock", COMPUTE, "device time per launch of the spin kernels, without the library",
          env=REFERENCE),
    _share("share-long-30", LONG_NS, 30, "share of 2 ms kernels at a 30 % limit"),
    _share("share-long-60", LONG_NS, 60, "share of 2 ms kernels at a 60 % limit"),
    _share("share-short-30", SHORT_NS, 30, "share of a launch-bound loop of 20 us kernels at a 30 % limit"),
    _share("share-short-60", SHORT_NS, 60, "share of a launch-bound loop of 20 us kernels at a 60 % limit"),
    Probe("graph-30", COMPUTE, "stream capture (global mode) and graph replays at a 30 % limit",
          args={"spin": NODE_NS}, cores=30, needs_clock=True, fixed_s=30, windows=1),
    Probe("launch-overhead", COMPUTE, "launches/s of tiny kernels with the library and limits vs without",
          env=REFERENCE, fixed_s=60, windows=4),
    Probe("torch-memory", FRAMEWORKS, "PyTorch: allocating past the limit raises OutOfMemoryError; "
          "mem_get_info shows the limit", fixed_s=120),
    Probe("torch-share", FRAMEWORKS, "PyTorch: matmul throughput at 30 % and 60 % vs unlimited",
          env=REFERENCE, fixed_s=180, windows=3),
    Probe("torch-graph", FRAMEWORKS, "PyTorch: torch.cuda.graph capture and replay at a 30 % limit", cores=30,
          fixed_s=120, windows=1),
    Probe("cupy-memory", FRAMEWORKS, "CuPy: its memory pool refuses at the limit", fixed_s=120),
    Probe("jax-memory", FRAMEWORKS, "JAX: its preallocation (bytes_limit) follows the limit", fixed_s=120),
)

NAMES = tuple(p.name for p in PROBES)
CLOCK = "kernel-clock"


def select(names: list[str] | None) -> list[Probe]:
    """The probes named (all when None), in catalog order, with kernel-clock added when one of them needs it."""
    if not names:
        return list(PROBES)
    wanted = set(names)
    if any(p.needs_clock for p in PROBES if p.name in wanted):
        wanted.add(CLOCK)
    return [p for p in PROBES if p.name in wanted]
