"""Leader hand-over between two real `vgpu scheduler` processes: at most one binds at any moment. The leader is
frozen (SIGSTOP) past its lease, the standby takes over and binds; when the old leader wakes up with a /bind in
its hands it refuses, since its lease is no longer current, so the GPU is never over-committed."""

from __future__ import annotations

import os
import signal

import httpx
from sched_builders import container, gpu, node, pod
from sched_helpers import ExtenderProcess, wait_until


def test_a_leader_frozen_past_its_lease_never_binds_after_the_new_one(kube, apiserver):
    kube.create_node(node("n1", [gpu("GPU-1", 10000)]))
    first = kube.create_pod(pod("first", container(number=1, memory=8000, cores=50)))
    second = kube.create_pod(pod("second", container(number=1, memory=8000, cores=50)))
    flags = ("--leader-elect", "--lease-namespace", "default")
    old = ExtenderProcess(apiserver.kubeconfig, *flags).start()
    new = ExtenderProcess(apiserver.kubeconfig, *flags).start(ready=False)
    try:
        assert httpx.get(new.url + "/readyz").status_code != 200  # a standby
        answer = httpx.post(old.url + "/filter", json={"Pod": first, "NodeNames": ["n1"]}).json()
        assert answer["NodeNames"] == ["n1"]  # the old leader placed `first` and holds a reservation

        os.kill(old.proc.pid, signal.SIGSTOP)  # frozen: no renewals, no requests
        try:
            wait_until(lambda: httpx.get(new.url + "/readyz", timeout=2).status_code == 200, timeout=40,
                       interval=0.5, what="the standby to take over")
            assert httpx.post(new.url + "/filter", json={"Pod": second, "NodeNames": ["n1"]}).json()["NodeNames"] \
                == ["n1"]
            bound = httpx.post(new.url + "/bind", json={"PodName": "second", "PodNamespace": "default",
                                                        "PodUID": second["metadata"]["uid"], "Node": "n1"}).json()
            assert bound == {"Error": ""}
        finally:
            os.kill(old.proc.pid, signal.SIGCONT)
        late = httpx.post(old.url + "/bind", json={"PodName": "first", "PodNamespace": "default",
                                                   "PodUID": first["metadata"]["uid"], "Node": "n1"}, timeout=20).json()
        assert late["Error"], "the old leader bound after the new one"
        assert "leader" in late["Error"] or "lease" in late["Error"]
        assert not kube.pod("first")["spec"].get("nodeName")
        assert kube.pod("second")["spec"]["nodeName"] == "n1"
    finally:
        old.stop()
        new.stop()
