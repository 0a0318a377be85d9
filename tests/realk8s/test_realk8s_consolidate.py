"""`vgpu whatif` and `vgpu consolidate` against a real cluster: shares fragmented over the four GPUs of one node, a
pending pod that asks a whole GPU and fits nowhere, and `vgpu consolidate --execute` freeing a GPU for it with the
fewest evictions it can make: kube-controller-manager's ReplicaSet controller re-creates the evicted pods, its
disruption controller keeps the PodDisruptionBudget's status that the plan honours, the extender charges the node's
consolidation hold so that no replacement lands on the GPU being freed, and the pending pod runs there.

The layout is made by departures, as fragmentation comes about in a cluster: stand-in "finished jobs" (bare filler
pods) take room while the shares are placed and are deleted afterwards, so that every placement is forced by
capacity alone, whatever GPU order the extender's policy has. The running pods carry no GPU order of their own
(`hami.io/gpu-scheduler-policy`): `vgpu whatif` re-places each pod with the order it carries, so pods that asked to
be spread would be spread again in every row, and no row could show the room that packing makes.

    GPU  pods                                   moves to free it
    G_a  lone (bare, 80 %)                      never: a bare pod
    G_b  guarded-x (60 %, 2,000 MiB)            never: its budget allows no disruption
    G_c  guarded-y (60 %, 2,000 MiB)            never: the same
    G_d  batch-x, batch-y (30 %, 4,000 MiB)     2: the fewest there are

A GPU with one share would take one move if bare pods and budgets did not count; the plan must take two. The moved
shares fit beside the budgeted ones only (80 % + 30 % is too much for G_a).

The batch ReplicaSet's template asks binpack once its pods run (a ReplicaSet leaves the pods it has as they are when
its template changes): an evicted pod is still charged on G_d while it terminates, which makes G_d the fullest GPU
that fits its replacement, so only the consolidation hold keeps the replacement off it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from realk8s_helpers import create, get_pod, gpu_container, gpu_pod, phase, report, wait_finished

from vgpu import keys
from vgpu.assignment import decode

pytestmark = [pytest.mark.realk8s, pytest.mark.slow]

NS = "default"
NODE = "node-0"
CARD_MIB = 40960  # the simulated A100-40GB
LONE_CORES = 80  # nothing of the batch fits beside it
GUARDED_CORES = 60  # two never share a GPU, nor one with `lone`; a batch share fits beside one
SMALL_MIB = 2000  # the memory of `lone` and `guarded`: less than batch's, so binpack prefers G_d while it can
BATCH_CORES, BATCH_MIB = 30, 4000
_script = Path(sys.executable).with_name("vgpu")
VGPU = [str(_script)] if _script.exists() else [sys.executable, "-m", "vgpu.cli"]


# ----------------------------------------------------------------------------------------------- objects

def _sleeper(cores: int, memory: int | None = None, percent: int | None = None) -> dict:
    """A container that holds a GPU share and sleeps (the share is what matters, not what runs in it)."""
    limits = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-cores": str(cores)}
    if memory is not None:
        limits["volcano.sh/vgpu-memory"] = str(memory)
    if percent is not None:
        limits["volcano.sh/vgpu-memory-percentage"] = str(percent)
    return {"name": "main", "command": ["sleep", "3600"],
            "resources": {"limits": limits, "requests": {"cpu": "10m", "memory": "16Mi"}}}


def _bare(name: str, container: dict) -> dict:
    return gpu_pod(name, [container])


def _replica_set(name: str, replicas: int, cores: int, memory: int) -> dict:
    pod = gpu_pod("template", [_sleeper(cores, memory)], restartPolicy="Always")
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": pod["spec"]}}}


def _budget(name: str, app: str, min_available: int) -> dict:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name, "namespace": NS},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}}}


# ----------------------------------------------------------------------------------------------- reading

def _wait(cluster, what: str, predicate: Callable[[], Any], timeout: float) -> Any:
    try:
        return cluster.wait(what, predicate, timeout)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}\n{cluster.describe()}") from exc


def _gpu(pod: dict) -> str | None:
    """The one GPU the pod's assignment names (None while it has none)."""
    ids = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.VGPU_IDS)
    if not ids:
        return None
    uuids = {grant.uuid.split("[", 1)[0] for segment in decode(ids) for grant in segment}
    assert len(uuids) == 1, (pod["metadata"]["name"], ids)
    return uuids.pop()


