"""The device-plugin DaemonSets against the contract: kubelet's socket directories, the $HOOK_PATH/vgpu layout
(host path = container path = --hook-path + /vgpu, the per-container lock directories under it), node name from
the downward API, the grant key and scheduler names shared with the extender, opt-in node label, GPU taint
toleration, no privilege, metrics on :9394."""

import pytest
import yaml
from deploy_helpers import find, flag, mounted_file

DAEMONSETS = {"vgpu-device-plugin": ("true", "nvml"), "vgpu-device-plugin-sim": ("sim", "sim")}
NODE_LABEL = "vgpu-sharing/device-plugin"
KUBELET_DIR = "/var/lib/kubelet/device-plugins"
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
HOOK_PATH = "/usr/local"  # CONTRACT.md default


def pod(name: str) -> dict:
    """The pod template spec of a DaemonSet."""
    return find("DaemonSet", name)["spec"]["template"]["spec"]


def plugin(name: str) -> dict:
    """The device-plugin container."""
    (c,) = pod(name)["containers"]
    return c


def host_path_mounts(name: str) -> dict[str, tuple[str, str]]:
    """mountPath -> (hostPath, type) of the container's hostPath volumes."""
    volumes = {v["name"]: v for v in pod(name)["volumes"]}
    out = {}
    for mount in plugin(name)["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "hostPath" in volume:
            out[mount["mountPath"]] = (volume["hostPath"]["path"], volume["hostPath"].get("type", ""))
    return out


@pytest.mark.parametrize("name", sorted(DAEMONSETS))
def test_host_paths_are_the_contracts(name):
    mounts = host_path_mounts(name)
    hook = flag(plugin(name)["command"], "hook-path")
    assert hook == HOOK_PATH
    assert mounts == {
        KUBELET_DIR: (KUBELET_DIR, "Directory"),
        POD_RESOURCES_DIR: (POD_RESOURCES_DIR, "DirectoryOrCreate"),
        f"{hook}/vgpu": (f"{hook}/vgpu", "DirectoryOrCreate"),
    }
    assert not flag(plugin(name)["command"], "pod-resources-socket")  # the default: beside the kubelet dir
    # each container's lock directory is made by the plugin under the hook path, never shared between containers
    assert flag(plugin(name)["command"], "lock-dir") == f"{hook}/vgpu/locks"
    for mount in plugin(name)["volumeMounts"]:
        if mount["mountPath"] in mounts:
            assert mount.get("readOnly", False) == (mount["mountPath"] == POD_RESOURCES_DIR)


@pytest.mark.parametrize("name", sorted(DAEMONSETS))
def test_node_name_from_the_downward_api(name):
    c = plugin(name)
    assert c["command"][:2] == ["vgpu", "device-plugin"]
    assert flag(c["command"], "node-name") == "$(NODE_NAME)"
    (env,) = [e for e in c["env"] if e["name"] == "NODE_NAME"]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


@pytest.mark.parametrize("name", sorted(DAEMONSETS))
def test_backend_and_opt_in_node_label(name):
    value, backend = DAEMONSETS[name]
    assert pod(name)["nodeSelector"] == {NODE_LABEL: value}
    assert flag(plugin(name)["command"], "backend") == backend
    if backend == "sim":
        assert flag(plugin(name)["command"], "sim-gpus")


def test_real_and_simulated_plugins_never_share_a_node():
    values = [pod(name)["nodeSelector"][NODE_LABEL] for name in DAEMONSETS]
    assert len(set(values)) == len(values)


@pytest.mark.parametrize("name", sorted(DAEMONSETS))
def test_tolerates_the_gpu_taint_and_is_node_critical(name):
    spec = pod(name)
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["priorityClassName"] == "system-node-critical"


def test_privileged_only_to_mount_each_containers_storage():
    """The real DaemonSet mounts a tmpfs per container where kubelet sees it: privileged, Bidirectional propagation
    on the $HOOK_PATH volume alone, no host network; the host's PID namespace, since NVML names GPU processes by
    their host PIDs and the memory guard reads their cgroups (the simulated DaemonSet has no NVML: not there)."""
    container = plugin("vgpu-device-plugin")
    assert container["securityContext"].get("privileged") is True
    assert "--container-storage=tmpfs" in container["command"]
    propagated = {m["name"]: m["mountPropagation"] for m in container["volumeMounts"] if "mountPropagation" in m}
    assert propagated == {"hook-path": "Bidirectional"}
    assert not pod("vgpu-device-plugin").get("hostNetwork", False) and pod("vgpu-device-plugin")["hostPID"] is True
    assert not pod("vgpu-device-plugin-sim").get("hostPID")


def test_the_simulated_plugin_is_not_privileged():
    """The sim DaemonSet (no GPUs, for trying the stack) keeps plain directories and no capabilities."""
    ctx = plugin("vgpu-device-plugin-sim")["securityContext"]
    assert not ctx.get("privileged", False)
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert "--container-storage=tmpfs" not in plugin("vgpu-device-plugin-sim")["command"]


def test_nvml_plugin_sees_the_gpus_through_the_container_toolkit():
    env = {e["name"]: e.get("value") for e in plugin("vgpu-device-plugin")["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    sim_env = {e["name"] for e in plugin("vgpu-device-plugin-sim")["env"]}
    assert "NVIDIA_VISIBLE_DEVICES" not in sim_env


@pytest.mark.parametrize("name", sorted(DAEMONSETS))
def test_metrics_on_9394_reachable_on_the_node(name):
    c = plugin(name)
    assert flag(c["command"], "metrics-listen") == ":9394"
    assert c["ports"] == [{"name": "metrics", "containerPort": 9394, "hostPort": 9394}]


@pytest.mark.parametrize("name", sorted(DAEMONSETS))
def test_checks_the_extenders_signature_for_the_profiles_pods(name):
    env = {e["name"]: e.get("value") for e in plugin(name)["env"]}
    # the public key only: a node cannot sign
    assert mounted_file("DaemonSet", name, "device-plugin", env["GRANT_KEY_FILE"]) == (
        "ConfigMap", "vgpu-grant-public-keys", "keys.pem")
    config = yaml.safe_load(find("ConfigMap", "vgpu-scheduler-config")["data"]["config.yaml"])
    assert env["SCHEDULER_NAMES"].split(",") == [p["schedulerName"] for p in config["profiles"]]
    assert "ACCEPT_UNSIGNED_GRANTS" not in env and "DISABLE_CONTROL_NAMESPACES" not in env  # opt-ins, off
