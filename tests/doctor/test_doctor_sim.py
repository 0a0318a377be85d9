"""`vgpu doctor --quick` over the test bed's simulated GPU, run once as a subprocess: the limits hold, every probe
reports, the JSON has its documented shape."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from capabilities import missing
from doctor_helpers import FRAMEWORK_MODULE, NON_FRAMEWORK, Ran, run_doctor

from vgpu.isolation.doctor.catalog import NAMES

GiB = 1 << 30
# probes the simulated driver has everything for: they must run, not skip
MUST_RUN = ["mem-alloc", "mem-pitch", "mem-managed", "mem-async", "mem-pool", "mem-vmm", "mem-array", "meminfo-cuda",
            "meminfo-nvml", "mem-reclaim", "mem-shared", "kernel-clock", "share-long-30", "share-long-60",
            "share-short-30", "share-short-60", "launch-overhead"]


@pytest.fixture(scope="module")
def ran(sim_dir: Path, libvgpu: Path, tmp_path_factory: pytest.TempPathFactory) -> Ran:
    """This checkout's library (a node's installed copy must not stand in for it)."""
    return run_doctor(tmp_path_factory.mktemp("doctor"), "--driver-dir", str(sim_dir), "--quick", "--lib",
                      str(libvgpu))


def test_limits_hold_and_the_run_says_so(ran):
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.rstrip().splitlines()[-1].startswith("limits hold: ")
    progress = [line for line in ran.stderr.splitlines() if line.startswith("vgpu doctor: [")]
    assert [line.split("] ", 1)[1].split(":")[0] for line in progress] == list(NAMES)   # one line per probe
    for name in NAMES:
        assert any(line.startswith(name + " ") for line in ran.stdout.splitlines()), name   # a table row each


def test_the_json_document_has_its_shape(ran, sim_dir, libvgpu):
    doc = ran.doc
    assert doc is not None
    assert {"doctor", "driver", "library", "settings", "probes"} <= set(doc)
    assert doc["doctor"]["exit_status"] == 0
    driver = doc["driver"]
    assert driver["cuda_driver_version"] > 0 and driver["nvml_driver_version"]
    assert driver["libcuda"].startswith(str(sim_dir))
    (device,) = driver["devices"]
    assert device["name"] == "Sim-A100-40GB" and device["uuid"].startswith("GPU-")
    assert device["total_bytes"] == 40 * GiB
    assert doc["library"] == {"path": str(libvgpu.resolve()), "source": "--lib"}
    assert doc["settings"]["memory_limit_bytes"] == GiB and doc["settings"]["quick"] is True
    assert [p["name"] for p in doc["probes"]] == list(NAMES)
    for p in doc["probes"]:
        assert {"name", "group", "what", "ok", "skipped", "reason", "summary", "figures", "seconds"} <= set(p)
        assert isinstance(p["ok"], bool) and isinstance(p["skipped"], bool) and isinstance(p["figures"], dict)
        assert p["reason"] if (p["skipped"] or not p["ok"]) else p["summary"], p


def test_memory_and_compute_probes_pass(ran):
    for name in NON_FRAMEWORK:
        p = ran.probe(name)
        assert p["ok"], p
        if name in MUST_RUN:
            assert not p["skipped"], p
        elif p["skipped"]:       # the v1 cuMemAlloc, stream capture: only where the driver has no entry point
            assert "does not export" in p["reason"], p


def test_the_memory_figures(ran):
    for name in ("mem-alloc", "mem-pitch", "mem-managed", "mem-async", "mem-pool", "mem-vmm", "mem-array"):
        f = ran.probe(name)["figures"]
        assert f["allocated_bytes"] == GiB and f["refused_with"] == "CUDA_ERROR_OUT_OF_MEMORY (2)", (name, f)
    info = ran.probe("meminfo-cuda")["figures"]
    assert info["meminfo_total"] == info["device_total_mem"] == GiB
    assert info["meminfo_free"] == GiB - info["held_bytes"]
    nvml = ran.probe("meminfo-nvml")["figures"]
    assert nvml["nvmlDeviceGetMemoryInfo"]["total"] == GiB
    assert nvml["nvmlDeviceGetMemoryInfo"]["used"] == nvml["held_bytes"]
    shared = ran.probe("mem-shared")["figures"]
    assert sum(shared["per_process_bytes"]) == GiB and all(b > 0 for b in shared["per_process_bytes"])


def test_the_compute_figures(ran):
    clock = ran.probe("kernel-clock")["figures"]["device_ns"]
    assert clock["2000000"] == pytest.approx(2e6, rel=0.01)     # the simulated GPU runs `sleep` for its parameter
    for name, limit in (("share-long-30", 30), ("share-long-60", 60), ("share-short-30", 30), ("share-short-60", 60)):
        f = ran.probe(name)["figures"]
        assert f["limit_pct"] == limit and abs(f["share_pct"] - limit) <= 5 and f["launches"] > 0, (name, f)
    overhead = ran.probe("launch-overhead")["figures"]
    assert overhead["launches_per_s_with"] > 0 and overhead["launches_per_s_without"] > 0
    assert "overhead_pct" in overhead


@pytest.mark.parametrize("name", sorted(FRAMEWORK_MODULE))
def test_framework_probes_skip_where_the_framework_is_missing(ran, name):
    p = ran.probe(name)
    if importlib.util.find_spec(FRAMEWORK_MODULE[name]) is not None:
        missing("frameworks-absent", f"{FRAMEWORK_MODULE[name]} is installed here")
    assert p["ok"] and p["skipped"], p
    assert p["reason"].startswith(f"{FRAMEWORK_MODULE[name]} not importable"), p
