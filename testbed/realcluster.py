"""TEST INFRASTRUCTURE: a real Kubernetes cluster on loopback, built from upstream's Go modules, around our product.

`UpstreamCluster` starts, each as a process group with its log under `<workdir>/logs/`:
  * etcd, then kube-apiserver (TLS on 127.0.0.1, x509 client certificates and ServiceAccount tokens, Node and RBAC
    authorization, its default admission chain with NodeRestriction added), kube-controller-manager (every default
    controller with ServiceAccount credentials: garbage collector, ReplicaSets, disruption budgets, the DRA claim
    controller, the root CA publisher) and kube-scheduler running the installed KubeSchedulerConfiguration, whose
    extender is our `vgpu scheduler`, following kube-scheduler's Lease. With `scheduler_replicas` above one, each
    replica is a pair of them as in one pod of the Deployment: kube-scheduler in a UTS namespace of its own with the
    pod's hostname `vgpu-scheduler-<i>` (kube-scheduler's identity is `<hostname>_<uuid>`), the extender told that
    hostname, and both reaching kube-apiserver through a PartitionProxy of the replica (testbed/tcpproxy.py);
  * what an operator installs, applied with kubectl: `manifests` (such as the Helm chart's render), or else
    deploy/'s namespace, RBAC and admission policies;
  * per node: a mount namespace of its own (kubelet's device-plugin directory is fixed at
    /var/lib/kubelet/device-plugins, so two kubelets on one machine each need their own; with `numa_nodes` the
    machine's NUMA layout that kubelet's Topology Manager reads is replaced there by one of that many nodes), containerd
    (testbed/containerd.py) whose runc is the NVIDIA container runtime stand-in (testbed/nvidia_runtime.py), the
    real kubelet, and our `vgpu device-plugin` (or `vgpu dra-plugin`) with a ServiceAccount token bound to the node,
    the simulated libnvidia-ml.so.1 describing the node's GPUs (testbed/machine.py);
  * with `webhook_configuration` (such as the chart's MutatingWebhookConfiguration) our `vgpu webhook` over HTTPS,
    registered by that configuration with each clientConfig turned into its URL: kube-apiserver reaches a webhook
    Service through its endpoints, and an endpoint may not be a loopback address.
The upstream programs come from testbed/upstream/build.sh's cache (`upstream_dir()`); `unavailable()` says what
is missing. Pods are real containers of a local image (an empty root filesystem; `host_software()` gives the
hostPath volumes that bring this machine's Python, the virtual environment and the checkout in).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from vgpu.testbed.cluster import LocalCluster, Proc, _vgpu, free_port, isolation_paths
from vgpu.testbed.containerd import BASE_IMAGE, Containerd
from vgpu.testbed.containerd import unavailable as containerd_unavailable
from vgpu.testbed.machine import machine
from vgpu.testbed.nvidia_runtime import wrapper_script
from vgpu.testbed.pki import CertificateAuthority, pem_key
from vgpu.testbed.tcpproxy import PartitionProxy

__all__ = ["BASE_IMAGE", "UpstreamCluster", "UpstreamNode", "host_software", "real_pod", "unavailable",
           "upstream_dir"]

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = Path(__file__).resolve().parent / "upstream" / "build.sh"
DEPLOY = REPO / "deploy"
NAMESPACE = "vgpu-system"
_SOCKET_PATH_MAX = 107  # a unix socket's path, without its terminating NUL
_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"  # kubelet's fixed path (deviceplugin v1beta1 KubeletSocket)


def upstream_dir() -> Path | None:
    """The folder testbed/upstream/build.sh built (bin/, images/, manifest.json), None when it is not built."""
    try:
        done = subprocess.run(["bash", str(BUILD_SCRIPT), "--dir"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(done.stdout.strip()) if done.returncode == 0 else None


def unavailable() -> str:
    """Why the real cluster cannot run here ("" when it can)."""
    found = upstream_dir()
    if found is None:
        return "the upstream programs are not built (testbed/upstream/build.sh)"
    if shutil.which("kubectl") is None:
        return "kubectl is not installed"
    for tool in ("unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (util-linux)"
    return containerd_unavailable(found / "bin")


def host_software() -> tuple[list[dict], list[dict]]:
    """(volumes, volumeMounts): this machine's /usr, the Python installation, the virtual environment and the
    checkout, read-only at the same paths, so `sys.executable -m vgpu.testbed.workload` runs in the base image."""
    paths = ["/usr/bin", "/usr/lib", "/usr/lib64", "/etc/alternatives"]
    paths += sorted({str(Path(p).resolve()) for p in (sys.base_prefix, sys.prefix, REPO)})
    volumes, mounts = [], []
    for i, path in enumerate(p for p in paths if Path(p).exists()):
        volumes.append({"name": f"host-{i}", "hostPath": {"path": path, "type": "Directory"}})
        mounts.append({"name": f"host-{i}", "mountPath": path, "readOnly": True})
    return volumes, mounts


def real_pod(pod: dict) -> dict:
    """A copy of `pod` as this tier runs it: the local base image with the host's software mounted in
    (`host_software`), `python3` as this Python (the base system's has not our package), other bare commands from
    the host's /usr/bin, no ServiceAccount token, a grace period of 2 s."""
    volumes, mounts = host_software()
    pod = copy.deepcopy(pod)
    spec = pod["spec"]
    spec["volumes"] = [*(spec.get("volumes") or ()), *volumes]
    spec.update(automountServiceAccountToken=False, terminationGracePeriodSeconds=2)
    for container in spec["containers"]:
        command = container["command"]
        if command[0] == "python3":
            command = [sys.executable, *command[1:]]
        elif "/" not in command[0]:
            command = [f"/usr/bin/{command[0]}", *command[1:]]
        container.update(image=BASE_IMAGE, imagePullPolicy="Never", command=command,
                         volumeMounts=[*(container.get("volumeMounts") or ()), *mounts])
    return pod


def _kubeconfig(path: Path, server: str, ca: Path, cert: tuple[Path, Path] | None = None,
                token: str | None = None) -> str:
    user: dict[str, str] = {"token": token} if token else {"client-certificate": str(cert[0]),
                                                           "client-key": str(cert[1])} if cert else {}
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "real",
           "clusters": [{"name": "real", "cluster": {"server": server, "certificate-authority": str(ca)}}],
           "users": [{"name": "real", "user": user}],
           "contexts": [{"name": "real", "context": {"cluster": "real", "user": "real"}}]}
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def cgroup_mounts() -> list[Path]:
    """The mount points of this machine's cgroup hierarchies (each v1 controller's, and the v2 one)."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" - ", 1)
        if len(fields) == 2 and fields[1].split()[0] in ("cgroup", "cgroup2"):
            points.append(Path(fields[0].split()[4]))
    return points


def make_cgroup(name: str) -> list[Path]:
    """Create the cgroup `/<name>` in every hierarchy (kubelet wants its cgroupRoot to exist in each; a v1 cpuset
    cgroup starts with no CPUs or memory nodes, so it takes its parent's); the paths made."""
    made = []
    for mount in cgroup_mounts():
        path = mount / name
        path.mkdir(exist_ok=True)
        made.append(path)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (mount / knob).exists() and not (path / knob).read_text().strip():
                (path / knob).write_text((mount / knob).read_text())
    return made


def remove_cgroup(paths: Iterable[Path]) -> None:
    """Remove cgroups made by `make_cgroup` and everything kubelet and runc made under them, the deepest first
    (a cgroup with processes left in it stays)."""
    for top in paths:
        if not top.exists():
            continue
        for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                path.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


_SYS_NODES = Path("/sys/devices/system/node")
_SYS_CPUS = Path("/sys/devices/system/cpu")


def numa_sysfs(folder: Path, nodes: int) -> Path:
    """A copy of /sys/devices/system/node describing this machine as `nodes` NUMA nodes, its CPUs dealt out in turn
    and each node with node 0's memory figures: what kubelet (cAdvisor's sysfs reader: node*/cpu*, meminfo,
    distance, hugepages) sees when it is bound over the real one in a node's mount namespace. Test infrastructure
    for the Topology Manager, as the simulated NVML is for the GPUs."""
    cpus = sorted(int(p.name[3:]) for p in _SYS_CPUS.glob("cpu[0-9]*"))
    source = _SYS_NODES / "node0"
    folder.mkdir(parents=True, exist_ok=True)
    span = f"0-{nodes - 1}" if nodes > 1 else "0"
    for name in ("online", "possible", "has_cpu", "has_memory", "has_normal_memory"):
        (folder / name).write_text(span + "\n")
    for index in range(nodes):
        node = folder / f"node{index}"
        node.mkdir(exist_ok=True)
        mine = [cpu for cpu in cpus if cpu % nodes == index]
        for cpu in mine:
            link = node / f"cpu{cpu}"
            if not link.is_symlink():
                link.symlink_to(_SYS_CPUS / f"cpu{cpu}")
        (node / "cpulist").write_text(",".join(map(str, mine)) + "\n")
        (node / "distance").write_text(" ".join("10" if i == index else "20" for i in range(nodes)) + "\n")
        (node / "meminfo").write_text((source / "meminfo").read_text().replace("Node 0 ", f"Node {index} "))
        for pages in (source / "hugepages").glob("hugepages-*"):
            target = node / "hugepages" / pages.name
            target.mkdir(parents=True, exist_ok=True)
            for counter in ("nr_hugepages", "free_hugepages", "surplus_hugepages"):
                if (pages / counter).exists():
                    (target / counter).write_text((pages / counter).read_text())
    return folder


class UpstreamNode:
    """One node: its mount namespace, containerd, kubelet and our plugin, with their paths."""

    def __init__(self, cluster: UpstreamCluster, index: int, gpus: str) -> None:
        self.name = f"node-{index}"
        self.gpus = gpus
        self.dir = cluster.workdir / self.name
        self.kubelet_root = self.dir / "kubelet"
        self.device_plugins = self.dir / "device-plugins"
        self.state_dir = self.dir / "simgpu"
        self.cdi_dir = self.dir / "cdi"
        # one cgroup per node of each cluster on the machine (two clusters may run at once, in folders named alike)
        digest = hashlib.sha256(str(cluster.workdir).encode()).hexdigest()[:10]
        self.cgroup_root = f"vgpu-realk8s-{digest}-{self.name}"
        self.cgroups: list[Path] = []
        self.kubelet_port = free_port()
        self.healthz_port = free_port()
        self.metrics_port = free_port()
        self.holder: Proc | None = None
        self.containerd: Containerd | None = None
        self.kubelet: Proc | None = None
        self.plugin: Proc | None = None

    @property
    def namespace_file(self) -> str:
        """The node's mount namespace, for nsenter."""
        assert self.holder is not None and self.holder.pid is not None
        return f"/proc/{self.holder.pid}/ns/mnt"

    def nsenter(self) -> list[str]:
        """The argv prefix that runs a program in the node's mount namespace."""
        return ["nsenter", f"--mount={self.namespace_file}", "--"]


class UpstreamCluster:
    """The real control plane, N nodes of real kubelets and containerd, and our components; see the module text."""

    def __init__(self, workdir: str | os.PathLike[str], nodes: int = 2, gpus: str | list[str] = "2xA100-40GB",
                 topology_policy: str = "none", numa_nodes: int = 0, dra: bool = False,
                 manifests: list[dict] | None = None,
                 webhook_configuration: dict | None = None,
                 webhook_args: Iterable[str] = (), log_level: str = "INFO", scheduler_args: Iterable[str] = (),
                 plugin_args: Iterable[str] = (), scheduler_replicas: int = 1) -> None:
        found = upstream_dir()
        if found is None:
            raise RuntimeError(unavailable())
        self.bin = found / "bin"
        self.images = found / "images"
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs = self.workdir / "logs"
        self.pki = self.workdir / "pki"
        self.dra = dra
        self.manifests = manifests
        self.webhook_configuration = webhook_configuration
        self.webhook_args = list(webhook_args)
        self.topology_policy = topology_policy
        self.numa_nodes = numa_nodes
        self.log_level = log_level
        self.scheduler_args = list(scheduler_args) + (["--dra"] if dra else [])
        self.plugin_args = list(plugin_args)
        per_node = [gpus] * nodes if isinstance(gpus, str) else list(gpus)
        if len(per_node) != nodes:
            raise ValueError(f"gpus: {len(per_node)} specs for {nodes} nodes")
        self.nodes = [UpstreamNode(self, i, spec) for i, spec in enumerate(per_node)]
        for node in self.nodes:  # the deepest unix sockets kubelet and our plugins make below the folder
            for socket_path in (node.device_plugins / "nvidia-vgpu-number.sock",
                                node.kubelet_root / "plugins_registry" / "gpu.vgpu-sharing.io-reg.sock"):
                if len(os.fsencode(socket_path)) > _SOCKET_PATH_MAX:
                    raise ValueError(f"{self.workdir} is too deep for the unix sockets below it ({socket_path} is "
                                     f"over {_SOCKET_PATH_MAX} bytes): use a shorter folder")
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        self.scheduler_replicas = scheduler_replicas
        self.extender_ports = [free_port() for _ in range(scheduler_replicas)]
        self.extender_metrics_ports = [free_port() for _ in range(scheduler_replicas)]
        self.extender_port, self.extender_metrics_port = self.extender_ports[0], self.extender_metrics_ports[0]
        self.proxies: list[PartitionProxy] = []  # per replica, when there are several
        self.webhook_port = free_port()
        self.procs: dict[str, Proc] = {}
        self.kubeconfig = ""
        self._ca: CertificateAuthority | None = None
        self._http: httpx.Client | None = None

    # -- processes
    def _proc(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, argv, self.logs / f"{name}.log", env=env)
        self.procs[name] = proc
        return proc.start()

    def _upstream(self, program: str) -> str:
        return str(self.bin / program)

    @staticmethod
    def wait(what: str, predicate: Callable[[], Any], timeout: float, interval: float = 0.3,
             proc: Proc | None = None) -> Any:
        """`LocalCluster.wait`, with a predicate that may raise while what it asks is not up yet (read as false)."""
        def tolerant() -> Any:
            try:
                return predicate()
            except Exception:  # not ready yet
                return None

        return LocalCluster.wait(what, tolerant, timeout, interval, procs=[proc])

    # -- credentials
    def _make_pki(self) -> None:
        ca = self._ca = CertificateAuthority(self.pki, "ca", "vgpu-realk8s-ca")
        ca.issue("apiserver", "kube-apiserver", dns_names=["localhost", "kubernetes", "kubernetes.default",
                                                           "kubernetes.default.svc"],
                 ips=["127.0.0.1"], server=True)
        ca.issue("admin", "kubernetes-admin", ["system:masters"], client=True)
        ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ["system:masters"], client=True)
        ca.issue("kube-controller-manager", "system:kube-controller-manager", client=True)
        for node in self.nodes:
            ca.issue(node.name, f"system:node:{node.name}", ["system:nodes"], client=True)
            ca.issue(f"{node.name}-serving", node.name, dns_names=[node.name, "localhost"], ips=["127.0.0.1"],
                     server=True)
        key = ec.generate_private_key(ec.SECP256R1())
        (self.pki / "sa.key").write_bytes(pem_key(key))
        (self.pki / "sa.pub").write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        self.kubeconfig = self.cert_kubeconfig("admin")

    def cert_kubeconfig(self, name: str) -> str:
        """A kubeconfig authenticating with the client certificate `pki/<name>.crt`."""
        assert self._ca is not None
        return _kubeconfig(self.workdir / f"kubeconfig-{name}", self.server, self._ca.cert,
                           cert=(self.pki / f"{name}.crt", self.pki / f"{name}.key"))

    def token_kubeconfig(self, service_account: str, namespace: str = NAMESPACE, node: str | None = None,
                         replica: int | None = None) -> str:
        """A kubeconfig with a TokenRequest token of the ServiceAccount, bound to `node` when given (the token then
        carries the node's name, as a token mounted into a pod on that node does); for a scheduler `replica`,
        through that replica's proxy when it has one."""
        assert self._ca is not None
        spec: dict[str, Any] = {"expirationSeconds": 86400}
        if node is not None:
            uid = self.get(f"/api/v1/nodes/{node}")["metadata"]["uid"]
            spec["boundObjectRef"] = {"kind": "Node", "apiVersion": "v1", "name": node, "uid": uid}
        answer = self.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
                           {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
        suffix = f"-{node}" if node else f"-{replica}" if replica is not None else ""
        server = self.proxies[replica].url if replica is not None and self.proxies else self.server
        return _kubeconfig(self.workdir / f"kubeconfig-{service_account}{suffix}", server, self._ca.cert,
                           token=answer["status"]["token"])

    # -- API access (as the cluster admin)
    @property
    def http(self) -> httpx.Client:
        """An HTTP client on kube-apiserver with the admin's certificate."""
        if self._http is None:
            assert self._ca is not None
            context = ssl.create_default_context(cafile=str(self._ca.cert))
            context.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")
            self._http = httpx.Client(base_url=self.server, verify=context, timeout=15)
        return self._http

    def get(self, path: str, **params: Any) -> Any:
        """GET `path` as JSON; raises httpx.HTTPStatusError on an error status."""
        answer = self.http.get(path, params=params)
        answer.raise_for_status()
        return answer.json()

    def post(self, path: str, body: dict) -> Any:
        """POST `body` to `path`; raises RuntimeError with the server's message on an error status."""
        answer = self.http.post(path, json=body)
        if answer.is_error:
            raise RuntimeError(f"POST {path}: {answer.status_code} {answer.text}")
        return answer.json()

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None,
                kubeconfig: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl against this cluster."""
        done = subprocess.run(["kubectl", "--kubeconfig", kubeconfig or self.kubeconfig, *args], input=stdin,
                              capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done

    # -- control plane
    def _start_etcd(self) -> None:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        proc = self._proc("etcd", [
            self._upstream("etcd"), "--name", "default", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}", "--unsafe-no-fsync", "--log-level", "warn"])
        self.wait("etcd", lambda: httpx.get(f"http://127.0.0.1:{self.etcd_port}/health", timeout=2)
                  .json().get("health") == "true", 60, proc=proc)

    def _start_apiserver(self) -> None:
        pki = self.pki
        # kubelet refuses a loopback node IP, so a node's only dialable address is its Hostname: kube-apiserver runs
        # in a mount namespace of its own whose /etc/hosts puts every node name on 127.0.0.1
        hosts = self.workdir / "apiserver-hosts"
        hosts.write_text(Path("/etc/hosts").read_text() + "".join(f"127.0.0.1 {n.name}\n" for n in self.nodes))
        proc = self._proc("kube-apiserver", [
            "unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount --bind "{hosts}" /etc/hosts && exec "$0" "$@"', self._upstream("kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.api_port}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/24", "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction", "--allow-privileged=true",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={pki / 'ca.crt'}", "--kubelet-preferred-address-types=Hostname",
            "--profiling=false",
            # the `kubernetes` Service's endpoints cannot be a loopback address; nothing here uses that Service
            "--endpoint-reconciler-type=none", "--v=1"])
        self.wait("kube-apiserver ready", lambda: self.http.get("/readyz").status_code == 200, 120, proc=proc)

    def _apply_deploy(self) -> None:
        """What an operator installs: `manifests` (such as the chart's render) into a namespace created for them,
        or else deploy/'s namespace, RBAC and admission policies (DRA mode: its classes and RBAC too); kubectl."""
        if self.manifests is not None:
            self.kubectl("create", "namespace", NAMESPACE)
            path = self.workdir / "manifests.yaml"
            path.write_text(yaml.safe_dump_all(self.manifests))
            self.kubectl("apply", "--server-side", "-f", str(path))
            return
        files = [DEPLOY / "namespace.yaml", *sorted((DEPLOY / "rbac").glob("*.yaml")),
                 *sorted((DEPLOY / "admission").glob("*.yaml"))]
        if self.dra:
            files += [DEPLOY / "dra" / "deviceclasses.yaml", DEPLOY / "dra" / "rbac.yaml",
                      DEPLOY / "dra" / "admission-own-node.yaml", DEPLOY / "dra" / "scheduler" / "rbac.yaml"]
        for path in files:
            self.kubectl("apply", "--server-side", "-f", str(path))

    def _start_controller_manager(self) -> None:
        pki = self.pki
        kubeconfig = self.cert_kubeconfig("kube-controller-manager")
        self._proc("kube-controller-manager", [
            self._upstream("kube-controller-manager"), f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--leader-elect=false",
            "--use-service-account-credentials=true", f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-account-private-key-file={pki / 'sa.key'}", f"--client-ca-file={pki / 'ca.crt'}",
            "--controllers=*,-service-lb-controller,-node-ipam-controller,-cloud-node-lifecycle-controller",
            "--v=1"])

    def replica_proc(self, program: str, replica: int) -> Proc:
        """The process of `program` ("kube-scheduler" or "extender") of a scheduler replica."""
        return self.procs[program if replica == 0 else f"{program}-{replica}"]

    def scheduler_hostname(self, replica: int) -> str:
        """The hostname of a replica's pod: kube-scheduler's identity starts with it, and the extender follows it."""
        return f"vgpu-scheduler-{replica}" if self.scheduler_replicas > 1 else socket.gethostname()

    def _start_extender(self, replica: int) -> None:
        election = self.scheduler_configuration().get("leaderElection") or {}
        follow: list[str] = []
        if election.get("leaderElect", True):  # kube-scheduler's default
            follow = ["--follow-lease", f"{election.get('resourceNamespace') or 'kube-system'}/"
                                        f"{election.get('resourceName') or 'kube-scheduler'}",
                      "--leader-identity", self.scheduler_hostname(replica)]
        kubeconfig = self.token_kubeconfig("vgpu-scheduler-extender", replica=replica)
        self._proc("extender" if replica == 0 else f"extender-{replica}", _vgpu(
            "--log-level", self.log_level, "scheduler", "--kubeconfig", kubeconfig,
            "--listen", f"127.0.0.1:{self.extender_ports[replica]}", "--metrics-listen",
            f"127.0.0.1:{self.extender_metrics_ports[replica]}", "--scheduler-names", "vgpu-scheduler",
            *follow, *self.scheduler_args))

    def serving_replica(self) -> int | None:
        """The replica whose extender answers /readyz 200 (the one beside the leading kube-scheduler), or None."""
        serving = []
        for replica, port in enumerate(self.extender_ports):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    serving.append(replica)
            except httpx.HTTPError:
                continue
        if len(serving) > 1:
            raise AssertionError(f"extenders of replicas {serving} serve at once")
        return serving[0] if serving else None

    def _start_webhook(self) -> None:
        assert self._ca is not None and self.webhook_configuration is not None
        cert, key = self._ca.issue("webhook", "vgpu-webhook", dns_names=["localhost"], ips=["127.0.0.1"], server=True)
        proc = self._proc("webhook", _vgpu(
            "--log-level", self.log_level, "webhook", "--listen", f"127.0.0.1:{self.webhook_port}",
            "--tls-cert-file", str(cert), "--tls-private-key-file", str(key), *self.webhook_args))
        context = ssl.create_default_context(cafile=str(self._ca.cert))
        self.wait("the webhook", lambda: httpx.get(f"https://127.0.0.1:{self.webhook_port}/healthz", timeout=2,
                                                   verify=context).status_code == 200, 60, proc=proc)
        doc = copy.deepcopy(self.webhook_configuration)
        bundle = base64.b64encode(self._ca.cert.read_bytes()).decode()
        for hook in doc.get("webhooks") or ():
            path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path", "/")
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{self.webhook_port}{path}", "caBundle": bundle}
        path = self.workdir / "webhook-configuration.yaml"
        path.write_text(yaml.safe_dump(doc))
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))

    def scheduler_configuration(self, replica: int | None = None) -> dict:
        """The KubeSchedulerConfiguration installed (the `vgpu-scheduler-config` ConfigMap of `manifests`, else
        deploy/'s, in DRA mode deploy/dra/scheduler's), with the extender's address and kube-scheduler's
        kubeconfig (that of `replica`) filled in."""
        if self.manifests is not None:
            docs = self.manifests
        else:
            folder = DEPLOY / "dra" / "scheduler" if self.dra else DEPLOY / "scheduler"
            docs = [doc for path in sorted(folder.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())]
        found = [doc for doc in docs if isinstance(doc, dict) and doc.get("kind") == "ConfigMap"
                 and doc["metadata"]["name"] == "vgpu-scheduler-config"]
        if not found:
            raise FileNotFoundError("no vgpu-scheduler-config ConfigMap installed")
        config = yaml.safe_load(found[0]["data"]["config.yaml"])
        if replica is not None:
            for extender in config.get("extenders") or []:
                extender["urlPrefix"] = f"http://127.0.0.1:{self.extender_ports[replica]}"
            config["clientConnection"] = {"kubeconfig": self.token_kubeconfig("vgpu-kube-scheduler",
                                                                              replica=replica)}
        return config

    def _start_scheduler(self, replica: int) -> None:
        path = self.workdir / f"kube-scheduler-{replica}.yaml"
        path.write_text(yaml.safe_dump(self.scheduler_configuration(replica)))
        argv = [self._upstream("kube-scheduler"), f"--config={path}", "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}", "--v=2"]
        if self.scheduler_replicas > 1:  # the pod's hostname, which kube-scheduler's identity starts with
            argv = ["unshare", "--uts", "sh", "-c", f'hostname {self.scheduler_hostname(replica)} && exec "$0" "$@"',
                    *argv]
        self._proc("kube-scheduler" if replica == 0 else f"kube-scheduler-{replica}", argv)

    # -- nodes
    def _kubelet_config(self, node: UpstreamNode) -> Path:
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": "127.0.0.1", "port": node.kubelet_port, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": node.healthz_port,
            "tlsCertFile": str(self.pki / f"{node.name}-serving.crt"),
            "tlsPrivateKeyFile": str(self.pki / f"{node.name}-serving.key"),
            "authentication": {"x509": {"clientCAFile": str(self.pki / "ca.crt")}, "webhook": {"enabled": True},
                               "anonymous": {"enabled": False}},
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{node.cgroup_root}", "failSwapOn": False,
            "failCgroupV1": False,
            "containerRuntimeEndpoint": node.containerd.endpoint if node.containerd else "",
            "podLogsDir": str(node.dir / "pod-logs"), "resolvConf": "",
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "topologyManagerPolicy": self.topology_policy, "topologyManagerScope": "container",
            "serializeImagePulls": False, "registerNode": True, "syncFrequency": "10s",
            "fileCheckFrequency": "10s", "staticPodPath": "", "maxPods": 50,
        }
        path = node.dir / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def _start_node(self, node: UpstreamNode) -> None:
        for path in (node.kubelet_root, node.device_plugins, node.state_dir, node.cdi_dir, node.dir / "pod-logs"):
            path.mkdir(parents=True, exist_ok=True)
        Path(_DEVICE_PLUGIN_DIR).mkdir(parents=True, exist_ok=True)
        node.holder = self._proc(f"mountns-{node.name}", ["unshare", "--mount", "--propagation", "private",
                                                          "sleep", "infinity"])
        self.wait(f"{node.name}'s mount namespace", lambda: os.readlink(node.namespace_file)
                  != os.readlink("/proc/self/ns/mnt"), 10, proc=node.holder)
        subprocess.run([*node.nsenter(), "mount", "--bind", str(node.device_plugins), _DEVICE_PLUGIN_DIR],
                       check=True, capture_output=True, timeout=10)
        if self.numa_nodes > 1:
            subprocess.run([*node.nsenter(), "mount", "--bind", str(numa_sysfs(node.dir / "numa", self.numa_nodes)),
                            str(_SYS_NODES)], check=True, capture_output=True, timeout=10)
        runc = shutil.which("runc") or "runc"
        wrapper = wrapper_script(node.dir / "nvidia-container-runtime", node.gpus, node.name,
                                 isolation_paths()[1], node.state_dir, runc)
        node.containerd = Containerd(node.dir / "containerd", self.bin, self.images, cdi_dirs=[node.cdi_dir],
                                     prefix=node.nsenter(), runc=str(wrapper))
        node.containerd.start()
        node.cgroups = make_cgroup(node.cgroup_root)
        node.kubelet = self._proc(f"kubelet-{node.name}", [
            *node.nsenter(), self._upstream("kubelet"), f"--config={self._kubelet_config(node)}",
            f"--kubeconfig={self.cert_kubeconfig(node.name)}", f"--root-dir={node.kubelet_root}",
            f"--hostname-override={node.name}", "--v=1"])

    def _node_ready(self, name: str) -> bool:
        node = self.get(f"/api/v1/nodes/{name}")
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))

    def _start_plugin(self, node: UpstreamNode) -> None:
        env = {"SIMGPU_STATE": str(node.state_dir / "node.state"),
               "SIMGPU_DEVICES": ",".join(g.simgpu_entry() for g in machine(node.gpus, node.name)),
               "LD_LIBRARY_PATH": str(isolation_paths()[1])}
        account = "vgpu-dra-plugin" if self.dra else "vgpu-device-plugin"
        kubeconfig = self.token_kubeconfig(account, node=node.name)
        common = ["--backend", "nvml", "--node-name", node.name, "--kubeconfig", kubeconfig,
                  "--hook-path", str(node.dir / "hook"), "--lock-dir", str(node.dir / "vgpulock")]
        if self.dra:
            argv = _vgpu("--log-level", self.log_level, "dra-plugin", *common,
                         "--plugins-dir", str(node.kubelet_root / "plugins"),
                         "--registry-dir", str(node.kubelet_root / "plugins_registry"),
                         "--cdi-dir", str(node.cdi_dir), *self.plugin_args)
        else:
            argv = _vgpu("--log-level", self.log_level, "device-plugin", *common,
                         "--kubelet-dir", str(node.device_plugins),
                         "--pod-resources-socket", str(node.kubelet_root / "pod-resources" / "kubelet.sock"),
                         "--metrics-listen", f"127.0.0.1:{node.metrics_port}", *self.plugin_args)
        node.plugin = self._proc(f"{'dra' if self.dra else 'device'}-plugin-{node.name}", argv, env=env)

    def start(self) -> UpstreamCluster:
        """Start everything and wait until every node is Ready and advertises its GPUs."""
        self._make_pki()
        self._start_etcd()
        self._start_apiserver()
        self._apply_deploy()
        self._start_controller_manager()
        if self.scheduler_replicas > 1:
            self.proxies = [PartitionProxy("127.0.0.1", self.api_port).start()
                            for _ in range(self.scheduler_replicas)]
        for replica in range(self.scheduler_replicas):
            self._start_scheduler(replica)
            self._start_extender(replica)
        self.wait("an extender serving beside the leading kube-scheduler", lambda: self.serving_replica() is not None,
                  60, proc=self.procs["extender"])
        if self.webhook_configuration is not None:
            self._start_webhook()
        for node in self.nodes:
            self._start_node(node)
        for node in self.nodes:
            self.wait(f"{node.name} Ready", partial(self._node_ready, node.name), 120, proc=node.kubelet)
            self._start_plugin(node)
        for node in self.nodes:
            self.wait(f"{node.name}'s GPUs advertised", partial(self.gpus_advertised, node.name), 60,
                      proc=node.plugin)
        return self

    def gpus_advertised(self, name: str) -> bool:
        """Whether the node advertises our resource (device-plugin mode) or publishes a ResourceSlice (DRA)."""
        if self.dra:
            slices = self.get("/apis/resource.k8s.io/v1/resourceslices")["items"]
            return any(s["spec"].get("nodeName") == name for s in slices)
        allocatable = self.get(f"/api/v1/nodes/{name}")["status"].get("allocatable", {})
        return int(allocatable.get("volcano.sh/vgpu-number", "0")) > 0

    def stop(self) -> None:
        """Stop our components, the nodes (containers included) and the control plane; leaves nothing running."""
        for node in self.nodes:
            for proc in (node.plugin, node.kubelet):
                if proc is not None:
                    proc.stop()
        for node in self.nodes:
            if node.containerd is not None:
                node.containerd.stop()
            if node.holder is not None:
                node.holder.stop()
            remove_cgroup(node.cgroups)
        replicas = [f"{program}{'' if r == 0 else f'-{r}'}" for r in range(self.scheduler_replicas)
                    for program in ("kube-scheduler", "extender")]
        for name in (*replicas, "webhook", "kube-controller-manager", "kube-apiserver", "etcd"):
            if name in self.procs:
                self.procs[name].stop()
        for proxy in self.proxies:
            proxy.stop()
        if self._http is not None:
            self._http.close()

    def __enter__(self) -> UpstreamCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- pods
    def pod_logs(self, namespace: str, name: str, container: str) -> str:
        """A container's log, read through kube-apiserver from the kubelet (`kubectl logs`)."""
        return self.kubectl("logs", "-n", namespace, name, "-c", container).stdout

    def events(self, namespace: str, name: str) -> list[str]:
        """The reasons and messages of the events about one object."""
        items = self.get(f"/api/v1/namespaces/{namespace}/events",
                         fieldSelector=f"involvedObject.name={name}")["items"]
        return [f"{e.get('reason')}: {e.get('message')}" for e in items]

    def describe(self) -> str:
        """What a failed test shows: the nodes, the pods, recent events and each process's log tail."""
        parts = [self.kubectl("get", "nodes,pods", "-A", "-o", "wide", check=False).stdout,
                 self.kubectl("get", "events", "-A", check=False).stdout[-4000:]]
        parts += [f"--- {p.name}\n{p.tail(15)}" for p in self.procs.values()]
        return "\n".join(parts)

    def manifest(self) -> dict:
        """What testbed/upstream/build.sh recorded: versions and build times."""
        return json.loads((self.bin.parent / "manifest.json").read_text())
