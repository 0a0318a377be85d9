"""The NVIDIA device plugin's options (docs/deviceplugin-options.md): flag, environment, files, precedence, invalid
values, and their effect on the running plugin (Allocate response, init failure, health checks, node labels,
whole-GPU mode)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
from dp_helpers import NODE, RESOURCES, ROOT, gpu_container
from prometheus_client.parser import text_string_to_metric_families

from vgpu.deviceplugin.config import OPTIONS, resolve_config
from vgpu.deviceplugin.registrar import Registrar
from vgpu.deviceplugin.server import DeviceState
from vgpu.errors import ConfigError
from vgpu.node.backends import GPUInfo

BASE = {"node_name": "n1"}


def resolve(flags=None, env=None, config=None, config_file=None):
    """resolve_config with only these sources (a clean environment)."""
    return resolve_config(config, {**BASE, **(flags or {})}, env or {}, config_file)


def nvidia_file(tmp_path, text: str) -> str:
    path = tmp_path / "nvidia.yaml"
    path.write_text(text)
    return str(path)


# option field, flag text, env text, NVIDIA-layout file text, expected value
CASES = [
    ("fail_on_init_error", "false", "0", "flags:\n  failOnInitError: false\n", False),
    ("nvidia_driver_root", "/run/nvidia/driver", "/run/nvidia/driver",
     "flags:\n  nvidiaDriverRoot: /run/nvidia/driver\n", "/run/nvidia/driver"),
    ("pass_device_specs", "true", "TRUE", "flags:\n  plugin:\n    passDeviceSpecs: true\n", True),
    ("device_list_strategy", "volume-mounts,envvar", "volume-mounts,envvar",
     "flags:\n  plugin:\n    deviceListStrategy: [volume-mounts, envvar]\n", ["volume-mounts", "envvar"]),
    ("device_id_strategy", "index", "index", "flags:\n  plugin:\n    deviceIDStrategy: index\n", "index"),
    ("mig_strategy", "none", "none", "flags:\n  migStrategy: none\n", "none"),
    ("disable_healthchecks", "48,79", "48,79", "flags:\n  plugin:\n    disableHealthchecks: \"48,79\"\n", "48,79"),
    ("node_labels", "false", "false", "flags:\n  vgpu:\n    nodeLabels: false\n", False),
    ("hook_path", "/opt/hook", "/opt/hook", "flags:\n  vgpu:\n    hookPath: /opt/hook\n", "/opt/hook"),
    ("resource_mode", "devices", "devices", "flags:\n  vgpu:\n    resourceMode: devices\n", "devices"),
]
ENV = {o.field: o.env for o in OPTIONS}


@pytest.mark.parametrize("field, flag_text, env_text, file_text, expected", CASES, ids=[c[0] for c in CASES])
def test_each_option_from_flag_env_and_file(tmp_path, field, flag_text, env_text, file_text, expected):
    assert getattr(resolve({field: flag_text}), field) == expected
    assert getattr(resolve(env={ENV[field]: env_text}), field) == expected
    path = nvidia_file(tmp_path, "version: v1\n" + file_text)
    assert getattr(resolve(config_file=path), field) == expected
    assert getattr(resolve(env={"CONFIG_FILE": path}), field) == expected  # the file named by CONFIG_FILE
    if field != "mig_strategy":  # none is also the default (and the only value)
        assert getattr(resolve(), field) != expected


def test_the_memory_factor_from_flag_env_and_file_in_devices_mode(tmp_path):
    devices = {"resource_mode": "devices"}
    assert resolve({**devices, "gpu_memory_factor": "auto"}).gpu_memory_factor == "auto"
    assert resolve(devices, {"GPU_MEMORY_FACTOR": "8"}).gpu_memory_factor == 8
    path = nvidia_file(tmp_path, "version: v1\nflags:\n  vgpu:\n    gpuMemoryFactor: auto\n")
    assert resolve(devices, config_file=path).gpu_memory_factor == "auto"
    assert resolve(devices).gpu_memory_factor is None


def test_precedence_flag_env_file_component_file_default(tmp_path):
    component = tmp_path / "device-plugin.yaml"
    component.write_text("device_id_strategy: index\npass_device_specs: true\nsharing:\n  split_count: 4\n")
    options = nvidia_file(tmp_path, "version: v1\nflags:\n  plugin:\n    deviceIDStrategy: uuid\n"
                                    "    deviceListStrategy: volume-mounts\n  failOnInitError: false\n")
    env = {"DEVICE_LIST_STRATEGY": "cdi-annotations", "FAIL_ON_INIT_ERROR": "true", "CONFIG_FILE": options}
    config = resolve({"fail_on_init_error": "false"}, env, str(component))
    assert config.pass_device_specs is True  # only in --config
    assert config.sharing.split_count == 4  # only in --config
    assert config.device_id_strategy == "uuid"  # --config-file over --config
    assert config.device_list_strategy == ["cdi-annotations"]  # env over --config-file
    assert config.fail_on_init_error is False  # flag over env over file
    assert resolve().device_id_strategy == "uuid" and resolve().device_list_strategy == ["envvar"]


INVALID = [
    ({"device_id_strategy": "serial"}, {}, r"^--device-id-strategy: unknown value 'serial' \(expected uuid or index\)"),
    ({}, {"DEVICE_ID_STRATEGY": "serial"}, r"^DEVICE_ID_STRATEGY: unknown value 'serial'"),
    ({"device_list_strategy": "envvar,tarball"}, {}, r"^--device-list-strategy: unknown value 'tarball'"),
    ({}, {"DEVICE_LIST_STRATEGY": " , "}, r"^DEVICE_LIST_STRATEGY: empty"),
    ({"mig_strategy": "single"}, {}, r"^--mig-strategy: 'single' is not supported yet"),
    ({}, {"MIG_STRATEGY": "mixed"}, r"^MIG_STRATEGY: 'mixed' is not supported yet"),
    ({}, {"MIG_STRATEGY": "sometimes"}, r"^MIG_STRATEGY: unknown value 'sometimes' \(expected none\)"),
    ({"fail_on_init_error": "maybe"}, {}, r"^--fail-on-init-error: not a boolean: 'maybe'"),
    ({}, {"PASS_DEVICE_SPECS": "yes please"}, r"^PASS_DEVICE_SPECS: not a boolean"),
    ({}, {"DP_DISABLE_HEALTHCHECKS": "all,gpu"}, r"^DP_DISABLE_HEALTHCHECKS: unknown value 'gpu'"),
    ({"nvidia_driver_root": "run/nvidia"}, {}, r"^--nvidia-driver-root: must be an absolute path"),
    ({"node_labels": "2"}, {}, r"^--node-labels: not a boolean"),
    ({"gpu_memory_factor": "0"}, {}, r"^--gpu-memory-factor: must be 1..1024 or auto"),
    ({}, {"GPU_MEMORY_FACTOR": "lots"}, r"^GPU_MEMORY_FACTOR: not a number or auto"),
    ({"gpu_memory_factor": "4"}, {}, r"resource_mode mib counts vgpu-memory in MiB"),
    ({}, {"RESOURCE_MODE": "units"}, r"^RESOURCE_MODE: unknown value 'units' \(expected mib or devices\)"),
    ({"backend": "cuda"}, {}, r"^--backend: unknown value 'cuda'"),
    ({"backend": "nvml", "sim_gpus": "1xT4"}, {}, r"^--sim-gpus: only meaningful with --backend sim"),
    ({"backend": "sim"}, {}, r"^--sim-gpus: required with --backend sim"),
    ({"advertise_nvidia_gpu": "true"}, {}, r"^--advertise-nvidia-gpu: needs sharing.hami_names: all"),
    ({"node_name": ""}, {}, r"^--node-name: required"),
    ({}, {"CONFIG_FILE": "/nonexistent/options.yaml"}, r"^--config-file /nonexistent/options.yaml: No such file"),
]


@pytest.mark.parametrize("flags, env, message", INVALID, ids=[m.split(":")[0].strip("^\\") for _, _, m in INVALID])
def test_invalid_values_name_the_option(flags, env, message):
    with pytest.raises(ConfigError, match=message):
        resolve(flags, env)


@pytest.mark.parametrize(
    "text, message",
    [
        ("version: v2\n", r"version: unknown value 'v2'"),
        ("version: v1\nsharing:\n  timeSlicing:\n    resources: []\n", r"sharing: time-slicing and MPS"),
        ("version: v1\nresources:\n  gpus: []\n", r"resources: resource renaming is not supported"),
        ("version: v1\nflags:\n  plugin:\n    deviceIdStrategy: uuid\n",
         r"flags.plugin.deviceIdStrategy in .*: unknown key"),
        ("version: v1\nflags:\n  plugin:\n    deviceIDStrategy: serial\n",
         r"^flags.plugin.deviceIDStrategy in .*: unknown value 'serial'"),
        ("version: v1\nflags:\n  migStrategy: mixed\n", r"^flags.migStrategy in .*: 'mixed' is not supported"),
        ("- a list\n", r"expected a mapping"),
        ("flags: [\n", r"not valid YAML"),
    ],
)
def test_bad_config_file_names_the_file_and_the_key(tmp_path, text, message):
    path = nvidia_file(tmp_path, text)
    with pytest.raises(ConfigError, match=message):
        resolve(config_file=path)


def test_nvidia_plugin_file_keys_without_meaning_here_are_accepted(tmp_path):
    path = nvidia_file(tmp_path, "version: v1\nflags:\n  migStrategy: none\n  gdsEnabled: false\n"
                                 "  plugin:\n    passDeviceSpecs: true\n    cdiAnnotationPrefix: cdi.k8s.io/\n")
    assert resolve(config_file=path).pass_device_specs is True


def test_disable_healthchecks_values():
    assert resolve().healthchecks() == (False, False, frozenset())
    assert resolve(env={"DP_DISABLE_HEALTHCHECKS": "all"}).healthchecks()[0] is True
    assert resolve(env={"DP_DISABLE_HEALTHCHECKS": "xids"}).healthchecks()[1] is True
    config = resolve(env={"DP_DISABLE_HEALTHCHECKS": "48, 79"})
    assert config.effective_ignored_xids() == sorted({13, 31, 43, 45, 68, 109, 48, 79})


def _run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "vgpu.cli", "device-plugin", *args], check=False, cwd=ROOT,
                          env=full_env, capture_output=True, text=True, timeout=timeout)


def test_help_lists_options_with_defaults_and_env_names():
    text = " ".join(_run_cli("--help").stdout.split())
    for option in OPTIONS:
        assert option.flag in text
        if option.env:
            assert f"env {option.env}" in text
    for needle in ("default true; env FAIL_ON_INIT_ERROR", "default envvar; env DEVICE_LIST_STRATEGY",
                   "default uuid; env DEVICE_ID_STRATEGY", "default none; env MIG_STRATEGY", "env CONFIG_FILE",
                   "env DP_DISABLE_HEALTHCHECKS", "default /; env NVIDIA_DRIVER_ROOT",
                   "default false; env PASS_DEVICE_SPECS", "Precedence: flag > environment > --config-file"):
        assert needle in text, needle


def test_invalid_value_is_one_line_and_exit_2():
    result = _run_cli("--node-name", "n", "--backend", "null", env={"DEVICE_ID_STRATEGY": "serial"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "vgpu device-plugin: DEVICE_ID_STRATEGY: unknown value 'serial' (expected uuid or index)"]


def test_fail_on_init_error_true_exits(tmp_path):
    """NVML cannot start: no libnvidia-ml.so.1 under the driver root."""
    result = _run_cli("--node-name", "n", "--backend", "nvml", "--nvidia-driver-root", str(tmp_path),
                      "--metrics-listen", "")
    assert result.returncode == 1, result.stderr
    (line,) = [x for x in result.stderr.strip().splitlines() if x.startswith("vgpu device-plugin:")]
    assert line.startswith("vgpu device-plugin: GPU backend nvml failed to start: NVML: libnvidia-ml.so.1 not found "
                           f"under driver root {tmp_path}")


def test_fail_on_init_error_false_stays_up_advertising_nothing(cluster, tmp_path):
    cluster.start_plugin("1xT4", wait=False)  # for the arguments only
    cluster.proc.kill()
    cluster.proc.wait(10)
    args = [a for a in cluster.plugin_args]
    i = args.index("--backend")
    args[i + 1:i + 4] = ["nvml"]  # drop --sim-gpus SPEC as well
    cluster.plugin_args = [*args, "--nvidia-driver-root", str(tmp_path / "driver")]
    cluster.plugin_env = {"FAIL_ON_INIT_ERROR": "false"}
    cluster._spawn(wait=False)
    deadline = time.monotonic() + 20
    while True:
        try:
            text = httpx.get(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=2).text
            break
        except httpx.HTTPError:
            assert time.monotonic() < deadline, cluster.log()
            assert cluster.proc.poll() is None, cluster.log()
            time.sleep(0.1)
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["vgpu_device_plugin_backend_up"] == 0
    assert "event=backend_init_failed backend=nvml" in cluster.log()
    assert "staying up and advertising nothing" in cluster.log()
    assert cluster.proc.poll() is None
    assert not cluster.kubelet.resources  # nothing registered
    assert "volcano.sh/node-vgpu-register" not in cluster.node_annotations()


def test_mig_enabled_card_is_refused(cluster):
    cluster.start_plugin("1xT4,1xA100-40GB+mig", "--gpu-memory-factor", "auto", wait=False)
    assert cluster.proc.wait(30) == 2
    log = cluster.log()
    assert "vgpu device-plugin: --mig-strategy: none: GPU GPU-" in log
    assert "(index 1) has MIG mode enabled" in log and "nvidia-smi -i 1 -mig 0" in log


def test_allocate_with_volume_mounts_index_ids_and_device_specs(cluster, tmp_path):
    cluster.start_plugin("2xT4", "--device-list-strategy", "volume-mounts", "--device-id-strategy=index",
                         "--pass-device-specs", "--nvidia-driver-root", "/run/nvidia/driver")
    _, b = cluster.wait_inventory()
    pod = cluster.create_pod("specs", [gpu_container("c", 1, 1000, 10)], f"{b},NVIDIA,1000,10:")
    (c,) = cluster.kubelet.admit(pod)
    response = c.responses["volcano.sh/vgpu-number"]
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    assert response.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    mounts = [(m.container_path, m.host_path, m.read_only) for m in response.mounts]
    assert ("/var/run/nvidia-container-devices/1", "/dev/null", True) in mounts
    assert mounts[0][0] == "/usr/local/vgpu/libvgpu.so"
    assert [(d.container_path, d.host_path, d.permissions) for d in response.devices] == [
        ("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", "/run/nvidia/driver/dev/nvidia-uvm", "rw"),
        ("/dev/nvidia-uvm-tools", "/run/nvidia/driver/dev/nvidia-uvm-tools", "rw"),
        ("/dev/nvidia1", "/run/nvidia/driver/dev/nvidia1", "rw"),
    ]
    assert not response.annotations


def test_allocate_with_cdi_annotations_from_the_config_file_named_in_the_environment(cluster, tmp_path):
    options = tmp_path / "options.yaml"
    options.write_text("version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-annotations\n")
    cluster.start_plugin("2xT4", env={"CONFIG_FILE": str(options)})
    a, b = cluster.wait_inventory()
    pod = cluster.create_pod("cdi", [gpu_container("c", 2, 1000, 10)], f"{a},NVIDIA,1000,10:{b},NVIDIA,1000,10:")
    (c,) = cluster.kubelet.admit(pod)
    response = c.responses["volcano.sh/vgpu-number"]
    assert dict(response.annotations) == {"cdi.k8s.io/vgpu-sharing": f"nvidia.com/gpu={a},nvidia.com/gpu={b}"}
    assert "NVIDIA_VISIBLE_DEVICES" not in response.envs  # as NVIDIA's plugin: the runtime reads CDI
    assert response.envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "1000m"
    assert not response.devices  # pass-device-specs is off by default


def test_healthchecks_disabled_for_xids_only(cluster):
    cluster.start_plugin("2xT4", env={"DP_DISABLE_HEALTHCHECKS": "xids"})
    a, b = cluster.wait_inventory()
    with cluster.control.open("a") as control:
        control.write("xid 0 79\nlost 1\n")  # processed in order: the Xid before the lost GPU
    number = cluster.kubelet.resources["volcano.sh/vgpu-number"]
    assert cluster.kubelet.wait_for(lambda: number.devices[f"{b}-0"] == "Unhealthy", 5), cluster.log()
    assert all(number.devices[f"{a}-{i}"] == "Healthy" for i in range(10))
    assert "event=health_ignored uuid=" + a in cluster.log()


def test_node_labels_written_and_patched_only_on_change(cluster):
    cluster.start_plugin("2xT4")
    cluster.wait_inventory()
    deadline = time.monotonic() + 10
    while "nvidia.com/gpu.product" not in cluster.node_labels():
        assert time.monotonic() < deadline, cluster.log()
        time.sleep(0.05)
    labels = cluster.node_labels()
    assert {k: labels[k] for k in ("nvidia.com/gpu.product", "nvidia.com/gpu.memory", "nvidia.com/gpu.count",
                                   "volcano.sh/vgpu.mode")} == {
        "nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.memory": "15360", "nvidia.com/gpu.count": "2",
        "volcano.sh/vgpu.mode": "hami-core"}
    # in-process registrar against the same API server: no patch when nothing changed, one when a label drifted
    state = DeviceState([GPUInfo("GPU-x", "Tesla T4", 15360, 0), GPUInfo("GPU-y", "Tesla T4", 15360, 1)])
    registrar = Registrar(cluster.api, NODE, state, split=10, factor=1, labels=True)
    cluster.proc.terminate()
    cluster.proc.wait(10)
    assert registrar.sync() is True  # different UUIDs: the inventory annotation changes
    assert registrar.sync() is False
    cluster.core.patch_node(NODE, {"metadata": {"labels": {"nvidia.com/gpu.count": "7"}}})
    assert registrar.sync() is True
    assert cluster.node_labels()["nvidia.com/gpu.count"] == "2"
    assert registrar.sync() is False


def test_node_labels_off(cluster):
    cluster.start_plugin("1xT4", "--node-labels=false")
    cluster.wait_inventory()
    assert not any(k.startswith("nvidia.com/gpu.") for k in cluster.node_labels())


def test_whole_gpu_mode_advertises_nvidia_gpu_and_grants_whole_cards(cluster, tmp_path):
    config = tmp_path / "device-plugin.yaml"
    config.write_text("sharing:\n  hami_names: all\n")
    cluster.start_plugin("2xT4", "--config", str(config), "--advertise-nvidia-gpu",
                         resources=(*RESOURCES, "nvidia.com/gpu"))
    a, b = cluster.wait_inventory()
    assert set(cluster.kubelet.devices("nvidia.com/gpu")) == {a, b}  # one device per GPU, ID = UUID
    assert cluster.kubelet.resources["nvidia.com/gpu"].endpoint == "nvidia-gpu.sock"
    # what the scheduler writes for `nvidia.com/gpu: 1` with aliases on: the whole card, cores 100
    pod = cluster.create_pod("whole", [{"name": "c", "image": "cuda", "resources": {"limits": {
        "nvidia.com/gpu": "1"}}}], f"{b},NVIDIA,15360,100:")
    (c,) = cluster.kubelet.admit(pod)
    response = c.responses["nvidia.com/gpu"]
    assert c.devices["nvidia.com/gpu"] == [b]  # GetPreferredAllocation steered kubelet to the chosen card
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == b
    assert response.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "15360m"
    assert response.envs["CUDA_DEVICE_SM_LIMIT"] == "100"
    assert cluster.pod("whole")["metadata"]["annotations"]["volcano.sh/bind-phase"] == "success"
