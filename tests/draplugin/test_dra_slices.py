"""The node's ResourceSlice as the plugin publishes it, read through the kubernetes client: content, owner,
and republishing with a higher pool generation when a GPU goes unhealthy (Xid through the sim control file) and
when it recovers."""

from __future__ import annotations

import pytest
from dra_helpers import DRIVER, NODE, SLICE, DRABed, eventually

from vgpu.dra import slice_devices
from vgpu.kube.client import read_json


def _names(bed: DRABed) -> list[str]:
    return [d["name"] for d in (bed.read_slice() or {}).get("spec", {}).get("devices", [])]


def _generation(bed: DRABed) -> int:
    return int(bed.read_slice()["spec"]["pool"]["generation"])


def test_slice_content(bed: DRABed) -> None:
    bed.start(gpus="2xA100-40GB")
    typed = bed.resource.read_resource_slice(SLICE)
    spec = typed.spec
    assert spec.driver == DRIVER and spec.node_name == NODE
    assert (spec.pool.name, spec.pool.resource_slice_count) == (NODE, 1)
    assert spec.pool.generation >= 1
    assert [d.name for d in spec.devices] == ["gpu-0", "gpu-1"]
    for index, device in enumerate(spec.devices):
        attributes = device.attributes
        assert attributes["uuid"].string.startswith("GPU-")
        assert attributes["model"].string == "NVIDIA A100-PCIE-40GB"
        assert attributes["index"].int == index
        assert attributes["memory"].int == 40960
        assert "resource.kubernetes.io/numaNode" not in attributes  # the sim backend does not know it
        # NVIDIA's DRA driver's names beside ours: a selector written for it needs only the domain changed
        assert (attributes["type"].string, attributes["productName"].string) == ("gpu", "NVIDIA A100-PCIE-40GB")
        assert (attributes["architecture"].string, attributes["cudaComputeCapability"].version) == ("Ampere", "8.0.0")
        memory, cores = device.capacity["memory"], device.capacity["cores"]
        assert memory.value == "40960Mi"
        assert memory.request_policy.default == "40960Mi"
        assert (memory.request_policy.valid_range.min, memory.request_policy.valid_range.max,
                memory.request_policy.valid_range.step) == ("1Mi", "40960Mi", "1Mi")
        assert cores.value == "100" and cores.request_policy.default == "0"
        assert (cores.request_policy.valid_range.min, cores.request_policy.valid_range.max,
                cores.request_policy.valid_range.step) == ("0", "100", "1")
        assert device.allow_multiple_allocations is True
    uuids = {d.attributes["uuid"].string for d in spec.devices}
    assert len(uuids) == 2
    owners = typed.metadata.owner_references
    assert [(o.kind, o.name, o.uid) for o in owners] == [("Node", NODE, bed.node["metadata"]["uid"])]
    # the shared reader reads it as the scheduler will
    read = slice_devices(bed.read_slice())
    assert [(d.name, d.memory_mib, d.cores, d.shared) for d in read] == [("gpu-0", 40960, 100, True),
                                                                         ("gpu-1", 40960, 100, True)]


def test_an_xid_takes_the_gpu_out_and_recovery_brings_it_back(bed: DRABed) -> None:
    bed.start(gpus="2xT4")
    first = _generation(bed)
    uuid1 = bed.read_slice()["spec"]["devices"][1]["attributes"]["uuid"]["string"]
    bed.inject("xid 1 79")
    eventually(lambda: _names(bed) == ["gpu-0"], what="gpu-1 to leave the slice")
    assert _generation(bed) == first + 1
    bed.inject("recover 1")
    eventually(lambda: _names(bed) == ["gpu-0", "gpu-1"], what="gpu-1 to come back")
    assert _generation(bed) == first + 2
    assert bed.read_slice()["spec"]["devices"][1]["attributes"]["uuid"]["string"] == uuid1
    # a lost GPU leaves too
    bed.inject("lost 0")
    eventually(lambda: _names(bed) == ["gpu-1"], what="gpu-0 to leave the slice")
    assert _generation(bed) == first + 3


def test_a_restart_keeps_the_slice_and_a_changed_inventory_bumps_the_generation(bed: DRABed) -> None:
    bed.start(gpus="2xT4")
    before = bed.read_slice()
    bed.restart()
    eventually(lambda: "event=slice_current" in bed.log(), what="the restarted plugin to check its slice")
    after = bed.read_slice()  # same GPUs: not rewritten
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["spec"] == before["spec"]
    bed.kill()
    bed.args = bed.command(gpus="3xT4")
    bed._spawn()
    eventually(lambda: _names(bed) == ["gpu-0", "gpu-1", "gpu-2"], what="the third GPU")
    assert _generation(bed) == before["spec"]["pool"]["generation"] + 1


