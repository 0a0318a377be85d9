"""Several processes sharing one accounting file: atomic limit, and SIGKILL never blocks the others."""
from __future__ import annotations

import os
import random
import signal
import time

import pytest

from vgpu.isolation.region import Region

MiB = 1 << 20


@pytest.mark.parametrize("nproc", [2, 8])
def test_processes_never_exceed_the_limit_together(sim, nproc):
    limit = 256 * MiB
    helpers = sim.helpers()
    start_at = helpers.simgpu_now_ns() + 300_000_000          # all start hammering at the same instant
    procs = [sim.popen("race", str(8 * MiB), str(limit), "1.5", str(start_at), CUDA_DEVICE_MEMORY_LIMIT="256m")
             for _ in range(nproc)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        results.append(sim.parse(out))
    assert all(int(r["violations"]) == 0 for r in results), results
    assert all(int(r["maxseen"]) <= limit for r in results), results
    assert sum(int(r["ooms"]) for r in results) > 0          # the limit was actually contended
    assert sum(int(r["allocs"]) for r in results) > 100
    with Region.open(sim.cache) as r:
        assert r.used(0) == 0 and r.processes() == []


def test_sigkilled_process_never_blocks_the_others_and_is_reclaimed(sim):
    env = dict(CUDA_DEVICE_MEMORY_LIMIT="512m")
    survivors = [sim.popen("loop", str(16 * MiB), "4", **env) for _ in range(2)]
    rng = random.Random(7)
    kills = 0
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        # the victim sleeps while holding the region lock, so most kills land inside the critical section
        victim = sim.popen("loop", str(16 * MiB), "0", VGPU_TEST_HOLD_LOCK_US="2000", **env)
        time.sleep(rng.uniform(0.02, 0.08))
        os.kill(victim.pid, signal.SIGKILL)
        victim.communicate(timeout=10)
        kills += 1
    for p in survivors:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        kv = sim.parse(out)
        assert int(kv["maxgap_ns"]) < 1_000_000_000, kv       # never blocked for a second
        assert int(kv["iters"]) > 100
    assert kills >= 10
    # everything the killed processes held is reclaimed: the full limit is available again
    kv = sim.run("chunks", str(64 * MiB), **env)
    assert kv["count"] == "8", kv
    with Region.open(sim.cache) as r:
        assert r.used(0) == 0
        assert r.processes() == []


def test_slot_of_a_reused_pid_is_reclaimed(sim):
    """A slot whose pid now belongs to another process (different start time) is treated as dead."""
    assert sim.run("chunks", str(64 * MiB), CUDA_DEVICE_MEMORY_LIMIT="1g")["count"] == "16"
    with Region.open(sim.cache, readonly=False) as r:
        # forge a slot: a live pid (this test process) but a start time that is not its own
        s = r._r.procs[5]
        s.pid, s.status = os.getpid(), 1
        s.used[0].total = s.used[0].data_size = 512 * MiB
        r._x.slot_start[5] = 12345
        r._x.used[0] += 512 * MiB
        r._r.proc_num = 6
        assert r.used(0) == 512 * MiB
    kv = sim.run("chunks", str(64 * MiB), CUDA_DEVICE_MEMORY_LIMIT="1g")
    assert kv["count"] == "16", kv
    with Region.open(sim.cache) as r:
        assert r.used(0) == 0 and r.processes() == []
