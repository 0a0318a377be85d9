"""The DRA protocols (plugin registration, DRA node service v1 and v1beta1, device health v1 and v1alpha1) match
kubelet's wire facts.

Facts are those of kubelet's published DRA protos (k8s.io/kubelet pkg/apis/dra): packages, services, method paths,
message and field names, numbers and types. The device-health facts are those of k8s.io/kubelet
pkg/apis/dra-health/v1alpha1/api.proto (tags v0.34.0 to v0.37.0-beta.0; field 4 since v0.35.0, field 5 since
v0.36.0) and pkg/apis/dra-health/v1/api.proto (master, commit 20b239517c2e, the same messages under package v1).
The generated code itself is checked current by test_proto_codegen.
"""

from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from proto_facts import B, S, assert_messages

from vgpu.proto.dra.v1 import api_pb2 as dra
from vgpu.proto.dra.v1 import api_pb2_grpc as dra_grpc
from vgpu.proto.dra.v1beta1 import api_pb2 as dra_beta
from vgpu.proto.dra.v1beta1 import api_pb2_grpc as dra_beta_grpc
from vgpu.proto.drahealth.v1 import api_pb2 as health
from vgpu.proto.drahealth.v1alpha1 import api_pb2 as health_alpha
from vgpu.proto.drahealth.v1alpha1 import api_pb2_grpc as health_alpha_grpc
from vgpu.proto.pluginregistration.v1 import api_pb2 as reg
from vgpu.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc

REGISTRATION_FACTS = {
    "InfoRequest": {},
    "PluginInfo": {"type": (1, S, False), "name": (2, S, False), "endpoint": (3, S, False),
                   "supported_versions": (4, S, True)},
    "RegistrationStatus": {"plugin_registered": (1, B, False), "error": (2, S, False)},
    "RegistrationStatusResponse": {},
}
DRA_FACTS = {
    "Claim": {"namespace": (1, S, False), "uid": (2, S, False), "name": (3, S, False)},
    "NodePrepareResourcesRequest": {"claims": (1, "Claim", True)},
    "NodePrepareResourcesResponse": {"claims": (1, "ClaimsEntry", True)},
    "NodePrepareResourceResponse": {"devices": (1, "Device", True), "error": (2, S, False)},
    "Device": {"request_names": (1, S, True), "pool_name": (2, S, False), "device_name": (3, S, False),
               "cdi_device_ids": (4, S, True), "share_id": (5, S, False)},
    "NodeUnprepareResourcesRequest": {"claims": (1, "Claim", True)},
    "NodeUnprepareResourcesResponse": {"claims": (1, "ClaimsEntry", True)},
    "NodeUnprepareResourceResponse": {"error": (1, S, False)},
}

HEALTH_FACTS = {
    "NodeWatchResourcesRequest": {},
    "NodeWatchResourcesResponse": {"devices": (1, "DeviceHealth", True)},
    "DeviceHealth": {"device": (1, "DeviceIdentifier", False), "health": (2, "HealthStatus", False),
                     "last_updated_time": (3, "int64", False), "health_check_timeout_seconds": (4, "int64", False),
                     "message": (5, S, False)},
    "DeviceIdentifier": {"pool_name": (1, S, False), "device_name": (2, S, False)},
}


def test_registration_is_kubelets():
    assert reg.DESCRIPTOR.package == "pluginregistration"
    assert_messages(reg, REGISTRATION_FACTS)
    service = reg.DESCRIPTOR.services_by_name["Registration"]
    assert service.full_name == "pluginregistration.Registration"
    assert [m.name for m in service.methods] == ["GetInfo", "NotifyRegistrationStatus"]


def test_dra_node_service_is_kubelets():
    assert dra.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    assert_messages(dra, DRA_FACTS)
    service = dra.DESCRIPTOR.services_by_name["DRAPlugin"]
    assert service.full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert [m.name for m in service.methods] == ["NodePrepareResources", "NodeUnprepareResources"]
    # responses are maps keyed by claim UID
    for name, value in (("NodePrepareResourcesResponse", "NodePrepareResourceResponse"),
                        ("NodeUnprepareResourcesResponse", "NodeUnprepareResourceResponse")):
        entry = dra.DESCRIPTOR.message_types_by_name[name].fields_by_name["claims"].message_type
        assert entry.GetOptions().map_entry
        assert entry.fields_by_name["key"].type == FieldDescriptor.TYPE_STRING
        assert entry.fields_by_name["value"].message_type.name == value
    # share_id is explicitly optional: an unset share differs from an empty one on the wire
    share = dra.DESCRIPTOR.message_types_by_name["Device"].fields_by_name["share_id"]
    assert share.has_presence