def test_a_stale_slice_of_ours_for_this_node_is_deleted_and_others_are_kept(bed: DRABed) -> None:
    def a_slice(name: str, driver: str, node: str) -> dict:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
                "spec": {"driver": driver, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                         "nodeName": node, "devices": []}}

    for body in (a_slice("old-name", DRIVER, NODE), a_slice("other-driver", "net.example.com", NODE),
                 a_slice("other-node", DRIVER, "node-b")):
        bed.resource.create_resource_slice(body)
    bed.start()
    eventually(lambda: "old-name" not in {s.metadata.name for s in bed.resource.list_resource_slice().items},
               what="the stale slice to go")
    assert {s.metadata.name for s in bed.resource.list_resource_slice().items} == {
        SLICE, "other-driver", "other-node"}


def test_a_registration_with_kubelet_restores_a_deleted_slice(bed: DRABed) -> None:
    bed.start(gpus="2xT4")
    generation = _generation(bed)
    bed.resource.delete_resource_slice(SLICE)  # as kubelet does with an unknown driver's slices at its start
    assert bed.read_slice() is None
    bed.notify(True)
    eventually(bed.read_slice, what="the slice to come back")
    assert _names(bed) == ["gpu-0", "gpu-1"]
    assert _generation(bed) > generation


def test_quantities_in_canonical_form_are_the_same_slice(bed: DRABed) -> None:
    bed.start(gpus="1xA100-40GB")
    current = bed.read_slice()
    memory = current["spec"]["devices"][0]["capacity"]["memory"]
    memory["value"] = memory["requestPolicy"]["default"] = memory["requestPolicy"]["validRange"]["max"] = "40Gi"
    replaced = read_json(bed.resource.replace_resource_slice(SLICE, current, _preload_content=False))
    bed.restart()
    eventually(lambda: "event=slice_current" in bed.log(), what="the restarted plugin to check its slice")
    assert bed.read_slice()["metadata"]["resourceVersion"] == replaced["metadata"]["resourceVersion"]


def test_failed_slice_writes_are_retried_while_prepare_keeps_working(bed: DRABed) -> None:
    from dra_helpers import result

    bed.start(gpus="2xT4")
    generation = _generation(bed)
    # 403 (say, RBAC not there yet): the client does not retry it, the publisher does
    bed.apiserver.faults.set([{"action": "error", "method": "PUT", "path": "/resourceslices/", "status": 403}])
    bed.inject("xid 1 79")
    eventually(lambda: bed.apiserver.faults.view()[0]["hits"] >= 2, what="the write to be retried")
    assert _names(bed) == ["gpu-0", "gpu-1"]  # not written yet
    claim = bed.claim("meanwhile", [result("gpu-0")])
    entry = bed.prepare(claim)[claim["metadata"]["uid"]]
    assert entry.error == "" and [d.device_name for d in entry.devices] == ["gpu-0"]
    bed.apiserver.faults.clear()
    eventually(lambda: _names(bed) == ["gpu-0"], timeout=40, what="the slice once the API server takes writes")
    assert _generation(bed) == generation + 1
    assert "event=slice_publish_failed" in bed.log()


def test_a_known_numa_node_is_published_as_the_standard_attribute() -> None:
    from vgpu.draplugin.slices import slice_spec
    from vgpu.node.backends import GPUInfo

    gpus = [GPUInfo("GPU-b", "NVIDIA L4", 23034, minor=1, numa=1, index=1),
            GPUInfo("GPU-a", "NVIDIA L4", 23034, minor=0, numa=None, index=0)]
    spec = slice_spec("n1", gpus, 7)
    assert spec["pool"] == {"name": "n1", "generation": 7, "resourceSliceCount": 1}
    first, second = spec["devices"]
    assert (first["name"], second["name"]) == ("gpu-0", "gpu-1")  # index order
    assert "resource.kubernetes.io/numaNode" not in first["attributes"]
    assert second["attributes"]["resource.kubernetes.io/numaNode"] == {"int": 1}
    assert second["capacity"]["memory"]["value"] == "23034Mi"


def test_nvidia_attribute_names_and_versions() -> None:
    from vgpu.draplugin.slices import nvidia_attributes
    from vgpu.node.backends import GPUInfo

    gpu = GPUInfo("GPU-a", "NVIDIA H100 80GB HBM3", 81559, minor=0, architecture="Hopper", compute_capability="9.0",
                  driver_version="580.159.04", cuda_driver_version="13.0", pci_bus_id="0000:00:06.0",
                  pcie_root="pci0000:00")
    assert nvidia_attributes(gpu) == {
        "type": {"string": "gpu"}, "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "architecture": {"string": "Hopper"}, "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.159.4"}, "cudaDriverVersion": {"version": "13.0.0"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:00:06.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"}}
    unknown = nvidia_attributes(GPUInfo("GPU-b", "Sim", 100, minor=0, driver_version="r580"))
    assert set(unknown) == {"type", "productName"}  # nothing invented where the backend does not know


