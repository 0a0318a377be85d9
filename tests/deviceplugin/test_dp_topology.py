"""GPU topology on the node: NVLink islands and NUMA nodes read by the NVML backend from the simulated NVML (the test
bed's `@nvlinkK` / `/numaN` machine specs), the sim backend's own spec syntax, and the device plugin publishing them
as `vgpu-sharing.io/node-gpu-topology`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dp_helpers import NODE
from test_dp_nvml import start_nvml_plugin

from vgpu.deviceplugin.registrar import topology_value
from vgpu.deviceplugin.server import NUMBER, WHOLE, DeviceState, ResourceService
from vgpu.errors import ConfigError
from vgpu.inventory import decode_topology
from vgpu.node.backends import GPUInfo
from vgpu.node.backends.nvml import nvlink_islands
from vgpu.node.backends.sim import SimBackend, parse_sim_layout, parse_sim_spec
from vgpu.testbed.build import ensure_sim_built
from vgpu.testbed.machine import MachineSpecError, machine, parse_machine_spec

TOPOLOGY = "vgpu-sharing.io/node-gpu-topology"

_PROBE = """
import json, logging
logging.basicConfig(level=logging.WARNING)
from vgpu.node.backends.nvml import NVMLBackend
backend = NVMLBackend()
print(json.dumps([[g.uuid, g.nvml_index, g.numa, g.nvlink_island] for g in backend.devices()]))
backend.close()
"""


def nvml_devices(spec: str, tmp: Path) -> tuple[list[list], str]:
    """[uuid, index, numa, island] per GPU as NVMLBackend reads them from the simulated NVML of machine `spec`, and
    the backend's log."""
    gpus = machine(spec, "topo-node")
    tmp.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, LD_LIBRARY_PATH=str(ensure_sim_built().sim_dir), SIMGPU_STATE=str(tmp / "node.state"),
               SIMGPU_DEVICES=",".join(g.simgpu_entry() for g in gpus))
    res = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    found = json.loads(res.stdout)
    assert [row[0] for row in found] == [g.uuid for g in gpus]
    return found, res.stderr


def test_machine_spec_topology_syntax():
    entries, numa = parse_machine_spec("8xH100-80GB@nvlink4,2xT4/numa2")
    assert [(e.model.nvml_name, e.count, e.island) for e in entries] == [
        ("NVIDIA H100 80GB HBM3", 8, 4), ("Tesla T4", 2, 0)]
    assert numa == 2
    gpus = machine("4xH100-80GB@nvlink2/numa2", "n")
    assert [g.numa for g in gpus] == [0, 0, 1, 1]
    assert [g.nvlink_peers for g in gpus] == [(gpus[1].bus,), (gpus[0].bus,), (gpus[3].bus,), (gpus[2].bus,)]
    assert gpus[2].simgpu_entry().endswith(f":bus{gpus[2].bus:#x}+numa1+root1+nvl{gpus[3].bus:#x}")
    assert machine("2xT4", "n")[0].simgpu_entry().endswith(":bus0x17")  # no topology said: none invented
    sixteen = machine("16xH100-80GB@nvlink8", "n")
    assert len({g.bus for g in sixteen}) == 16 and max(g.bus for g in sixteen) <= 0xFF
    for bad in ("3xH100-80GB@nvlink2", "4xH100-80GB@nvlink1", "34xH100-80GB@nvlink17", "3xT4/numa2", "2xT4/numa0",
                "2xT4@nvlink"):
        with pytest.raises(MachineSpecError):
            parse_machine_spec(bad)


def test_sim_backend_topology_syntax():
    gpus = SimBackend.from_spec("2xT4,4xH100-80GB@nvlink2/numa2", node_name="n").devices()
    assert [(g.numa, g.nvlink_island) for g in gpus] == [(0, None), (0, None), (0, 2), (1, 2), (1, 4), (1, 4)]
    plain = SimBackend.from_spec("2xA100-40GB", node_name="n").devices()
    assert [(g.numa, g.nvlink_island) for g in plain] == [(None, None), (None, None)]
    assert parse_sim_layout("8xH100-80GB+mig@nvlink8/numa1") == ([("H100-80GB", 8, True, 8)], 1)
    assert parse_sim_spec("8xH100-80GB@nvlink4/numa2") == [("H100-80GB", 8)]
    for bad in ("3xH100-80GB@nvlink2", "2xT4@nvlink1", "2xT4@nvlink", "3xT4/numa2", "2xT4/numa9",
                "8xH100-80GB@nvlink8+mig"):
        with pytest.raises(ConfigError, match="sim_gpus"):
            parse_sim_spec(bad)


