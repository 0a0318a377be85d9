"""The committed gRPC code is current, loads with the installed runtimes, and matches kubelet's wire facts.

Facts are those of kubelet's published protos (k8s.io/kubelet: deviceplugin v1beta1 and podresources v1).
"""

import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from proto_facts import I32, I64, U64, B, S, assert_messages

from vgpu.proto.deviceplugin.v1beta1 import api_pb2 as dp
from vgpu.proto.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from vgpu.proto.podresources.v1 import api_pb2 as pr
from vgpu.proto.podresources.v1 import api_pb2_grpc as pr_grpc

ROOT = Path(__file__).resolve().parents[2]

# message -> {field name: (number, type or message name, repeated)}
DEVICEPLUGIN_FACTS = {
    "DevicePluginOptions": {"pre_start_required": (1, B, False), "get_preferred_allocation_available": (2, B, False)},
    "RegisterRequest": {
        "version": (1, S, False),
        "endpoint": (2, S, False),
        "resource_name": (3, S, False),
        "options": (4, "DevicePluginOptions", False),
    },
    "Empty": {},
    "ListAndWatchResponse": {"devices": (1, "Device", True)},
    "TopologyInfo": {"nodes": (1, "NUMANode", True)},
    "NUMANode": {"ID": (1, I64, False)},
    "Device": {"ID": (1, S, False), "health": (2, S, False), "topology": (3, "TopologyInfo", False)},
    "PreStartContainerRequest": {"devices_ids": (1, S, True)},
    "PreStartContainerResponse": {},
    "PreferredAllocationRequest": {"container_requests": (1, "ContainerPreferredAllocationRequest", True)},
    "ContainerPreferredAllocationRequest": {
        "available_deviceIDs": (1, S, True),
        "must_include_deviceIDs": (2, S, True),
        "allocation_size": (3, I32, False),
    },
    "PreferredAllocationResponse": {"container_responses": (1, "ContainerPreferredAllocationResponse", True)},
    "ContainerPreferredAllocationResponse": {"deviceIDs": (1, S, True)},
    "AllocateRequest": {"container_requests": (1, "ContainerAllocateRequest", True)},
    "ContainerAllocateRequest": {"devices_ids": (1, S, True)},
    "CDIDevice": {"name": (1, S, False)},
    "AllocateResponse": {"container_responses": (1, "ContainerAllocateResponse", True)},
    "ContainerAllocateResponse": {
        "envs": (1, "EnvsEntry", True),
        "mounts": (2, "Mount", True),
        "devices": (3, "DeviceSpec", True),
        "annotations": (4, "AnnotationsEntry", True),
        "cdi_devices": (5, "CDIDevice", True),
    },
    "Mount": {"container_path": (1, S, False), "host_path": (2, S, False), "read_only": (3, B, False)},
    "DeviceSpec": {"container_path": (1, S, False), "host_path": (2, S, False), "permissions": (3, S, False)},
}
PODRESOURCES_FACTS = {
    "ListPodResourcesRequest": {},
    "ListPodResourcesResponse": {"pod_resources": (1, "PodResources", True)},
    "PodResources": {
        "name": (1, S, False),
        "namespace": (2, S, False),
        "containers": (3, "ContainerResources", True),
        "cpu_ids": (4, I64, True),
        "memory": (5, "ContainerMemory", True),
    },
    "ContainerResources": {
        "name": (1, S, False),
        "devices": (2, "ContainerDevices", True),
        "cpu_ids": (3, I64, True),
        "memory": (4, "ContainerMemory", True),
        "dynamic_resources": (5, "DynamicResource", True),
    },
    "ContainerDevices": {
        "resource_name": (1, S, False),
        "device_ids": (2, S, True),
        "topology": (3, "TopologyInfo", False),
    },
    "ContainerMemory": {"memory_type": (1, S, False), "size": (2, U64, False), "topology": (3, "TopologyInfo", False)},
    "AllocatableResourcesRequest": {},
    "AllocatableResourcesResponse": {
        "devices": (1, "ContainerDevices", True),
        "cpu_ids": (2, I64, True),
        "memory": (3, "ContainerMemory", True),
    },
    "TopologyInfo": {"nodes": (1, "NUMANode", True)},
    "NUMANode": {"ID": (1, I64, False)},
    "DynamicResource": {
        "class_name": (1, S, False),
        "claim_name": (2, S, False),
        "claim_namespace": (3, S, False),
        "claim_resources": (4, "ClaimResource", True),
    },
    "ClaimResource": {
        "cdi_devices": (1, "CDIDevice", True),
        "driver_name": (2, S, False),
        "pool_name": (3, S, False),
        "device_name": (4, S, False),
    },
    "CDIDevice": {"name": (1, S, False)},
    "GetPodResourcesRequest": {"pod_name": (1, S, False), "pod_namespace": (2, S, False)},
    "GetPodResourcesResponse": {"pod_resources": (1, "PodResources", False)},
}
@pytest.mark.parametrize(
    "module,facts,package",
    [(dp, DEVICEPLUGIN_FACTS, "v1beta1"), (pr, PODRESOURCES_FACTS, "v1")],
    ids=["deviceplugin", "podresources"],
)
def test_field_numbers_match_kubelet(module, facts, package):
    assert module.DESCRIPTOR.package == package
    assert_messages(module, facts)


def test_method_paths_are_kubelets():
    services = {s.full_name: [m.name for m in s.methods] for s in dp.DESCRIPTOR.services_by_name.values()}
    assert services == {
        "v1beta1.Registration": ["Register"],
        "v1beta1.DevicePlugin": [
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        ],
    }
    lister = pr.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert lister.full_name == "v1.PodResourcesLister"
    assert [m.name for m in lister.methods] == ["List", "GetAllocatableResources", "Get"]
    assert dp.DESCRIPTOR.services_by_name["DevicePlugin"].methods_by_name["ListAndWatch"].server_streaming


def test_wire_bytes_are_protobuf_standard():
    # field 1, length-delimited, then the string: what kubelet's Go code writes and reads.
    assert dp.ContainerAllocateRequest(devices_ids=["GPU-a-0"]).SerializeToString() == b"\n\x07GPU-a-0"
    options = dp.DevicePluginOptions(get_preferred_allocation_available=True)
    assert options.SerializeToString() == b"\x10\x01"
    mount = dp.Mount(container_path="/a", host_path="/b", read_only=True).SerializeToString()
    assert mount == b"\n\x02/a\x12\x02/b\x18\x01"


def test_generated_stubs_are_importable():
    assert hasattr(dp_grpc, "RegistrationServicer") and hasattr(dp_grpc, "DevicePluginStub")
    assert hasattr(pr_grpc, "PodResourcesListerStub")
    def version(text):
        return tuple(int(part) for part in text.split(".")[:3])

    assert version(grpc.__version__) >= version(dp_grpc.GRPC_GENERATED_VERSION)


def test_regenerating_changes_nothing():
    result = subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--check"], capture_output=True, text=True, cwd=ROOT,
        check=False
    )
    assert result.returncode == 0, result.stderr


def test_runtime_grpcio_is_a_lower_bound_and_the_generator_is_pinned_to_the_generated_version():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = [d for d in project["dependencies"] if d.startswith("grpcio")]
    tools = [d for d in project["optional-dependencies"]["test"] if d.startswith("grpcio-tools")]
    assert runtime == [f"grpcio>={dp_grpc.GRPC_GENERATED_VERSION}"]
    assert tools == [f"grpcio-tools=={dp_grpc.GRPC_GENERATED_VERSION}"]
