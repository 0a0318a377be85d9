"""The plugin's device-health stream as kubelets follow it: the kubelet stand-in (testbed/dra_kubelet.py) with its
ResourceHealthStatus gate on registers the real `vgpu dra-plugin` through its plugin watcher and keeps the stream
open, once as kubelets 1.34 to 1.36 do (`v1alpha1.DRAResourceHealth`, whatever the registration lists) and once as
kubelets with kubernetes/kubernetes#139477 do (only a listed service, v1 preferred). The stream also repeats the
states while nothing changes, so that kubelet never takes a quiet device for a stale one."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from dra_helpers import DRIVER, NODE, DRABed, eventually

from vgpu.draplugin.health import GPUHealth
from vgpu.draplugin.server import HEALTH_VERSIONS, HealthService
from vgpu.node.backends import GPUInfo, HealthEvent
from vgpu.testbed.dra_kubelet import PLUGIN_TYPE, DRAPlugins
from vgpu.testbed.plugin_watcher import PluginWatcher


@pytest.fixture
def kubelet(request: pytest.FixtureRequest, bed: DRABed) -> Iterator[DRAPlugins]:
    """The stand-in's DRA plugin handler with the gate on (`health_from_registration` from the test's param) and a
    plugin watcher on the plugin's registry directory."""
    plugins = DRAPlugins(resource_health_status=True, health_from_registration=getattr(request, "param", False),
                         health_retry=0.2)
    watcher = PluginWatcher(bed.registry, {PLUGIN_TYPE: plugins}).start()
    try:
        yield plugins
    finally:
        watcher.stop()
        plugins.close()


def _states(plugins: DRAPlugins) -> dict[str, str]:
    return plugins.health.snapshot().get(DRIVER, {})


def test_a_kubelet_of_1_34_to_1_36_with_the_gate_on_gets_every_devices_health(bed: DRABed,
                                                                               kubelet: DRAPlugins) -> None:
    """Released kubelets dial only `v1alpha1.DRAResourceHealth`: were the plugin to serve v1 alone, this stream
    would end Unimplemented and no health would arrive."""
    bed.start(gpus="2xT4")
    assert kubelet.wait_registered(DRIVER)
    assert kubelet.wait_health(lambda: _states(kubelet) == {f"{NODE}/gpu-0": "Healthy", f"{NODE}/gpu-1": "Healthy"})
    bed.inject("xid 1 79")
    assert kubelet.wait_health(lambda: _states(kubelet).get(f"{NODE}/gpu-1") == "Unhealthy", timeout=15)
    health, message = kubelet.health.get(DRIVER, NODE, "gpu-1")
    assert health == "Unhealthy" and "79" in message
    assert kubelet.health_calls[DRIVER] == ["v1alpha1.DRAResourceHealth"]
    assert DRIVER not in kubelet.health_ends  # the one stream is still open
    bed.inject("recover 1")
    assert kubelet.wait_health(lambda: _states(kubelet).get(f"{NODE}/gpu-1") == "Healthy", timeout=15)


@pytest.mark.parametrize("kubelet", [True], indirect=True)
def test_a_kubelet_that_takes_the_service_from_the_registration_uses_v1(bed: DRABed, kubelet: DRAPlugins) -> None:
    """Kubelets with kubernetes/kubernetes#139477 watch only a plugin that lists the health service, in v1 when
    listed: were the registration to leave it out, no stream would be opened."""
    bed.start(gpus="1xT4")
    assert kubelet.wait_registered(DRIVER)
    assert kubelet.wait_health(lambda: _states(kubelet) == {f"{NODE}/gpu-0": "Healthy"})
    assert kubelet.health_calls[DRIVER] == ["v1.DRAResourceHealth"]


def test_the_plugin_going_drops_its_devices_health(bed: DRABed, kubelet: DRAPlugins) -> None:
    """Kubelet forgets a driver's health when its stream ends (devices read Unknown)."""
    bed.start(gpus="1xT4")
    assert kubelet.wait_health(lambda: _states(kubelet) == {f"{NODE}/gpu-0": "Healthy"})
    assert bed.stop() == 0
    assert kubelet.wait_health(lambda: _states(kubelet) == {})
    assert kubelet.health.get(DRIVER, NODE, "gpu-0") == ("Unknown", "")


@pytest.mark.parametrize("service", list(HEALTH_VERSIONS))
def test_a_quiet_stream_repeats_the_states(service: str) -> None:
    """Kubelet takes a device it heard nothing of for 30 s as Unknown: with no change at all the stream sends the
    full list again every `resend_seconds` (10 s in the plugin; 0.2 s here)."""
    pb = HEALTH_VERSIONS[service]
    gpus = [GPUInfo("GPU-a", "Sim", 1000, minor=0), GPUInfo("GPU-b", "Sim", 1000, minor=1)]
    health = GPUHealth(gpus)
    service_impl = HealthService(NODE, health, check_seconds=0.05, resend_seconds=0.2)
    with tempfile.TemporaryDirectory(prefix="hs-", dir="/tmp") as tmp:
        socket = Path(tmp) / "dra.sock"
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers(tuple(service_impl.handlers()))
        server.add_insecure_port(f"unix://{socket}")
        server.start()
        channel = grpc.insecure_channel(f"unix://{socket}")
        try:
            watch = channel.unary_stream(f"/{service}/NodeWatchResources",
                                         request_serializer=pb.NodeWatchResourcesRequest.SerializeToString,
                                         response_deserializer=pb.NodeWatchResourcesResponse.FromString)
            stream = watch(pb.NodeWatchResourcesRequest(), timeout=20)
            started = time.monotonic()
            first, second, third = next(stream), next(stream), next(stream)
            assert time.monotonic() - started < 5
            for message in (first, second, third):
                assert [(d.device.pool_name, d.device.device_name, d.health) for d in message.devices] == [
                    (NODE, "gpu-0", pb.HEALTHY), (NODE, "gpu-1", pb.HEALTHY)]
            health.apply(HealthEvent("GPU-b", False, "Xid 79", 79))
            changed = eventually(lambda: next(m for m in stream if m.devices[1].health == pb.UNHEALTHY),
                                 what="the change")
            assert changed.devices[1].message == "Xid 79"
            stream.cancel()
        finally:
            service_impl.stopping.set()
            channel.close()
            server.stop(0).wait(5)
