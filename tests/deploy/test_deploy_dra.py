"""deploy/dra/, DRA mode: its manifests against the schemas of the Kubernetes releases that have resource.k8s.io/v1
(1.34, the first, and the newest kubernetes-validate ships), the DeviceClasses' CEL selectors evaluated on devices
shaped as our driver publishes them, the DaemonSet against the plugin's own option parsing and derived paths, the
RBAC against the calls of the plugin, the ResourceSlice admission policy evaluated with CEL, the scheduler
component against the base KubeSchedulerConfiguration, and the examples against the classes they name.

The DaemonSet's container also runs (simulated GPUs) against the API-server stand-in with a token of its own: it
publishes its slice, republishes it after a GPU fault, deletes a stale slice of its node, registers and prepares
and unprepares a claim over gRPC on its sockets. Every call it made must be granted, every file it wrote must be
on one of its host paths, and its slice writes are replayed through the admission policy.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import kubernetes_validate
import orjson
import pytest
import yaml
from admission_helpers import TENANT, Policy, Review, User, service_account
from capabilities import tool
from cel_expr_python import cel
from cluster_scenario import wait_for
from deploy_helpers import DEPLOY, DRA, NAMESPACE, assert_valid_kubernetes, find, flag, load_manifests, manifest_files
from kubernetes import client as k8s
from test_deploy_scheduler_config import EXTENDER_KEYS, PROFILE_KEYS, TOP_KEYS

from vgpu.cli import build_parser
from vgpu.dra import (
    CAPACITY_CORES,
    CAPACITY_MEMORY,
    CDI_KIND,
    DEVICE_CLASS,
    DRIVER,
    EXTENDED_DEVICE_CLASS,
    cores_of,
    device_name,
    mib_of,
    slice_devices,
)
from vgpu.draplugin.config import DRAConfig
from vgpu.draplugin.slices import slice_name, slice_spec
from vgpu.kube.client import make_api_client
from vgpu.node.backends import GPUInfo
from vgpu.proto.dra.v1 import api_pb2 as dra
from vgpu.proto.dra.v1 import api_pb2_grpc as dra_grpc
from vgpu.proto.pluginregistration.v1 import api_pb2 as reg
from vgpu.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from vgpu.resources import ResourceNames
from vgpu.testbed.apiserver import ApiServerStandIn, RecordedRequest

FIRST_VERSION = "1.34"  # resource.k8s.io/v1 is GA from Kubernetes 1.34
NEWEST_VERSION = max(kubernetes_validate.utils.all_versions(), key=lambda v: tuple(int(p) for p in v.split(".")))
DRA_VERSIONS = (FIRST_VERSION, NEWEST_VERSION.rsplit(".", 1)[0])
NODE_LABEL = "vgpu-sharing/device-plugin"
DRA_NODE_VALUE = "dra"
PLUGIN = "vgpu-dra-plugin"
HOOK_PATH = "/usr/local"
# The calls of `vgpu dra-plugin` (ResourceSlice publishing, claim reading for Prepare, its node): (API group,
# resource, verb); deploy/dra/rbac.yaml grants exactly these.
PLUGIN_CALLS = {
    *(("resource.k8s.io", "resourceslices", v) for v in ("get", "list", "create", "update", "delete")),
    ("resource.k8s.io", "resourceclaims", "get"),
    ("", "nodes", "get"),
}
# With --dra the extender lists and watches both (scheduler/runtime.py's WatchCaches).
EXTENDER_DRA_CALLS = {("resource.k8s.io", resource, verb) for resource in ("resourceslices", "resourceclaims")
                      for verb in ("list", "watch")}
SCHEDULER_COMPONENT = DRA / "scheduler"
EXAMPLES = DRA / "examples"


def kustomization(directory) -> dict:
    """The parsed kustomization.yaml of a directory."""
    return yaml.safe_load((directory / "kustomization.yaml").read_text())


INSTALL_FILES = [DRA / name for name in kustomization(DRA)["resources"]]
COMPONENT_FILES = [SCHEDULER_COMPONENT / name for name in kustomization(SCHEDULER_COMPONENT)["resources"]]
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))
INSTALL = load_manifests(INSTALL_FILES)
EXAMPLE_MANIFESTS = load_manifests(EXAMPLE_FILES)
COMPONENT_PATCH = yaml.safe_load((SCHEDULER_COMPONENT / "configmap-patch.yaml").read_text())
ALL = INSTALL + load_manifests(COMPONENT_FILES) + EXAMPLE_MANIFESTS + load_manifests(
    [SCHEDULER_COMPONENT / "configmap-patch.yaml"])


def dra_object(kind: str, name: str) -> dict:
    """The one object of that kind and name that `kubectl apply -k deploy/dra` creates."""
    hits = [m.doc for m in INSTALL if m.doc["kind"] == kind and m.doc["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected one {kind}/{name} in deploy/dra, found {len(hits)}"
    return hits[0]


def plugin_pod() -> dict:
    """The pod template spec of the DRA plugin's DaemonSet."""
    return dra_object("DaemonSet", PLUGIN)["spec"]["template"]["spec"]


def plugin_container() -> dict:
    """The DRA plugin's container."""
    (c,) = plugin_pod()["containers"]
    return c