def test_dra_node_service_v1beta1_has_v1s_shape_in_its_own_package():
    assert dra_beta.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1beta1"
    assert_messages(dra_beta, DRA_FACTS)
    service = dra_beta.DESCRIPTOR.services_by_name["DRAPlugin"]
    assert service.full_name == "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    paths = [f"/{service.full_name}/{m.name}" for m in service.methods]
    assert paths == ["/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
                     "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources"]
    assert hasattr(dra_beta_grpc, "DRAPluginServicer") and hasattr(dra_beta_grpc, "DRAPluginStub")
    # the same message on the wire in both versions
    claim = {"namespace": "default", "uid": "u1", "name": "c"}
    assert dra_beta.Claim(**claim).SerializeToString() == dra.Claim(**claim).SerializeToString()


def test_wire_bytes_are_protobuf_standard():
    info = reg.PluginInfo(type="DRAPlugin", name="gpu.vgpu-sharing.io", endpoint="/p.sock",
                          supported_versions=["v1.DRAPlugin"])
    assert info.SerializeToString() == (b"\n\tDRAPlugin\x12\x13gpu.vgpu-sharing.io\x1a\x07/p.sock"
                                        b"\"\x0cv1.DRAPlugin")
    assert dra.Device(share_id="").SerializeToString() == b"*\x00"  # present though empty
    assert dra.Device().SerializeToString() == b""
    response = dra.NodeUnprepareResourcesResponse()
    response.claims["u1"].error = "x"
    # field 1 (map entry), entry: key field 1 "u1", value field 2 {error field 1 "x"}
    assert response.SerializeToString() == b"\n\t\n\x02u1\x12\x03\n\x01x"


def test_generated_stubs_load_with_the_installed_grpc():
    assert hasattr(reg_grpc, "RegistrationServicer") and hasattr(reg_grpc, "RegistrationStub")
    assert hasattr(dra_grpc, "DRAPluginServicer") and hasattr(dra_grpc, "DRAPluginStub")

    def version(text):
        return tuple(int(part) for part in text.split(".")[:3])

    assert version(grpc.__version__) >= version(dra_grpc.GRPC_GENERATED_VERSION)


@pytest.mark.parametrize("module,package", [(health, "v1"), (health_alpha, "v1alpha1")])
def test_device_health_service_is_kubelets(module, package):
    assert module.DESCRIPTOR.package == package
    messages = module.DESCRIPTOR.message_types_by_name
    assert set(messages) == set(HEALTH_FACTS)
    for name, fields in HEALTH_FACTS.items():
        found = {}
        for field in messages[name].fields:
            kind = (field.message_type or field.enum_type).name if (field.message_type or field.enum_type) else \
                {FieldDescriptor.TYPE_STRING: S, FieldDescriptor.TYPE_INT64: "int64"}[field.type]
            found[field.name] = (field.number, kind, field.is_repeated)
        assert found == fields, name
    status = module.DESCRIPTOR.enum_types_by_name["HealthStatus"]
    assert {v.name: v.number for v in status.values} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
    service = module.DESCRIPTOR.services_by_name["DRAResourceHealth"]
    assert service.full_name == f"{package}.DRAResourceHealth"
    [method] = service.methods
    assert (method.name, method.client_streaming, method.server_streaming) == ("NodeWatchResources", False, True)


def test_the_health_versions_differ_only_in_the_package_name():
    """Kubelets 1.34 to 1.36 dial /v1alpha1.DRAResourceHealth/NodeWatchResources; the messages on the wire are the
    same bytes in both packages."""
    def response(pb):
        return pb.NodeWatchResourcesResponse(devices=[pb.DeviceHealth(
            device=pb.DeviceIdentifier(pool_name="node-a", device_name="gpu-1"), health=pb.UNHEALTHY,
            last_updated_time=1700000000, health_check_timeout_seconds=60, message="Xid 79")])

    assert response(health).SerializeToString() == response(health_alpha).SerializeToString()
    assert hasattr(health_alpha_grpc, "DRAResourceHealthServicer") and hasattr(health_alpha_grpc,
                                                                               "DRAResourceHealthStub")
    generated = Path(health_alpha_grpc.__file__).read_text()
    assert "'/v1alpha1.DRAResourceHealth/NodeWatchResources'" in generated
