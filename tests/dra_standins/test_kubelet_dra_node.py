"""The kubelet stand-in's DRA side against a test-only DRA plugin over real unix sockets: plugin registration through
the plugin watcher, claim preparation before a pod's containers start, CDI edits in the container's environment,
failed preparations keeping the pod waiting, unpreparation after the pod ends, and a plugin that goes and comes
back."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubelet_dra_helpers import DRIVER, KIND, NODE, NodeBed, env_container, env_name


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[NodeBed]:
    b = NodeBed(tmp_path)
    try:
        yield b
    finally:
        b.close()


def _claimed_pod(bed: NodeBed, name: str, containers: list[dict], requests: tuple[str, ...] = ("gpu",),
                 claim_name: str | None = None) -> tuple[dict, dict]:
    """A claim allocated and reserved for a new pod, then the pod bound to the node."""
    claim = bed.create_claim(claim_name or f"{name}-claim", requests)
    pod = bed.create_pod(name, containers, [{"name": "gpus", "resourceClaimName": claim["metadata"]["name"]}])
    claim = bed.allocate(claim, pod)
    bed.bind(name)
    return claim, pod


# -- registration ---------------------------------------------------------------------------------------------------

def test_a_dra_plugin_is_registered_and_told_so(bed):
    plugin = bed.plugin().start()
    assert bed.wait_driver()
    assert bed.agent.dra.drivers() == {DRIVER: str(plugin.service_socket)}
    assert plugin.wait(lambda: plugin.statuses == [(True, "")])
    assert bed.agent.dra.status()["drivers"] == {DRIVER: str(plugin.service_socket)}


@pytest.mark.parametrize("kwargs,error", [
    ({"plugin_type": "CSIPlugin"}, "no handler registered for plugin type: 'CSIPlugin'"),
    ({"versions": ("v1alpha3.DRAPlugin", "v2.DRAPlugin")}, "none of the versions"),
    ({"endpoint": "/nonexistent/dra.sock"}, "is not reachable"),
    ({"endpoint": "relative/dra.sock"}, "not an absolute socket path"),
])
def test_a_bad_plugin_is_refused_with_the_reason(bed, kwargs, error):
    plugin = bed.plugin(**kwargs).start()
    assert plugin.wait(lambda: len(plugin.statuses) == 1), "the plugin was never told the outcome"
    registered, message = plugin.statuses[0]
    assert not registered and error in message
    assert bed.agent.dra.drivers() == {}
    assert error in bed.agent.dra.status()["rejected"][str(plugin.reg_socket)]


def test_a_new_socket_of_the_same_driver_takes_over_and_the_old_one_serves_again_when_it_goes(bed):
    first = bed.plugin().start()
    assert bed.wait_driver()
    second = bed.plugin(socket_name=f"{DRIVER}-2-reg.sock")
    second.plugin_dir = bed.kubelet_root / "second"
    second.service_socket = second.plugin_dir / "dra.sock"
    second.endpoint = str(second.service_socket)
    second.start()
    assert bed.agent.dra.plugins.wait_for_endpoint(DRIVER, second.endpoint)
    second.stop()
    assert bed.agent.dra.plugins.wait_for_endpoint(DRIVER, first.endpoint)


# -- preparation ----------------------------------------------------------------------------------------------------

def test_claims_are_prepared_before_the_containers_start_and_their_cdi_env_reaches_the_process(bed):
    plugin = bed.plugin().start()
    assert bed.wait_driver()
    marker = bed.tmp / "prepared"
    plugin.on_prepare = lambda claim: marker.write_text(claim.uid)
    # the process fails unless the claim was prepared before it started
    ctr = env_container("main", [{"name": "gpus"}], env=[{"name": "DRA_TEST_CLAIM", "value": "mine"}],
                        script=f"test -f {marker} && env -0")
    claim, pod = _claimed_pod(bed, "p1", [ctr])
    bed.wait_phase("p1", ("Succeeded",))
    assert plugin.prepares == [[("default", claim["metadata"]["uid"], "p1-claim")]]
    env = bed.container_env("p1", "main")
    # spec-level then device-level edits; the runtime applies CDI env after the container's own
    assert env["DRA_TEST_CLAIM"] == "default/p1-claim"
    assert env[env_name("gpu")] == f"{bed.agent.node_name}/gpu-0"
    status = bed.agent.dra.status()["pods"]
    assert status == {} or pod["metadata"]["uid"] not in status  # ended: nothing prepared for it any more


def test_a_container_naming_a_request_gets_only_that_requests_devices(bed):
    plugin = bed.plugin().start()
    assert bed.wait_driver()
    containers = [env_container("one", [{"name": "gpus", "request": "a"}]),
                  env_container("both", [{"name": "gpus"}]),
                  env_container("none", [])]
    claim = bed.create_claim("split", ("a", "b"))
    pod = bed.create_pod("p2", containers, [{"name": "gpus", "resourceClaimName": "split"}])
    bed.allocate(claim, pod, devices={"a": "gpu-0", "b": "gpu-1"})
    bed.bind("p2")
    bed.wait_phase("p2", ("Succeeded",))
    one, both, none = (bed.container_env("p2", c) for c in ("one", "both", "none"))
    assert one[env_name("a")] == f"{bed.agent.node_name}/gpu-0" and env_name("b") not in one
    assert one["DRA_TEST_LAST_DEVICE"] == "gpu-0"
    assert both[env_name("a")].endswith("gpu-0") and both[env_name("b")].endswith("gpu-1")
    assert both["DRA_TEST_LAST_DEVICE"] == "gpu-1"  # device edits in the order of the devices: the later wins
    assert "DRA_TEST_CLAIM" not in none
    assert len(plugin.prepares) == 1


def test_a_per_claim_error_keeps_the_pod_waiting_with_the_reason_and_it_starts_once_prepare_succeeds(bed):
    plugin = bed.plugin().start()
    assert bed.wait_driver()
    plugin.prepare_errors["bad-claim"] = "GPU 0 is on fire"
    _claimed_pod(bed, "p3", [env_container("main", [{"name": "gpus"}])], claim_name="bad-claim")
    assert plugin.wait(lambda: len(plugin.prepares) >= 2), "kubelet retries a failed preparation"
    pod = bed.pod("p3")
    assert pod["status"]["phase"] == "Pending"
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "ContainerCreating"
    assert "NodePrepareResources failed for ResourceClaim bad-claim: GPU 0 is on fire" in waiting["message"]
    assert any(e["reason"] == "FailedPrepareDynamicResources" and "GPU 0 is on fire" in e["message"]
               for e in bed.events("p3"))
    assert not bed.log_exists("p3", "main"), "the container must not run"
    del plugin.prepare_errors["bad-claim"]
    bed.wait_phase("p3", ("Succeeded",))
    assert bed.container_env("p3", "main")["DRA_TEST_CLAIM"] == "default/bad-claim"


def test_a_claim_left_out_of_the_answer_fails_the_preparation(bed):
    plugin = bed.plugin().start()
    assert bed.wait_driver()
    plugin.skip.add("skipped")
    _claimed_pod(bed, "p4", [env_container("main", [{"name": "gpus"}])], claim_name="skipped")
    assert plugin.wait(lambda: len(plugin.prepares) >= 2)
    assert "skipped 1 ResourceClaims" in bed.agent.dra_errors[bed.pod("p4")["metadata"]["uid"]]
    assert not bed.log_exists("p4", "main")


def test_a_claim_not_reserved_for_the_pod_is_not_prepared(bed):
    plugin = bed.plugin().start()
    assert bed.wait_driver()
    claim = bed.create_claim("other")
    pod = bed.create_pod("p5", [env_container("main", [{"name": "gpus"}])],
                         [{"name": "gpus", "resourceClaimName": "other"}])
    bed.allocate(claim, None)  # allocated, reserved for nobody
    bed.bind("p5")
    uid = pod["metadata"]["uid"]
    assert bed.agent.dra.manager.wait_for(lambda: "not reserved for the pod" in bed.agent.dra_errors.get(uid, ""))
    assert plugin.prepares == []
    bed.allocate(claim, pod)  # the scheduler reserves it: the retry prepares it and the pod runs
    bed.wait_phase("p5", ("Succeeded",))
    assert plugin.prepares == [[("default", claim["metadata"]["uid"], "other")]]


def test_a_cdi_id_that_resolves_to_nothing_fails_the_preparation(bed):
    plugin = bed.plugin().start()
    assert bed.wait_driver()
    plugin.on_prepare = lambda claim: plugin.spec_path(claim.uid).unlink()  # the plugin "forgets" its spec
    _, pod = _claimed_pod(bed, "p6", [env_container("main", [{"name": "gpus"}])])
    uid = pod["metadata"]["uid"]
    assert bed.agent.dra.manager.wait_for(lambda: "unresolvable CDI devices" in bed.agent.dra_errors.get(uid, ""))
    assert KIND in bed.agent.dra_errors[uid]
    assert not bed.log_exists("p6", "main")


# -- unpreparation --------------------------------------------------------------------------------------------------

def test_claims_are_unprepared_once_the_pod_has_ended(bed):
    plugin = bed.plugin().start()
    assert bed.wait_driver()
    claim, _ = _claimed_pod(bed, "p7", [env_container("main", [{"name": "gpus"}])])
    bed.wait_phase("p7", ("Succeeded",))
    identity = ("default", claim["metadata"]["uid"], "p7-claim")
    assert plugin.wait(lambda: plugin.unprepares == [[identity]])
    assert not plugin.spec_path(claim["metadata"]["uid"]).exists()
    assert bed.agent.dra.manager.wait_for(lambda: not bed.agent.dra.manager.pending)
    assert bed.agent.dra.manager.claims == {}


def test_claims_of_a_deleted_pod_are_unprepared_after_its_processes_are_killed(bed):
    plugin = bed.plugin().start()
    assert bed.wait_driver()
    claim, pod = _claimed_pod(bed, "p8", [env_container("main", [{"name": "gpus"}], script="sleep 60")])
    bed.wait_phase("p8", ("Running",))
    assert plugin.unprepares == []
    # what the node reports (in memory, and in <workdir>/dra-status.json for observers outside the process)
    uid = pod["metadata"]["uid"]
    cdi_id = f"{KIND}={claim['metadata']['uid']}-gpu-gpu-0"
    reported = bed.agent.dra.status()["pods"][uid]
    assert reported["claims"] == ["p8-claim"] and reported["cdiDevices"] == {"main": [cdi_id]}
    assert "DRA_TEST_CLAIM=default/p8-claim" in reported["edits"]["main"]["env"]
    status_file = bed.workdir / "dra-status.json"
    assert bed.agent.dra.manager.wait_for(
        lambda: status_file.exists() and uid in json.loads(status_file.read_text())["pods"])
    bed.core.delete_namespaced_pod("p8", "default", _preload_content=False)
    assert plugin.wait(lambda: plugin.unprepares == [[("default", claim["metadata"]["uid"], "p8-claim")]])


def test_a_failed_unprepare_is_retried(bed):
    plugin = bed.plugin().start()
    assert bed.wait_driver()
    plugin.unprepare_errors["sticky"] = "device busy"
    _claimed_pod(bed, "p9", [env_container("main", [{"name": "gpus"}])], claim_name="sticky")
    bed.wait_phase("p9", ("Succeeded",))
    assert plugin.wait(lambda: len(plugin.unprepares) >= 2)
    assert bed.agent.dra.status()["pendingUnprepare"] == ["default/sticky"]
    del plugin.unprepare_errors["sticky"]
    assert bed.agent.dra.manager.wait_for(lambda: not bed.agent.dra.manager.pending, 20)


def test_a_plugin_that_goes_is_unregistered_and_its_pending_unprepares_run_when_it_is_back(bed):
    plugin = bed.plugin().start()
    assert bed.wait_driver()
    bed.agent.dra.manager.unprepare_attempts = 2  # give up quickly: only the plugin's return retries
    claim, _ = _claimed_pod(bed, "p10", [env_container("main", [{"name": "gpus"}], script="sleep 1")])
    bed.wait_phase("p10", ("Running",))
    plugin.stop()
    assert bed.wait_driver(present=False)
    bed.wait_phase("p10", ("Succeeded",))
    manager = bed.agent.dra.manager
    assert manager.wait_for(lambda: any(i.attempts >= 2 for i in manager.pending.values()))
    assert plugin.unprepares == []
    plugin.start()
    assert bed.wait_driver()
    assert plugin.wait(lambda: plugin.unprepares == [[("default", claim["metadata"]["uid"], "p10-claim")]])
    assert manager.wait_for(lambda: not manager.pending)
    # and the returned plugin serves new pods
    _claimed_pod(bed, "p11", [env_container("main", [{"name": "gpus"}])])
    bed.wait_phase("p11", ("Succeeded",))


def test_a_restarted_node_agent_remembers_prepared_claims_and_unprepares_them(bed):
    plugin = bed.plugin().start()
    assert bed.wait_driver()
    claim, _ = _claimed_pod(bed, "p12", [env_container("main", [{"name": "gpus"}], script="sleep 60")])
    bed.wait_phase("p12", ("Running",))
    bed.restart_agent()  # the pod's process is gone: the new agent fails the pod and unprepares its claim
    assert bed.wait_driver()
    assert bed.wait_phase("p12", ("Failed",))["status"]["reason"] == "ContainerLost"
    assert plugin.wait(lambda: plugin.unprepares == [[("default", claim["metadata"]["uid"], "p12-claim")]])


def test_a_dead_socket_is_rejected_after_a_few_attempts_and_a_plugin_taking_its_path_is_registered(bed):
    import socket

    bed.registry.mkdir(parents=True, exist_ok=True)
    path = bed.registry / f"{DRIVER}-reg.sock"
    with socket.socket(socket.AF_UNIX) as dead:  # a socket file nobody listens on any more
        dead.bind(str(path))
    watcher = bed.agent.dra.watcher
    assert bed.agent.dra.manager.wait_for(lambda: "GetInfo failed: UNAVAILABLE" in watcher.rejected.get(path, ""))
    plugin = bed.plugin().start()  # unlinks the dead socket and serves on the same path
    assert plugin.wait(lambda: plugin.statuses == [(True, "")])
    assert bed.wait_driver() and path not in watcher.rejected


def _slice(bed: NodeBed, name: str, driver: str, node: str) -> None:
    bed.resource.create_resource_slice({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                                        "metadata": {"name": name},
                                        "spec": {"driver": driver, "nodeName": node, "devices": [],
                                                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}})


def _slices(bed: NodeBed) -> set[str]:
    return {s.metadata.name for s in bed.resource.list_resource_slice().items}


def test_kubelet_wipes_its_nodes_slices_at_start(bed):
    # pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go wipeResourceSlices: every driver's slices of the node, at once
    _slice(bed, "mine-a", DRIVER, NODE)
    _slice(bed, "mine-b", "other.example.com", NODE)
    _slice(bed, "theirs", DRIVER, "node-b")
    bed.restart_agent()
    assert _slices(bed) == {"theirs"}


def test_a_driver_gone_for_the_delay_loses_its_slices_and_one_back_in_time_keeps_them(bed):
    # the same function, for a driver whose last plugin deregistered: after a delay (30 s; 0.5 s here so that the
    # test is short) that a new registration cancels
    bed.agent.dra.wiper.delay = 0.5
    _slice(bed, "driver-slice", DRIVER, NODE)
    _slice(bed, "other-driver", "other.example.com", NODE)
    first = bed.plugin().start()
    assert bed.wait_driver()
    first.stop()
    assert bed.wait_driver(present=False)
    bed.plugin().start()  # back within the delay
    assert bed.wait_driver()
    time.sleep(1.5)
    assert _slices(bed) == {"driver-slice", "other-driver"}
    bed.plugins[-1].stop()
    assert bed.wait_driver(present=False)
    deadline = time.monotonic() + 10
    while "driver-slice" in _slices(bed) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _slices(bed) == {"other-driver"}
