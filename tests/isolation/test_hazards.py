"""Hazards of an LD_PRELOAD library that real programs run into: a lookup of an unrelated name, exit() from a signal
handler inside the library's lock, a region lock left unrecoverable, processes of one container in different PID
namespaces."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from vgpu.isolation.region import Region

MiB = 1 << 20


def test_looking_up_an_unrelated_cu_name_loads_no_driver(sim):
    """`dlsym(RTLD_DEFAULT, "cuserid")` is a libc function: the lookup must neither load libcuda nor initialise the
    library (every process under ld.so.preload would pay for it)."""
    code = ("import ctypes, os; ctypes.CDLL(None).cuserid; "
            "print('libcuda' in open('/proc/self/maps').read()); print(os.path.exists(os.environ['VGPU_CACHE']))")
    env = sim.env(CUDA_DEVICE_MEMORY_LIMIT="1g", VGPU_CACHE=str(sim.cache))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "False"], res.stdout


def test_exit_from_a_signal_handler_inside_the_lock_does_not_hang(sim):
    """The handler calls exit() while the library holds its region lock (held long on purpose): the process ends,
    and what it held is given back."""
    env = dict(CUDA_DEVICE_MEMORY_LIMIT="1g", VGPU_TEST_HOLD_LOCK_US="400000")
    proc = sim.popen("exit_in_lock", **env)
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the process hung in exit() after a signal handler interrupted the library's lock")
    assert proc.returncode == 0, err
    assert sim.parse(out)["started"] == "1"
    with Region.open(sim.cache) as r:
        assert r.used(0) == 0
        assert r.processes() == []


@pytest.mark.parametrize("devices_known", [True, False])
def test_an_unrecoverable_region_lock_refuses_allocations(sim, devices_known):
    """A lock nobody can take any more must not be ignored: the library refuses allocations rather than account
    without it, also when the file has no device rows yet (they are added under that lock)."""
    if devices_known:
        first = sim.run("chunks", str(64 * MiB), CUDA_DEVICE_MEMORY_LIMIT="256m")
        assert first["count"] == "4", first
    else:
        assert sim.run("init", CUDA_DEVICE_MEMORY_LIMIT="256m")["init"] == "0"
    poisoned = sim.run("poison", str(sim.cache))
    assert poisoned["poisoned"] == "1", poisoned
    after = sim.run("chunks", str(64 * MiB), CUDA_DEVICE_MEMORY_LIMIT="256m")
    assert after["count"] == "0" and after["err"] == "2", after
    assert "unusable" in after["_stderr"], after["_stderr"]


def _in_pid_namespace(sim, *args: str, **env: str) -> subprocess.Popen[str]:
    """The probe as the first process of a new PID namespace, as a container runtime starts it (PID 1)."""
    return subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", str(sim.probe), *args],
                            env=sim.env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _read_line(proc: subprocess.Popen[str], timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert time.monotonic() < deadline and line, proc.stderr.read() if proc.stderr else ""
    return line.strip()


def test_containers_in_their_own_pid_namespaces_share_one_limit(sim, unshare_pid):
    """Two containers of a pod share one accounting file, each its own PID namespace, both PID 1: neither may take
    the other's slot for its own or for a dead process's, so together they stay within the limit."""
    env = dict(CUDA_DEVICE_MEMORY_LIMIT="1000m")
    first = _in_pid_namespace(sim, "hold", "600", "30", **env)
    second = None
    try:
        assert _read_line(first) == "alloc=0"
        second = _in_pid_namespace(sim, "hold", "600", "0.1", **env)
        assert _read_line(second) == "alloc=2"          # refused: 600 + 600 > 1000
        second.communicate(timeout=30)
        with Region.open(sim.cache) as r:
            assert r.used(0) == 600 * MiB
            assert [p.pid for p in r.processes()] == [1]
    finally:
        first.kill()
        first.communicate(timeout=30)
        if second and second.poll() is None:
            second.kill()
    # the first container is gone: its 600 MiB are reclaimed for the next process, whatever its namespace
    third = _in_pid_namespace(sim, "hold", "900", "0.1", **env)
    assert _read_line(third) == "alloc=0"
    third.communicate(timeout=30)


def test_no_event_of_a_destroyed_context_is_ever_used(sim, probe_api):
    """The limiter's timing events live in a context; when it is destroyed (cuCtxDestroy, a primary context reset)
    they go with it, and a new context, even at the same address, gets new ones."""
    out = sim.run("ctxcycle", "4", program=probe_api, timeout=60, CUDA_DEVICE_MEMORY_LIMIT="4g",
                  CUDA_DEVICE_SM_LIMIT="50", GPU_CORE_UTILIZATION_POLICY="force")
    assert out["_rc"] == "0", out
    assert out["dead_event_uses"] == "0", out
