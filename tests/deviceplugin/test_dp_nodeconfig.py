"""The per-node configuration file (`--node-config`, deviceplugin/nodeconfig.py): parsing an entry, picking this
node's, laying it over the other sources, refusing what we do not do (memory oversubscription), tolerating another
node's mistakes, and the running plugin advertising what the entry says."""

from __future__ import annotations

import logging
import re
import time

import pytest
from dp_helpers import NODE

from vgpu.deviceplugin.config import resolve_config
from vgpu.deviceplugin.nodeconfig import excluded, node_entry, parse_entry
from vgpu.errors import ConfigError
from vgpu.node.backends.sim import SimBackend

NUMBER = "volcano.sh/vgpu-number"


def write(tmp_path, text: str) -> str:
    path = tmp_path / "nodes.yaml"
    path.write_text(text)
    return str(path)


def resolve(node_config: str, node: str = NODE, flags: dict | None = None, env: dict | None = None):
    return resolve_config(None, {"node_name": node, "node_config": node_config, **(flags or {})}, env or {})


# ------------------------------------------------------------------------------------------------- one entry

def test_an_entry_in_our_spelling_and_in_hamis():
    ours = parse_entry({"name": "n1", "splitCount": 4, "filterDevices": {"uuid": ["GPU-a"], "index": [1, "3"]},
                        "memoryScaling": 1})
    assert (ours.name, ours.split_count, ours.exclude_uuids, ours.exclude_indices) == ("n1", 4, ("GPU-a",), (1, 3))
    assert ours.exclude_devices() == ["GPU-a", "1", "3"]
    hami = parse_entry({"name": "n1", "devicesplitcount": 4, "devicememoryscaling": 1.0,
                        "filterdevices": {"uuid": ["GPU-a"], "index": [1, 3]}})
    assert (hami.split_count, hami.exclude_devices()) == (4, ["GPU-a", "1", "3"])
    assert parse_entry({"name": "n1"}).split_count is None


@pytest.mark.parametrize("raw, message", [
    ({"name": "n1", "splitCount": 0}, "splitCount: must be 1..1000, got 0"),
    ({"name": "n1", "splitCount": "four"}, "splitCount: expected an integer"),
    ({"name": "n1", "splitCount": True}, "splitCount: expected an integer"),
    ({"name": "n1", "memoryScaling": 1.5}, "memoryScaling: 1.5 is not supported: vgpu-sharing never oversubscribes"),
    ({"name": "n1", "memoryScaling": 0.9}, "memoryScaling: 0.9 is not supported"),
    ({"name": "n1", "filterDevices": {"index": [-1]}}, "filterDevices.index[0]: must be >= 0"),
    ({"name": "n1", "filterDevices": {"uuid": "GPU-a"}}, "filterDevices.uuid: expected a list"),
    ({"name": "n1", "filterDevices": {"serial": ["x"]}}, "filterDevices.serial: unknown key"),
    ({"name": "n1", "filterDevices": {"uuid": [""]}}, "filterDevices.uuid[0]: expected a GPU UUID"),
    ({"name": "n1", "splitcount": 4}, "splitcount: unknown key"),
    ({"name": "n1", "splitCount": 4, "devicesplitcount": 4}, "devicesplitcount: given twice"),
    ({"splitCount": 4}, "name: expected the node's name"),
    ("n1", "expected a mapping"),
])
def test_a_bad_entry_names_its_field(raw, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        parse_entry(raw)


def test_excluded_matches_uuids_and_nvml_indices():
    gpus = SimBackend.from_spec("4xT4", node_name="n1").devices()
    kept, dropped, unmatched = excluded(gpus, [gpus[0].uuid, "2", "7", "GPU-missing"])
    assert [g.nvml_index for g in kept] == [1, 3] and [g.nvml_index for g in dropped] == [0, 2]
    assert unmatched == ["7", "GPU-missing"]
    assert excluded(gpus, []) == (gpus, [], [])


# ------------------------------------------------------------------------------------------------- the file

FILE = """\
nodeConfig:
  - name: node-a
    splitCount: 4
    filterDevices:
      index: [1]
  - name: node-b
    splitCount: 2
"""


def test_only_this_nodes_entry_applies(tmp_path):
    path = write(tmp_path, FILE)
    a = resolve(path, "node-a")
    assert (a.sharing.split_count, a.exclude_devices) == (4, ["1"])
    b = resolve(path, "node-b")
    assert (b.sharing.split_count, b.exclude_devices) == (2, [])
    other = resolve(path, "node-c")
    assert (other.sharing.split_count, other.exclude_devices) == (10, [])


def test_the_entry_wins_over_flags_and_the_component_file(tmp_path):
    component = tmp_path / "device-plugin.yaml"
    component.write_text("sharing:\n  split_count: 7\nexclude_devices: ['GPU-x']\n")
    nodes = write(tmp_path, FILE)
    config = resolve_config(str(component), {"node_name": "node-a", "node_config": nodes, "sharing.split_count": "9"},
                            {})
    assert config.sharing.split_count == 4
    assert config.exclude_devices == ["GPU-x", "1"]  # the entry's GPUs join those excluded cluster-wide
    # without the file the other sources apply as before
    plain = resolve_config(str(component), {"node_name": "node-a", "sharing.split_count": "9"}, {})
    assert plain.sharing.split_count == 9


def test_the_file_from_the_environment_and_the_nvidia_layout_file(tmp_path):
    nodes = write(tmp_path, FILE)
    assert resolve_config(None, {"node_name": "node-a"}, {"NODE_CONFIG_FILE": nodes}).sharing.split_count == 4
    options = tmp_path / "options.yaml"
    options.write_text(f"version: v1\nflags:\n  vgpu:\n    nodeConfigFile: {nodes}\n")
    assert resolve_config(None, {"node_name": "node-a"}, {}, str(options)).sharing.split_count == 4


def test_a_bad_entry_of_this_node_stops_the_plugin_with_one_line(tmp_path):
    path = write(tmp_path, "nodeConfig:\n  - name: node-a\n    memoryScaling: 2\n")
    with pytest.raises(ConfigError) as caught:
        resolve(path, "node-a")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"--node-config {path}: node node-a: memoryScaling: 2 is not supported")