@pytest.mark.parametrize("package", ["v1alpha1", "v1"])
def test_the_health_stream_reports_every_device_then_each_change(bed: DRABed, package: str) -> None:
    """`<package>.DRAResourceHealth/NodeWatchResources` on the DRA socket, followed as kubelet does: v1alpha1 is
    what kubelets 1.34 to 1.36 dial, v1 what kubelets with kubernetes/kubernetes#139477 prefer."""
    import importlib
    import queue
    import threading

    import grpc

    health = importlib.import_module(f"vgpu.proto.drahealth.{package}.api_pb2")

    bed.start(gpus="2xT4")
    channel = grpc.insecure_channel(f"unix://{bed.dra_socket}")
    # the method path as kubelet writes it
    watch = channel.unary_stream(f"/{package}.DRAResourceHealth/NodeWatchResources",
                                 request_serializer=health.NodeWatchResourcesRequest.SerializeToString,
                                 response_deserializer=health.NodeWatchResourcesResponse.FromString)
    stream = watch(health.NodeWatchResourcesRequest())
    seen: queue.Queue = queue.Queue()

    def follow() -> None:
        try:
            for message in stream:
                seen.put(message)
        except grpc.RpcError:
            pass  # cancelled at the end of the test

    threading.Thread(target=follow, daemon=True).start()

    def states() -> dict[tuple[str, str], int]:
        message = seen.get(timeout=15)
        return {(d.device.pool_name, d.device.device_name): d.health for d in message.devices}

    try:
        assert states() == {(NODE, "gpu-0"): health.HEALTHY, (NODE, "gpu-1"): health.HEALTHY}
        bed.inject("xid 1 79")
        assert states() == {(NODE, "gpu-0"): health.HEALTHY, (NODE, "gpu-1"): health.UNHEALTHY}
        bed.inject("recover 1")
        assert states() == {(NODE, "gpu-0"): health.HEALTHY, (NODE, "gpu-1"): health.HEALTHY}
    finally:
        stream.cancel()
        channel.close()
    assert bed.stop() == 0  # an open stream does not hold the plugin up


def test_health_streams_beyond_a_few_are_refused(bed: DRABed) -> None:
    """Each open health stream holds a worker of the server that also prepares claims: past a few, new streams are
    refused with RESOURCE_EXHAUSTED instead of waiting for a worker (and starving NodePrepareResources)."""
    import grpc

    from vgpu.proto.drahealth.v1 import api_pb2 as health
    from vgpu.proto.drahealth.v1 import api_pb2_grpc as health_grpc

    bed.start(gpus="1xT4")
    channels = [grpc.insecure_channel(f"unix://{bed.dra_socket}") for _ in range(12)]
    # a deadline, so that a stream no worker ever serves fails instead of waiting for ever
    streams = [health_grpc.DRAResourceHealthStub(c).NodeWatchResources(health.NodeWatchResourcesRequest(), timeout=60)
               for c in channels]
    codes = []
    try:
        for stream in streams:
            try:
                next(stream)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
    finally:
        for stream in streams:
            stream.cancel()
        for channel in channels:
            channel.close()
    assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert 1 <= codes.count(grpc.StatusCode.OK) <= 4, codes


def test_an_api_server_without_consumable_capacity_is_noticed_once_and_not_fought(bed: DRABed) -> None:
    # kube-apiserver with DRAConsumableCapacity off (the 1.34 / 1.35 default) stores the slice without
    # allowMultipleAllocations and requestPolicy (resourceslice strategy dropDisabledFields)
    bed.apiserver.store.consumable_capacity = False
    bed.start(gpus="2xT4")
    stored = bed.read_slice()
    assert all("allowMultipleAllocations" not in d for d in stored["spec"]["devices"])
    eventually(lambda: "event=consumable_capacity_off" in bed.log(), what="the warning")
    events = eventually(lambda: [e for e in read_json(bed.core.list_event_for_all_namespaces(
        _preload_content=False))["items"] if e.get("reason") == "DRAConsumableCapacityOff"], what="the Node event")
    assert events[0]["involvedObject"]["kind"] == "Node" and events[0]["involvedObject"]["name"] == NODE
    bed.notify(True)  # a registration republishes: the slice the server kept is what we wrote, not rewritten
    eventually(lambda: bed.log().count("event=slice_current") >= 1, what="the slice found current")
    assert bed.read_slice()["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    assert bed.log().count("event=consumable_capacity_off") == 1
