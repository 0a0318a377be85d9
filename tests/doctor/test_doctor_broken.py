"""A library that enforces nothing (a shared object that exports nothing, given with --lib): the doctor must find
every limit broken and exit 1."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from doctor_helpers import NON_FRAMEWORK, Ran, run_doctor

# every probe that checks a limit: all but the measurement without the library and the overhead figure
LIMIT_PROBES = [name for name in NON_FRAMEWORK if name not in ("kernel-clock", "launch-overhead")]
# those the simulated driver always has the entry points for (the others may be skipped)
ALWAYS_RUN = [name for name in LIMIT_PROBES if name not in ("mem-alloc-v1", "graph-30")]


@pytest.fixture(scope="module")
def ran(sim_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Ran:
    tmp = tmp_path_factory.mktemp("broken")
    (tmp / "empty.c").write_text("/* exports nothing: nothing is enforced */\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp / "noop.so"), str(tmp / "empty.c")], check=True)
    return run_doctor(tmp, "--driver-dir", str(sim_dir), "--quick", "--lib", str(tmp / "noop.so"))


def test_a_library_that_enforces_nothing_fails_the_run(ran):
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert ran.doc is not None and ran.doc["doctor"]["exit_status"] == 1
    assert ran.stdout.rstrip().splitlines()[-1].startswith("LIMITS BROKEN: ")


@pytest.mark.parametrize("name", LIMIT_PROBES)
def test_each_limit_is_reported_broken(ran, name):
    p = ran.probe(name)
    if name not in ALWAYS_RUN and p["skipped"]:
        assert "does not export" in p["reason"], p
        return
    assert not p["ok"] and not p["skipped"] and p["reason"], p


def test_memory_paths_say_what_was_allocated_past_the_limit(ran):
    p = ran.probe("mem-alloc")
    assert "past the 1024 MiB limit" in p["reason"]
    assert p["figures"]["allocated_bytes"] > p["figures"]["limit_bytes"]
    assert "not the 1024 MiB limit" in ran.probe("meminfo-cuda")["reason"]


def test_the_reference_measurements_are_unaffected(ran):
    assert ran.probe("kernel-clock")["ok"]
    assert ran.probe("launch-overhead")["ok"]      # a figure, not a limit
    assert ran.probe("share-long-30")["figures"]["share_pct"] > 90
