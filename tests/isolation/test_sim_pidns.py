"""Process identity in the simulated driver does not rest on pids: processes in different PID namespaces (both
PID 1 here) share one node state, each one's memory stays counted while it lives and is given back when it dies
(kill -9), and a forked child that never uses CUDA does not keep its dead parent's memory alive.  Liveness is an
open file description lock on one byte of the state file per process (gpusim.h)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from sim_helpers import MiB, kv

# PID namespaces: tests/isolation/conftest.py's `unshare_pid` (fails where CI requires `unshare`, skips elsewhere)
needs_pidns = pytest.mark.usefixtures("unshare_pid")


def wait_ready(proc: subprocess.Popen) -> dict[str, str]:
    line = proc.stdout.readline()
    assert line.startswith("ready"), line + proc.stderr.read()
    return kv(line.replace(" ", "\n"))


def ns_child(unshare_pid: int) -> int:
    """The host pid of the PID-1 process `unshare --fork` started."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for task in Path(f"/proc/{unshare_pid}/task").iterdir():
            kids = (task / "children").read_text().split()
            if kids:
                return int(kids[0])
        time.sleep(0.05)
    raise AssertionError("no child in the new PID namespace")


def used(sim_programs, state: Path) -> int:
    """What GPU 0 holds, as a new process sees it after joining the node (joining reaps the dead)."""
    return int(sim_programs.run("sim_holder", "used", state=state)["used"])


@needs_pidns
def test_processes_in_separate_pid_namespaces_share_one_state(sim_programs, tmp_path):
    state = tmp_path / "sim.state"
    exe = str(sim_programs.program("sim_holder"))
    env = sim_programs.env(state)
    holders = [subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", exe, "hold", str(mib)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for mib in (100, 200)]
    try:
        assert [wait_ready(h)["pid"] for h in holders] == ["1", "1"]   # both PID 1 in their own namespace
        assert used(sim_programs, state) == 300 * MiB
        assert used(sim_programs, state) == 300 * MiB   # a second newcomer reaps no one either
        os.kill(ns_child(holders[0].pid), signal.SIGKILL)
        holders[0].wait(timeout=30)
        assert used(sim_programs, state) == 200 * MiB
        os.kill(ns_child(holders[1].pid), signal.SIGKILL)
        holders[1].wait(timeout=30)
        assert used(sim_programs, state) == 0
    finally:
        for h in holders:
            if h.poll() is None:
                h.kill()
                h.wait(timeout=30)


def test_a_forked_child_does_not_keep_its_parent_alive(sim_programs, tmp_path):
    state = tmp_path / "sim.state"
    parent = subprocess.Popen([str(sim_programs.program("sim_holder")), "forkhold", "64"], env=sim_programs.env(state),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child = 0
    try:
        child = int(wait_ready(parent)["child"])
        assert used(sim_programs, state) == 64 * MiB
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        assert os.path.exists(f"/proc/{child}")   # the child lives on, holding the inherited descriptors
        assert used(sim_programs, state) == 0
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=30)
        if child:
            os.kill(child, signal.SIGKILL)


def test_a_process_that_exits_gives_its_memory_back(sim_programs, tmp_path):
    state = tmp_path / "sim.state"
    holder = subprocess.Popen([str(sim_programs.program("sim_holder")), "hold", "32"], env=sim_programs.env(state),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(holder)
        assert used(sim_programs, state) == 32 * MiB
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        assert used(sim_programs, state) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)
