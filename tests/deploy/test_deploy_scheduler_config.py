"""The KubeSchedulerConfiguration in deploy/scheduler/configmap.yaml (the one `vgpu demo` also reads) and
its wiring into the scheduler Deployment: profile, extender entry, managed resources equal to the code's
defaults, and the sharing configuration both components mount."""

import re

import pytest
import yaml
from deploy_helpers import NAMESPACE, find, flag, mounted_file

from vgpu.resources import HAMI_NAMES, QUOTA_CORES, QUOTA_MEMORY, SCHEDULER_NAME, ResourceNames, SharingConfig

# Field names of kubescheduler.config.k8s.io/v1 (k8s.io/kube-scheduler/config/v1/types.go); kube-scheduler
# decodes strictly, so a misspelt key (say `enableHttps`, the removed Policy API's spelling) stops it.
TOP_KEYS = {
    "apiVersion", "kind", "parallelism", "leaderElection", "clientConnection", "healthzBindAddress",
    "metricsBindAddress", "enableProfiling", "enableContentionProfiling", "percentageOfNodesToScore",
    "podInitialBackoffSeconds", "podMaxBackoffSeconds", "profiles", "extenders", "delayCacheUntilActive",
}
PROFILE_KEYS = {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"}
EXTENDER_KEYS = {
    "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
    "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable",
}
LEADER_KEYS = {
    "leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock", "resourceName",
    "resourceNamespace",
}
DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|ms|s|m|h))+$")


def scheduler_config() -> dict:
    """The parsed KubeSchedulerConfiguration."""
    cm = find("ConfigMap", "vgpu-scheduler-config")
    assert set(cm["data"]) == {"config.yaml"}
    return yaml.safe_load(cm["data"]["config.yaml"])


def container(name: str) -> dict:
    """A container of the scheduler Deployment."""
    pod = find("Deployment", "vgpu-scheduler")["spec"]["template"]["spec"]
    (hit,) = [c for c in pod["containers"] if c["name"] == name]
    return hit


def test_is_a_v1_kube_scheduler_configuration_with_known_keys_only():
    cfg = scheduler_config()
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    assert set(cfg) <= TOP_KEYS
    assert set(cfg["leaderElection"]) <= LEADER_KEYS
    for profile in cfg["profiles"]:
        assert set(profile) <= PROFILE_KEYS
    for extender in cfg["extenders"]:
        assert set(extender) <= EXTENDER_KEYS
        for resource in extender["managedResources"]:
            assert set(resource) == {"name", "ignoredByScheduler"}


def test_single_profile_vgpu_scheduler_scoring_all_nodes():
    (profile,) = scheduler_config()["profiles"]
    assert profile["schedulerName"] == SCHEDULER_NAME == "vgpu-scheduler"
    assert profile["percentageOfNodesToScore"] == 100


def test_extender_entry():
    (ext,) = scheduler_config()["extenders"]
    assert ext["urlPrefix"] == "http://127.0.0.1:8888"
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"]) == ("filter", "prioritize", "bind")
    assert ext["enableHTTPS"] is False
    assert ext["nodeCacheCapable"] is True
    assert ext.get("ignorable", False) is False
    assert isinstance(ext["weight"], int) and ext["weight"] > 0
    assert DURATION.match(ext["httpTimeout"]), ext["httpTimeout"]


def test_managed_resources_are_the_codes_default_names():
    (ext,) = scheduler_config()["extenders"]
    names = [r["name"] for r in ext["managedResources"]]
    assert names == [*ResourceNames().all(), HAMI_NAMES.memory, HAMI_NAMES.memory_percentage, HAMI_NAMES.cores,
                     QUOTA_MEMORY, QUOTA_CORES]
    assert {"volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores"} <= set(names)
    assert all(r["ignoredByScheduler"] is True for r in ext["managedResources"])


def test_kube_scheduler_lease_is_its_own():
    le = scheduler_config()["leaderElection"]
    assert le["leaderElect"] is True
    assert le["resourceLock"] == "leases"
    # Not the default kube-scheduler's Lease, nor (by convention) the extender's.
    assert le["resourceName"] not in ("kube-scheduler", SCHEDULER_NAME)
    assert le["resourceNamespace"] == NAMESPACE


def test_kube_scheduler_container_reads_the_configmap():
    ks = container("kube-scheduler")
    assert ks["image"].startswith("registry.k8s.io/kube-scheduler:v1.")
    path = flag(ks["command"], "config")
    directory, key = path.rsplit("/", 1)
    (mount,) = [m for m in ks["volumeMounts"] if m["mountPath"] == directory]
    pod = find("Deployment", "vgpu-scheduler")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == "vgpu-scheduler-config"
    assert key in find("ConfigMap", "vgpu-scheduler-config")["data"]


