"""The layering rules of docs/DEVELOPING.md, checked on the source: who may import whom."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("vgpu", "scheduler", "deviceplugin", "isolation", "proto")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "_pb2" not in p.name)


def _top(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize("package, forbidden", [("scheduler", "deviceplugin"), ("deviceplugin", "scheduler")])
def test_scheduler_and_deviceplugin_never_import_each_other(package, forbidden):
    offenders = [str(p.relative_to(ROOT)) for p in _modules(package) if forbidden in map(_top, _imports(p))]
    assert offenders == []


def test_core_imports_no_protocol_stacks():
    """vgpu/ outside kube/, standins/ and the CLI entry points stays free of fastapi, grpc, cffi and proto."""
    heavy = {"fastapi", "grpc", "cffi", "proto", "uvicorn"}
    ours = {"scheduler", "deviceplugin", "isolation"}
    offenders = []
    for path in _modules("vgpu"):
        rel = path.relative_to(ROOT / "vgpu")
        if rel.parts[0] in ("kube", "standins") or rel.name in ("cli.py", "demo.py", "demo_cli.py"):
            continue
        bad = {_top(name) for name in _imports(path)} & (heavy | ours)
        if bad:
            offenders.append(f"{rel}: {sorted(bad)}")
    assert offenders == []


def test_only_deviceplugin_and_standins_import_proto():
    offenders = []
    for package in ("scheduler", "isolation"):
        offenders += [str(p.relative_to(ROOT)) for p in _modules(package) if "proto" in map(_top, _imports(p))]
    assert offenders == []
