"""Configuration and the simulated backend: memory-factor budget, YAML + flag precedence, --sim-gpus parsing."""

import pytest

from vgpu.deviceplugin.config import load_config, resolve_memory_factor
from vgpu.errors import ConfigError
from vgpu.node.backends.sim import SimBackend, parse_sim_spec

EIGHT_80GB = [81920] * 8


def test_auto_factor_keeps_memory_devices_within_budget():
    config = load_config(None, {"resource_mode": "devices", "gpu_memory_factor": "auto"})
    factor = resolve_memory_factor(config, EIGHT_80GB)
    assert factor == 11
    assert sum(m // factor for m in EIGHT_80GB) <= 60000 < sum(m // (factor - 1) for m in EIGHT_80GB)


def test_explicit_factor_too_small_is_refused_with_the_needed_value():
    config = load_config(None, {"resource_mode": "devices", "gpu_memory_factor": 4})
    with pytest.raises(ConfigError, match=r"gpu_memory_factor: 4 gives 163840 .* at least 11"):
        resolve_memory_factor(config, EIGHT_80GB)


def test_default_factor_is_one_and_an_overflowing_node_is_refused():
    """The contract's default 1 is never changed silently: a node over kubelet's budget must opt in."""
    devices = {"resource_mode": "devices"}
    assert resolve_memory_factor(load_config(None, devices), [15360, 15360]) == 1
    with pytest.raises(ConfigError, match=r"^sharing.gpu_memory_factor: 1 gives 81920 volcano.sh/vgpu-memory devices "
                                          r".* at least 2 .*--gpu-memory-factor=auto"):
        resolve_memory_factor(load_config(None, devices), [40960, 40960])
    shared = load_config(None, {**devices, "sharing.gpu_memory_factor": 2})
    assert resolve_memory_factor(shared, [40960, 40960]) == 2
    override = load_config(None, {**devices, "sharing.gpu_memory_factor": 2, "gpu_memory_factor": 4})
    assert resolve_memory_factor(override, [40960, 40960]) == 4  # the plugin's own override wins


def test_mib_mode_is_the_default_and_has_no_memory_factor():
    """The default resource mode counts vgpu-memory in MiB on any node size; a factor is a devices-mode option."""
    assert load_config(None).resource_mode == "mib"
    for overrides in ({"gpu_memory_factor": 4}, {"gpu_memory_factor": "auto"}, {"sharing.gpu_memory_factor": 2}):
        with pytest.raises(ConfigError, match="resource_mode mib counts vgpu-memory in MiB"):
            load_config(None, overrides)


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "dp.yaml"
    path.write_text("sharing:\n  split_count: 5\nresource_mode: devices\ngpu_memory_factor: auto\nhandshake: true\n"
                    "ignored_xids: [13]\n")
    config = load_config(str(path), {"sharing.split_count": 7, "hook_path": None})
    assert (config.sharing.split_count, config.gpu_memory_factor, config.handshake, config.ignored_xids) == (
        7, "auto", True, [13])
    assert config.hook_path == "/usr/local"
    assert config.sharing_for(3).gpu_memory_factor == 3 and config.sharing_for(3).split_count == 7


@pytest.mark.parametrize(
    "text,message",
    [
        ("gpu_memory_factor: 0\n", "gpu_memory_factor"),
        ("gpu_memory_factor: lots\n", "gpu_memory_factor"),
        ("sharing:\n  split_count: 0\n", "sharing.split_count"),
        ("split_count: 5\n", "split_count: Extra inputs"),  # the flat layout of old: it lives under sharing now
        ("core_policy: sometimes\n", "core_policy"),
        ("colour: blue\n", "colour"),
        ("- a list\n", "mapping"),
    ],
)
def test_bad_config_names_the_field(tmp_path, text, message):
    path = tmp_path / "dp.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(str(path))


def test_sim_spec_and_deterministic_uuids():
    assert parse_sim_spec("4xA100-40GB, 2xT4") == [("A100-40GB", 4), ("T4", 2)]
    one = SimBackend.from_spec("2xa100-40gb,t4", node_name="n1").devices()
    again = SimBackend.from_spec("2xA100-40GB,1xT4", node_name="n1").devices()
    other = SimBackend.from_spec("2xA100-40GB,1xT4", node_name="n2").devices()
    assert one == again and one[0].uuid != other[0].uuid
    assert [(g.name, g.memory_mib, g.minor) for g in one] == [
        ("NVIDIA A100-PCIE-40GB", 40960, 0), ("NVIDIA A100-PCIE-40GB", 40960, 1), ("Tesla T4", 15360, 2)]
    assert all(g.uuid.startswith("GPU-") and len(g.uuid) == 40 for g in one)
    for bad in ("3xB200", "x", "0xT4"):
        with pytest.raises(ConfigError, match="sim_gpus"):
            parse_sim_spec(bad)


def test_sim_faults_in_process_and_from_control_file(tmp_path):
    control = tmp_path / "ctl"
    sim = SimBackend.from_spec("2xT4", node_name="n", control_file=str(control), ignored_xids=[43])
    u0, u1 = (g.uuid for g in sim.devices())
    sim.inject_xid(0, 43)
    assert sim.poll_health(0.05) == []
    sim.inject_xid(0, 79)
    assert [(e.uuid, e.healthy) for e in sim.poll_health(0.5)] == [(u0, False)]
    control.write_text(f"lost {u1}\nrecover 0\nusage 1 100 5\n")
    events = sim.poll_health(0.5)
    assert [(e.uuid, e.healthy) for e in events] == [(u1, False), (u0, True)]
    assert u1 not in sim.usage()  # a lost GPU cannot be read