def test_a_bad_entry_of_another_node_is_skipped_with_a_warning(tmp_path, caplog):
    path = write(tmp_path, """\
nodeConfig:
  - name: node-b
    splitCount: -3
  - splitCount: 2
  - just-a-string
  - name: node-a
    splitCount: 3
""")
    with caplog.at_level(logging.WARNING, logger="vgpu.deviceplugin.nodeconfig"):
        assert resolve(path, "node-a").sharing.split_count == 3
    warnings = [r.getMessage() for r in caplog.records]
    assert any("node node-b: splitCount: must be 1..1000, got -3" in w for w in warnings), warnings
    assert any("entry 1: name: expected the node's name" in w for w in warnings), warnings
    assert any("entry 2: expected a mapping" in w for w in warnings), warnings


@pytest.mark.parametrize("text, message", [
    ("nodeConfig:\n  - name: node-a\n  - name: node-a\n", "node node-a: 2 entries name this node"),
    ("nodes: []\n", "nodes: unknown key (expected nodeConfig)"),
    ("nodeConfig: {name: node-a}\n", "nodeConfig: expected a list of entries"),
    ("nodeConfig: [\n", "not valid YAML"),
])
def test_a_file_that_cannot_be_read_stops_the_plugin(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve(path, "node-a")


def test_a_missing_file_stops_the_plugin(tmp_path):
    with pytest.raises(ConfigError, match=r"^--node-config .*nodes\.yaml: "):
        resolve(str(tmp_path / "nodes.yaml"))


def test_hamis_top_level_key_and_an_empty_file(tmp_path):
    assert node_entry(write(tmp_path, "nodeconfig:\n  - name: n1\n    devicesplitcount: 5\n"), "n1").split_count == 5
    assert node_entry(write(tmp_path, ""), "n1") is None
    assert node_entry(write(tmp_path, "nodeConfig:\n"), "n1") is None


# ------------------------------------------------------------------------------------------ the real plugin

def test_the_running_plugin_advertises_what_its_entry_says(cluster, tmp_path):
    """`vgpu device-plugin --backend sim` with 4 GPUs and an entry for its node: split 3, GPU index 1 and GPU 3 by
    UUID left alone; kubelet gets 2 x 3 vgpu-number devices, none of an excluded GPU, and the inventory names only
    the two GPUs served."""
    gpus = SimBackend.from_spec("4xT4", node_name=NODE).devices()
    nodes = write(tmp_path, f"""\
nodeConfig:
  - name: other-node
    splitCount: nonsense
  - name: {NODE}
    splitCount: 3
    filterDevices:
      uuid: [{gpus[3].uuid}]
      index: [1]
""")
    cluster.start_plugin("4xT4", "--node-config", nodes, resources=(NUMBER,), mode="mib")
    served = {gpus[0].uuid, gpus[2].uuid}
    assert cluster.kubelet.wait_for(lambda: len(cluster.kubelet.devices(NUMBER)) == 6, 10), \
        (cluster.kubelet.devices(NUMBER), cluster.log())
    ids = cluster.kubelet.devices(NUMBER)
    assert {i for i in ids if not any(i.startswith(u) for u in served)} == set(), ids
    for uuid in served:
        assert sum(i.startswith(uuid) for i in ids) == 3
    assert sorted(cluster.wait_inventory()) == sorted(served)
    log = cluster.log()
    assert "event=node_config_applied" in log and "event=gpu_excluded" in log
    assert "event=node_config_entry_ignored" in log and "node other-node: splitCount" in log


def test_the_running_plugin_refuses_a_bad_entry_of_its_own_node(cluster, tmp_path):
    nodes = write(tmp_path, f"nodeConfig:\n  - name: {NODE}\n    memoryScaling: 1.5\n")
    cluster.start_plugin("2xT4", "--node-config", nodes, wait=False, resources=(NUMBER,), mode="mib")
    assert cluster.proc is not None
    deadline = time.monotonic() + 20
    while cluster.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cluster.proc.returncode == 2, cluster.log()
    assert f"node {NODE}: memoryScaling: 1.5 is not supported" in cluster.log()
    assert NUMBER not in cluster.kubelet.resources
