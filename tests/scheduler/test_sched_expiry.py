"""Reservations expire on their own: an idle extender (no request after /filter) drops a reservation whose bind
never came, and its metrics stop showing it."""

import orjson
from prometheus_client import generate_latest
from sched_builders import container, gpu, node, pod
from sched_helpers import wait_until


def assumed_lines(ext) -> list[str]:
    text = generate_latest(ext.runtime.metrics.registry).decode()
    return [line for line in text.splitlines()
            if line.startswith("vgpu_scheduler_pod_memory_allocated_bytes{") and 'state="assumed"' in line]


def test_a_reservation_without_bind_expires_with_no_further_request(kube, served):
    kube.create_node(node("n1", [gpu("GPU-1", 8000)]))
    waiting = kube.create_pod(pod("never-bound", container(number=1, memory=3000)))
    ext = served(mode="decide", assume_ttl_seconds=1)
    answer = ext.post("/filter", orjson.dumps({"Pod": waiting, "NodeNames": ["n1"]})).json()
    assert answer["NodeNames"] == ["n1"]
    assert len(assumed_lines(ext)) == 1
    assert [u.memory for u in ext.ledger.nodes["n1"].usage] == [3000]
    wait_until(lambda: not assumed_lines(ext), timeout=60, interval=0.2, what="the reservation to expire")
    assert [u.memory for u in ext.ledger.nodes["n1"].usage] == [0]
