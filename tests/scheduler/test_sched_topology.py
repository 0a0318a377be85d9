"""GPU topology reaching the scheduler: `vgpu-sharing.io/node-gpu-topology` read into GPUDevice.island and .numa in
device-plugin mode (a missing or malformed value never costs the node its scheduling), and the slice attributes
`nvlinkIsland` and `resource.kubernetes.io/numaNode` in DRA mode."""

import logging

import pytest
from sched_builders import dra_device, dra_slice, gpu, node

from vgpu import keys
from vgpu.inventory import encode_topology
from vgpu.scheduler.draview import DRAView
from vgpu.scheduler.ledger import Ledger
from vgpu.scheduler.policies.base import make_policy

UUIDS = [f"GPU-{i}" for i in range(4)]


def topo_node(name, topology):
    obj = node(name, [gpu(u) for u in UUIDS])
    if topology is not None:
        obj["metadata"]["annotations"][keys.NODE_TOPOLOGY] = topology
    return obj


def placed(ledger, name):
    state = ledger.nodes[name]
    return state.error, [(d.uuid, d.island, d.numa) for d in state.devices]


GOOD = encode_topology([("GPU-0", 0, 0), ("GPU-1", 0, 0), ("GPU-2", 2, 1), ("GPU-3", None, 1)])


def test_islands_and_numa_nodes_come_from_the_annotation():
    ledger = Ledger()
    ledger.on_node(topo_node("n1", GOOD))
    assert placed(ledger, "n1") == ("", [("GPU-0", 0, 0), ("GPU-1", 0, 0), ("GPU-2", 2, 1), ("GPU-3", -1, 1)])
    assert [(d.island, d.numa) for d in ledger.detached(topo_node("n9", GOOD)).devices] == [
        (0, 0), (0, 0), (2, 1), (-1, 1)]


def test_without_the_annotation_the_node_has_no_topology():
    ledger = Ledger()
    ledger.on_node(topo_node("n1", None))
    assert placed(ledger, "n1") == ("", [(u, -1, 0) for u in UUIDS])
    partial = encode_topology([("GPU-2", 2, None), ("GPU-elsewhere", 0, 0)])  # GPUs it does not name keep theirs
    ledger.on_node(topo_node("n2", partial))
    assert placed(ledger, "n2")[1] == [("GPU-0", -1, 0), ("GPU-1", -1, 0), ("GPU-2", 2, 0), ("GPU-3", -1, 0)]


def test_a_topology_change_alone_is_noticed():
    ledger = Ledger()
    ledger.on_node(topo_node("n1", None))
    ledger.on_node(topo_node("n1", GOOD))
    assert placed(ledger, "n1")[1][2] == ("GPU-2", 2, 1)
    ledger.on_node(topo_node("n1", "{}"))
    assert placed(ledger, "n1")[1][2] == ("GPU-2", -1, 0)


@pytest.mark.parametrize("garbage", ["", "[", "[]", '{"GPU-0":{"island":"x"}}', '{"GPU-0":{"rack":3}}',
                                     '{"GPU-0":{"island":-4}}', "{" * 100_000, '{"GPU-0":{}}' + " " * 300_000, 42,
                                     '{"GPU-0":{"numa":1},"GPU 1":{}}'])
def test_garbage_never_breaks_the_node_or_its_neighbours(garbage, caplog):
    ledger = Ledger()
    ledger.on_node(topo_node("good", GOOD))
    obj = topo_node("bad", None)
    obj["metadata"]["annotations"][keys.NODE_TOPOLOGY] = garbage
    with caplog.at_level(logging.WARNING, logger="vgpu.scheduler.nodestate"):
        ledger.on_node(obj)
        for _ in range(3):
            ledger.detached(obj)
    assert placed(ledger, "bad") == ("", [(u, -1, 0) for u in UUIDS])  # scheduled, without topology
    assert placed(ledger, "good")[1][0] == ("GPU-0", 0, 0)
    logged = [r.getMessage() for r in caplog.records if "node_topology_ignored" in r.getMessage()]
    assert len(logged) == 1 and "node=bad" in logged[0]


def test_dra_devices_take_island_and_numa_from_the_slice_attributes():
    view = DRAView(make_policy("fragaware"))
    view.on_slice(dra_slice("d1", [
        dra_device(0, nvlinkIsland={"int": 0}, **{"resource.kubernetes.io/numaNode": {"int": 0}}),
        dra_device(1, nvlinkIsland={"int": 0}, **{"resource.kubernetes.io/numaNode": {"int": 1}}),
        dra_device(2),
        dra_device(3, nvlinkIsland={"string": "0"}, **{"resource.kubernetes.io/numaNode": {"int": -1}}),
        dra_device(4, nvlinkIsland={"bool": True}, **{"resource.kubernetes.io/numaNode": {"int": 1 << 40}}),
    ]))
    state = view.states()["d1"]
    assert state.error == ""
    assert [(d.island, d.numa) for d in state.devices] == [(0, 0), (0, 1), (-1, 0), (-1, 0), (-1, 0)]