def kubectl_kustomize(directory) -> list[dict]:
    """The objects `kubectl kustomize` renders from a directory."""
    kubectl = tool("kubectl", "https://kubernetes.io/docs/tasks/tools/ (kubectl has kustomize built in)")
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


# ------------------------------------------------------------------------------------------------- the schemas

def test_dra_is_checked_against_the_newest_schemas_and_only_here():
    shipped = set(kubernetes_validate.utils.all_versions())
    assert any(v.startswith(FIRST_VERSION + ".") for v in shipped)
    assert NEWEST_VERSION in shipped and DRA_VERSIONS[-1] >= FIRST_VERSION
    # the reason deploy/dra/ is left out of the base install's checks: no resource.k8s.io/v1 before 1.34
    deviceclass = dra_object("DeviceClass", DEVICE_CLASS)
    with pytest.raises(kubernetes_validate.utils.SchemaNotFoundError):
        kubernetes_validate.validate(deviceclass, "1.33", strict=True)
    assert not [p for p in manifest_files() if p.is_relative_to(DRA)]
    assert not [m for m in load_manifests() if m.path.is_relative_to(DRA)]


@pytest.mark.parametrize("version", DRA_VERSIONS)
@pytest.mark.parametrize("manifest", ALL, ids=lambda m: m.id)
def test_manifest_is_valid_kubernetes(manifest, version, no_network):
    assert_valid_kubernetes(manifest, version)


def test_kustomizations_list_every_file_once():
    install = kustomization(DRA)
    component = kustomization(SCHEDULER_COMPONENT)
    assert (install["apiVersion"], install["kind"]) == ("kustomize.config.k8s.io/v1beta1", "Kustomization")
    assert (component["apiVersion"], component["kind"]) == ("kustomize.config.k8s.io/v1alpha1", "Component")
    patches = [SCHEDULER_COMPONENT / p["path"] for p in component["patches"]]
    listed = INSTALL_FILES + COMPONENT_FILES + patches
    assert len(set(listed)) == len(listed) and all(p.is_file() for p in listed)
    on_disk = {p for p in DRA.rglob("*.yaml") if p.name != "kustomization.yaml"}
    assert on_disk == set(listed) | set(EXAMPLE_FILES)  # examples/ is deliberately in no kustomization
    # the same image tag as the base install's, so that one `kustomize edit set image` story holds for both
    base_images = {i["name"]: i["newTag"] for i in kustomization(DEPLOY)["images"]}
    images = {i["name"]: i["newTag"] for i in install["images"]}
    assert images == {"vgpu-sharing/vgpu": base_images["vgpu-sharing/vgpu"]}


def test_objects_are_ours_and_in_our_namespace():
    cluster_scoped = {"DeviceClass", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                      "ValidatingAdmissionPolicyBinding"}
    base = {(m.doc["kind"], m.doc["metadata"]["name"]) for m in load_manifests()}
    for m in INSTALL + load_manifests(COMPONENT_FILES):
        meta = m.doc["metadata"]
        assert meta["labels"]["app.kubernetes.io/part-of"] == "vgpu-sharing", m.id
        if m.doc["kind"] in cluster_scoped:
            assert "namespace" not in meta, m.id
        else:
            assert meta["namespace"] == NAMESPACE, m.id
        assert (m.doc["kind"], meta["name"]) not in base, f"{m.id} would overwrite an object of deploy/"


def test_kustomize_renders_the_dra_install():
    docs = kubectl_kustomize(DRA)
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == sorted(
        (m.doc["kind"], m.doc["metadata"]["name"]) for m in INSTALL)
    for doc in docs:
        kubernetes_validate.validate(doc, DRA_VERSIONS[-1], strict=True)


def test_kustomize_renders_the_base_with_the_scheduler_component(tmp_path):
    """An overlay of deploy/ and deploy/dra/ with the component: what deploy/README.md tells users to build."""
    relative = os.path.relpath(DEPLOY, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [relative, f"{relative}/dra"], "components": [f"{relative}/dra/scheduler"]}))
    docs = {(d["kind"], d["metadata"]["name"]): d for d in kubectl_kustomize(tmp_path)}
    for doc in docs.values():
        if doc["kind"] != "ServiceMonitor":
            kubernetes_validate.validate(doc, DRA_VERSIONS[-1], strict=True)
    config = docs[("ConfigMap", "vgpu-scheduler-config")]["data"]["config.yaml"]
    assert yaml.safe_load(config) == dra_scheduler_config()
    (extender,) = [c for c in docs[("Deployment", "vgpu-scheduler")]["spec"]["template"]["spec"]["containers"]
                   if c["name"] == "extender"]
    (base,) = [c for c in find("Deployment", "vgpu-scheduler")["spec"]["template"]["spec"]["containers"]
               if c["name"] == "extender"]
    assert extender["command"] == [*base["command"], "--dra"]
    assert ("ClusterRoleBinding", "vgpu-scheduler-extender-dra") in docs
    assert ("DaemonSet", PLUGIN) in docs and ("DaemonSet", "vgpu-device-plugin") in docs


# ------------------------------------------------------------------------------------------- the DeviceClasses