def test_islands_are_connected_components_numbered_by_their_lowest_index():
    a, b, c, d, e = (f"0000:{bus:02x}:00.0" for bus in (0x17, 0x37, 0x57, 0x77, 0x97))
    switch = "0000:c0:00.0"
    ends = {0: (a, [b]), 1: (b, [a, c]), 2: (c, [b]),  # a chain is one island
            3: (d, [switch, switch]), 4: (e, [switch]),  # joined through an NVSwitch
            5: ("0000:a7:00.0", []),  # no active link
            6: ("0000:b7:00.0", ["0000:ff:00.0"])}  # linked to a GPU this process does not see
    assert nvlink_islands(ends) == {0: 0, 1: 0, 2: 0, 3: 3, 4: 3, 6: 6}
    assert nvlink_islands({2: (b, [a]), 0: (a, [b])}) == {0: 0, 2: 0}
    assert nvlink_islands({}) == {}


def test_nvml_backend_finds_islands_and_numa_nodes(tmp_path):
    found, log = nvml_devices("8xH100-80GB@nvlink4/numa2", tmp_path)
    assert [(index, numa, island) for _, index, numa, island in found] == [
        (0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0), (4, 1, 4), (5, 1, 4), (6, 1, 4), (7, 1, 4)]
    assert "nvml_device_failed" not in log
    one, _ = nvml_devices("16xH100-80GB@nvlink8", tmp_path / "16")
    assert [island for *_, island in one] == [0] * 8 + [8] * 8


def test_pcie_cards_have_no_island_and_not_supported_breaks_nothing(tmp_path):
    found, log = nvml_devices("2xT4,2xH100-80GB@nvlink2,1xL4", tmp_path)
    assert [(index, island) for _, index, _, island in found] == [(0, None), (1, None), (2, 2), (3, 2), (4, None)]
    assert "WARNING" not in log and "nvml_device_failed" not in log


def test_topology_value_of_the_device_state():
    state = DeviceState([GPUInfo("GPU-b", "H100", 81559, minor=1, numa=0, nvlink_island=0),
                         GPUInfo("GPU-a", "H100", 81559, minor=0, numa=0, nvlink_island=0),
                         GPUInfo("GPU-c", "T4", 15360, minor=2)])
    assert topology_value(state) == '{"GPU-a":{"island":0,"numa":0},"GPU-b":{"island":0,"numa":0}}'


def test_the_plugin_publishes_the_topology_beside_the_inventory(cluster):
    gpus = machine("4xH100-80GB@nvlink2,2xT4/numa2", NODE)
    start_nvml_plugin(cluster, ",".join(g.simgpu_entry() for g in gpus), "--gpu-memory-factor", "auto")
    assert cluster.wait_inventory() == [g.uuid for g in gpus]
    deadline = time.monotonic() + 10
    while TOPOLOGY not in cluster.node_annotations():
        assert time.monotonic() < deadline, cluster.log()
        time.sleep(0.05)
    value = cluster.node_annotations()[TOPOLOGY]
    decoded = decode_topology(value)
    assert [(t.island, t.numa) for t in decoded.values()] == [(0, 0), (0, 0), (2, 0), (2, 1), (-1, 1), (-1, 1)]
    assert list(decoded) == [g.uuid for g in gpus]
    assert json.loads(value)[gpus[4].uuid] == {"numa": 1}


def test_only_whole_gpus_carry_their_numa_node_to_kubelet():
    """kubelet's Topology Manager restricts Allocate to the devices of the NUMA node it prefers (devicemanager
    `filterByAffinity`); a share's GPU is already chosen in its grant, so shares say no NUMA node
    (tests/realk8s/test_realk8s_topology.py shows the failure with the real kubelet)."""
    state = DeviceState([GPUInfo("GPU-a", "A100", 40960, minor=0, numa=0), GPUInfo("GPU-b", "A100", 40960, minor=1,
                                                                                 numa=1)])
    shares = ResourceService(NUMBER, "volcano.sh/vgpu-number", state, lambda gpu: 2).device_list()
    assert [(d.ID, d.HasField("topology")) for d in shares.devices] == [
        ("GPU-a-0", False), ("GPU-a-1", False), ("GPU-b-0", False), ("GPU-b-1", False)]
    whole = ResourceService(WHOLE, "nvidia.com/gpu", state, lambda gpu: 1).device_list()
    assert [(d.ID, [n.ID for n in d.topology.nodes]) for d in whole.devices] == [("GPU-a", [0]), ("GPU-b", [1])]
