"""A tenant against libvgpu.so: when the container's accounting file cannot be used, the library fails closed
(CUDA and NVML refuse to initialise, one line on stderr) instead of running without limits; a full disk refuses
cleanly instead of killing every new CUDA process with SIGBUS. Real processes (the probe program) with the real
library preloaded over the simulated driver.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from capabilities import private_tmpfs
from iso_helpers import Libs, Sim, build_libs, build_probe, parse_kv

GiB = 1 << 30
CUDA_SUCCESS = "0"


@pytest.fixture(scope="module")
def libs() -> Libs:
    return build_libs()


@pytest.fixture(scope="module")
def probe(libs: Libs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_probe(libs, tmp_path_factory.mktemp("bin") / "probe")


@pytest.fixture
def sim(libs: Libs, probe: Path, tmp_path: Path) -> Iterator[Sim]:
    yield Sim(libs, probe, tmp_path / "sim.state", tmp_path / "acct" / "vgpu.cache")


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "ERROR" in line]


@pytest.mark.parametrize("spoil", ["directory", "missing-parent", "parent-is-a-file"])
def test_an_unusable_accounting_file_refuses_cuda_with_one_line(sim, spoil):
    """The container puts a directory where its accounting file goes, removes the directory it lives in, or makes
    that directory a file: with a limit set, cuInit fails and nothing is allocated (before: a warning, then the
    process ran with no limit at all)."""
    sim.cache.parent.mkdir(parents=True, exist_ok=True)
    if spoil == "directory":
        sim.cache.mkdir()
    elif spoil == "missing-parent":
        shutil.rmtree(sim.cache.parent)
    else:
        shutil.rmtree(sim.cache.parent)
        sim.cache.parent.write_text("not a directory")
    kv = sim.run("init", CUDA_DEVICE_MEMORY_LIMIT="1Gi")
    assert kv["init"] != CUDA_SUCCESS, kv
    (line,) = _error_lines(kv["_stderr"])
    assert "accounting file" in line and "refused" in line
    kv = sim.run("chunks", str(GiB), CUDA_DEVICE_MEMORY_LIMIT="1Gi")
    assert kv["_rc"] != "0" and kv.get("count", "0") == "0", kv


def test_the_admin_switch_runs_without_limits_and_says_so(sim):
    """VGPU_ISOLATION_FAIL_OPEN=1 (set by the device plugin's --isolation-fail-open) runs the process unlimited,
    with an error line saying so."""
    sim.cache.parent.mkdir(parents=True, exist_ok=True)
    sim.cache.mkdir()
    kv = sim.run("chunks", str(GiB), CUDA_DEVICE_MEMORY_LIMIT="1Gi", VGPU_ISOLATION_FAIL_OPEN="1")
    assert kv["_rc"] == "0" and kv["count"] == "40", kv
    (line,) = _error_lines(kv["_stderr"])
    assert "WITHOUT limits" in line
    kv = sim.run("init", CUDA_DEVICE_MEMORY_LIMIT="1Gi", VGPU_ISOLATION_FAIL_OPEN="true")  # only "1" counts
    assert kv["init"] != CUDA_SUCCESS


def test_without_limits_a_missing_accounting_file_changes_nothing(sim):
    """No limit configured: the library stays inert whatever the accounting path is."""
    sim.cache.parent.mkdir(parents=True, exist_ok=True)
    sim.cache.mkdir()
    kv = sim.run("init")
    assert kv["init"] == CUDA_SUCCESS and not _error_lines(kv["_stderr"])


def test_a_full_disk_refuses_cuda_instead_of_sigbus(sim):
    """The accounting directory sits on a 1 MiB tmpfs, smaller than one accounting file: CUDA initialisation is
    refused with a reason (before: the file was created sparse, and the first store past the end of the disk
    killed the process with SIGBUS)."""
    private_tmpfs()
    sim.cache.parent.mkdir(parents=True, exist_ok=True)
    script = (f"mount -t tmpfs -o size=1m tmpfs {sim.cache.parent} && "
              f"exec {sim.probe} chunks {GiB}")
    res = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                         env=sim.env(CUDA_DEVICE_MEMORY_LIMIT="1Gi"), capture_output=True, text=True, timeout=60)
    assert res.returncode > 0, (res.returncode, res.stderr)  # an error exit, not a signal
    (line,) = _error_lines(res.stderr)
    assert "No space left on device" in line and "refused" in line


def test_a_limit_rewritten_in_the_accounting_file_is_refused_not_obeyed(sim):
    """The container sets the memory limit stored in its own accounting file to 0 ("not limited"): the next process
    refuses CUDA with one line naming the mismatch (before: it obeyed the file and allocated the whole GPU). A limit
    written there above the container's own is refused the same way; a tighter one is obeyed
    (tests/isolation/test_memory.py, the live limit change)."""
    from vgpu.isolation.region import Region

    sim.cache.parent.mkdir(parents=True, exist_ok=True)
    kv = sim.run("chunks", str(GiB), CUDA_DEVICE_MEMORY_LIMIT_0="4Gi")
    assert 0 < int(kv["allocated"]) <= 4 * GiB, kv
    for tampered in (0, 40 * GiB):
        with Region.open(sim.cache, readonly=False) as region:
            region.set_memory_limit(0, tampered)
        for fail_open in ("0", "1"):  # the administrator's switch for broken files does not open a tampered one
            env = sim.env(CUDA_DEVICE_MEMORY_LIMIT_0="4Gi", VGPU_ISOLATION_FAIL_OPEN=fail_open)
            res = subprocess.run([str(sim.probe), "chunks", str(GiB)], env=env, capture_output=True, text=True,
                                 timeout=60)
            (line,) = _error_lines(res.stderr)
            assert "gives device 0 a memory limit of" in line and "looser than" in line, line
            assert "refused" in line and "WITHOUT" not in line, line
            assert parse_kv(res.stdout).get("allocated") in (None, "0"), res.stdout
