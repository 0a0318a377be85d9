"""The CDI registry of the kubelet stand-in (testbed/cdi.py), as a container runtime resolves DRA devices: qualified
names, spec validation, directory priority, and the order in which spec-level and device-level edits apply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vgpu.testbed.cdi import CDI_0_5_VERSIONS, CDIError, CDIRegistry, Mount, parse_qualified_name, required_version


def _spec(kind: str = "example.com/gpu", devices: list | None = None, **edits: object) -> dict:
    return {"cdiVersion": "0.6.0", "kind": kind, "containerEdits": edits,
            "devices": devices if devices is not None else [{"name": "gpu0", "containerEdits": {"env": ["GPU=0"]}}]}


def _write(directory: Path, name: str, spec: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(json.dumps(spec))
    return path


@pytest.mark.parametrize("device,parts", [
    ("example.com/gpu=gpu0", ("example.com", "gpu", "gpu0")),
    ("vendor/class=name:with.dots_and-dashes", ("vendor", "class", "name:with.dots_and-dashes")),
])
def test_qualified_names_parse(device, parts):
    assert parse_qualified_name(device) == parts


@pytest.mark.parametrize("device", ["gpu0", "example.com=gpu0", "/dev/nvidia0", "example.com/gpu=",
                                    "1vendor/gpu=a", "example.com/gpu-=a", "example.com/gpu=a/b", "example.com/gpu=-a"])
def test_bad_qualified_names_are_refused(device):
    with pytest.raises(CDIError):
        parse_qualified_name(device)


def test_spec_edits_apply_once_before_the_devices_then_each_device_in_order(tmp_path):
    devices = [{"name": "gpu0", "containerEdits": {"env": ["GPU=0", "ONLY0=yes"],
                                                  "mounts": [{"hostPath": "/h/0", "containerPath": "/dev/shm/x"}]}},
               {"name": "gpu1", "containerEdits": {"env": ["GPU=1"],
                                                  "mounts": [{"hostPath": "/h/1", "containerPath": "/dev/shm/x",
                                                              "options": ["ro"]}]}}]
    _write(tmp_path / "run", "gpu.json", _spec(devices=devices, env=["GPU=spec", "COMMON=1"],
                                               mounts=[{"hostPath": "/lib", "containerPath": "/usr/lib/x"}]))
    edits = CDIRegistry([tmp_path / "run"]).resolve(["example.com/gpu=gpu0", "example.com/gpu=gpu1"])
    assert edits.env == ["GPU=spec", "COMMON=1", "GPU=0", "ONLY0=yes", "GPU=1"]
    assert edits.apply_env({"GPU": "container", "OWN": "kept"}) == {"GPU": "1", "OWN": "kept", "COMMON": "1",
                                                                     "ONLY0": "yes"}
    # a mount on the same container path replaces the earlier one; mounts are ordered by depth
    assert edits.apply_mounts([Mount("/old", "/dev/shm/x"), Mount("/a", "/a")]) == [
        Mount("/a", "/a"), Mount("/lib", "/usr/lib/x"), Mount("/h/1", "/dev/shm/x", ("ro",))]


def test_yaml_specs_and_the_higher_priority_directory_win(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "gpu.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: example.com/gpu\ndevices:\n- name: gpu0\n  containerEdits:\n    env: [FROM=etc]\n"
        "- name: gpu9\n  containerEdits:\n    env: [FROM=etc]\n")
    _write(tmp_path / "run", "gpu.json", _spec(devices=[{"name": "gpu0", "containerEdits": {"env": ["FROM=run"]}}]))
    registry = CDIRegistry([tmp_path / "etc", tmp_path / "run"])
    assert registry.resolve(["example.com/gpu=gpu0"]).env == ["FROM=run"]
    assert registry.resolve(["example.com/gpu=gpu9"]).env == ["FROM=etc"]


def test_the_same_device_twice_in_one_directory_is_dropped(tmp_path):
    for name in ("a.json", "b.json"):
        _write(tmp_path, name, _spec())
    with pytest.raises(CDIError, match="conflicting device"):
        CDIRegistry([tmp_path]).resolve(["example.com/gpu=gpu0"])


@pytest.mark.parametrize("spec,error", [
    (_spec(env=["NOVALUE"]), "invalid environment variable"),
    (dict(_spec(), cdiVersion="9.9.9"), "unsupported cdiVersion"),
    (_spec(kind="example.com"), "invalid kind"),
    (_spec(devices=[]), "no devices"),
    (_spec(devices=[{"name": "gpu0"}]), "empty device edits"),
    (_spec(devices=[{"name": "gpu0", "containerEdits": {"env": ["A=1"]}}] * 2), "multiple devices"),
    (_spec(mounts=[{"hostPath": "/x"}]), "hostPath and containerPath are required"),
    (_spec(hooks=[{"hookName": "whenever", "path": "/bin/true"}]), "invalid hook name"),
    (_spec(deviceNodes=[{"type": "c"}]), "path is required"),
])
def test_an_invalid_spec_is_left_out_with_its_reason(tmp_path, spec, error):
    path = _write(tmp_path, "bad.json", spec)
    registry = CDIRegistry([tmp_path])
    with pytest.raises(CDIError) as err:
        registry.resolve(["example.com/gpu=gpu0"])
    assert "unresolvable CDI devices example.com/gpu=gpu0" in str(err.value)
    assert error in str(err.value) and error in registry.errors[str(path)]


def test_an_unqualified_id_is_refused_before_lookup(tmp_path):
    _write(tmp_path, "gpu.json", _spec())
    with pytest.raises(CDIError, match="unqualified device"):
        CDIRegistry([tmp_path]).resolve(["gpu0"])


def test_specs_are_read_again_on_each_resolution(tmp_path):
    registry = CDIRegistry([tmp_path])
    with pytest.raises(CDIError):
        registry.resolve(["example.com/gpu=gpu0"])
    _write(tmp_path, "gpu.json", _spec())
    assert registry.resolve(["example.com/gpu=gpu0"]).env == ["GPU=0"]


@pytest.mark.parametrize("spec,needed", [
    (_spec(), "0.3.0"),
    (_spec(mounts=[{"hostPath": "/x", "containerPath": "/y", "type": "bind"}]), "0.4.0"),
    (_spec(devices=[{"name": "0abc", "containerEdits": {"env": ["A=1"]}}]), "0.5.0"),
    (_spec(deviceNodes=[{"path": "/dev/x", "hostPath": "/dev/y"}]), "0.5.0"),
    (dict(_spec(), annotations={"a": "b"}), "0.6.0"),
    (_spec(kind="example.com/gpu.big"), "0.6.0"),
    (_spec(additionalGids=[5]), "0.7.0"),
    (_spec(netDevices=[{"hostInterfaceName": "eth1", "name": "net1"}]), "1.1.0"),
])
def test_the_version_a_spec_needs_follows_its_content(spec, needed):
    # specs-go/version.go requiredVersion (cncf-tags/container-device-interface)
    assert required_version(spec) == needed


def test_a_spec_older_than_its_content_needs_is_refused(tmp_path):
    digit = [{"name": "0abc", "containerEdits": {"env": ["A=1"]}}]
    _write(tmp_path, "old.json", dict(_spec(devices=digit), cdiVersion="0.4.0"))
    registry = CDIRegistry([tmp_path])
    with pytest.raises(CDIError, match=r"must be at least v0\.5\.0"):
        registry.resolve(["example.com/gpu=0abc"])
    _write(tmp_path, "old.json", dict(_spec(devices=digit), cdiVersion="0.5.0"))
    assert registry.resolve(["example.com/gpu=0abc"]).env == ["A=1"]


def test_a_runtime_with_cdi_0_5_knows_no_version_past_0_5_0(tmp_path):
    _write(tmp_path, "gpu.json", _spec())
    with pytest.raises(CDIError, match="unsupported cdiVersion"):
        CDIRegistry([tmp_path], known_versions=CDI_0_5_VERSIONS).resolve(["example.com/gpu=gpu0"])
    _write(tmp_path, "gpu.json", dict(_spec(), cdiVersion="0.5.0"))
    assert CDIRegistry([tmp_path], known_versions=CDI_0_5_VERSIONS).resolve(["example.com/gpu=gpu0"]).env == ["GPU=0"]
