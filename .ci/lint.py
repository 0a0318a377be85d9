"""Static checks of the tree: ruff, mypy and the import-linter contracts (pyproject.toml); tests/static runs them.

The folders install as one package (`scheduler/` -> `vgpu.scheduler`, ...: setup.py's FOLDERS). mypy and
import-linter find modules on the file system, not through the editable install's import hook, so they read a
view of the installed package made of symlinks (`.lint-view/vgpu/...`, gitignored) from inside that directory;
their messages are printed with the source paths. Usage: `.venv/bin/python .ci/lint.py [CHECK ...]` with CHECK
among ruff, mypy, import-linter (exit status: the number of failed checks). tests/static runs each as a test.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VIEW = ROOT / ".lint-view"
BIN = Path(sys.executable).parent


def folders() -> dict[str, str]:
    """setup.py's FOLDERS: import package -> folder."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "FOLDERS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit("setup.py defines no FOLDERS")


def build_view() -> dict[str, str]:
    """Make .lint-view/vgpu mirror the installed layout; returns view path prefix -> source path prefix."""
    shutil.rmtree(VIEW, ignore_errors=True)
    top = VIEW / "vgpu"
    top.mkdir(parents=True)
    for entry in (ROOT / "vgpu").iterdir():
        if entry.name != "__pycache__":
            (top / entry.name).symlink_to(entry)
    prefixes = {}
    for name, folder in folders().items():
        if name != "vgpu" and (ROOT / folder).is_dir():
            (top / name.split(".", 1)[1]).symlink_to(ROOT / folder)
            prefixes[f"{name.replace('.', '/')}/"] = f"{folder}/"
    return prefixes


def run(title: str, argv: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None,
        prefixes: dict[str, str] | None = None) -> bool:
    """Run one check; its output is printed with view paths turned into source paths."""
    print(f"== {title}: {' '.join(argv)}", flush=True)
    res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    out = res.stdout + res.stderr
    for view, source in (prefixes or {}).items():
        out = out.replace(view, source)
    sys.stdout.write(out)
    return res.returncode == 0


CHECKS = ("ruff", "mypy", "import-linter")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="ruff, mypy and the import-linter contracts")
    parser.add_argument("checks", nargs="*", metavar="CHECK", help=f"{', '.join(CHECKS)} (default: all)")
    wanted = parser.parse_args(argv).checks or list(CHECKS)
    for name in wanted:
        if name not in CHECKS:
            parser.error(f"unknown check {name!r} (known: {', '.join(CHECKS)})")
    prefixes = build_view()
    config = str(ROOT / "pyproject.toml")
    env = dict(os.environ, PYTHONPATH=str(VIEW))
    commands = {
        "ruff": ([str(BIN / "ruff"), "check", "."], ROOT, None),
        "mypy": ([str(BIN / "mypy"), "--config-file", config, "-p", "vgpu"], VIEW, env),
        "import-linter": ([str(BIN / "lint-imports"), "--config", config], VIEW, env),
    }
    results = [run(name, *commands[name], prefixes=prefixes) for name in wanted]
    failed = results.count(False)
    print(f"== static checks: {len(results) - failed} passed, {failed} failed")
    return failed


if __name__ == "__main__":
    sys.exit(main())
