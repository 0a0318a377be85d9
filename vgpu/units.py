"""Memory units, owned here: every conversion between bytes, MiB and the memory units of `volcano.sh/vgpu-memory`
(`gpu_memory_factor` MiB each) goes through this module, so that no site carries a bare factor of its own (one
missed factor is a wrong hard limit). tests/unit/test_units.py holds the rest of the product to that."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GIB", "KIB", "MIB", "MemoryUnit", "bytes_of_mib", "limit_bytes", "limit_text", "mib_ceil", "mib_floor"]

KIB = 1 << 10
"""Bytes in a KiB."""
MIB = 1 << 20
"""Bytes in a MiB."""
GIB = 1 << 30
"""Bytes in a GiB."""


def bytes_of_mib(mib: int) -> int:
    """Bytes in `mib` MiB."""
    return mib * MIB


def mib_floor(size: int) -> int:
    """Whole MiB in `size` bytes (rounded down: what fits in it)."""
    return size // MIB


def mib_ceil(size: int) -> int:
    """MiB that hold `size` bytes (rounded up: what it takes)."""
    return -(-size // MIB)


def limit_text(size: int) -> str:
    """A memory limit as the isolation library reads it (`CUDA_DEVICE_MEMORY_LIMIT_<i>`): whole MiB as `<n>m`, any
    other size in bytes."""
    return f"{size // MIB}m" if size % MIB == 0 else str(size)


def limit_bytes(text: str) -> int:
    """Bytes in a limit as `limit_text` writes it (`<n>m`, or bytes); ValueError for anything else."""
    if text.endswith("m") and text[:-1].isdigit():
        return bytes_of_mib(int(text[:-1]))
    if text.isdigit():
        return int(text)
    raise ValueError(f"{text!r} is not a memory limit (<MiB>m, or bytes)")


@dataclass(frozen=True, slots=True)
class MemoryUnit:
    """The memory unit of `volcano.sh/vgpu-memory` on a node or cluster: `factor` MiB (1 unless the device
    plugin's `gpu_memory_factor` says otherwise)."""

    factor: int = 1

    def mib(self, units: int) -> int:
        """MiB in `units` units."""
        return units * self.factor

    def bytes(self, units: int) -> int:
        """Bytes in `units` units."""
        return bytes_of_mib(units * self.factor)

    def units(self, mib: int) -> int:
        """Whole units in `mib` MiB (rounded down: what a card of that size offers)."""
        return mib // self.factor
