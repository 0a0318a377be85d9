"""vgpu/units.py owns memory units: its conversions, and a scan of the product's Python for bare binary factors
(`* 1024`, `<< 20`, `2**20`, ...) anywhere else. A power of two that is not a memory size says so on its line
(`# not a memory size`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from vgpu.units import KIB, MIB, MemoryUnit, bytes_of_mib, mib_ceil, mib_floor

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("vgpu", "scheduler", "node", "deviceplugin", "draplugin", "isolation", "replay", "webhook")
OWNERS = {"vgpu/units.py", "vgpu/quantity.py"}   # the units, and Kubernetes' quantity suffixes (Ki, Mi, ...)
MARK = "# not a memory size"
FACTORS = {1024, 1 << 20, 1 << 30}
SHIFTS = {10, 20, 30}


def test_the_conversions():
    assert (KIB, MIB, bytes_of_mib(3)) == (1024, 1048576, 3 * 1048576)
    assert (mib_floor(MIB - 1), mib_floor(MIB), mib_ceil(MIB), mib_ceil(MIB + 1), mib_ceil(0)) == (0, 1, 1, 2, 0)
    unit = MemoryUnit(4)
    assert (unit.mib(10), unit.bytes(10), unit.units(40959)) == (40, 40 * MIB, 10239)
    assert MemoryUnit().bytes(1) == MIB


def _bare(node: ast.AST) -> bool:
    if not isinstance(node, ast.BinOp):
        return False
    left, right = (n.value if isinstance(n, ast.Constant) else None for n in (node.left, node.right))
    if isinstance(node.op, (ast.LShift, ast.RShift)):
        return right in SHIFTS
    if isinstance(node.op, ast.Pow):
        return left == 2 and right in SHIFTS
    if isinstance(node.op, (ast.Mult, ast.Div, ast.FloorDiv, ast.Mod)):
        return left in FACTORS or right in FACTORS
    return False


def _sites() -> list[str]:
    found = []
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in OWNERS or "_pb2" in path.name or "/build/" in rel:
                continue
            lines = path.read_text().splitlines()
            for node in ast.walk(ast.parse("\n".join(lines), rel)):
                if _bare(node) and MARK not in lines[node.lineno - 1]:
                    found.append(f"{rel}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def test_no_product_site_converts_memory_with_a_bare_factor():
    assert _sites() == []


@pytest.mark.parametrize("line", ["x = n << 20", "x = n * 1024", "x = 2**20", "x = n // (1024 * 1024)"])
def test_the_scan_finds_a_bare_factor(line):
    assert any(_bare(node) for node in ast.walk(ast.parse(line)))
