"""The burst workload shared by tests/e2e/test_e2e_burst.py, the fault tests and bench/bench_e2e.py.

`burst_pods(n, seed)` gives n short pods of mixed shapes (1 or 2 GPUs, 1000 to 8000 MiB, 0 to 30 cores), each
running a couple of seconds with the isolation library loaded, plus `impossible` pods no GPU can hold (they must
stay pending with a reason). `submit` creates them as fast as the API server takes them.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from e2e_helpers import container, pod

IMPOSSIBLE_LABEL = "e2e/impossible"


def burst_pods(n: int, factor: int, namespace: str = "burst", seed: int = 7, impossible: int = 3,
               run_seconds: float = 2.0) -> list[dict]:
    """n schedulable pods of mixed shapes and `impossible` pods asking for more memory than any card has."""
    rng = random.Random(seed)
    pods = []
    for i in range(n):
        number = 2 if rng.random() < 0.15 else 1
        memory = rng.choice((1000, 2000, 4000, 8000))
        cores = rng.choice((0, 5, 10, 20, 30))
        sleep = f"{run_seconds * rng.uniform(0.5, 1.5):.2f}"
        pods.append(pod(f"p{i:03d}", [container("main", ["sleep", sleep], number=number,
                                                memory=-(-memory // factor), cores=cores)], namespace=namespace))
    for i in range(impossible):
        pods.append(pod(f"huge{i}", [container("main", ["sleep", "1"], number=1, memory=-(-200000 // factor))],
                        namespace=namespace, labels={IMPOSSIBLE_LABEL: "true"}))
    return pods


def submit(cluster: Any, pods: list[dict], workers: int = 8) -> float:
    """Create every pod (a few at a time); return the wall-clock time the first one was sent."""
    start = time.time()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(cluster.create_pod, pods))
    return start