def sample_slice(driver: str = DRIVER) -> dict:
    """The ResourceSlice the DRA plugin publishes for a node with two A100s (draplugin.slices), of `driver`."""
    gpus = [GPUInfo("GPU-0b6c2d9e-7f5b-4c5e-9a43-3c1e0e6b8d11", "NVIDIA A100-SXM4-40GB", 40960, 0, numa=0),
            GPUInfo("GPU-7f5b4c5e-9a43-4c1e-8d11-0b6c2d9e3c1e", "NVIDIA A100-SXM4-40GB", 40960, 1, numa=1)]
    spec = slice_spec("gpu-node-1", gpus, 1)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": slice_name("gpu-node-1")},
            "spec": {**spec, "driver": driver}}


def cel_device(resource_slice: dict, device: dict) -> dict:
    """`device` as kube-scheduler's CEL environment shows a slice's device: attributes and capacity by domain, an
    unqualified name being in the driver's domain."""
    driver = resource_slice["spec"]["driver"]

    def by_domain(entries: dict, value) -> dict:
        out: dict = {}
        for name, entry in entries.items():
            domain, _, short = name.rpartition("/")
            out.setdefault(domain or driver, {})[short] = value(entry)
        return out

    return {"driver": driver,
            "attributes": by_domain(device["attributes"], lambda e: next(iter(e.values()))),
            "capacity": by_domain(device["capacity"], lambda e: e["value"]),
            "allowMultipleAllocations": device.get("allowMultipleAllocations", False)}


def selects(deviceclass: dict, resource_slice: dict) -> list[bool]:
    """For each device of the slice, whether every CEL selector of the class accepts it."""
    env = cel.NewEnv(variables={"device": cel.Type.DYN})
    out = []
    for device in resource_slice["spec"]["devices"]:
        data = {"device": cel_device(resource_slice, device)}
        verdicts = []
        for selector in deviceclass["spec"]["selectors"]:
            result = env.compile(selector["cel"]["expression"]).eval(data=data)
            assert result.type() != cel.Type.ERROR, (selector, result.value())
            verdicts.append(result.plain_value())
        out.append(all(v is True for v in verdicts))
    return out


def test_the_plugins_slice_is_valid_and_read_back_by_the_vocabulary():
    devices = slice_devices(sample_slice())
    assert [(d.name, d.memory_mib, d.cores, d.shared) for d in devices] == [
        ("gpu-0", 40960, 100, True), ("gpu-1", 40960, 100, True)]
    kubernetes_validate.validate(sample_slice(), DRA_VERSIONS[-1], strict=True)


def test_device_classes_are_the_vocabularys():
    classes = {m.doc["metadata"]["name"]: m.doc for m in INSTALL if m.doc["kind"] == "DeviceClass"}
    assert set(classes) == {DEVICE_CLASS, EXTENDED_DEVICE_CLASS}
    assert "extendedResourceName" not in classes[DEVICE_CLASS]["spec"]
    assert classes[EXTENDED_DEVICE_CLASS]["spec"]["extendedResourceName"] == ResourceNames().number
    for doc in classes.values():
        assert set(doc["spec"]) <= {"selectors", "extendedResourceName"}  # no opaque config: nothing reads it


@pytest.mark.parametrize("name", [DEVICE_CLASS, EXTENDED_DEVICE_CLASS])
def test_selectors_take_every_gpu_of_our_driver_and_nothing_else(name):
    deviceclass = dra_object("DeviceClass", name)
    assert deviceclass["spec"]["selectors"], "a class without selectors would take every driver's devices"
    assert selects(deviceclass, sample_slice()) == [True, True]
    for other in ("gpu.nvidia.com", "gpu.resource.example.com", "vgpu-sharing.io", "hami-core-gpu.project-hami.io"):
        assert selects(deviceclass, sample_slice(other)) == [False, False], other