def _live_pods(cluster, app: str | None = None) -> list[dict]:
    """The pods of the namespace (of one app), not being deleted."""
    params = {"labelSelector": f"app={app}"} if app else {}
    items = cluster.get(f"/api/v1/namespaces/{NS}/pods", **params)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def _placed(cluster, names_or_app: list[str] | str, count: int | None = None) -> dict[str, str] | None:
    """name -> GPU of these pods (by name, or of an app, `count` of them) once every one is bound with an
    assignment; None before."""
    pods = ([get_pod(cluster, n) for n in names_or_app] if isinstance(names_or_app, list)
            else _live_pods(cluster, names_or_app))
    if count is not None and len(pods) != count:
        return None
    where = {p["metadata"]["name"]: _gpu(p) for p in pods if p["spec"].get("nodeName")}
    return where if len(where) == len(pods) and all(where.values()) else None


def _gone(cluster, name: str) -> bool:
    return cluster.http.get(f"/api/v1/namespaces/{NS}/pods/{name}").status_code == 404


def _delete(cluster, name: str) -> None:
    cluster.http.delete(f"/api/v1/namespaces/{NS}/pods/{name}").raise_for_status()


def _hold_annotation(cluster) -> str | None:
    return (cluster.get(f"/api/v1/nodes/{NODE}")["metadata"].get("annotations") or {}).get(keys.CONSOLIDATION_HOLD)


def _vgpu(cluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*VGPU, *args, "--kubeconfig", cluster.kubeconfig], capture_output=True, text=True,
                          timeout=timeout)


def _layout(cluster) -> dict[str, list[dict]]:
    """GPU -> the live vGPU pods on it."""
    by_gpu: dict[str, list[dict]] = {}
    for pod in _live_pods(cluster):
        gpu = _gpu(pod)
        if gpu is not None:
            by_gpu.setdefault(gpu, []).append(pod)
    return by_gpu


def _state(cluster) -> dict[str, tuple[str, str | None, str | None]]:
    """uid -> (name, node, GPU) of every live pod: what a dry run must leave as it is."""
    return {p["metadata"]["uid"]: (p["metadata"]["name"], p["spec"].get("nodeName"), _gpu(p))
            for p in _live_pods(cluster)}


# ----------------------------------------------------------------------------------------------- the cluster

@pytest.fixture(scope="module")
def cluster(make_real_cluster):
    """One node of four GPUs: one kubelet and one containerd start sooner than two on this tier, and the moved
    shares find room on the same node as they would on another."""
    return make_real_cluster(nodes=1, gpus="4xA100-40GB")


