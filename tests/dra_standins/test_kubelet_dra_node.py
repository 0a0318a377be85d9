"""The kubelet stand-in's DRA side against a test-only DRA plugin over real unix sockets: plugin registration through
the plugin watcher, claim preparation before a pod's containers start, CDI edits in the container's environment,
failed preparations keeping the pod waiting, unpreparation after the pod ends, a plugin that goes and comes
back, and the device-health stream behind the ResourceHealthStatus gate."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
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


# -- device health (ResourceHealthStatus) ---------------------------------------------------------------------------

HEALTH_BOTH = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[NodeBed]:
    """A node whose kubelet has the ResourceHealthStatus gate on, with a short retry (kubelet waits 5 s)."""
    b = NodeBed(tmp_path, resource_health_status=True, health_retry=0.2)
    try:
        yield b
    finally:
        b.close()


def _owner(pod: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"],
            "controller": True}


def _template_pod(bed: NodeBed, name: str) -> tuple[dict, dict]:
    """A running pod whose container uses a claim generated from a template, allocated on gpu-0."""
    pod = bed.create_pod(name, [env_container("main", [{"name": "gpu"}], script="sleep 60")],
                         [{"name": "gpu", "resourceClaimTemplateName": "gpu-template"}])
    claim = bed.allocate(bed.create_claim(f"{name}-gpu-abcde", owner=_owner(pod)), pod)
    bed.core.patch_namespaced_pod_status(name, "default", {"status": {"resourceClaimStatuses": [
        {"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}]}}, _preload_content=False)
    bed.bind(name)
    bed.wait_phase(name, ("Running",))
    return pod, claim


def test_with_the_gate_off_kubelet_never_opens_a_health_stream(bed):
    # ResourceHealthStatus is off by default in kubelet 1.34 and 1.35 (alpha), and so in the stand-in
    plugin = bed.plugin(versions=("v1.DRAPlugin", *HEALTH_BOTH), health_services=HEALTH_BOTH).start()
    plugin.set_health("gpu-0", "UNHEALTHY", "Xid 79")
    assert bed.wait_driver()
    _template_pod(bed, "h0")
    time.sleep(1.0)
    assert plugin.health_calls == []
    assert bed.agent.dra.status()["deviceHealth"] == {}
    assert bed.agent.dra.manager.allocated_resources_status(bed.pod("h0")) == {}


def test_with_the_gate_on_kubelet_follows_v1alpha1_and_reports_each_claimed_devices_health(gated):
    bed = gated
    # released kubelets dial v1alpha1 whatever the registration lists (here: nothing about health)
    plugin = bed.plugin(health_services=("v1alpha1.DRAResourceHealth",)).start()
    plugin.set_health("gpu-0", "HEALTHY")
    plugin.set_health("gpu-1", "HEALTHY")
    assert bed.wait_driver()
    plugins, manager = bed.agent.dra.plugins, bed.agent.dra.manager
    assert plugins.wait_health(lambda: plugins.health.get(DRIVER, NODE, "gpu-0")[0] == "Healthy")
    assert plugin.health_calls == ["v1alpha1.DRAResourceHealth"]
    pod, claim = _template_pod(bed, "h1")
    resource_id = f"{KIND}={claim['metadata']['uid']}-gpu-gpu-0"
    assert manager.allocated_resources_status(bed.pod("h1")) == {
        "main": [{"name": "claim:gpu", "resources": [{"resourceID": resource_id, "health": "Healthy"}]}]}
    plugin.set_health("gpu-0", "UNHEALTHY", "Xid 79")
    assert manager.wait_for(lambda: {pod["metadata"]["uid"]} in manager.health_updates)
    assert manager.allocated_resources_status(bed.pod("h1")) == {
        "main": [{"name": "claim:gpu", "resources": [{"resourceID": resource_id, "health": "Unhealthy",
                                                        "message": "Xid 79"}]}]}
    plugin.set_health("gpu-1", "UNHEALTHY")  # a device no pod here uses: no pod to update
    assert plugins.wait_health(lambda: plugins.health.get(DRIVER, NODE, "gpu-1")[0] == "Unhealthy")
    assert manager.health_updates == [{pod["metadata"]["uid"]}]
    assert bed.agent.dra.status()["deviceHealth"] == {DRIVER: {f"{NODE}/gpu-0": "Unhealthy",
                                                               f"{NODE}/gpu-1": "Unhealthy"}}


def test_released_kubelets_dial_a_plugin_without_the_service_again_and_again(gated):
    # kubelet 1.34 to 1.36 treat Unimplemented as any other end of the stream: dialled again after the retry delay
    # (kubernetes/kubernetes#141855)
    plugin = gated.plugin().start()
    assert gated.wait_driver()
    plugins = gated.agent.dra.plugins
    assert plugins.wait_health(lambda: len(plugins.health_ends.get(DRIVER, [])) >= 3)
    assert set(plugins.health_calls[DRIVER]) == {"v1alpha1.DRAResourceHealth"}
    assert set(plugins.health_ends[DRIVER]) == {"UNIMPLEMENTED"}
    assert plugin.health_calls == []  # never reached the test plugin's code: the server has no such method


def test_a_kubelet_taking_the_service_from_the_registration_prefers_v1_and_stops_at_unimplemented(tmp_path):
    bed = NodeBed(tmp_path, resource_health_status=True, health_from_registration=True, health_retry=0.2)
    try:
        silent = bed.plugin(driver="silent.example.com", health_services=HEALTH_BOTH).start()  # serves, lists none
        both = bed.plugin(driver="both.example.com", versions=("v1.DRAPlugin", *HEALTH_BOTH),
                          health_services=HEALTH_BOTH).start()
        both.set_health("gpu-0", "HEALTHY")
        refusing = bed.plugin(driver="refusing.example.com", versions=("v1.DRAPlugin", "v1alpha1.DRAResourceHealth"),
                              health_services=("v1alpha1.DRAResourceHealth",))
        refusing.health_error = grpc.StatusCode.UNIMPLEMENTED
        refusing.start()
        for driver in ("silent.example.com", "both.example.com", "refusing.example.com"):
            assert bed.wait_driver(driver)
        plugins = bed.agent.dra.plugins
        assert plugins.wait_health(lambda: plugins.health.get("both.example.com", NODE, "gpu-0")[0] == "Healthy")
        assert plugins.wait_health(lambda: plugins.health_ends.get("refusing.example.com") == ["UNIMPLEMENTED"])
        time.sleep(1.0)  # five retry delays: nothing more is dialled
        assert both.health_calls == ["v1.DRAResourceHealth"]
        assert refusing.health_calls == ["v1alpha1.DRAResourceHealth"]
        assert silent.health_calls == [] and "silent.example.com" not in plugins.health_calls
    finally:
        bed.close()


def test_the_health_cache_reads_a_device_unknown_once_stale_and_reconciles_devices_left_out():
    # pkg/kubelet/cm/dra/healthinfo.go: the receipt time counts, not the plugin's last_updated_time; the timeout is
    # the device's health_check_timeout_seconds when above 0, else 30 s
    from vgpu.proto.drahealth.v1alpha1 import api_pb2 as pb
    from vgpu.testbed.dra_kubelet import DeviceHealthCache

    now = [1000.0]
    cache = DeviceHealthCache(clock=lambda: now[0])

    def report(*devices: tuple[str, int, int]) -> list[str]:
        response = pb.NodeWatchResourcesResponse(devices=[
            pb.DeviceHealth(device=pb.DeviceIdentifier(pool_name="p", device_name=name), health=health,
                            last_updated_time=1, health_check_timeout_seconds=timeout, message="m" * 2000)
            for name, health, timeout in devices])
        return [f"{d.device}={d.health}" for d in cache.update("drv", response, pb)]

    assert report(("a", pb.HEALTHY, 0), ("b", pb.UNHEALTHY, 60)) == ["a=Healthy", "b=Unhealthy"]
    health, message = cache.get("drv", "p", "b")
    assert health == "Unhealthy" and len(message) == 1024 and message.endswith("...")
    assert report(("a", pb.HEALTHY, 0), ("b", pb.UNHEALTHY, 60)) == []  # nothing changed
    now[0] += 31
    assert cache.get("drv", "p", "a") == ("Unknown", "")  # 30 s default passed
    assert cache.get("drv", "p", "b")[0] == "Unhealthy"  # its own 60 s not yet
    assert report(("b", pb.UNHEALTHY, 60)) == ["a=Unknown"]  # left out and stale
    assert cache.get("drv", "p", "zzz") == ("Unknown", "")
    cache.clear("drv")
    assert cache.get("drv", "p", "b") == ("Unknown", "")
