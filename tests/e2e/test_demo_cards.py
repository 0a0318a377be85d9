"""`vgpu demo --headless` on cards other than the A100 its samples were first written for: the type-selector
sample asks for a model the nodes have (before: `infer-a100` found no GPU of that type, `0/4 fit (4 type not
allowed)`, exit 1), and every other sample is sized to the smallest card."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize(("gpus", "sample"), [("4xH100-80GB", "infer-h100"), ("4xRTX4090", "infer-4090"),
                                              ("1xT4,1xA100-40GB", "infer-t4")])
def test_the_headless_demo_passes_on_the_cards_help_lists(gpus, sample):
    done = subprocess.run([sys.executable, "-m", "vgpu.cli", "demo", "--headless", "--nodes", "1", "--gpus", gpus],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert f"demo/{sample}" in done.stdout and "vgpu demo: PASS" in done.stdout, done.stdout[-4000:]
