"""`vgpu demo --headless` on cards other than the A100 its samples were first written for: the type-selector
sample asks for a model the nodes have (before: `infer-a100` found no GPU of that type, `0/4 fit (4 type not
allowed)`, exit 1), and every other sample is sized to the smallest card. And pod files written for HAMi and
Volcano, unedited."""

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


PODS_OF_OTHERS = """\
apiVersion: v1
kind: Pod
metadata: {name: hami-infer}
spec:
  restartPolicy: Never
  containers:
    - name: main
      image: cuda
      command: ["python3", "-m", "vgpu.testbed.workload", "--mib", "2000"]
      resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 3000, nvidia.com/gpucores: 30}}
---
apiVersion: v1
kind: Pod
metadata: {name: volcano-infer}
spec:
  schedulerName: volcano
  restartPolicy: Never
  containers:
    - name: main
      image: cuda
      command: ["python3", "-m", "vgpu.testbed.workload", "--mib", "1000"]
      resources: {limits: {volcano.sh/vgpu-number: 1, volcano.sh/vgpu-memory: 2000}}
"""


@pytest.mark.slow
def test_pods_written_for_hami_and_volcano_run_unedited_in_the_demo(tmp_path):
    """The demo runs our webhook (registered by deploy/webhook's configuration), as a cluster does: HAMi's names
    and Volcano's scheduler name are taken as ours (before: `3 Insufficient nvidia.com/gpu`)."""
    pods = tmp_path / "pods.yaml"
    pods.write_text(PODS_OF_OTHERS)
    done = subprocess.run([sys.executable, "-m", "vgpu.cli", "demo", "--headless", "--nodes", "1", "--gpus",
                           "4xRTX4090", "--pods", str(pods)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "vgpu demo: PASS: 2 pod(s)" in done.stdout, done.stdout[-4000:]
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.startswith(("hami", "volcano"))}
    assert rows["hami-infer"][1] == rows["volcano-infer"][1] == "Succeeded"
    assert rows["hami-infer"][5] == "2000/3000" and rows["volcano-infer"][5] == "1000/2000"   # MiB used/limit