def test_a_selector_that_does_not_compile_is_caught():
    broken = {"spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.vgpu-sharing.io'}}]}}
    with pytest.raises(RuntimeError):
        selects(broken, sample_slice())


# ----------------------------------------------------------------------------------------------- the DaemonSet

def plugin_config() -> DRAConfig:
    """The DaemonSet's command line through `vgpu`'s own parser and the plugin's option checks (NODE_NAME as the
    downward API sets it, nothing else from the environment)."""
    command = plugin_container()["command"]
    assert command[:2] == ["vgpu", "dra-plugin"]
    assert all(arg.startswith("--") and "=" in arg for arg in command[2:]), command  # one token per option
    args = build_parser().parse_args([arg.replace("$(NODE_NAME)", "gpu-node-1") for arg in command[1:]])
    assert args.command == "dra-plugin"
    return DRAConfig.from_flags({name: getattr(args, name) for name in DRAConfig.__dataclass_fields__}, {})


def host_path_mounts() -> dict[str, tuple[str, str]]:
    """mountPath -> (hostPath, type) of the plugin container's hostPath volumes."""
    volumes = {v["name"]: v for v in plugin_pod()["volumes"]}
    return {m["mountPath"]: (volumes[m["name"]]["hostPath"]["path"], volumes[m["name"]]["hostPath"].get("type", ""))
            for m in plugin_container()["volumeMounts"] if "hostPath" in volumes[m["name"]]}


def test_options_parse_and_are_the_contracts():
    config = plugin_config()
    assert config.node_name == "gpu-node-1" and config.backend == "nvml" and config.kubeconfig is None
    assert str(config.hook_path) == HOOK_PATH
    assert str(config.plugins_dir) == "/var/lib/kubelet/plugins"
    assert str(config.registry_dir) == "/var/lib/kubelet/plugins_registry"
    assert str(config.cdi_dir) == "/var/run/cdi"
    assert str(config.lock_dir) == f"{HOOK_PATH}/vgpu/locks"  # inside the hook path's mount, as the device plugin's
    assert config.isolation_fail_open is False
    (env,) = [e for e in plugin_container()["env"] if e["name"] == "NODE_NAME"]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_every_path_the_plugin_writes_is_the_hosts_at_the_same_path():
    config = plugin_config()
    mounts = host_path_mounts()
    assert mounts == {
        str(config.driver_dir): (str(config.driver_dir), "DirectoryOrCreate"),
        str(config.registry_dir): (str(config.registry_dir), "Directory"),
        str(config.cdi_dir): (str(config.cdi_dir), "DirectoryOrCreate"),
        f"{config.hook_path}/vgpu": (f"{config.hook_path}/vgpu", "DirectoryOrCreate"),
    }
    written = [config.dra_socket, config.checkpoint_path, config.registration_socket, config.cdi_dir / "x.json",
               config.lock_dir / "claim", config.hook_path / "vgpu" / "libvgpu.so"]
    for path in written:
        assert any(path.is_relative_to(mount) for mount in mounts), f"{path} is not on a host path"
    # only our driver's directory of kubelet's plugins: not the sockets of other drivers
    assert str(config.plugins_dir) not in mounts
    assert all(not m.get("readOnly", False) for m in plugin_container()["volumeMounts"])


def test_runs_only_on_dra_nodes_where_no_device_plugin_runs():
    assert plugin_pod()["nodeSelector"] == {NODE_LABEL: DRA_NODE_VALUE}
    assert "affinity" not in plugin_pod()
    for name in ("vgpu-device-plugin", "vgpu-device-plugin-sim"):
        selector = find("DaemonSet", name)["spec"]["template"]["spec"]["nodeSelector"]
        # one label, one value per node: a DRA node never matches a device plugin's selector
        assert NODE_LABEL in selector and selector[NODE_LABEL] != DRA_NODE_VALUE, name


def test_same_image_and_node_conventions_as_the_device_plugin():
    device_plugin = find("DaemonSet", "vgpu-device-plugin")["spec"]["template"]["spec"]
    (dp,) = device_plugin["containers"]
    c = plugin_container()
    assert c["image"] == dp["image"] and c["imagePullPolicy"] == dp["imagePullPolicy"]
    assert plugin_pod()["tolerations"] == device_plugin["tolerations"]
    assert plugin_pod()["priorityClassName"] == "system-node-critical"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["NVIDIA_DRIVER_CAPABILITIES"]) == ("all", "utility")
    selector = dra_object("DaemonSet", PLUGIN)["spec"]["selector"]["matchLabels"]
    assert selector.items() <= dra_object("DaemonSet", PLUGIN)["spec"]["template"]["metadata"]["labels"].items()


def test_privileged_only_to_mount_each_claims_storage_and_host_pids_for_the_pacer():
    assert plugin_container()["securityContext"].get("privileged") is True
    assert "--container-storage=tmpfs" in plugin_container()["command"]
    assert not any(plugin_pod().get(k, False) for k in ("hostNetwork", "hostIPC"))
    assert plugin_pod()["hostPID"] is True   # NVML's PIDs are the host's: the pacer reads their cgroups
    propagated = {m["name"]: m["mountPropagation"] for m in plugin_container()["volumeMounts"]
                  if "mountPropagation" in m}
    assert propagated == {"hook-path": "Bidirectional"}


# ------------------------------------------------------------------------------- the DaemonSet's container, run

@dataclass
class PluginRun:
    """What the DaemonSet's container did against the API-server stand-in: its requests, and the files it left in
    the host directory (the hostPath volumes laid out under `root`)."""

    requests: list[RecordedRequest]
    stale: dict  # the slice of this node under another name that it found and deleted
    root: Path
    prepared: Any  # NodePrepareResourceResponse of the claim
    files: list[Path]  # everything under root while the claim was prepared


def moved(arg: str, root: Path) -> str:
    """`--flag=/path` with the path moved under `root`."""
    name, eq, value = arg.rpartition("=")
    return f"{name}{eq}{root}{value}" if value.startswith("/") else arg


