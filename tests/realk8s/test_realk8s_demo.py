"""`vgpu demo --real-kubernetes --headless`: the demo's sample pods placed by upstream kube-scheduler through our
extender, admitted by upstream kubelet through our device plugin and run by containerd, judged by the demo's own
summary; and the one line it says where the upstream programs are not built."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from capabilities import missing

from vgpu.testbed.realcluster import unavailable

pytestmark = [pytest.mark.realk8s, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ["train-multi", "infer-a100", "notebook-quarter", "exclusive-trainer", "cpu-only", "pinned-uuid",
           "over-limit", "neighbour"]


def _demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vgpu.cli", "demo", "--real-kubernetes", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=env)


def test_the_samples_run_as_expected_on_one_real_node(tmp_path_factory):
    reason = unavailable()
    if reason:
        missing("real-kubernetes", reason)
    # a short folder: kubelet's and the plugins' unix sockets live below it (at most 107 bytes a path)
    workdir = tmp_path_factory.mktemp("demo") / "w"
    res = _demo("--headless", "--nodes", "1", "--workdir", str(workdir))
    out = res.stdout
    assert res.returncode == 0, f"{out[-4000:]}\n{res.stderr[-3000:]}"
    # started by UpstreamCluster, each process shown as it started
    for process in ("etcd", "kube-apiserver", "kube-scheduler", "kubelet-node-0", "device-plugin-node-0"):
        assert re.search(rf"^vgpu demo: +[0-9.]+s {process}$", out, re.M), out
    assert re.search(r"^vgpu demo: up in [0-9.]+s; API server https://127\.0\.0\.1:", out, re.M), out
    summary = out[out.index("\nsummary:\n"):]
    verdicts = dict(re.findall(r"^  demo/(\S+) +node=node-0 +(.+)$", summary, re.M))
    assert verdicts == {name: "ok" for name in SAMPLES} | {
        "over-limit": "ok, over-limit allocation refused with CUDA_ERROR_OUT_OF_MEMORY"}, summary
    # the over-limit container was stopped at the step crossing its 2000 MiB; its neighbour on that GPU got all
    assert re.search(r"^over-limit +Succeeded +node-0 +greedy +\d+ +2000/2000 +OOM refused at 2500 MiB$", out, re.M)
    assert re.search(r"^neighbour +Succeeded +node-0 +main +\d+ +1500/2000 +-$", out, re.M), out
    assert f"vgpu demo: PASS: {len(SAMPLES)} pod(s); logs in {workdir}/logs" in out


def test_without_the_upstream_programs_it_says_how_to_build_them(tmp_path):
    res = _demo("--headless", env={**os.environ, "VGPU_UPSTREAM_CACHE": str(tmp_path / "empty")})
    (line,) = res.stderr.strip().splitlines()
    assert res.returncode == 1 and res.stdout == "", (res.returncode, res.stdout)
    assert line.startswith("vgpu demo: --real-kubernetes cannot run here: the upstream programs are not built")
    assert line.endswith("; run `bash testbed/upstream/build.sh` first")
