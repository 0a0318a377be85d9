"""The pacer (node/pacing.py) in the real `vgpu dra-plugin --backend nvml` over the simulated NVML, on a GPU that
time-slices between contexts (SIMGPU_TIMESLICE_NS, 2 ms). Two claims share the A100 at 30 and 50 cores, each
reserved for one pod (status.reservedFor, as kube-scheduler writes it); processes in those pods' cgroups run 2.7 ms
kernels under libvgpu.so with the CDI environment the claims were prepared with. The plugin tells a process's claim
from its pod, reads NVML's per-process utilization and the claims' accounting files once a second, and writes each
claim's pace file (mounted read-only at /usr/local/vgpu/pace). Each claim gets its limit within 3 points, where
without the pacer it gets about two thirds (tests/isolation/test_compute_timeslice.py). Also: which pods a claim
serves is kept in the checkpoint and refreshed when a further pod's prepare asks for the claim again."""

from __future__ import annotations

import subprocess
import time
import uuid as uuidlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from dra_helpers import DRABed, cdi_devices, eventually, result
from pacing_checks import WARMUP, WINDOW, assert_paced, build_probe, timeline

from vgpu.draplugin.checkpoint import PreparedClaim
from vgpu.draplugin.prepare import pacing_records
from vgpu.isolation.build import ensure_built
from vgpu.testbed.build import ensure_sim_built

A100 = "GPU-0a7d2c1e-5b9f-4c3d-8e21-6f4a9b0c1d2e"
DEVICES = f"NVIDIA A100-PCIE-40GB:40960:108:{A100}"


def _start_nvml(bed: DRABed) -> dict[str, str]:
    """Run the plugin over the simulated NVML (one A100); the simulator's environment."""
    sim = ensure_sim_built()
    sim_env = {"LD_LIBRARY_PATH": str(sim.sim_dir), "SIMGPU_DEVICES": DEVICES,
               "SIMGPU_STATE": str(bed.tmp / "node.state")}
    bed.env = sim_env
    args = bed.command("--pace-seconds", "1")
    args[args.index("--backend") + 1] = "nvml"
    for flag in ("--sim-gpus", "--sim-control"):   # the sim backend's own
        at = args.index(flag)
        del args[at:at + 2]
    bed.args = args
    bed._spawn()
    return sim_env


def _reserve(bed: DRABed, claim: dict[str, Any], *pods: str) -> dict[str, Any]:
    """Reserve the claim for pods (name, a fresh UID each) as kube-scheduler does; the claim and the UIDs."""
    reserved = [{"resource": "pods", "name": p, "uid": str(uuidlib.uuid4())} for p in pods]
    status = {"status": {"allocation": claim["status"]["allocation"], "reservedFor": reserved}}
    bed.resource.patch_namespaced_resource_claim_status(claim["metadata"]["name"], "default", status,
                                                        _preload_content=False)
    return {**claim, "reservedFor": [r["uid"] for r in reserved]}


def _device_name(bed: DRABed) -> str:
    (device,) = [d["name"] for d in bed.read_slice()["spec"]["devices"] if d["attributes"]["uuid"]["string"] == A100]
    return str(device)


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    return build_probe(tmp_path_factory.mktemp("pacing"))