@pytest.fixture(scope="module")
def plugin_run():
    """The DaemonSet's container as kubelet would run it (hostPaths under a root directory, $(NODE_NAME) expanded),
    with the simulated backend instead of NVML and a kubeconfig of its own token: it publishes its slice, registers
    and prepares and unprepares one claim over gRPC on the sockets it made."""
    work = Path(tempfile.mkdtemp(prefix="dra-deploy-", dir="/tmp"))  # a unix socket path holds 107 bytes at most
    root = work / "host"  # the node's filesystem; the test's own files are beside it
    apiserver = ApiServerStandIn(record_requests=True).start()
    admin_api = make_api_client(apiserver.write_kubeconfig(work / "admin.kubeconfig", "admin"))
    plugin_kubeconfig = apiserver.write_kubeconfig(work / "plugin.kubeconfig", "dra-plugin-token")
    proc = None
    channels: list[grpc.Channel] = []
    try:
        core, resource = k8s.CoreV1Api(admin_api), k8s.ResourceV1Api(admin_api)
        core.create_node({"metadata": {"name": "gpu-node-1"}})
        # a slice of this node under another name (an older plugin's): the plugin deletes it
        stale = {**sample_slice(), "metadata": {"name": "gpu-node-1-old"}}
        resource.create_resource_slice(stale)
        volumes = {v["name"]: v for v in plugin_pod()["volumes"]}
        for mount in plugin_container()["volumeMounts"]:
            assert volumes[mount["name"]]["hostPath"]["path"] == mount["mountPath"]
            (root / mount["mountPath"].lstrip("/")).mkdir(parents=True, exist_ok=True)
        args = [moved(a.replace("$(NODE_NAME)", "gpu-node-1"), root) for a in plugin_container()["command"][2:]]
        # the simulated backend, and plain directories: tmpfs mounts made here would be this machine's own
        args = [a for a in args if not a.startswith(("--backend=", "--container-storage="))]
        control = work / "sim-control"
        control.touch()
        args += ["--backend=sim", "--sim-gpus=2xA100-40GB", f"--sim-control={control}", "--container-storage=directory",
                 f"--kubeconfig={plugin_kubeconfig}"]
        with open(work / "plugin.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "vgpu.cli", "dra-plugin", *args], cwd=DEPLOY.parent,
                                    stdout=log, stderr=log)
        config = DRAConfig.from_flags({a[2:].split("=", 1)[0].replace("-", "_"): a.split("=", 1)[1] for a in args}, {})

        def devices_published() -> list[int]:
            """The number of devices of each slice of the node."""
            assert proc.poll() is None, (work / "plugin.log").read_text()[-4000:]
            return [len(s.spec.devices or ()) for s in resource.list_resource_slice().items
                    if s.spec.node_name == "gpu-node-1"]

        wait_for(lambda: devices_published() == [2] and config.dra_socket.exists()
                   and config.registration_socket.exists(), "the plugin's slice and sockets, the old slice gone")
        with open(control, "a") as handle:
            handle.write("xid 1 79\n")  # GPU 1 falls off the bus: the plugin republishes its slice without it
        wait_for(lambda: devices_published() == [1], "the slice without the failed GPU")
        channels += [grpc.insecure_channel(f"unix://{path}") for path in (config.registration_socket,
                                                                           config.dra_socket)]
        registration = reg_grpc.RegistrationStub(channels[0])
        info = registration.GetInfo(reg.InfoRequest(), timeout=10)
        assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, str(config.dra_socket))
        registration.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=10)

        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "share"},
                 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}]}}}
        resource.create_namespaced_resource_claim("default", claim)
        allocation = {"devices": {"results": [{
            "request": "gpu", "driver": DRIVER, "pool": "gpu-node-1", "device": device_name(0), "shareID": "s1",
            "consumedCapacity": {CAPACITY_MEMORY: "10Gi", CAPACITY_CORES: "30"}}]}}
        allocated = resource.patch_namespaced_resource_claim_status(
            "share", "default", {"status": {"allocation": allocation}})
        ref = dra.Claim(namespace="default", name="share", uid=allocated.metadata.uid)
        node_service = dra_grpc.DRAPluginStub(channels[1])
        prepared = node_service.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=[ref]), timeout=30)
        files = sorted(root.rglob("*"))  # files, sockets and directories, while the claim is prepared
        unprepared = node_service.NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(claims=[ref]), timeout=30)
        assert unprepared.claims[ref.uid].error == ""
        proc.terminate()
        assert proc.wait(15) == 0, (work / "plugin.log").read_text()[-4000:]
        yield PluginRun(apiserver.requests("dra-plugin-token"), stale, root, prepared.claims[ref.uid], files)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(5)
        for channel in channels:
            channel.close()
        admin_api.close()
        apiserver.stop()
        shutil.rmtree(work, ignore_errors=True)


def test_the_container_prepares_a_claim(plugin_run):
    assert plugin_run.prepared.error == ""
    (device,) = plugin_run.prepared.devices
    assert (device.pool_name, device.device_name, list(device.request_names)) == ("gpu-node-1", "gpu-0", ["gpu"])
    assert device.cdi_device_ids and all(i.startswith(f"{CDI_KIND}=") for i in device.cdi_device_ids)


def test_everything_the_container_wrote_is_on_a_host_path(plugin_run):
    mounts = [plugin_run.root / m["mountPath"].lstrip("/") for m in plugin_container()["volumeMounts"]]
    # the mount points and the directories above them are the test's; everything else must be in a mount
    outside = [p for p in plugin_run.files if not any(p.is_relative_to(m) or m.is_relative_to(p) for m in mounts)]
    assert not outside, outside
    for mount in mounts:  # and each host path is used
        assert any(p.is_relative_to(mount) and p != mount for p in plugin_run.files), mount
    cdi_specs = [p for p in plugin_run.files if p.parent == plugin_run.root / "var/run/cdi"]
    assert len(cdi_specs) == 1 and cdi_specs[0].suffix == ".json"


