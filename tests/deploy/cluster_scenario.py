"""The shipped components, started from their manifests, through one scheduling round against the API-server
stand-in, each with a kubeconfig of its own bearer token so that the stand-in's record tells who called what.

What kubelet would do for a container is done here: volumes are laid out under a root directory (ConfigMaps of
deploy/, the Secret vgpu-grant-key and the ConfigMap vgpu-grant-public-keys with a fresh Ed25519 pair, empty
directories for hostPath and emptyDir), every absolute path in the command and the environment is moved under that
root, $(VAR) references are expanded and the downward API is answered. The device plugin runs the simulated
DaemonSet's container with the kubelet stand-in; the extender runs the Deployment's `extender` container, which
follows kube-scheduler's Lease: kube-scheduler's campaign for it (the Lease of the scheduler ConfigMap, held as
`<hostname>_<uuid>`) is played by a LeaderElector with the admin's token.

The round: the device plugin publishes its node; a pod is created while the extender's watches are held back, so
/filter reads it from the API; /bind places it with a signed assignment and the kubelet stand-in admits it (the
plugin patches bind-phase); a pod created with a forged assignment is refused by the plugin in two of its
versions, and a pod asking for more GPUs than the node has fails /filter twice (each repeated event bumps its
count); a pod of priority 1000 that needs every GPU of the node whole has the extender evict the pods holding
shares there (a dry run, then the eviction); the extender keeps reading kube-scheduler's Lease.

The consolidation controller (the chart's `consolidation.enabled`, which deploy/ does not ship) runs apart, from the
chart's render (two replicas, so with leader election; a look every second, no wait before room is made), through
one move: two nodes of two GPUs with a 30 % share on each GPU, and a pending pod asking a whole GPU. The controller
holds a GPU for it, records an Event and evicts the share there; the test plays the ReplicaSet controller (a
replacement on the other GPU) and the scheduler (the pod bound into the room); the controller sees both, lets the
hold go, renews its Lease, and gives it back when stopped.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from uuid import uuid4

import httpx
import orjson
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from deploy_helpers import ROOT, find
from kubernetes import client as k8s

from vgpu import grants, keys
from vgpu.assignment import DeviceGrant, encode
from vgpu.holds import decode_holds
from vgpu.inventory import GPUDevice, encode_volcano
from vgpu.kube import LeaderElector
from vgpu.kube.client import make_api_client, read_json
from vgpu.testbed.apiserver import ApiServerStandIn, RecordedRequest
from vgpu.testbed.cluster import free_port
from vgpu.testbed.kubelet import AdmissionError, KubeletStandIn

NODE = "gpu-node-1"
ADMIN = "admin"  # the token of the test itself, in the roles of tenant, admin and kubelet
TOKENS = {"vgpu-scheduler-extender": "extender-token", "vgpu-device-plugin": "device-plugin-token"}
GPU = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "2000", "volcano.sh/vgpu-cores": "30"}
CONSOLIDATE = "vgpu-consolidate"  # the controller's ServiceAccount in the chart
CONSOLIDATE_TOKEN = "consolidate-token"
# The chart's values the controller runs with here.
CONSOLIDATION = {"consolidation": {"enabled": True, "replicas": 2, "interval": "1s", "pendingFor": "0s",
                                   "timeout": "30s"}}
CARD_MIB = 40960


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """The first truthy value of `predicate`, polled until `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class KeyFiles(NamedTuple):
    """A grant key pair as the admin creates it (docs/install.md): the PEM files behind the Secret and the ConfigMap."""

    private_pem: bytes
    public_pem: bytes

    @classmethod
    def generate(cls) -> KeyFiles:
        private = Ed25519PrivateKey.generate()
        return cls(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()),
                   private.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))

    def signer(self, tmp: Path) -> grants.GrantKey:
        """The scheduler's key, read as the extender reads its file."""
        path = tmp / "grant.key"
        path.write_bytes(self.private_pem)
        return grants.read_key(path, "--grant-key-file")


class Container:
    """One container of a workload of deploy/ (or of the objects `lookup` finds by kind and name), made runnable
    here: its volumes under `root`, its command and environment with paths moved under `root`."""

    def __init__(self, kind: str, name: str, container: str, root: Path, key: KeyFiles,
                 lookup: Callable[[str, str], dict[str, Any]] = find) -> None:
        self.lookup = lookup
        pod = lookup(kind, name)["spec"]["template"]["spec"]
        (self.spec,) = [c for c in pod["containers"] if c["name"] == container]
        self.service_account = pod["serviceAccountName"]
        self.root = root
        volumes = {v["name"]: v for v in pod["volumes"]}
        for mount in self.spec.get("volumeMounts", ()):
            self._lay_out(volumes[mount["name"]], self.path(mount["mountPath"]), key)

    def path(self, container_path: str) -> Path:
        """Where a path of the container's filesystem is here."""
        return self.root / container_path.lstrip("/")

    def _lay_out(self, volume: dict[str, Any], target: Path, key: KeyFiles) -> None:
        target.mkdir(parents=True, exist_ok=True)
        if "configMap" in volume and volume["configMap"]["name"] == "vgpu-grant-public-keys":
            for item in volume["configMap"]["items"]:
                assert item["key"] == "keys.pem", "the ConfigMap vgpu-grant-public-keys has one key, `keys.pem`"
                (target / item["path"]).write_bytes(key.public_pem)
        elif "configMap" in volume:
            data = self.lookup("ConfigMap", volume["configMap"]["name"])["data"]
            for item in volume["configMap"].get("items") or [{"key": k, "path": k} for k in data]:
                (target / item["path"]).write_text(data[item["key"]])
        elif "secret" in volume and volume["secret"]["secretName"] == "vgpu-grant-key":
            for item in volume["secret"]["items"]:
                assert item["key"] == "key", "the Secret vgpu-grant-key has one key, `key`"
                (target / item["path"]).write_bytes(key.private_pem)

    def _moved(self, value: str) -> str:
        flag, eq, path = value.rpartition("=")
        if path.startswith("/"):
            return f"{flag}{eq}{self.path(path)}"
        return value

    def environment(self, node: str) -> dict[str, str]:
        """The container's environment variables, the downward API answered for a pod on `node`."""
        fields = {"spec.nodeName": node, "metadata.namespace": "vgpu-system"}
        env = {}
        for var in self.spec.get("env", ()):
            value = var["value"] if "value" in var else fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
            env[var["name"]] = self._moved(value)
        return env

    def command(self, node: str, **replace: str) -> list[str]:
        """The command line as kubelet would run it (`$(VAR)` expanded), paths moved, `--flag=value` replaced
        or added for each `flag=value` of `replace` (underscores stand for dashes)."""
        env = self.environment(node)
        args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], self._moved(a)) for a in self.spec["command"]]
        for name, value in replace.items():
            flag = "--" + name.replace("_", "-")
            args = [a for a in args if a.split("=", 1)[0] != flag] + [f"{flag}={value}"]
        assert args[0] == "vgpu", args
        return [sys.executable, "-m", "vgpu.cli", *args[1:]]


@dataclass
class Round:
    """What a scheduling round left behind, for the RBAC and admission checks."""

    apiserver: ApiServerStandIn
    key: grants.GrantKey  # the scheduler's (signs; the nodes' public key checks)
    bound: dict[str, Any]  # the placed pod right after /bind, before the device plugin patched it
    admitted: dict[str, Any]  # the same pod after the device plugin answered Allocate

    def requests(self, service_account: str) -> list[RecordedRequest]:
        """What the component running as `service_account` sent to the API server."""
        return self.apiserver.requests(TOKENS[service_account])


class _Api:
    """The test's own client (token ADMIN)."""

    def __init__(self, kubeconfig: str) -> None:
        self.api = make_api_client(kubeconfig, qps=1000, burst=1000)
        self.core = k8s.CoreV1Api(self.api)

    def pod(self, name: str) -> dict[str, Any]:
        return read_json(self.core.read_namespaced_pod(name, "default", _preload_content=False))

    def create_pod(self, body: dict[str, Any]) -> dict[str, Any]:
        return read_json(self.core.create_namespaced_pod("default", body, _preload_content=False))

    def gone(self, name: str) -> bool:
        try:
            self.pod(name)
        except k8s.ApiException as exc:
            return exc.status == 404
        return False

    def event_count(self, reason: str) -> int:
        items = read_json(self.core.list_namespaced_event("default", _preload_content=False))["items"]
        return sum(e.get("count", 1) for e in items if e["reason"] == reason)


def gpu_pod(name: str, limits: dict[str, str], **spec: Any) -> dict[str, Any]:
    """A pod of the vGPU scheduler with one container of these limits."""
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulerName": "vgpu-scheduler", **spec,
                     "containers": [{"name": "cuda", "image": "cuda", "resources": {"limits": limits}}]}}


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=out)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def run_round(tmp: Path) -> Round:
    """Run the round; the stand-in is left running (stop it with `.apiserver.stop()`)."""
    apiserver = ApiServerStandIn(record_requests=True).start()
    key = KeyFiles.generate()
    kubeconfigs = {sa: apiserver.write_kubeconfig(tmp / f"{sa}.kubeconfig", token)
                   for sa, token in TOKENS.items()}
    admin = _Api(apiserver.write_kubeconfig(tmp / "admin.kubeconfig", ADMIN))
    admin.core.create_node({"metadata": {"name": NODE}, "status": {"allocatable": {
        "cpu": "64", "memory": "256Gi", "volcano.sh/vgpu-number": "40", "volcano.sh/vgpu-memory": "40960",
        "volcano.sh/vgpu-cores": "400"}}})

    plugin = Container("DaemonSet", "vgpu-device-plugin-sim", "device-plugin", tmp / "node", key)
    assert plugin.service_account == "vgpu-device-plugin"
    kubelet_dir = plugin.path("/var/lib/kubelet/device-plugins")
    kubelet = KubeletStandIn(kubelet_dir).start()
    extender = Container("Deployment", "vgpu-scheduler", "extender", tmp / "extender", key)
    assert extender.service_account == "vgpu-scheduler-extender"
    port = free_port()
    procs = []
    election = yaml.safe_load(find("ConfigMap", "vgpu-scheduler-config")["data"]["config.yaml"])["leaderElection"]
    kube_scheduler = LeaderElector(admin.api, election["resourceName"], election["resourceNamespace"],
                                   identity=f"{socket.gethostname()}_{uuid4()}").start()
    try:
        procs.append(_start(plugin.command(NODE, kubeconfig=kubeconfigs["vgpu-device-plugin"],
                                           kubelet_dir=str(kubelet_dir), metrics_listen=""),
                            plugin.environment(NODE), tmp / "device-plugin.log"))
        assert kubelet.wait_registered(("volcano.sh/vgpu-number",), 30), (tmp / "device-plugin.log").read_text()

        def inventory() -> str:
            node = read_json(admin.core.read_node(NODE, _preload_content=False))
            return (node["metadata"].get("annotations") or {}).get("volcano.sh/node-vgpu-register", "")

        wait_for(inventory, "the node inventory")
        procs.append(_start(extender.command(NODE, kubeconfig=kubeconfigs["vgpu-scheduler-extender"],
                                             listen=f"127.0.0.1:{port}", metrics_listen=""),
                            extender.environment(NODE), tmp / "extender.log"))
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

        def ready() -> bool:
            assert procs[-1].poll() is None, (tmp / "extender.log").read_text()
            try:
                return http.get("/readyz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, "the extender's /readyz (caches synced, kube-scheduler's Lease held by its pod)")

        def post(verb: str, body: dict[str, Any]) -> Any:
            answer = http.post(f"/{verb}", content=orjson.dumps(body), headers={"Content-Type": "application/json"})
            assert answer.status_code == 200, answer.text
            return answer.json()

        with apiserver.hold_watches():  # the extender's pod cache misses the pod: /filter reads it
            pod = admin.create_pod(gpu_pod("placed", GPU))
            assert post("filter", {"Pod": pod, "NodeNames": [NODE]})["NodeNames"] == [NODE]
        meta = pod["metadata"]
        assert post("bind", {"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"],
                             "Node": NODE}) == {"Error": ""}
        bound = admin.pod("placed")
        kubelet.admit(bound)
        admitted = admin.pod("placed")
        assert admitted["metadata"]["annotations"]["volcano.sh/bind-phase"] == "success"

        uuid = inventory().split(",", 1)[0]
        forged = f"{uuid},NVIDIA,10240,100:"  # a whole card, for a pod whose spec asks for 2000 units and 30 %
        admin.create_pod(gpu_pod("forged", GPU, nodeName=NODE) | {"metadata": {
            "name": "forged", "namespace": "default",
            "annotations": {"volcano.sh/vgpu-node": NODE, "volcano.sh/vgpu-ids-new": forged,
                            "volcano.sh/devices-to-allocate": forged, "volcano.sh/bind-phase": "allocating"}}})

        def refused(count: int) -> bool:
            """Admit the forged pod once more (refused); True once its refusal has been recorded `count` times."""
            try:
                kubelet.admit(admin.pod("forged"))
            except AdmissionError:
                return admin.event_count("VGPUGrantRefused") >= count
            raise AssertionError("the device plugin served a forged assignment")

        for count in (1, 2):
            # a new version of the pod (the plugin judges each version once, as its watch delivers it)
            admin.core.patch_namespaced_pod("forged", "default", {"metadata": {"labels": {"try": str(count)}}})
            wait_for(lambda n=count: refused(n), "the device plugin's event")

        too_big = admin.create_pod(gpu_pod("too-big", {"volcano.sh/vgpu-number": "5"}))
        for count in (1, 2):
            assert post("filter", {"Pod": too_big, "NodeNames": [NODE]})["NodeNames"] == []
            wait_for(lambda n=count: admin.event_count("FilteringFailed") >= n, "the extender's event")
        k8s.SchedulingV1Api(admin.api).create_priority_class(
            {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "urgent"},
             "value": 1000})
        urgent = admin.create_pod(gpu_pod("urgent", {"volcano.sh/vgpu-number": "4",
                                                     "volcano.sh/vgpu-memory-percentage": "100"},
                                          priorityClassName="urgent"))
        assert post("filter", {"Pod": urgent, "NodeNames": [NODE]})["NodeNames"] == []
        wait_for(lambda: admin.gone("placed"), "the eviction of the pod the urgent one preempts")
        http.close()
        wait_for(lambda: any(r.method == "GET" and f"/leases/{election['resourceName']}" in r.target
                             for r in apiserver.requests(TOKENS["vgpu-scheduler-extender"])),
                 "the extender reading kube-scheduler's Lease")
    finally:
        for proc in reversed(procs):
            _stop(proc)
        kube_scheduler.stop()
        kubelet.stop()
        admin.api.close()
    return Round(apiserver, key.signer(tmp), bound, admitted)


@dataclass
class ConsolidationRound:
    """What the consolidation controller's round left behind, for the RBAC check."""

    apiserver: ApiServerStandIn
    manifests: list[dict[str, Any]]  # the chart's render it ran from

    def requests(self) -> list[RecordedRequest]:
        """What the controller sent to the API server."""
        return self.apiserver.requests(CONSOLIDATE_TOKEN)


def _gpu_node(name: str) -> dict[str, Any]:
    """A node of two 40 GB GPUs, as the device plugin publishes it."""
    devices = [GPUDevice(f"GPU-{name}-{g}", 10, CARD_MIB, "NVIDIA-NVIDIA A100-PCIE-40GB", index=g) for g in range(2)]
    return {"metadata": {"name": name, "annotations": {keys.NODE_REGISTER: encode_volcano(devices)}},
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "volcano.sh/vgpu-number": "20"}}}


def _share(name: str, node: str, gpu: str) -> dict[str, Any]:
    """A running pod of the ReplicaSet `rs` holding 10000 MiB and 30 % of `gpu`."""
    pod = gpu_pod(name, {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "10000",
                         "volcano.sh/vgpu-cores": "30"}, nodeName=node)
    pod["metadata"] |= {
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-uid",
                             "controller": True}],
        "annotations": {keys.VGPU_IDS: encode(((DeviceGrant(gpu, 10000, 30),),))}}
    return pod


def run_consolidation(tmp: Path) -> ConsolidationRound:
    """Run the consolidation controller's round (module docstring); the stand-in is left running (stop it with
    `.apiserver.stop()`)."""
    from chart_render import render

    manifests = render(CONSOLIDATION)

    def lookup(kind: str, name: str) -> dict[str, Any]:
        (doc,) = [d for d in manifests if (d["kind"], d["metadata"]["name"]) == (kind, name)]
        return doc

    apiserver = ApiServerStandIn(record_requests=True).start()
    kubeconfig = apiserver.write_kubeconfig(tmp / "consolidate.kubeconfig", CONSOLIDATE_TOKEN)
    admin = _Api(apiserver.write_kubeconfig(tmp / "admin.kubeconfig", ADMIN))
    controller = Container("Deployment", CONSOLIDATE, "consolidate", tmp / "consolidate", KeyFiles.generate(), lookup)
    assert controller.service_account == CONSOLIDATE
    log = tmp / "consolidate.log"
    shares = {"a": ("n1", 0), "b": ("n1", 1), "c": ("n2", 0), "d": ("n2", 1)}
    try:
        for node in ("n1", "n2"):
            admin.core.create_node(_gpu_node(node))
        for name, (node, g) in shares.items():
            pod = admin.create_pod(_share(name, node, f"GPU-{node}-{g}"))
            pod["status"] = {"phase": "Running", "startTime": pod["metadata"]["creationTimestamp"]}
            admin.core.replace_namespaced_pod_status(name, "default", pod)
        admin.create_pod(gpu_pod("big", {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory-percentage": "100",
                                         "volcano.sh/vgpu-cores": "100"}))
        proc = _start(controller.command("", kubeconfig=kubeconfig, metrics_listen=""), {}, log)
        try:
            def running() -> None:
                assert proc.poll() is None, log.read_text()

            def evicted() -> str | None:
                running()
                return next((name for name in shares if admin.gone(name)), None)

            moved = wait_for(evicted, "an eviction")
            node = shares[moved][0]
            annotations = read_json(admin.core.read_node(node, _preload_content=False))["metadata"]["annotations"]
            (hold,) = decode_holds(annotations[keys.CONSOLIDATION_HOLD])
            held = {g.uuid for segment in hold.assignment for g in segment}
            (free,) = {f"GPU-{node}-{g}" for g in range(2)} - held
            # the ReplicaSet controller and the scheduler: a replacement beside the room, then the pod into it
            admin.create_pod(_share(f"{moved}-2", node, free))
            grant = encode(((DeviceGrant(next(iter(held)), CARD_MIB, 100),),))
            admin.core.create_namespaced_pod_binding("big", "default", {
                "metadata": {"name": "big", "annotations": {keys.VGPU_IDS: grant}},
                "target": {"kind": "Node", "name": node}}, _preload_content=False)

            def let_go() -> bool:
                running()
                node_object = read_json(admin.core.read_node(node, _preload_content=False))
                return keys.CONSOLIDATION_HOLD not in (node_object["metadata"].get("annotations") or {})

            wait_for(let_go, "the hold let go once the pod was placed")
            assert [e["involvedObject"]["name"] for e in read_json(admin.core.list_namespaced_event(
                "default", _preload_content=False))["items"] if e["reason"] == "Consolidating"] == [moved]
            wait_for(lambda: any(r.method == "PUT" and f"/leases/{CONSOLIDATE}" in r.target
                                 for r in apiserver.requests(CONSOLIDATE_TOKEN)), "the controller renewing its Lease")
        finally:
            _stop(proc)
    finally:
        admin.api.close()
    return ConsolidationRound(apiserver, manifests)
