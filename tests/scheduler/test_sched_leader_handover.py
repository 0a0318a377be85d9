"""Leader hand-over between two real `vgpu scheduler` processes: at most one binds at any moment. The leader is
frozen (SIGSTOP) past its lease, the standby takes over and binds; when the old leader wakes up with a /bind in
its hands it refuses, since its lease is no longer current, so the GPU is never over-committed. So that the old
leader cannot learn of the hand-over before the /bind arrives, its lease requests hang once it wakes (a fault of
the API-server stand-in that matches its own token): the refusal comes from the lease fence alone."""

from __future__ import annotations

import os
import signal

import httpx
from sched_builders import container, gpu, node, pod
from sched_helpers import ExtenderProcess, wait_until

from vgpu.testbed.apiserver import write_kubeconfig


def test_a_leader_frozen_past_its_lease_never_binds_after_the_new_one(kube, apiserver, tmp_path):
    kube.create_node(node("n1", [gpu("GPU-1", 10000)]))
    first = kube.create_pod(pod("first", container(number=1, memory=8000, cores=50)))
    second = kube.create_pod(pod("second", container(number=1, memory=8000, cores=50)))
    flags = ("--leader-elect", "--lease-namespace", "default")
    old_config = write_kubeconfig(tmp_path / "old-leader.kubeconfig", apiserver.url, token="old-leader")
    old = ExtenderProcess(old_config, *flags).start()
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
            apiserver.faults.set([{"action": "delay", "path": "/leases", "token": "old-leader", "seconds": 20}])
        finally:
            os.kill(old.proc.pid, signal.SIGCONT)
        late = httpx.post(old.url + "/bind", json={"PodName": "first", "PodNamespace": "default",
                                                   "PodUID": first["metadata"]["uid"], "Node": "n1"}, timeout=20).json()
        assert late["Error"], "the old leader bound after the new one"
        assert "leader" in late["Error"] or "lease" in late["Error"]
        assert not kube.pod("first")["spec"].get("nodeName")
        assert kube.pod("second")["spec"]["nodeName"] == "n1"
    finally:
        apiserver.faults.clear()
        old.stop()
        new.stop()