def test_every_call_of_the_container_is_granted(plugin_run):
    granted = grants(PLUGIN, [m.doc for m in INSTALL])
    made = {(r.attributes.api_group, r.attributes.resource, r.attributes.verb) for r in plugin_run.requests}
    assert made, "the plugin made no API call"
    assert made <= granted, f"calls its RBAC does not allow: {made - granted}"
    assert made == PLUGIN_CALLS, f"granted but never called: {PLUGIN_CALLS - made}"


# ----------------------------------------------------------------------------------------------------- RBAC

def grants(service_account_name: str, docs: list[dict]) -> set[tuple[str, str, str]]:
    """(group, resource, verb) the ClusterRoles of `docs` grant `service_account_name` through their bindings."""
    subject = {"kind": "ServiceAccount", "name": service_account_name, "namespace": NAMESPACE}
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    out = set()
    for binding in (d for d in docs if d["kind"] == "ClusterRoleBinding" and subject in d["subjects"]):
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                      "name": binding["roleRef"]["name"]}
        role = roles[binding["roleRef"]["name"]]
        for rule in role["rules"]:
            assert set(rule) == {"apiGroups", "resources", "verbs"}  # no resourceNames, no nonResourceURLs
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], rule
            out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out


def test_the_plugin_is_granted_exactly_what_it_calls():
    docs = [m.doc for m in INSTALL]
    assert grants(PLUGIN, docs) == PLUGIN_CALLS
    assert plugin_pod()["serviceAccountName"] == PLUGIN
    assert dra_object("ServiceAccount", PLUGIN)["metadata"]["namespace"] == NAMESPACE
    assert [d["kind"] for d in docs if d["kind"] in ("Role", "RoleBinding")] == []
    for binding in (d for d in docs if d["kind"] == "ClusterRoleBinding"):
        assert len(binding["subjects"]) == 1


def test_the_extender_is_granted_what_dra_mode_adds():
    component = [m.doc for m in load_manifests(COMPONENT_FILES)]
    assert grants("vgpu-scheduler-extender", component) == EXTENDER_DRA_CALLS
    assert {d["kind"] for d in component} == {"ClusterRole", "ClusterRoleBinding"}


# ------------------------------------------------------------------------------------------ admission policy

OWN_SLICES = "vgpu-sharing-dra-plugin-own-node"