@pytest.fixture(scope="module")
def fragmented(cluster) -> dict[str, Any]:
    """The layout of the module text, and the pending whole-GPU pod `big`; what the tests compare with."""
    # 1. a finished-job stand-in takes one whole GPU, so `lone` and the budgeted shares go one to each of the others
    create(cluster, _bare("filler-whole", _sleeper(100, percent=100)))
    whole_gpu = _wait(cluster, "filler-whole placed", lambda: _placed(cluster, ["filler-whole"]), 60)["filler-whole"]
    create(cluster, _bare("lone", _sleeper(LONE_CORES, SMALL_MIB)))
    cluster.post(f"/apis/apps/v1/namespaces/{NS}/replicasets", _replica_set("guarded", 2, GUARDED_CORES, SMALL_MIB))
    lone = _wait(cluster, "lone placed", lambda: _placed(cluster, ["lone"]), 60)
    guarded = _wait(cluster, "guarded placed", lambda: _placed(cluster, "guarded", 2), 90)
    assert len({*lone.values(), *guarded.values(), whole_gpu}) == 4, (lone, guarded, whole_gpu)
    # 2. two more fill the rest of the budgeted shares' GPUs; the whole one leaves: the batch shares can only go there
    fillers = [f"filler-{i}" for i in range(2)]
    for name in fillers:
        create(cluster, _bare(name, _sleeper(100 - GUARDED_CORES, SMALL_MIB)))
    placed = _wait(cluster, "fillers placed", lambda: _placed(cluster, fillers), 90)
    assert sorted(placed.values()) == sorted(guarded.values()), (placed, guarded)
    _delete(cluster, "filler-whole")
    _wait(cluster, "filler-whole gone", lambda: _gone(cluster, "filler-whole"), 60)
    cluster.post(f"/apis/apps/v1/namespaces/{NS}/replicasets", _replica_set("batch", 2, BATCH_CORES, BATCH_MIB))
    batch = _wait(cluster, "batch placed", lambda: _placed(cluster, "batch", 2), 90)
    assert set(batch.values()) == {whole_gpu}, batch
    # from now on the batch ReplicaSet's new pods ask binpack (module text); the running ones ask nothing
    answer = cluster.http.patch(f"/apis/apps/v1/namespaces/{NS}/replicasets/batch", content=json.dumps(
        {"spec": {"template": {"metadata": {"annotations": {keys.HAMI_GPU_SCHEDULER_POLICY: "binpack"}}}}}),
        headers={"Content-Type": "application/merge-patch+json"})
    answer.raise_for_status()
    # 3. the other stand-ins leave too
    for name in fillers:
        _delete(cluster, name)
    _wait(cluster, "fillers gone", lambda: all(_gone(cluster, name) for name in fillers), 60)
    _wait(cluster, "the shares running", lambda: len(pods := _live_pods(cluster)) == 5
          and all(phase(p) == "Running" for p in pods), 90)
    layout = _layout(cluster)
    shares = {gpu: sorted(p["metadata"]["name"] for p in pods) for gpu, pods in layout.items()}
    assert len(layout) == 4, shares  # every GPU holds a share: none is free
    # the budget: kube-controller-manager's disruption controller counts the healthy pods and allows nothing
    cluster.post(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets", _budget("guarded", "guarded", 2))

    def budget_settled() -> bool:
        status = cluster.get(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/guarded").get("status") or {}
        return (status.get("observedGeneration") == 1 and status.get("currentHealthy") == 2
                and status.get("disruptionsAllowed") == 0)

    _wait(cluster, "the disruption controller's status", budget_settled, 60)
    # the pod that asks a whole GPU: it fits nowhere
    big = gpu_pod("big", [gpu_container("main", ["--mib", "1000", "--kernels", "2", "--hold", "1"], cores=100)])
    big["spec"]["containers"][0]["resources"]["limits"]["volcano.sh/vgpu-memory-percentage"] = "100"
    big_uid = create(cluster, big)["metadata"]["uid"]
    _wait(cluster, "big turned away", lambda: [e for e in cluster.events(NS, "big")
                                               if e.startswith("FilteringFailed:")], 60)
    time.sleep(3)
    assert phase(get_pod(cluster, "big")) == "Pending" and not get_pod(cluster, "big")["spec"].get("nodeName")
    return {"layout": layout, "shares": shares, "batch_gpu": whole_gpu, "big_uid": big_uid,
            "lone_uid": get_pod(cluster, "lone")["metadata"]["uid"],
            "guarded_uids": sorted(p["metadata"]["uid"] for p in _live_pods(cluster, "guarded"))}


def _protected(pod: dict) -> bool:
    """Whether the plan may never move the pod: a bare pod, or one of the budgeted ReplicaSet."""
    return not pod["metadata"].get("ownerReferences") or pod["metadata"].get("labels", {}).get("app") == "guarded"


def _fewest_moves(layout: dict[str, list[dict]]) -> tuple[int, set[str]]:
    """The fewest evictions that free a GPU, and the GPUs that take that many: only GPUs with no protected pod can
    be freed, at the cost of one move per share."""
    freeable = {gpu: len(pods) for gpu, pods in layout.items() if not any(_protected(p) for p in pods)}
    assert freeable, "no GPU of the layout can be freed"
    fewest = min(freeable.values())
    return fewest, {gpu for gpu, n in freeable.items() if n == fewest}


# ----------------------------------------------------------------------------------------------- the tests

def test_whatif_and_the_dry_run_see_the_room_and_change_nothing(cluster, fragmented):
    fewest, gpus = _fewest_moves(fragmented["layout"])
    assert (fewest, gpus) == (2, {fragmented["batch_gpu"]}), fragmented["shares"]
    # without the budget and the bare pod, one move would do: the plan's choice is not merely the emptiest GPU
    assert min(len(pods) for pods in fragmented["layout"].values()) == 1
    before, hold_before = _state(cluster), _hold_annotation(cluster)
    assert hold_before is None

    done = _vgpu(cluster, "whatif", "--json")
    assert done.returncode == 0, done.stderr
    rows = {row["policy"]: row for row in json.loads(done.stdout)["rows"]}
    assert rows["kept"]["pending"] == 1 and rows["kept"]["pending_placed"] == 0, rows["kept"]
    assert rows["kept"]["waiting"] == [f"{NS}/big"] and rows["kept"]["gpus_free"] == 0, rows["kept"]
    assert rows["fragaware"]["pending_placed"] == 1 and rows["fragaware"]["waiting"] == [], rows["fragaware"]

    done = _vgpu(cluster, "consolidate", "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["unmet"] == [] and plan["fitting"] == [], plan
    (step,) = plan["steps"]
    assert step["for"] == f"{NS}/big" and step["node"] == NODE and step["gpus"] == [fragmented["batch_gpu"]], plan
    assert plan["moves"] == len(step["moves"]) == fewest, plan
    on_freed = {f"{NS}/{p['metadata']['name']}" for p in fragmented["layout"][fragmented["batch_gpu"]]}
    assert {m["pod"] for m in step["moves"]} == on_freed, plan
    moved_names = {m["pod"].split("/", 1)[1] for m in step["moves"]}
    protected = {p["metadata"]["name"] for pods in fragmented["layout"].values() for p in pods if _protected(p)}
    assert len(protected) == 3 and "lone" in protected, protected  # the bare pod and both budgeted ones
    assert not moved_names & protected, plan
    for move in step["moves"]:
        assert move["from"] == move["to"] == NODE and fragmented["batch_gpu"] not in move["gpus"], move
    assert (plan["pending_placed_before"], plan["pending_placed_after"]) == (0, 1), plan

    # a dry run: nothing moved, nothing held, nothing placed
    assert _state(cluster) == before
    assert _hold_annotation(cluster) is None
    assert not get_pod(cluster, "big")["spec"].get("nodeName")
    assert not [e for p in before.values() for e in cluster.events(NS, p[0]) if e.startswith("Consolidating:")]


def test_execute_frees_the_gpu_and_the_pod_runs_there(cluster, fragmented):
    freed = fragmented["batch_gpu"]
    evicted = {p["metadata"]["uid"]: p["metadata"]["name"] for p in fragmented["layout"][freed]}
    started = time.monotonic()
    done = _vgpu(cluster, "consolidate", "--execute", "--timeout", "120s", "--json", timeout=300)
    took = time.monotonic() - started
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{cluster.describe()}"
    result = json.loads(done.stdout)
    assert result["stopped"] == "" and result["steps_done"] == 1, result
    assert result["moves_done"] == len(evicted) == 2, result
    # the room was kept for `big` while the replacements were placed; the hold is gone once `big` is bound
    assert _hold_annotation(cluster) is None

    big = get_pod(cluster, "big")
    assert big["metadata"]["uid"] == fragmented["big_uid"]
    assert big["spec"].get("nodeName") == NODE and _gpu(big) == freed, big["metadata"].get("annotations")
    finished = wait_finished(cluster, "big", timeout=90)
    assert phase(finished) == "Succeeded", (finished["status"], cluster.events(NS, "big"))
    (device,) = report(cluster, "big", "main")["devices"]
    assert device["uuid"] == freed and device["total_mib"] == CARD_MIB, device

    # the evicted pods are gone and their ReplicaSet replaced them, off the freed GPU, running
    for uid, name in evicted.items():
        answer = cluster.http.get(f"/api/v1/namespaces/{NS}/pods/{name}")
        assert answer.status_code == 404 or answer.json()["metadata"]["uid"] != uid or \
            answer.json()["metadata"].get("deletionTimestamp"), name
    replacements = _wait(cluster, "the replacements running", lambda: len(pods := _live_pods(cluster, "batch")) == 2
                         and all(phase(p) == "Running" for p in pods) and pods, 90)
    assert not {p["metadata"]["uid"] for p in replacements} & set(evicted), replacements
    assert all(p["spec"]["nodeName"] == NODE and _gpu(p) not in (None, freed) for p in replacements), \
        [(p["metadata"]["name"], _gpu(p)) for p in replacements]
    assert all(p["metadata"]["annotations"].get(keys.HAMI_GPU_SCHEDULER_POLICY) == "binpack" for p in replacements)
    # the extender charged the hold (its ledger read the node's annotation) for `big` on that node
    log = cluster.procs["extender"].log_path.read_text()
    assert f"event=consolidation_hold pod={NS}/big node={NODE}" in log, log[-3000:]
    # nothing else moved: the bare pod and the budgeted ones keep their UIDs and run on the GPUs they had
    kept = [get_pod(cluster, "lone"), *_live_pods(cluster, "guarded")]
    assert kept[0]["metadata"]["uid"] == fragmented["lone_uid"]
    assert sorted(p["metadata"]["uid"] for p in kept[1:]) == fragmented["guarded_uids"]
    had = {p["metadata"]["uid"]: gpu for gpu, pods in fragmented["layout"].items() for p in pods}
    assert all(phase(p) == "Running" and _gpu(p) == had[p["metadata"]["uid"]] for p in kept), kept
    # each moved pod was told why, once
    for name in evicted.values():
        told = [e for e in cluster.events(NS, name) if e.startswith("Consolidating:")]
        assert len(told) == 1 and freed in told[0] and f"{NS}/big" in told[0], (name, told)
    # the freed GPU was `big`'s alone: no other live pod has it
    assert all(_gpu(p) != freed for p in _live_pods(cluster) if p["metadata"]["name"] != "big")
    print(f"consolidate --execute took {took:.1f} s: {result['lines']}")
