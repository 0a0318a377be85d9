"""Two scheduler replicas, each a pair of the real kube-scheduler and our extender as in one pod of the
Deployment: one leadership for the pair. kube-scheduler's own leader election (client-go, Lease
vgpu-kube-scheduler) picks the leading pod, and the extender beside it is the only one that serves, because it
follows that Lease. Every single failure of the leading pod is tried: its extender, its kube-scheduler, the whole
pod, and its path to kube-apiserver (a partition, testbed/tcpproxy.py). After each, a new pod is placed and runs,
and no GPU holds more than its memory. What kubelet does for a failed container (start it again) is done here."""

from __future__ import annotations

import time

import pytest
from realk8s_helpers import create, get_pod, gpu_container, gpu_pod, phase

from vgpu import keys
from vgpu.assignment import decode

pytestmark = [pytest.mark.realk8s, pytest.mark.slow]

GPU_MIB = 40960  # one A100-40GB
POD_MIB = 4000


@pytest.fixture(scope="module")
def cluster(make_real_cluster):
    return make_real_cluster(nodes=1, gpus="1xA100-40GB", scheduler_replicas=2)


def _holder(name: str) -> dict:
    return gpu_pod(name, [gpu_container("main", ["--mib", "200", "--hold", "600"], memory=POD_MIB)])


def _running(cluster, name: str, timeout: float = 120) -> float:
    """Wait until the pod runs; the seconds it took."""
    began = time.monotonic()
    try:
        cluster.wait(f"pod {name} running", lambda: phase(get_pod(cluster, name)) == "Running", timeout)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}\n{cluster.describe()}") from exc
    return time.monotonic() - began


def _serving(cluster, timeout: float = 60) -> int:
    """The replica whose extender serves, once one does."""
    (replica,) = cluster.wait("one extender serving", lambda: (found := cluster.serving_replica()) is not None
                              and (found,), timeout)
    return replica


def _assert_nothing_overcommitted(cluster) -> None:
    """Every GPU's granted memory, summed over the pods that hold it, is within the card; no pod is granted twice."""
    used: dict[str, int] = {}
    for pod in cluster.get("/api/v1/namespaces/default/pods")["items"]:
        if phase(pod) in ("Succeeded", "Failed") or not pod["spec"].get("nodeName"):
            continue
        assignment = decode((pod["metadata"].get("annotations") or {}).get(keys.VGPU_IDS, ""))
        for grants in assignment:
            for grant in grants:
                used[grant.uuid] = used.get(grant.uuid, 0) + grant.memory
    assert used and all(mib <= GPU_MIB for mib in used.values()), used


def _other(replica: int) -> int:
    return 1 - replica


def _standby_says_who_leads(cluster, standby: int, leader: int) -> None:
    import httpx

    answer = httpx.get(f"http://127.0.0.1:{cluster.extender_ports[standby]}/readyz", timeout=5)
    assert answer.status_code == 503
    assert f"held by {cluster.scheduler_hostname(leader)}_" in answer.text, answer.text


def test_the_pair_in_one_pod_leads_and_the_other_waits(cluster):
    leader = _serving(cluster)
    _standby_says_who_leads(cluster, _other(leader), leader)
    create(cluster, _holder("first"))
    _running(cluster, "first")
    _assert_nothing_overcommitted(cluster)


def test_the_leading_extender_killed_is_restarted_and_serves_again(cluster):
    leader = _serving(cluster)
    extender = cluster.replica_proc("extender", leader)
    extender.kill()
    create(cluster, _holder("after-extender"))
    time.sleep(5)  # kube-scheduler's calls fail meanwhile; the standby pair does not step in
    assert cluster.serving_replica() is None
    assert not get_pod(cluster, "after-extender")["spec"].get("nodeName")
    extender.start()  # kubelet restarts the container
    took = _running(cluster, "after-extender")
    assert _serving(cluster) == leader  # its kube-scheduler kept the Lease
    _assert_nothing_overcommitted(cluster)
    print(f"extender restarted: the pod ran {took:.1f}s after the restart")


@pytest.mark.parametrize("which", [("kube-scheduler",), ("kube-scheduler", "extender")],
                         ids=["kube-scheduler", "whole-pod"])
def test_the_leading_pods_failure_hands_over_to_the_standby_pair(cluster, which):
    leader = _serving(cluster)
    procs = [cluster.replica_proc(program, leader) for program in which]
    for proc in procs:
        proc.kill()
    name = f"after-{'-'.join(which)}"
    create(cluster, _holder(name))
    took = _running(cluster, name)
    assert _serving(cluster) == _other(leader)
    for proc in procs:  # kubelet restarts them: they come back as the standby
        proc.start()
    time.sleep(5)
    assert _serving(cluster) == _other(leader)
    _standby_says_who_leads(cluster, leader, _other(leader))
    _assert_nothing_overcommitted(cluster)
    print(f"{' and '.join(which)} killed: the pod ran {took:.1f}s after")


def test_a_leading_pod_cut_off_from_the_api_server_stops_and_the_standby_takes_over(cluster):
    leader = _serving(cluster)
    cluster.proxies[leader].cut()
    try:
        create(cluster, _holder("after-partition"))
        took = _running(cluster, "after-partition")
        assert _serving(cluster) == _other(leader)
        # the cut-off kube-scheduler could not renew: it stopped leading and exited, as upstream does
        cluster.wait("the cut-off kube-scheduler to exit", lambda: not cluster.replica_proc("kube-scheduler",
                                                                                             leader).alive, 60)
    finally:
        cluster.proxies[leader].heal()
    cluster.replica_proc("kube-scheduler", leader).start()  # kubelet restarts it: the standby now
    time.sleep(5)
    assert _serving(cluster) == _other(leader)
    _assert_nothing_overcommitted(cluster)
    print(f"partition: the pod ran {took:.1f}s after the cut")