def test_extender_sidecar_serves_the_url_kube_scheduler_calls():
    ext = container("extender")
    assert ext["command"][:2] == ["vgpu", "scheduler"]
    (entry,) = scheduler_config()["extenders"]
    host_port = entry["urlPrefix"].removeprefix("http://")
    assert flag(ext["command"], "listen") == host_port
    assert flag(ext["command"], "metrics-listen") == ":9395"
    assert [p["containerPort"] for p in ext["ports"]] == [9395]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        command = " ".join(ext[probe]["exec"]["command"])
        assert f"http://{host_port}{path}" in command


def test_extender_signs_places_only_the_profiles_pods_and_follows_kube_schedulers_lease():
    command = container("extender")["command"]
    assert mounted_file("Deployment", "vgpu-scheduler", "extender", flag(command, "grant-key-file")) == (
        "Secret", "vgpu-grant-key", "key")
    assert flag(command, "scheduler-names").split(",") == [p["schedulerName"] for p in scheduler_config()["profiles"]]
    election = scheduler_config()["leaderElection"]
    assert flag(command, "follow-lease") == f"{election['resourceNamespace']}/{election['resourceName']}"
    assert "--leader-elect" not in command and flag(command, "leader-identity") is None  # the pod's hostname
    assert flag(command, "listen").startswith("127.0.0.1:")  # no TLS: loopback only
    assert not any(a.startswith("--tls-") for a in command)


COMPONENT_FILES = [
    ("Deployment", "vgpu-scheduler", "extender", "scheduler.yaml"),
    ("DaemonSet", "vgpu-device-plugin", "device-plugin", "device-plugin.yaml"),
    ("DaemonSet", "vgpu-device-plugin-sim", "device-plugin", "device-plugin.yaml"),
]


def shipped_file(kind: str, name: str, container_name: str, tmp_path) -> tuple[str, str]:
    """(ConfigMap key, path of a copy on disk) of the file a component's --config points at."""
    pod = find(kind, name)["spec"]["template"]["spec"]
    (c,) = [c for c in pod["containers"] if c["name"] == container_name]
    directory, key = flag(c["command"], "config").rsplit("/", 1)
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == directory]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == "vgpu-sharing-config"
    data = find("ConfigMap", "vgpu-sharing-config")["data"]
    assert key in data
    path = tmp_path / key
    path.write_text(data[key])
    return key, str(path)


@pytest.mark.parametrize("kind, name, container_name, key", COMPONENT_FILES)
def test_each_component_mounts_its_own_file(kind, name, container_name, key, tmp_path):
    assert shipped_file(kind, name, container_name, tmp_path)[0] == key


def test_both_components_load_their_file_with_the_same_sharing_section(tmp_path):
    """Each shipped file through the component's real loader; the `sharing` sections are equal."""
    from vgpu.deviceplugin.config import load_config as load_plugin_config
    from vgpu.scheduler.config import load_config as load_scheduler_config

    sections = []
    for kind, name, container_name, key in COMPONENT_FILES:
        (tmp_path / name).mkdir()
        _, path = shipped_file(kind, name, container_name, tmp_path / name)
        if key == "scheduler.yaml":
            sections.append(load_scheduler_config(path, {}).sharing)
        else:
            sections.append(load_plugin_config(path).sharing)
    assert sections[0] == sections[1] == sections[2]
    assert sections[0] == SharingConfig()  # the shipped files spell out the defaults


def test_sharing_config_names_the_managed_resources(tmp_path):
    from vgpu.scheduler.config import load_config as load_scheduler_config

    _, path = shipped_file(*COMPONENT_FILES[0][:3], tmp_path)
    cfg = load_scheduler_config(path, {}).sharing
    (ext,) = scheduler_config()["extenders"]
    managed = {r["name"] for r in ext["managedResources"]}
    assert all(r["ignoredByScheduler"] for r in ext["managedResources"])
    # ours, HAMi's share names (read by default) and the webhook's quota totals; nvidia.com/gpu alone is a whole GPU
    # of NVIDIA's device plugin under hami_names: shared, which NodeResourcesFit must keep counting
    assert cfg.hami_mode() == "shared"
    assert managed == {*cfg.resources.all(), HAMI_NAMES.memory, HAMI_NAMES.memory_percentage, HAMI_NAMES.cores,
                       QUOTA_MEMORY, QUOTA_CORES}


def test_the_daemonsets_count_memory_in_mib():
    """New installs use the plugin's default resource mode: no memory factor on any DaemonSet, and the shared
    configuration says resource_mode mib with factor 1, so vgpu-memory is MiB on every node size."""
    from vgpu.deviceplugin.config import load_config as load_plugin_config

    for name in ("vgpu-device-plugin", "vgpu-device-plugin-sim"):
        (c,) = find("DaemonSet", name)["spec"]["template"]["spec"]["containers"]
        assert not any("gpu-memory-factor" in arg for arg in c["command"]), name
        assert not any(e.get("name") == "GPU_MEMORY_FACTOR" for e in c.get("env") or ()), name
    data = find("ConfigMap", "vgpu-sharing-config")["data"]
    config = load_plugin_config(None, yaml.safe_load(data["device-plugin.yaml"]))
    assert config.resource_mode == "mib" and config.sharing.gpu_memory_factor == 1
