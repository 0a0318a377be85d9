"""`vgpu run` (vgpu.isolation.cli / vgpu.isolation.runner) against the simulated GPU."""
from __future__ import annotations

import argparse
import os

import pytest

from vgpu.isolation import cli


def vgpu(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="vgpu")
    cli.register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(list(argv))
    return args.func(args)


@pytest.fixture
def sim_env(sim, monkeypatch):
    for k in list(os.environ):
        if k.startswith(("CUDA_DEVICE_", "GPU_CORE_", "VGPU_")) or k == "LD_PRELOAD":
            monkeypatch.delenv(k)
    monkeypatch.setenv("SIMGPU_STATE", str(sim.state))
    return sim


def test_run_enforces_the_memory_limit(sim_env, capfd):
    rc = vgpu("run", "--memory", "256Mi", "--cores", "30", "--driver-dir", str(sim_env.libs.sim_dir), "--",
              str(sim_env.probe), "chunks", str(64 << 20))
    out = sim_env.parse(capfd.readouterr().out)
    assert rc == 0
    assert out["count"] == "4" and out["err"] == "2" and int(out["after_total"]) == 256 << 20


def test_run_sets_the_contract_environment(sim_env, capfd, tmp_path):
    cache = tmp_path / "c.cache"
    rc = vgpu("run", "--memory", "4g", "--cores", "30", "--policy", "force", "--cache", str(cache),
              "--driver-dir", str(sim_env.libs.sim_dir), "--", "sh", "-c",
              'echo "$CUDA_DEVICE_MEMORY_LIMIT_0 $CUDA_DEVICE_SM_LIMIT $GPU_CORE_UTILIZATION_POLICY '
              '$CUDA_DEVICE_MEMORY_SHARED_CACHE $LD_PRELOAD"')
    assert rc == 0
    words = capfd.readouterr().out.split()
    assert words[:4] == ["4096m", "30", "force", str(cache)]
    assert words[4].endswith("libvgpu.so")


def test_run_returns_the_command_exit_code(sim_env):
    assert vgpu("run", "--memory", "1g", "--", "sh", "-c", "exit 7") == 7


@pytest.mark.parametrize("sig,status", [("ABRT", 134), ("SEGV", 139), ("KILL", 137)])
def test_run_reports_a_fatal_signal_as_a_shell_does(sim_env, sig, status):
    assert vgpu("run", "--memory", "1g", "--", "sh", "-c", f"kill -{sig} $$") == status


@pytest.mark.parametrize("argv,needle", [
    (["--memory", "lots"], "--memory"),
    (["--cores", "130"], "--cores"),
    (["--devices", "a,b"], "--devices"),
    (["--memory", "1g"], "no command"),
])
def test_run_rejects_bad_arguments_with_one_line(sim_env, capfd, argv, needle):
    extra = [] if needle == "no command" else ["--", "true"]
    assert vgpu("run", *argv, *extra) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]
