"""Every subcommand of `vgpu`, fed garbage (binary files, missing files, YAML of the wrong shape, wrong types, bad
enums, bad numbers): it exits with an error status and one line on stderr, never a traceback, and starts nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def garbage(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("garbage")
    files = {
        "binary": bytes(range(256)) * 8,
        "list": b"- a\n- b\n",
        "broken": b"mode: [\n",
        "wrongtype": b"mode: 5\nsplit_count: many\n",
        "csv": b"not,a,trace\n1,2\n",
        "pods": b"kind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n    resources:\n"
                b"      limits: {volcano.sh/vgpu-number: lots}\n",
        "huge": b"kind: Pod\nmetadata: {name: huge}\nspec:\n  containers:\n  - name: c\n    resources:\n"
                b"      limits: {volcano.sh/vgpu-number: 1, volcano.sh/vgpu-memory: 999999}\n",
        "many": b"kind: Pod\nmetadata: {name: many}\nspec:\n  containers:\n  - name: c\n    resources:\n"
                b"      limits: {nvidia.com/gpu: 8, nvidia.com/gpumem: 1000}\n",
        "typed": b"kind: Pod\nmetadata: {name: typed, annotations: {nvidia.com/use-gputype: T4}}\nspec:\n"
                 b"  containers:\n  - name: c\n    resources:\n      limits: {volcano.sh/vgpu-number: 1}\n",
        "nodes_ok": b"sn,cpu_milli,memory_mib,gpu,model\nn1,32000,128000,2,V100M16\n",
        "pods_untimed": b"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1000,1,500\n",
        "unreachable": b"apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
                       b"contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
                       b"users: [{name: u, user: {}}]\n",
    }
    out = {}
    for name, data in files.items():
        path = d / name
        path.write_bytes(data)
        out[name] = str(path)
    out["missing"] = str(d / "does-not-exist")
    return out


CASES = [
    ("--log-level", "banana", "scheduler"),
    ("scheduler", "--config", "{binary}"),
    ("scheduler", "--config", "{missing}"),
    ("scheduler", "--config", "{list}"),
    ("scheduler", "--config", "{broken}"),
    ("scheduler", "--config", "{wrongtype}"),
    ("scheduler", "--kubeconfig", "{binary}"),
    ("scheduler", "--kubeconfig", "{missing}"),
    ("scheduler", "--listen", "nowhere", "--kubeconfig", "{missing}"),
    ("scheduler", "--node-policy", "best", "--kubeconfig", "{missing}"),
    ("scheduler", "--mode", "sometimes"),
    ("scheduler", "--qps", "fast"),
    ("inspect", "--kubeconfig", "{binary}"),
    ("inspect", "--kubeconfig", "{missing}"),
    ("inspect", "--config", "{binary}", "--kubeconfig", "{missing}"),
    ("device-plugin", "--config", "{binary}"),
    ("device-plugin", "--config", "{list}"),
    ("device-plugin", "--config-file", "{binary}"),
    ("device-plugin", "--config-file", "{missing}"),
    ("device-plugin", "--backend", "cuda"),
    ("device-plugin", "--backend", "sim", "--sim-gpus", "lots-of-gpus", "--node-name", "n"),
    ("device-plugin", "--resource-mode", "units"),
    ("device-plugin", "--kubeconfig", "{binary}", "--backend", "sim", "--sim-gpus", "1xT4", "--node-name", "n"),
    ("run", "--memory", "a lot", "--", "true"),
    ("run", "--cores", "500", "--", "true"),
    ("run",),
    ("replay", "--nodes", "{binary}", "--pods", "{binary}", "--no-progress"),
    ("replay", "--nodes", "{missing}", "--pods", "{missing}", "--no-progress"),
    ("replay", "--nodes", "{csv}", "--pods", "{csv}", "--no-progress"),
    ("replay", "--policy", "luck", "--no-progress"),
    ("replay", "--seeds", "-3", "--no-progress"),
    ("demo", "--pods", "{binary}", "--headless"),
    ("demo", "--pods", "{missing}", "--headless"),
    ("demo", "--pods", "{list}", "--headless"),
    ("demo", "--pods", "{pods}", "--headless"),
    ("demo", "--nodes", "0", "--headless"),
    ("demo", "--gpus", "3xH9000", "--headless"),
    ("demo", "--dra", "--gpus", "3xH9000", "--headless"),
    ("demo", "--dra", "--pods", "{pods}", "--headless"),
    ("dra-plugin", "--node-name", "n", "--backend", "sim", "--sim-gpus", "3xH9000"),
    ("dra-plugin", "--node-name", "n", "--backend", "sim", "--sim-gpus", "1xT4", "--kubeconfig", "{binary}"),
]

# Garbage that used to be taken, or refused only after work was done, or refused in several lines: the one line
# names the problem.
NAMED = [
    (("demo", "--nodes", "abc", "--headless"), "expected a whole number, got 'abc'"),
    (("demo", "--duration", "-5", "--headless"), "must be a positive number of seconds"),
    (("demo", "--hold", "forever", "--headless"), "expected a number of seconds"),
    (("demo", "--workdir", "{missing}/deeper/x", "--headless"), "does not exist"),
    (("demo", "--pods", "{broken}", "--headless"), "not YAML: "),
    (("demo", "--real-kubernetes", "--dra", "--headless"), "--dra works on the stand-ins only"),
    # a pod no node of --gpus could hold is refused before the cluster starts (it was found 34 s later)
    (("demo", "--pods", "{huge}", "--gpus", "4xH100-80GB", "--headless"),
     "pod 'huge' container 'c' asks 999999 MiB per GPU; the largest card of --gpus 4xH100-80GB it may use has "
     "81559 MiB"),
    (("demo", "--pods", "{many}", "--gpus", "4xRTX4090", "--headless"),
     "pod 'many' container 'c' asks 8 GPU(s); a node of --gpus 4xRTX4090 has 4"),
    (("demo", "--pods", "{typed}", "--gpus", "4xA100-40GB", "--headless"),
     "asks 1 GPU(s); a node of --gpus 4xA100-40GB has 0 of the types its GPU-type annotations allow"),
    (("demo", "--real-kubernetes", "--pods", "{pods}", "--headless"), "--pods"),
    (("run", "--driver-dir", "{missing}", "--", "true"), "--driver-dir"),
    (("run", "--cache", "{missing}/x.cache", "--", "true"), "--cache"),
    (("replay", "--plot", "{missing}/out.png", "--nodes", "{nodes_ok}", "--pods", "{pods_untimed}", "--no-progress"),
     "--plot"),
    (("scheduler", "--metrics-listen", "garbage", "--kubeconfig", "{unreachable}"), "--metrics-listen garbage"),
    (("replay", "--departures", "--nodes", "{nodes_ok}", "--pods", "{pods_untimed}", "--no-progress"),
     "creation_time"),
]


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(c).replace("{", "").replace("}", "") for c in CASES])
def test_garbage_gets_one_line_and_an_error_status(garbage, argv):
    args = [a.format(**garbage) for a in argv]
    res = subprocess.run([sys.executable, "-m", "vgpu.cli", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode in (1, 2), (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("vgpu"), res.stderr[-2000:]


@pytest.mark.parametrize("argv, words", NAMED, ids=[" ".join(c).replace("{", "").replace("}", "") for c, _ in NAMED])
def test_garbage_is_named_in_one_line_before_anything_runs(garbage, argv, words):
    args = [a.format(**garbage) for a in argv]
    res = subprocess.run([sys.executable, "-m", "vgpu.cli", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode in (1, 2), (res.returncode, res.stderr[-2000:])
    assert len(lines) == 1 and words in lines[0], res.stderr[-2000:]
    assert not res.stdout.strip(), res.stdout[-2000:]

