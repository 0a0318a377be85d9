"""Benchmark of the extender's preemption planning (prints figures; never pass/fail).

N nodes x 8 GPUs (40960 MiB, split 10), each GPU holding `--per-gpu` shares of 4000 MiB whose priorities are drawn
from 1..9; a pod of priority 10 asking one GPU of 20000 MiB fits nowhere, so every node has a plan. Measured: the time
of `Preemptor.plans` over all N candidate nodes (it stops at max(10 %, 100) plans, as upstream's DefaultPreemption),
and of one node's plan alone: the longest the ledger's lock is held at a time (plans takes it node by node).

Run: nice .venv/bin/python bench/bench_preemption.py [--nodes 1000] [--per-gpu 2] [--repeat 20]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from vgpu.inventory import GPUDevice, encode_volcano
from vgpu.scheduler.extender import Extender
from vgpu.scheduler.ledger import Ledger
from vgpu.scheduler.policies import make_policy
from vgpu.scheduler.preemption import Preemptor, plan_on_node

GPUS, MEMORY, SHARE = 8, 40960, 4000


def build(nodes: int, per_gpu: int, seed: int) -> tuple[Ledger, Extender]:
    rng = random.Random(seed)
    ledger = Ledger()
    for n in range(nodes):
        name = f"node-{n:05d}"
        devices = [GPUDevice(f"GPU-{n}-{g}", 10, MEMORY, "NVIDIA-NVIDIA A100-PCIE-40GB", index=g) for g in range(GPUS)]
        ledger.on_node({"metadata": {"name": name, "annotations": {
            "volcano.sh/node-vgpu-register": encode_volcano(devices)}},
            "status": {"allocatable": {"volcano.sh/vgpu-number": str(GPUS * 10)}}})
        for g in range(GPUS):
            for k in range(per_gpu):
                ids = f"GPU-{n}-{g},NVIDIA,{SHARE},0:"
                ledger.on_pod({"metadata": {"name": f"p-{n}-{g}-{k}", "namespace": "bench", "uid": f"u-{n}-{g}-{k}",
                                            "annotations": {"volcano.sh/vgpu-ids-new": ids}},
                               "spec": {"schedulerName": "vgpu-scheduler", "nodeName": name,
                                        "priority": rng.randint(1, 9), "containers": [{"name": "c", "resources": {
                                            "limits": {"volcano.sh/vgpu-number": "1",
                                                       "volcano.sh/vgpu-memory": str(SHARE)}}}]},
                               "status": {"phase": "Running"}})
    preemptor = Preemptor(ledger, lambda *args: None, lambda ns, name: None, lambda *args: None)
    return ledger, Extender(ledger, make_policy("fragaware"), mode="decide", preemptor=preemptor)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--per-gpu", type=int, default=8,
                    help="shares of 4000 MiB on each GPU (6 to 10: the pod fits nowhere)")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    ledger, ext = build(args.nodes, args.per_gpu, 42)
    pod = {"metadata": {"name": "high", "namespace": "bench", "uid": "high"},
           "spec": {"schedulerName": "vgpu-scheduler", "priority": 10, "containers": [{"name": "c", "resources": {
               "limits": {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "20000"}}}]}}
    info = ext._pod_info(pod)
    order = ext.placement.default_order
    states = [ledger.nodes[name] for name in sorted(ledger.nodes)]
    assert ext.preemptor is not None
    whole, single = [], []
    for _ in range(args.repeat):
        with ledger.lock:
            start = time.perf_counter()
            plans = ext.preemptor.plans(states, info.requests, info.selectors, info.priority, order)
            whole.append(time.perf_counter() - start)
            start = time.perf_counter()
            plan_on_node(states[0], ledger.on_node_charges(states[0].name), info.requests, info.selectors,
                         info.priority, order)
            single.append(time.perf_counter() - start)
    print(f"nodes={args.nodes} shares/GPU={args.per_gpu} plans found={len(plans)} "
          f"victims of the cheapest={len(plans[0].victims)} cost={plans[0].cost}")
    print(f"Preemptor.plans: median {statistics.median(whole) * 1e3:.1f} ms, max {max(whole) * 1e3:.1f} ms; "
          f"one node: median {statistics.median(single) * 1e6:.0f} us")


if __name__ == "__main__":
    main()