def test_the_dra_plugins_pacer_gives_each_claim_its_limit_on_a_time_sliced_gpu(bed, probe, cgroups, monkeypatch):
    sim_env = _start_nvml(bed)
    monkeypatch.setenv("SIMGPU_STATE", sim_env["SIMGPU_STATE"])   # the simulator's helpers read this node's GPU
    monkeypatch.setenv("SIMGPU_DEVICES", DEVICES)
    sim = timeline()
    gpu = _device_name(bed)
    claims = []
    for name, cores in (("thirty", 30), ("fifty", 50)):
        claim = bed.claim(name, [result(gpu, memory="4Gi", cores=str(cores), share=f"s-{name}")])
        claims.append(_reserve(bed, claim, f"{name}-pod"))
    response = bed.prepare(*claims)
    seconds = WARMUP + WINDOW + 0.5
    procs, pace_files = [], []
    for claim in claims:
        uid = claim["metadata"]["uid"]
        assert response[uid].error == "", response[uid].error
        (device,) = cdi_devices(bed.cdi_spec(claim)).values()
        env, mounts = device["env"], device["mounts"]
        pace_dir = Path(mounts["/usr/local/vgpu/pace"]["hostPath"])
        assert pace_dir == bed.hook / "vgpu" / "pace" / f"{uid}_gpu"
        assert "ro" in mounts["/usr/local/vgpu/pace"]["options"]
        pace_files.append(pace_dir / "factors")
        cache = Path(mounts["/tmp/vgpu"]["hostPath"]) / Path(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]).name
        run_env = {**sim_env, **env, "SIMGPU_TIMESLICE_NS": "2000000", "LD_PRELOAD": str(ensure_built().libvgpu),
                   "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cache), "VGPU_PACE_FILE": str(pace_dir / "factors")}
        cgroup = cgroups(claim["reservedFor"][0])
        procs.append(subprocess.Popen(
            ["sh", "-c", f'echo $$ > "{cgroup}/cgroup.procs" && exec "$0" mix long {seconds} 1', str(probe)],
            env=run_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    t0 = sim.simgpu_now_ns()
    time.sleep(WARMUP + WINDOW / 2)
    factors = [p.read_text() for p in pace_files]
    assert_paced(sim, procs, t0, factors, A100, seconds, bed.log())
    for claim in claims:   # unprepare removes the pace directory with the rest
        assert bed.unprepare(claim)[claim["metadata"]["uid"]].error == ""
    assert not any(p.parent.exists() for p in pace_files)


def test_the_pods_a_claim_serves_are_checkpointed_and_refreshed_by_a_further_prepare(bed):
    bed.start(gpus="1xA100-40GB")
    claim = bed.claim("shared", [result("gpu-0", memory="4Gi", cores="30", share="s1")])
    first = _reserve(bed, claim, "one")
    assert bed.prepare(first)[claim["metadata"]["uid"]].error == ""
    checkpoint = bed.dra_socket.parent / "checkpoint.json"

    def consumers() -> list[str]:
        (only,) = orjson.loads(checkpoint.read_bytes())["claims"].values()
        return list(only.get("consumers"))

    assert consumers() == first["reservedFor"]
    both = _reserve(bed, claim, "one", "two")   # a second pod shares the claim: its prepare asks again
    assert bed.prepare(both)[claim["metadata"]["uid"]].error == ""
    eventually(lambda: consumers() == both["reservedFor"], 5, "the checkpoint to name both pods")
    bed.restart()   # read back after a restart, as it was written
    assert bed.prepare(both)[claim["metadata"]["uid"]].error == ""
    assert consumers() == both["reservedFor"]


def test_pacing_records_are_the_claims_whose_pods_are_known():
    from vgpu.draplugin.checkpoint import CDIDevice
    env = {"VGPU_DEVICE_UUIDS": A100, "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m", "CUDA_DEVICE_SM_LIMIT": "30",
           "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/vgpu/c1.cache"}
    known = PreparedClaim("u1", "default", "one", (), (CDIDevice("u1-gpu", env, ()),), ("gpu",), ("pod-a",))
    unknown = PreparedClaim("u2", "default", "two", (), (CDIDevice("u2-gpu", env, ()),), ("gpu",))
    assert PreparedClaim.from_json("u1", known.to_json()) == known
    old = known.to_json()
    del old["consumers"]   # a checkpoint written before claims named their pods
    assert PreparedClaim.from_json("u1", old).consumers == ()
    (record,) = pacing_records({"u1": known, "u2": unknown})
    assert (record.pod_uid, record.container, record.gpus, record.cores) == ("u1", "gpu", (A100,), 30)
    assert record.memory_bytes == (4096 << 20,) and record.cache_file == "c1.cache"