class SliceReview(Review):
    """An admission request on resource.k8s.io/v1 resourceslices (cluster-scoped; DELETE has no object)."""

    def request(self) -> dict:
        subject = self.object if self.operation != "DELETE" else self.old_object
        user: dict = {"username": self.user.username, "groups": list(self.user.groups)}
        if self.user.extra:
            user["extra"] = {k: list(v) for k, v in self.user.extra.items()}
        kind = {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceSlice"}
        resource = {"group": "resource.k8s.io", "version": "v1", "resource": "resourceslices"}
        return {"uid": "0c0e7d0a-3c55-4d43-9a1a-2b3c4d5e6f70", "kind": kind, "requestKind": kind,
                "resource": resource, "requestResource": resource, "name": subject["metadata"]["name"],
                "operation": self.operation, "userInfo": user, "dryRun": False}


class SlicePolicy(Policy):
    """A policy on resource.k8s.io/v1 resourceslices."""

    def matches(self, review: Review) -> bool:
        return any("resource.k8s.io" in rule["apiGroups"] and "v1" in rule["apiVersions"]
                   and review.operation in rule["operations"] and "resourceslices" in rule["resources"]
                   for rule in self.rules)


def slice_policy() -> SlicePolicy:
    """The shipped ResourceSlice policy, compiled."""
    return SlicePolicy(dra_object("ValidatingAdmissionPolicy", OWN_SLICES))


def dra_plugin(node: str | None = "gpu-node-1") -> User:
    """The DRA plugin with a pod-bound token of a pod on `node` (None: a token without the node claim)."""
    return service_account(PLUGIN, node)


def on_node(resource_slice: dict, node: str, driver: str = DRIVER) -> dict:
    """The slice moved to another node and/or driver."""
    spec = {**resource_slice["spec"], "nodeName": node, "driver": driver}
    return {**resource_slice, "spec": spec}


def review(operation: str, user: User, new: dict | None = None, old: dict | None = None) -> list[str]:
    """What the policy refuses about one request (empty: admitted or not matched)."""
    return slice_policy().denials(SliceReview(operation, "resourceslices", new, user, old))


def test_the_policy_is_bound_to_deny_and_fails_closed():
    policy = dra_object("ValidatingAdmissionPolicy", OWN_SLICES)
    binding = dra_object("ValidatingAdmissionPolicyBinding", OWN_SLICES)
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"] == {"policyName": OWN_SLICES, "validationActions": ["Deny"]}
    assert slice_policy().constant("driver") == DRIVER


def test_the_plugin_writes_the_slices_of_its_own_node():
    own = sample_slice()
    assert review("CREATE", dra_plugin(), own) == []
    assert review("UPDATE", dra_plugin(), own, own) == []
    assert review("DELETE", dra_plugin(), None, own) == []


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_the_plugin_cannot_write_another_nodes_or_drivers_slices(operation):
    own = sample_slice()
    cluster_wide = {**own, "spec": {k: v for k, v in own["spec"].items() if k != "nodeName"} | {"allNodes": True}}
    for other in (on_node(own, "gpu-node-2"), on_node(own, "gpu-node-1", "gpu.nvidia.com"), cluster_wide):
        new, old = {"CREATE": (other, None), "UPDATE": (other, other), "DELETE": (None, other)}[operation]
        assert review(operation, dra_plugin(), new, old) == [
            "the DRA plugin of node gpu-node-1 may write only the ResourceSlices of that node and of driver "
            + DRIVER]


def test_the_plugin_cannot_take_over_a_slice_by_renaming_its_node():
    theirs, taken = on_node(sample_slice(), "gpu-node-2"), sample_slice()
    assert len(review("UPDATE", dra_plugin(), taken, theirs)) == 1
    assert len(review("UPDATE", dra_plugin(), theirs, taken)) == 1  # nor give its own away


def test_a_token_without_the_node_claim_is_refused():
    denied = review("CREATE", dra_plugin(None), sample_slice())
    assert denied and denied[0].startswith("the DRA plugin's token names no node")


def test_the_slice_writes_of_the_run_are_admitted_on_its_own_node_only(plugin_run):
    """The plugin's own creates, updates and deletes of the run, replayed through the policy."""
    replayed = []
    current: dict | None = None
    for r in plugin_run.requests:
        if r.attributes.resource != "resourceslices" or r.method not in ("POST", "PUT", "DELETE"):
            continue
        if r.method == "DELETE":
            assert r.attributes.name == plugin_run.stale["metadata"]["name"]
            operation, new, old = "DELETE", None, plugin_run.stale
        else:
            body = orjson.loads(r.body)
            operation, new, old = ("CREATE", body, None) if r.method == "POST" else ("UPDATE", body, current)
            current = body
        assert review(operation, dra_plugin(), new, old) == [], (operation, new, old)
        assert len(review(operation, dra_plugin("gpu-node-2"), new, old)) == 1
        replayed.append(operation)
    assert set(replayed) == {"CREATE", "UPDATE", "DELETE"}


def test_other_users_are_not_this_policys_concern():
    other_node = on_node(sample_slice(), "gpu-node-2")
    for user in (TENANT, service_account("vgpu-device-plugin", "gpu-node-1"),
                 User("system:node:gpu-node-1", ("system:nodes", "system:authenticated"))):
        assert review("CREATE", user, other_node) == []


# ------------------------------------------------------------------------------------- the scheduler component

def base_scheduler_config() -> dict:
    """The base install's KubeSchedulerConfiguration (deploy/scheduler/configmap.yaml)."""
    return yaml.safe_load(find("ConfigMap", "vgpu-scheduler-config")["data"]["config.yaml"])


def dra_scheduler_config() -> dict:
    """The KubeSchedulerConfiguration the component puts in its place."""
    assert set(COMPONENT_PATCH["data"]) == {"config.yaml"}
    return yaml.safe_load(COMPONENT_PATCH["data"]["config.yaml"])


def test_the_patch_targets_the_base_configmap():
    base = find("ConfigMap", "vgpu-scheduler-config")
    assert (COMPONENT_PATCH["kind"], COMPONENT_PATCH["metadata"]["name"], COMPONENT_PATCH["metadata"]["namespace"]) \
        == (base["kind"], base["metadata"]["name"], base["metadata"]["namespace"])


def test_dra_config_is_the_base_with_its_one_entry_open_to_every_pod():
    base, dra = base_scheduler_config(), dra_scheduler_config()
    assert {k: v for k, v in dra.items() if k not in ("profiles", "extenders")} \
        == {k: v for k, v in base.items() if k not in ("profiles", "extenders")}
    assert [{k: v for k, v in p.items() if k != "pluginConfig"} for p in dra["profiles"]] == base["profiles"]
    assert set(dra) <= TOP_KEYS and all(set(p) <= PROFILE_KEYS for p in dra["profiles"])
    (main,) = base["extenders"]
    (entry,) = dra["extenders"]  # one entry: no pod is filtered or scored twice
    assert set(entry) <= EXTENDER_KEYS
    # without managedResources kube-scheduler calls it for every pod of the profile, DRA pods among them
    assert entry == {k: v for k, v in main.items() if k != "managedResources"}


def test_the_dra_profile_keeps_our_resources_out_of_node_resources_fit():
    """kube-scheduler fills NodeResourcesFit's ignoredResources from the entries' ignoredByScheduler only when an
    entry has some (buildExtenders, pkg/scheduler/scheduler.go); the DRA entry has none, so the profile lists them."""
    (main,) = base_scheduler_config()["extenders"]
    for profile in dra_scheduler_config()["profiles"]:
        (fit,) = profile["pluginConfig"]
        assert fit["name"] == "NodeResourcesFit"
        assert set(fit["args"]) <= {"ignoredResources", "ignoredResourceGroups", "scoringStrategy"}
        assert fit["args"]["ignoredResources"] == [r["name"] for r in main["managedResources"]]
        assert set(ResourceNames().all()) <= set(fit["args"]["ignoredResources"])


def test_the_extender_flag_patch_targets_the_extender_container():
    component = kustomization(SCHEDULER_COMPONENT)
    (patch,) = [p for p in component["patches"] if "target" in p]
    assert patch["target"] == {"group": "apps", "version": "v1", "kind": "Deployment", "name": "vgpu-scheduler"}
    ops = yaml.safe_load((SCHEDULER_COMPONENT / patch["path"]).read_text())
    index = int(ops[0]["path"].split("/")[5])
    containers = find("Deployment", "vgpu-scheduler")["spec"]["template"]["spec"]["containers"]
    assert ops[0] == {"op": "test", "path": f"/spec/template/spec/containers/{index}/name", "value": "extender"}
    assert containers[index]["name"] == "extender"
    assert ops[1] == {"op": "add", "path": f"/spec/template/spec/containers/{index}/command/-", "value": "--dra"}
    assert flag(containers[index]["command"], "dra") is None and "--dra" not in containers[index]["command"]


def test_the_extender_parses_its_command_with_the_dra_flag():
    (base,) = [c for c in find("Deployment", "vgpu-scheduler")["spec"]["template"]["spec"]["containers"]
               if c["name"] == "extender"]
    args = build_parser().parse_args([*base["command"][1:], "--dra"])
    assert args.command == "scheduler" and args.dra is True


# ---------------------------------------------------------------------------------------------- the examples

def examples() -> dict[str, list[dict]]:
    """The documents of each example file, by file name."""
    return {p.name: [m.doc for m in EXAMPLE_MANIFESTS if m.path == p] for p in EXAMPLE_FILES}


def pods_and_templates(docs: list[dict]) -> tuple[list[dict], dict[str, dict]]:
    """The Pods of an example file and its ResourceClaimTemplates by name."""
    return ([d for d in docs if d["kind"] == "Pod"],
            {d["metadata"]["name"]: d for d in docs if d["kind"] == "ResourceClaimTemplate"})


def requests_of(template: dict) -> dict[str, dict]:
    """A template's device requests by name (their `exactly`)."""
    return {r["name"]: r["exactly"] for r in template["spec"]["spec"]["devices"]["requests"]}


def test_every_example_pod_refers_to_what_exists():
    classes = {m.doc["metadata"]["name"] for m in INSTALL if m.doc["kind"] == "DeviceClass"}
    assert set(examples()) == {"share-10gi-30pct.yaml", "two-gpus-same-model.yaml", "vgpu-number-limit.yaml"}
    for name, docs in examples().items():
        assert {d["kind"] for d in docs} <= {"Pod", "ResourceClaimTemplate"}, name
        pods, templates = pods_and_templates(docs)
        assert len(pods) == 1, name
        spec = pods[0]["spec"]
        assert spec["schedulerName"] == "vgpu-scheduler"
        assert all("namespace" not in d["metadata"] for d in docs)  # applied where the user is
        claims = {c["name"]: c for c in spec.get("resourceClaims", ())}
        assert set(templates) == {c["resourceClaimTemplateName"] for c in claims.values()}, name
        for template in templates.values():
            for request in requests_of(template).values():
                assert request["deviceClassName"] in classes
        for container in spec["containers"]:
            for ref in container["resources"].get("claims", ()):
                assert ref["name"] in claims
                if "request" in ref:
                    template = templates[claims[ref["name"]]["resourceClaimTemplateName"]]
                    assert ref["request"] in requests_of(template)


def test_the_share_example_asks_10_gib_and_30_percent():
    _, templates = pods_and_templates(examples()["share-10gi-30pct.yaml"])
    (template,) = templates.values()
    (request,) = requests_of(template).values()
    assert request["deviceClassName"] == DEVICE_CLASS and request.get("count", 1) == 1
    asked = request["capacity"]["requests"]
    assert set(asked) == {CAPACITY_MEMORY, CAPACITY_CORES}
    assert mib_of(asked[CAPACITY_MEMORY], "memory") == 10 * 1024
    assert cores_of(asked[CAPACITY_CORES], "cores") == 30


def test_the_two_gpu_example_keeps_one_model_on_two_gpus():
    _, templates = pods_and_templates(examples()["two-gpus-same-model.yaml"])
    (template,) = templates.values()
    (name, request), = requests_of(template).items()
    assert request["deviceClassName"] == DEVICE_CLASS
    assert (request["allocationMode"], request["count"]) == ("ExactCount", 2)
    constraints = template["spec"]["spec"]["devices"]["constraints"]
    assert {(c.get("matchAttribute"), c.get("distinctAttribute")) for c in constraints} == {
        (f"{DRIVER}/model", None), (None, f"{DRIVER}/uuid")}
    assert all(c["requests"] == [name] for c in constraints)
    # both attributes are on every device our driver publishes
    attributes = cel_device(sample_slice(), sample_slice()["spec"]["devices"][0])["attributes"][DRIVER]
    assert {"model", "uuid"} <= set(attributes)


def test_the_extended_resource_example_asks_what_the_class_maps():
    pods, templates = pods_and_templates(examples()["vgpu-number-limit.yaml"])
    assert templates == {} and "resourceClaims" not in pods[0]["spec"]
    (container,) = pods[0]["spec"]["containers"]
    extended = dra_object("DeviceClass", EXTENDED_DEVICE_CLASS)["spec"]["extendedResourceName"]
    assert container["resources"]["limits"] == {extended: 1}
    assert pods[0]["spec"]["nodeSelector"] == plugin_pod()["nodeSelector"]
