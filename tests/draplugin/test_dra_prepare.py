"""NodePrepareResources / NodeUnprepareResources over the real DRA socket, for claims whose allocation the test
writes through the status subresource as kube-scheduler would: CDI specs and the IDs that resolve in them, the
limits and mounts, shares of one GPU, idempotence, a kill -9 in between, per-claim errors in a batch, and both
v1 and v1beta1."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from dra_helpers import NODE, ROOT, DRABed, cdi_devices, result

from vgpu.node.response import RESERVED_ENV_NAMES
from vgpu.testbed.cdi import CDI_0_5_VERSIONS, CDIRegistry


def _uuid(bed: DRABed, device: str) -> str:
    for entry in bed.read_slice()["spec"]["devices"]:
        if entry["name"] == device:
            return str(entry["attributes"]["uuid"]["string"])
    raise AssertionError(f"{device} is not in the slice")


def _answer(response: Any, claim: dict[str, Any]) -> list[tuple[Any, ...]]:
    entry = response[claim["metadata"]["uid"]]
    assert entry.error == "", entry.error
    return [(tuple(d.request_names), d.pool_name, d.device_name, tuple(d.cdi_device_ids),
             d.share_id if d.HasField("share_id") else None) for d in entry.devices]


def _host_dirs(bed: DRABed, claim: dict[str, Any], request: str = "gpu") -> tuple[Path, Path]:
    key = f"{claim['metadata']['uid']}_{request}"
    return bed.hook / "vgpu" / "containers" / key, bed.lock / key


@pytest.fixture
def started(bed: DRABed) -> DRABed:
    bed.start(gpus="2xA100-40GB")
    return bed


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_prepare_writes_a_cdi_spec_whose_ids_resolve(started: DRABed, version: str) -> None:
    bed = started
    claim = bed.claim("share", [result("gpu-1", memory="10Gi", cores="30", share="a1b2")])
    uid = claim["metadata"]["uid"]
    answer = _answer(bed.prepare(claim, version=version), claim)
    assert len(answer) == 1
    requests, pool, device, ids, share = answer[0]
    assert (requests, pool, device, share) == (("gpu",), NODE, "gpu-1", "a1b2")
    assert len(ids) == 1 and ids[0].startswith("vgpu-sharing.io/gpu=")
    spec = bed.cdi_spec(claim)
    assert spec["kind"] == "vgpu-sharing.io/gpu"
    # the lowest version names led by a digit need, which runtimes with the CDI library v0.5.x also read
    assert spec["cdiVersion"] == "0.5.0"
    assert set(CDIRegistry([bed.cdi], known_versions=CDI_0_5_VERSIONS).resolve(ids).env) >= {"CUDA_DEVICE_SM_LIMIT=30"}
    devices = cdi_devices(spec)
    assert set(devices) == set(ids)  # the returned ID resolves in the spec
    env, mounts = devices[ids[0]]["env"], devices[ids[0]]["mounts"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == _uuid(bed, "gpu-1")
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "10240m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith("/tmp/vgpu/")
    # every variable the library reads as a limit or a switch is ours: CDI env replaces what the pod sets
    assert env["VGPU_ISOLATION_FAIL_OPEN"] == "0" and env["CUDA_DEVICE_SM_LIMIT_0"] == "30"
    assert (env["GPU_CORE_UTILIZATION_POLICY"], env["VGPU_COUNT_MANAGED"]) == ("default", "1")
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "10240m" and env["VGPU_CONTEXT_OVERHEAD"] == "0"
    assert set(env) >= RESERVED_ENV_NAMES
    cache, lock = _host_dirs(bed, claim)
    assert mounts["/usr/local/vgpu/libvgpu.so"]["hostPath"] == str(bed.hook / "vgpu" / "libvgpu.so")
    assert "ro" in mounts["/usr/local/vgpu/libvgpu.so"]["options"]
    assert mounts["/etc/ld.so.preload"]["hostPath"] == str(bed.hook / "vgpu" / "ld.so.preload")
    assert mounts["/tmp/vgpu"]["hostPath"] == str(cache) and "rw" in mounts["/tmp/vgpu"]["options"]
    assert mounts["/tmp/vgpulock"]["hostPath"] == str(lock)
    for path in (cache, lock):
        assert path.is_dir()
    for mount in mounts.values():
        assert Path(mount["hostPath"]).exists(), mount
    assert (bed.hook / "vgpu" / "libvgpu.so").is_file()
    assert uid in ids[0]
    # unprepare through the same version removes the spec and the directories
    assert bed.unprepare(claim, version=version)[uid].error == ""
    assert not list(bed.cdi.glob("*.json"))
    assert not cache.exists() and not lock.exists()


def test_two_claims_share_one_gpu_each_with_its_own_limits_and_directories(started: DRABed) -> None:
    bed = started
    one = bed.claim("one", [result("gpu-0", memory="8Gi", cores="25", share="s-one")])
    two = bed.claim("two", [result("gpu-0", memory="16Gi", cores="50", share="s-two")])
    response = bed.prepare(one, two)
    a, b = _answer(response, one)[0], _answer(response, two)[0]
    assert (a[2], a[4]) == ("gpu-0", "s-one") and (b[2], b[4]) == ("gpu-0", "s-two")
    assert a[3] != b[3]
    env_a = cdi_devices(bed.cdi_spec(one))[a[3][0]]["env"]
    env_b = cdi_devices(bed.cdi_spec(two))[b[3][0]]["env"]
    assert env_a["NVIDIA_VISIBLE_DEVICES"] == env_b["NVIDIA_VISIBLE_DEVICES"] == _uuid(bed, "gpu-0")
    assert (env_a["CUDA_DEVICE_MEMORY_LIMIT_0"], env_a["CUDA_DEVICE_SM_LIMIT"]) == ("8192m", "25")
    assert (env_b["CUDA_DEVICE_MEMORY_LIMIT_0"], env_b["CUDA_DEVICE_SM_LIMIT"]) == ("16384m", "50")
    assert set(_host_dirs(bed, one)).isdisjoint(_host_dirs(bed, two))
    # unpreparing one leaves the other's files
    assert bed.unprepare(one)[one["metadata"]["uid"]].error == ""
    assert all(p.is_dir() for p in _host_dirs(bed, two))
    assert cdi_devices(bed.cdi_spec(two))


def test_one_request_over_two_gpus_and_a_second_request(started: DRABed) -> None:
    bed = started
    claim = bed.claim("multi", [result("gpu-0", request="train", memory="4Gi", cores="0", share="x"),
                                result("gpu-1", request="train", memory="6Gi", cores="0", share="y"),
                                result("gpu-1", request="eval", memory="1Gi", cores="10", share="z")],
                      requests=("train", "eval"))
    answer = _answer(bed.prepare(claim), claim)
    assert [(r, d, s) for r, _, d, _, s in answer] == [(("train",), "gpu-0", "x"), (("train",), "gpu-1", "y"),
                                                       (("eval",), "gpu-1", "z")]
    train_id, eval_id = answer[0][3][0], answer[2][3][0]
    assert answer[1][3][0] == train_id and eval_id != train_id  # one CDI device per request
    devices = cdi_devices(bed.cdi_spec(claim))
    assert set(devices) == {train_id, eval_id}
    train = devices[train_id]["env"]
    assert train["NVIDIA_VISIBLE_DEVICES"] == f"{_uuid(bed, 'gpu-0')},{_uuid(bed, 'gpu-1')}"
    assert (train["CUDA_DEVICE_MEMORY_LIMIT_0"], train["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("4096m", "6144m")
    assert train["CUDA_DEVICE_SM_LIMIT"] == "0"  # no cores asked: no SM limit
    assert devices[eval_id]["env"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1024m"
    assert all(p.is_dir() for r in ("train", "eval") for p in _host_dirs(bed, claim, r))


def test_a_first_available_result_is_answered_under_its_parent_request(started: DRABed) -> None:
    # kube-scheduler writes `request: gpu/large` for the alternative it took; a container names `gpu`, and kubelet
    # matches request names exactly
    bed = started
    claim = bed.claim("alt", [result("gpu-0", request="gpu/large", memory="4Gi", cores="20", share="q")])
    answer = _answer(bed.prepare(claim), claim)
    assert [(r, d) for r, _, d, _, _ in answer] == [(("gpu",), "gpu-0")]
    env = cdi_devices(bed.cdi_spec(claim))[answer[0][3][0]]["env"]
    assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT"]) == ("4096m", "20")


def test_a_whole_device_without_consumed_capacity_gets_the_whole_card(started: DRABed) -> None:
    bed = started
    claim = bed.claim("whole", [result("gpu-0", memory=None, cores=None, share=None)])
    answer = _answer(bed.prepare(claim), claim)
    assert answer[0][4] is None  # no share ID: share_id is absent, not empty
    env = cdi_devices(bed.cdi_spec(claim))[answer[0][3][0]]["env"]
    assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT"]) == ("40960m", "100")


def test_prepare_twice_answers_the_same_and_unprepare_twice_succeeds(started: DRABed) -> None:
    bed = started
    claim = bed.claim("twice", [result("gpu-1")])
    uid = claim["metadata"]["uid"]
    first = _answer(bed.prepare(claim), claim)
    spec = bed.cdi_spec(claim)
    assert _answer(bed.prepare(claim), claim) == first
    assert bed.cdi_spec(claim) == spec  # not rebuilt (the accounting file name stays)
    assert bed.unprepare(claim)[uid].error == ""
    assert bed.unprepare(claim)[uid].error == ""
    assert not list(bed.cdi.glob("*.json"))
    # a claim this plugin never saw
    stranger = {"metadata": {"namespace": "default", "name": "nobody", "uid": "0000-never"}}
    assert bed.unprepare(stranger)["0000-never"].error == ""


def test_prepare_survives_kill_9(started: DRABed) -> None:
    bed = started
    claim = bed.claim("survivor", [result("gpu-0", memory="2Gi", cores="20", share="k9")])
    uid = claim["metadata"]["uid"]
    first = _answer(bed.prepare(claim), claim)
    spec = bed.cdi_spec(claim)
    bed.restart()  # SIGKILL, then the same command
    assert _answer(bed.prepare(claim), claim) == first
    assert bed.cdi_spec(claim) == spec
    # even with the claim gone from the API server, the restarted plugin knows what it made
    bed.resource.delete_namespaced_resource_claim("survivor", "default")
    bed.restart()
    assert bed.unprepare(claim)[uid].error == ""
    assert not list(bed.cdi.glob("*.json"))
    assert not any(p.exists() for p in _host_dirs(bed, claim))


def test_a_bad_claim_in_a_batch_fails_alone(started: DRABed) -> None:
    bed = started
    good = bed.claim("good", [result("gpu-0")])
    bad = bed.claim("bad", [result("gpu-7")])
    response = bed.prepare(bad, good)
    assert set(response) == {good["metadata"]["uid"], bad["metadata"]["uid"]}
    assert _answer(response, good)[0][2] == "gpu-0"
    error = response[bad["metadata"]["uid"]].error
    assert "default/bad" in error and "gpu-7" in error and "no such device" in error
    assert not response[bad["metadata"]["uid"]].devices
    assert len(list(bed.cdi.glob("*.json"))) == 1  # nothing left behind by the refused claim
    assert not any(p.exists() for p in _host_dirs(bed, bad))
    # a refused claim is not remembered as prepared: once fixed (a new claim), it prepares
    response = bed.unprepare(bad, good)
    assert [response[c["metadata"]["uid"]].error for c in (bad, good)] == ["", ""]


def _error(bed: DRABed, claim: dict[str, Any]) -> str:
    response = bed.prepare(claim)
    entry = response[claim["metadata"]["uid"]]
    assert not entry.devices
    return str(entry.error)


@pytest.mark.parametrize("results,message", [
    (None, "not allocated"),
    ([result("gpu-0", pool="node-b")], "no allocation result of driver gpu.vgpu-sharing.io in pool 'node-a'"),
    ([result("gpu-0", driver="net.example.com")], "no allocation result"),
    ([result("gpu-9")], "no such device on this node"),
    ([result("gpu-0", memory="lots")], "consumed memory"),
    ([result("gpu-0", cores="150")], "consumed cores"),
    ([result("gpu-0", memory="41Gi")], "more than the device's 40960Mi"),
    ([result("gpu-0", memory="0")], "consumes no memory"),
])
def test_a_claim_that_cannot_be_prepared_says_why(started: DRABed, results: list[dict[str, Any]] | None,
                                                 message: str) -> None:
    claim = started.claim("wrong", results)
    error = _error(started, claim)
    assert "default/wrong" in error and message in error, error
    assert not list(started.cdi.glob("*.json"))


def test_a_missing_or_replaced_claim_says_so(started: DRABed) -> None:
    bed = started
    ghost = {"metadata": {"namespace": "default", "name": "ghost", "uid": "1111"}}
    assert "not found" in _error(bed, ghost)
    real = bed.claim("real", [result("gpu-0")])
    impostor = {"metadata": {"namespace": "default", "name": "real", "uid": "2222"}}
    error = _error(bed, impostor)
    assert "UID" in error and real["metadata"]["uid"] in error


def test_an_unhealthy_gpu_is_not_prepared_for_a_new_claim(started: DRABed) -> None:
    from dra_helpers import eventually

    bed = started
    bed.inject("xid 0 79")
    eventually(lambda: [d["name"] for d in bed.read_slice()["spec"]["devices"]] == ["gpu-1"], what="gpu-0 out")
    claim = bed.claim("late", [result("gpu-0")])
    assert "unhealthy" in _error(bed, claim)


def test_isolation_fail_open_reaches_the_container(bed: DRABed) -> None:
    bed.start("--isolation-fail-open")
    claim = bed.claim("open", [result("gpu-0")])
    answer = _answer(bed.prepare(claim), claim)
    assert cdi_devices(bed.cdi_spec(claim))[answer[0][3][0]]["env"]["VGPU_ISOLATION_FAIL_OPEN"] == "1"


@pytest.mark.parametrize("content,message", [
    (b"{not json", "malformed"),
    (b'{"version": 99, "claims": {}}', "version 99 is not 1"),
    (b'{"version": 1, "claims": {"u": {"namespace": "default"}}}', "malformed"),
])
def test_an_unreadable_checkpoint_stops_the_plugin_with_one_line(bed: DRABed, content: bytes, message: str) -> None:
    checkpoint = bed.plugins / "gpu.vgpu-sharing.io" / "checkpoint.json"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(content)
    res = subprocess.run(bed.command(), cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("vgpu dra-plugin: checkpoint ") and str(checkpoint) in last and message in last, last
    assert checkpoint.read_bytes() == content  # left as it was
    assert not bed.dra_socket.exists() and not bed.registration_socket.exists()
