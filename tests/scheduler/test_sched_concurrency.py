"""Concurrency: 200 pods against 20 GPUs through concurrent /filter + /bind calls; afterwards the API server's
bound pods must never hold more than a GPU's memory, cores (100) or shares (split), also when the extender
process is SIGKILLed and restarted in the middle of the run."""

import queue
import random
import threading
import time

import httpx
import orjson
from sched_builders import container, gpu, node, pod
from sched_helpers import ExtenderProcess

from vgpu import keys
from vgpu.assignment import decode

NODES = {f"gpu-node-{i}": [gpu(f"GPU-{i}-{j}", memory=10000, split=4) for j in range(4)] for i in range(5)}
CAPACITY = {d.uuid: (d.memory, 100, d.split) for devices in NODES.values() for d in devices}
OWNER = {d.uuid: name for name, devices in NODES.items() for d in devices}


def seed(kube, count=200, seed_=7):
    rng = random.Random(seed_)
    for name, devices in NODES.items():
        kube.create_node(node(name, devices))
    created = []
    for i in range(count):
        number = 2 if rng.random() < 0.1 else 1
        c = container(name="c", number=number, memory=rng.choice([1000, 2000, 3000, 4000]),
                      cores=rng.choice([0, 0, 10, 20, 30, 100]))
        created.append(kube.create_pod(pod(f"p{i:03d}", c)))
    return created


def check_invariants(kube):
    used = {u: [0, 0, 0] for u in CAPACITY}
    bound = 0
    for p in kube.pods():
        ann = p["metadata"].get("annotations") or {}
        node_name = p["spec"].get("nodeName")
        if not node_name:
            assert keys.VGPU_IDS not in ann
            continue
        bound += 1
        assert ann[keys.VGPU_NODE] == node_name
        assert ann[keys.DEVICES_TO_ALLOCATE] == ann[keys.VGPU_IDS]
        for segment in decode(ann[keys.VGPU_IDS]):
            assert len({g.uuid for g in segment}) == len(segment)
            for g in segment:
                assert OWNER[g.uuid] == node_name
                used[g.uuid][0] += g.memory
                used[g.uuid][1] += g.cores
                used[g.uuid][2] += 1
    for uuid, (memory, cores, shares) in used.items():
        cap = CAPACITY[uuid]
        assert memory <= cap[0] and cores <= cap[1] and shares <= cap[2], (uuid, memory, cores, shares)
    return bound, used


def drive(url_of, pods, kube, workers=8, on_progress=None, choose=None):
    """kube-scheduler's part: filter then bind each pod, from several threads; retries on errors."""
    todo: queue.Queue = queue.Queue()
    for p in pods:
        todo.put((p, 0))
    outcome = {}
    lock = threading.Lock()
    names = list(NODES)
    rng = random.Random(3)
    retries: list = []
    drive.retries = retries

    def work():
        client = httpx.Client(timeout=10)
        while True:
            try:
                p, attempt = todo.get_nowait()
            except queue.Empty:
                return
            name = p["metadata"]["name"]
            if attempt > 200:
                with lock:
                    outcome[name] = "gave-up"
                continue
            try:
                r = client.post(url_of() + "/filter", content=orjson.dumps({"Pod": p, "NodeNames": names}))
                out = r.json()
                if out["Error"]:
                    raise RuntimeError(out["Error"])
                if on_progress:
                    on_progress(len(outcome))
                if not out["NodeNames"]:
                    with lock:
                        outcome[name] = "unschedulable"
                    continue
                target = choose(out["NodeNames"], rng) if choose else out["NodeNames"][0]
                meta = p["metadata"]
                r = client.post(url_of() + "/bind", content=orjson.dumps(
                    {"PodName": name, "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": target}))
                if r.json()["Error"]:
                    raise RuntimeError(r.json()["Error"])
                with lock:
                    outcome[name] = "bound"
            except (httpx.HTTPError, RuntimeError, ValueError) as exc:
                retries.append(str(exc)[:80])
                if kube.pod(name)["spec"].get("nodeName"):  # the bind landed before the failure
                    with lock:
                        outcome[name] = "bound"
                    continue
                time.sleep(0.05)
                todo.put((p, attempt + 1))

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return outcome


def test_concurrent_score_mode_in_process(kube, served):
    pods = seed(kube)
    ext = served(mode="score")
    outcome = drive(lambda: ext.url, pods, kube, choose=lambda names, rng: rng.choice(names))
    assert len(outcome) == 200 and "gave-up" not in outcome.values()
    bound, _used = check_invariants(kube)
    assert bound == sum(1 for v in outcome.values() if v == "bound") and bound > 40


def test_concurrent_decide_mode_with_extender_killed_and_restarted(kube, apiserver):
    pods = seed(kube)
    proc = ExtenderProcess(apiserver.kubeconfig, "--mode", "decide").start()
    restarted = threading.Event()

    def progress(done):
        if done >= 30 and not restarted.is_set():
            restarted.set()
            proc.kill()
            threading.Thread(target=proc.start, daemon=True).start()

    try:
        outcome = drive(lambda: proc.url, pods, kube, on_progress=progress)
    finally:
        proc.stop()
    assert restarted.is_set()
    assert len(outcome) == 200 and "gave-up" not in outcome.values()
    bound, _used = check_invariants(kube)
    assert bound == sum(1 for v in outcome.values() if v == "bound") and bound > 40
