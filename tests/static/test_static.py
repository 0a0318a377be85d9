"""The static checks of .ci/lint.py as tests: ruff, mypy (strict on the core, the scheduler and the protocol edges)
and the import-linter contracts of pyproject.toml (layers, no cycles, nothing imports the test bed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("check", ["ruff", "mypy", "import-linter"])
def test_static_check_passes(check):
    result = subprocess.run([sys.executable, str(ROOT / ".ci" / "lint.py"), check], cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_layering_contracts_have_no_exemptions():
    text = (ROOT / "pyproject.toml").read_text()
    contracts = text[text.index("[tool.importlinter]"):text.index("[tool.ruff]")]
    assert "ignore_imports" not in contracts and "unmatched_ignore_imports" not in contracts
    for contract in ("layers", "independence", "protected", "forbidden", "acyclic_siblings"):
        assert f'type = "{contract}"' in contracts
