"""TEST INFRASTRUCTURE: a whole cluster in a box, as real processes on this machine.

Shared by `vgpu demo` and tests/e2e. `LocalCluster` starts, each as its own process group with its log under
`<workdir>/logs/`:
  * the API-server stand-in (`python -m vgpu.testbed.apiserver`, persistent, so it can be killed and restarted);
  * per node: a kubelet stand-in that runs admitted pods as local processes (`python -m vgpu.testbed.podrunner`),
    and our real device plugin (`vgpu device-plugin --backend nvml`) registered with it over unix sockets. A node's
    GPUs are the test bed's own description (testbed/machine.py): the plugin finds them through the simulated
    libnvidia-ml.so.1, as it finds real ones through NVML, and the pod runner gives containers the same GPUs;
  * our real extender (`vgpu scheduler`) and the kube-scheduler stand-in (`python -m vgpu.testbed.scheduler_driver`)
    reading deploy/'s KubeSchedulerConfiguration.
With `admission_policies` (ValidatingAdmissionPolicies and bindings, such as deploy/admission's), the API server
authenticates every component by a token of its own, as the identity it has in a real cluster (our scheduler and
plugins as their ServiceAccounts, a plugin's token bound to a pod on its node, kubelets as `system:node:<name>`,
kube-scheduler as `system:kube-scheduler`), evaluates the policies on every write, and `tenant_kubeconfig` is a
tenant's (a plain user); the harness itself stays a cluster admin.
With `webhook_configuration` (a MutatingWebhookConfiguration, such as the Helm chart's), our admission webhook
(`vgpu webhook`) runs too, over HTTPS with a certificate of the test bed's own CA, and is registered by that
configuration with each clientConfig pointed at it by URL (the stand-in has no Service network), so pods are created
unedited and opted in by it.
With `graceful_deletion`, the API server deletes pods as kube-apiserver does (`--graceful-deletion`): a deleted
pod is terminating (deletionTimestamp) until its node's kubelet stand-in has stopped its processes (SIGTERM, SIGKILL
after the grace period), released its devices, written its final status and removed it.
Each piece can be killed (SIGKILL to its process group), stopped and restarted on the same ports and paths, which
is what the fault tests do. `stop()` (also run at interpreter exit) ends every group it started, whatever
happened before.
"""

from __future__ import annotations

import atexit
import base64
import copy
import ctypes
import fcntl
import logging
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Any

import httpx
import orjson

from vgpu.testbed.admission import POLICY_PLURALS
from vgpu.testbed.apiserver import write_kubeconfig
from vgpu.testbed.machine import MachineGPU, machine
from vgpu.testbed.pki import make_pki

ADMIN_TOKEN = "standin"  # the token of the kubeconfig the API server writes (testbed.apiserver.write_kubeconfig)

__all__ = ["LocalCluster", "NodeProcs", "Proc", "free_port", "isolation_paths", "memory_factor_for", "port_or_free",
           "release_port"]

log = logging.getLogger(__name__)

_LIVE: set[Proc] = set()
_LIVE_LOCK = threading.Lock()


_HANDED_OUT: set[int] = set()
_RESERVED: dict[int, IO[str]] = {}  # preferred ports this process holds, each by a lock on a file (port_or_free)
_PORTS_LOCK = threading.Lock()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now, for a process started later to listen on.

    Drawn below the kernel's ephemeral range, so an outgoing connection cannot take it as its local port before the
    listener binds it, and never handed out twice by this process."""
    low = max(1025, _ephemeral_low())
    rng = random.Random()
    with _PORTS_LOCK:
        for _ in range(200):
            port = rng.randrange(max(1024, low - 12000), low)
            if port in _HANDED_OUT:
                continue
            with socket.socket() as sock:
                try:
                    sock.bind(("", port))
                except OSError:
                    continue
            _HANDED_OUT.add(port)
            return port
    with socket.socket() as sock:  # the range below is crowded: any free port
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_or_free(preferred: int, host: str = "127.0.0.1") -> int:
    """`preferred` if it can be bound on all interfaces and no other cluster (of this process or another, such as a
    second `vgpu demo` started at the same moment) has reserved it, else a free port.  The reservation is an
    exclusive lock on a file named after the port, held until `release_port` or the process's exit, so that two
    harnesses cannot both pick a port that neither has bound yet."""
    with _PORTS_LOCK:
        if preferred not in _RESERVED:
            lock = open(Path(tempfile.gettempdir()) / f"vgpu-testbed-port-{preferred}.lock", "a")  # noqa: SIM115
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                lock.close()
            else:
                with socket.socket() as sock:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    try:
                        sock.bind(("", preferred))
                    except OSError:
                        lock.close()
                    else:
                        _RESERVED[preferred] = lock
                        return preferred
    return free_port(host)


def release_port(port: int) -> None:
    """Give back a port `port_or_free` reserved (its listener has stopped)."""
    with _PORTS_LOCK:
        lock = _RESERVED.pop(port, None)
    if lock is not None:
        lock.close()


def isolation_paths() -> tuple[Path, Path]:
    """(libvgpu.so, directory of the simulated libcuda.so.1 / libnvidia-ml.so.1), building them if needed; raises
    vgpu.isolation.build.BuildError when they cannot be built."""
    from vgpu.isolation.build import ensure_built
    from vgpu.testbed.build import ensure_sim_built

    return ensure_built().libvgpu, ensure_sim_built().sim_dir


def memory_factor_for(gpus: str) -> int:
    """The smallest power-of-two MiB per memory unit that keeps a node with `gpus` within kubelet's budget."""
    from vgpu.deviceplugin.config import MEMORY_ENTRY_BUDGET
    from vgpu.testbed.machine import total_memory_mib

    total = total_memory_mib(gpus)
    factor = 1
    while total // factor > MEMORY_ENTRY_BUDGET:
        factor *= 2
    return factor


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Proc:
    """A child process in its own process group; stdout and stderr go to `log_path`."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> Proc:
        """Start (or start again)."""
        if self.alive:
            return self
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(self.env or {})
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(f"--- start {time.strftime('%H:%M:%S')} {' '.join(self.argv)}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=env, cwd=str(self.cwd) if self.cwd else None, start_new_session=True,
                                          preexec_fn=_die_with_parent)
        self.starts += 1
        with _LIVE_LOCK:
            _LIVE.add(self)
        return self

    @property
    def alive(self) -> bool:
        """Whether the process is running."""
        return self.popen is not None and self.popen.poll() is None

    @property
    def pid(self) -> int | None:
        """The process id (also the process group id)."""
        return self.popen.pid if self.popen else None

    def _signal_group(self, sig: int) -> None:
        if self.popen is None:
            return
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """SIGKILL the whole process group, as a crash would."""
        if self.popen is None:
            return
        self._signal_group(signal.SIGKILL)
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            pass
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def stop(self, timeout: float = 8.0) -> None:
        """SIGTERM the group, then SIGKILL what is left after `timeout`."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self._signal_group(signal.SIGKILL)  # stragglers in the group
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def tail(self, lines: int = 20) -> str:
        """The end of this process's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _kill_all_live() -> None:
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for proc in procs:
        proc._signal_group(signal.SIGKILL)


atexit.register(_kill_all_live)


def _vgpu(*args: str) -> list[str]:
    return [sys.executable, "-m", "vgpu.cli", *args]


@dataclass(slots=True)
class NodeProcs:
    """The processes and paths of one simulated node."""

    name: str
    dir: Path
    kubelet_dir: Path
    hook_path: Path
    metrics_port: int
    kubelet: Proc | None = None
    plugin: Proc | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    gpus: list[MachineGPU] = field(default_factory=list)  # the node's GPUs, as the test bed describes the node
    plugins_registry: Path | None = None  # where DRA plugins register with the node's kubelet stand-in
    cdi_dir: Path | None = None  # CDI specs the node's kubelet stand-in resolves DRA devices against


class LocalCluster:
    """The API server, N GPU nodes, the extender and the scheduling driver; see the module docstring."""

    def __init__(self, workdir: str | os.PathLike[str], nodes: int = 3, gpus: str | list[str] = "4xA100-40GB",
                 scheduler_config: str | None = None, metrics_port: int = 9394, scheduler_metrics_port: int = 9395,
                 node_cpu: str = "64", node_memory: str = "256Gi", log_level: str = "INFO",
                 scheduler_args: Iterable[str] = (), plugin_args: Iterable[str] = (),
                 unschedulable_flush: float = 5.0, memory_factor: int | None = None,
                 resource_mode: str = "mib", cgroup_root: str | None = None, container_runtime: str = "processes",
                 dra: bool = False, admission_policies: Iterable[dict] | None = None,
                 webhook_configuration: dict | None = None, webhook_args: Iterable[str] = (),
                 graceful_deletion: bool = False) -> None:
        self.workdir = Path(workdir).resolve()
        self.dra = dra
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs = self.workdir / "logs"
        self.n_nodes = nodes
        self.gpus = gpus
        self.node_cpu, self.node_memory = node_cpu, node_memory
        self.log_level = log_level
        self.scheduler_args = list(scheduler_args) + (["--dra"] if dra else [])
        self.plugin_args = list(plugin_args)
        self.unschedulable_flush = unschedulable_flush
        from vgpu.testbed.scheduler_driver import find_deploy_config

        config = scheduler_config or find_deploy_config(dra=dra)
        if config is None:
            # deploy/ has no KubeSchedulerConfiguration in this tree: fall back to the driver's built-in copy
            self.scheduler_config: str | None = None
        else:
            self.scheduler_config = str(config)
        self.api_port = free_port()
        self.url = f"http://127.0.0.1:{self.api_port}"
        self.kubeconfig = str(self.workdir / "kubeconfig")
        self.admission_policies = list(admission_policies) if admission_policies is not None else None
        self.tenant_kubeconfig = self.kubeconfig
        self.extender_port = free_port()
        # preferred ports (the contract's :9394 / :9395) when free, else (or when 0) any free port
        self.scheduler_metrics_port = port_or_free(scheduler_metrics_port) if scheduler_metrics_port else free_port()
        first_metrics = port_or_free(metrics_port) if metrics_port else 0
        self.nodes: list[NodeProcs] = []
        for i in range(nodes):
            name = f"node-{i}"
            ndir = self.workdir / name
            port = first_metrics if i == 0 and first_metrics else free_port()
            self.nodes.append(NodeProcs(name=name, dir=ndir, kubelet_dir=ndir / "device-plugins",
                                        hook_path=ndir / "hook",
                                        metrics_port=port, plugins_registry=ndir / "plugins_registry",
                                        cdi_dir=ndir / "cdi"))
        per_node = [gpus] * nodes if isinstance(gpus, str) else list(gpus)
        if len(per_node) != nodes:
            raise ValueError(f"gpus: {len(per_node)} specs for {nodes} nodes")
        # "mib" (the plugin's default): vgpu-memory is MiB everywhere; "devices": Volcano's layout, memory counted
        # in units of the factor each node needs, told to the extender too (the sharing section they share)
        self.resource_mode = resource_mode
        if resource_mode == "mib":
            self.memory_factor = 1
        else:
            self.memory_factor = memory_factor or max(memory_factor_for(spec) for spec in per_node)
        mode_args = ["--resource-mode", resource_mode]
        if resource_mode == "devices":
            mode_args += ["--gpu-memory-factor", str(self.memory_factor)]
            sharing = self.workdir / "scheduler-sharing.yaml"
            sharing.write_text(f"sharing:\n  gpu_memory_factor: {self.memory_factor}\n")
            self.scheduler_args = ["--config", str(sharing), *self.scheduler_args]
        self.webhook: Proc | None = None
        self.webhook_configuration = webhook_configuration
        if webhook_configuration is not None:
            self.webhook_port = free_port()
            (self.workdir / "webhook-pki").mkdir(exist_ok=True)
            self.webhook_pki = make_pki(self.workdir / "webhook-pki")
            # the scheduler's configuration file, whose sharing section the webhook reads too
            shared = self.scheduler_args[self.scheduler_args.index("--config"):][:2] \
                if "--config" in self.scheduler_args else []
            self.webhook = Proc("webhook", _vgpu(
                "--log-level", log_level, "webhook", "--listen", f"127.0.0.1:{self.webhook_port}",
                "--tls-cert-file", str(self.webhook_pki["cert"]), "--tls-private-key-file",
                str(self.webhook_pki["key"]), *shared, *webhook_args), self.logs / "webhook.log")
        self.trace = self.workdir / "trace.jsonl"
        identity = self._identities() if self.admission_policies is not None else {}
        users_args = ["--users-file", str(self.workdir / "users.json")] if identity else []
        self.apiserver = Proc("apiserver", [
            sys.executable, "-m", "vgpu.testbed.apiserver", "--listen", f"127.0.0.1:{self.api_port}",
            "--data", str(self.workdir / "apiserver.json"), "--kubeconfig-out", self.kubeconfig,
            "--history", "200000", *users_args, *(["--graceful-deletion"] if graceful_deletion else [])],
            self.logs / "apiserver.log")
        self.extender = Proc("extender", _vgpu(
            "--log-level", log_level, "scheduler", "--kubeconfig", identity.get("extender", self.kubeconfig),
            "--listen", f"127.0.0.1:{self.extender_port}",
            "--metrics-listen", f"0.0.0.0:{self.scheduler_metrics_port}",
            *self.scheduler_args), self.logs / "extender.log")
        driver_args = [sys.executable, "-m", "vgpu.testbed.scheduler_driver", "--kubeconfig",
                       identity.get("kube-scheduler", self.kubeconfig),
                       "--extender-url", f"http://127.0.0.1:{self.extender_port}", "--trace", str(self.trace),
                       "--unschedulable-flush", str(unschedulable_flush), "--log-level", log_level]
        driver_args += ["--config", self.scheduler_config] if self.scheduler_config else ["--builtin-config"]
        self.driver = Proc("scheduler-driver", driver_args, self.logs / "scheduler-driver.log")
        # the plugins read each node's GPUs through NVML, the simulated libnvidia-ml.so.1 over the test bed's
        # description of the node, which the node's pods get too; with a cgroup root each container runs in a
        # cgroup of its own
        for node, node_gpus in zip(self.nodes, per_node):
            node.extra["gpus"] = node_gpus
            node.gpus = machine(node_gpus, node.name)
            cgroup_args = ["--cgroup-root", f"{cgroup_root}/{node.name}"] if cgroup_root else []
            if cgroup_root:
                Path(cgroup_root, node.name).mkdir(parents=True, exist_ok=True)
            node.kubelet = Proc(f"kubelet-{node.name}", [
                sys.executable, "-m", "vgpu.testbed.podrunner", "--node-name", node.name,
                "--kubelet-dir", str(node.kubelet_dir), "--kubeconfig",
                identity.get(f"kubelet-{node.name}", self.kubeconfig), "--workdir", str(node.dir),
                "--trace", str(self.trace), "--gpus", node_gpus, "--sim-dir", str(isolation_paths()[1]),
                "--runtime", container_runtime,
                "--cpu", node_cpu,
                "--memory", node_memory, "--log-level", log_level, *cgroup_args,
                "--plugins-registry", str(node.plugins_registry), "--cdi-dir", str(node.cdi_dir)],
                self.logs / f"kubelet-{node.name}.log")
            source = ["--backend", "nvml", *cgroup_args]
            plugin_kubeconfig = identity.get(f"plugin-{node.name}", self.kubeconfig)
            if dra:
                node.plugin = self._dra_plugin(node, source, log_level, plugin_kubeconfig)
                continue
            node.plugin = Proc(f"device-plugin-{node.name}", _vgpu(
                "--log-level", log_level, "device-plugin", *source,
                "--node-name", node.name, "--kubelet-dir", str(node.kubelet_dir), "--hook-path", str(node.hook_path),
                "--lock-dir", str(node.dir / "vgpulock"), "--kubeconfig", plugin_kubeconfig,
                "--metrics-listen", f"0.0.0.0:{node.metrics_port}",
                *mode_args, *self.plugin_args), self.logs / f"device-plugin-{node.name}.log",
                env=self.nvml_env(node))
        # the harness is a cluster admin: the token the API server's own kubeconfig carries
        self._http = httpx.Client(base_url=self.url, timeout=10, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        self._core: Any = None

    # -- helpers
    def _identities(self) -> dict[str, str]:
        """Write the API server's users file and one kubeconfig per component; the kubeconfig path of each."""
        sa = "system:serviceaccount:vgpu-system:{}"
        sa_groups = ["system:serviceaccounts", "system:serviceaccounts:vgpu-system", "system:authenticated"]
        users: dict[str, dict[str, Any]] = {
            ADMIN_TOKEN: {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
            "tenant": {"username": "tenant@example.com", "groups": ["tenants", "system:authenticated"]},
            "extender": {"username": sa.format("vgpu-scheduler-extender"), "groups": sa_groups},
            "kube-scheduler": {"username": "system:kube-scheduler", "groups": ["system:authenticated"]},
        }
        plugin = "vgpu-dra-plugin" if self.dra else "vgpu-device-plugin"
        for node in self.nodes:
            users[f"kubelet-{node.name}"] = {"username": f"system:node:{node.name}",
                                             "groups": ["system:nodes", "system:authenticated"]}
            users[f"plugin-{node.name}"] = {"username": sa.format(plugin), "groups": sa_groups,
                                            "extra": {"authentication.kubernetes.io/node-name": [node.name]}}
        (self.workdir / "users.json").write_bytes(orjson.dumps(users, option=orjson.OPT_INDENT_2))
        paths = {role: write_kubeconfig(self.workdir / f"kubeconfig-{role}", self.url, token=role)
                 for role in users if role != ADMIN_TOKEN}
        self.tenant_kubeconfig = paths["tenant"]
        return paths

    def _dra_plugin(self, node: NodeProcs, source: list[str], log_level: str, kubeconfig: str) -> Proc:
        """DRA mode: the node's GPUs are served by our real `vgpu dra-plugin`, registered with the kubelet
        stand-in through its plugin registry and writing CDI specs where the stand-in reads them."""
        return Proc(f"dra-plugin-{node.name}", _vgpu(
            "--log-level", log_level, "dra-plugin", *source, "--node-name", node.name,
            "--plugins-dir", str(node.dir / "plugins"), "--registry-dir", str(node.plugins_registry),
            "--cdi-dir", str(node.cdi_dir), "--hook-path", str(node.hook_path),
            "--lock-dir", str(node.dir / "vgpulock"), "--kubeconfig", kubeconfig, *self.plugin_args),
            self.logs / f"dra-plugin-{node.name}.log", env=self.nvml_env(node))

    @property
    def core(self) -> Any:
        """A kubernetes CoreV1Api on the stand-in (created on first use)."""
        if self._core is None:
            from kubernetes import client as k8s

            from vgpu.kube.client import make_api_client

            self._core = k8s.CoreV1Api(make_api_client(self.kubeconfig, qps=1000, burst=2000))
        return self._core

    def api_get(self, path: str) -> Any:
        """GET a path of the API server as JSON (None when it does not answer)."""
        try:
            resp = self._http.get(path)
        except httpx.HTTPError:
            return None
        return orjson.loads(resp.content) if resp.status_code == 200 else None

    def pods(self) -> list[dict]:
        """Every pod."""
        return (self.api_get("/api/v1/pods") or {}).get("items") or []

    def node_objects(self) -> list[dict]:
        """Every node."""
        return (self.api_get("/api/v1/nodes") or {}).get("items") or []

    def events(self) -> list[dict]:
        """Every core/v1 event."""
        return (self.api_get("/api/v1/events") or {}).get("items") or []

    def create_pod(self, pod: dict, namespace: str | None = None) -> dict:
        """Create a pod (retrying while the API server is restarting)."""
        ns = namespace or (pod.get("metadata") or {}).get("namespace") or "default"
        for _attempt in range(50):
            try:
                resp = self._http.post(f"/api/v1/namespaces/{ns}/pods", content=orjson.dumps(pod),
                                       headers={"Content-Type": "application/json"})
            except httpx.HTTPError:
                time.sleep(0.2)
                continue
            if resp.status_code in (200, 201):
                return orjson.loads(resp.content)
            raise RuntimeError(f"create pod {ns}/{(pod.get('metadata') or {}).get('name')}: {resp.status_code} "
                               f"{resp.text[:300]}")
        raise RuntimeError("create pod: API server does not answer")

    def api_post(self, path: str, body: dict) -> dict:
        """Create an object at `path`; an object that exists already is left as it is (409)."""
        resp = self._http.post(path, content=orjson.dumps(body), headers={"Content-Type": "application/json"})
        if resp.status_code == 409:
            return body
        if resp.status_code not in (200, 201):
            raise RuntimeError(f"POST {path}: {resp.status_code} {resp.text[:300]}")
        created: dict = orjson.loads(resp.content)
        return created

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod (with `graceful_deletion` it goes once its kubelet stand-in has ended it)."""
        try:
            self._http.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except httpx.HTTPError:
            pass

    def patch_node(self, name: str, patch: dict) -> None:
        """Merge-patch a node (metadata or spec)."""
        self._http.patch(f"/api/v1/nodes/{name}", content=orjson.dumps(patch),
                         headers={"Content-Type": "application/merge-patch+json"})

    @staticmethod
    def wait(what: str, predicate: Callable[[], Any], timeout: float, interval: float = 0.2,
             procs: Iterable[Proc | None] = ()) -> Any:
        """Poll `predicate` until truthy; raise TimeoutError naming `what` (with logs of dead processes)."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            for proc in procs:
                if proc is not None and not proc.alive:
                    raise RuntimeError(f"{proc.name} exited while waiting for {what}:\n{proc.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(interval)

    # -- start / stop of the pieces
    def start_apiserver(self, timeout: float = 20.0) -> None:
        """Start (or restart) the API-server stand-in and wait until it answers."""
        self.apiserver.start()
        self.wait("the API server", lambda: self.api_get("/api/v1/nodes") is not None, timeout,
                  procs=[self.apiserver])

    def ensure_node_object(self, node: NodeProcs) -> None:
        """Create the Node object if the kubelet stand-in has not (cpu/memory/pods allocatable)."""
        if self.api_get(f"/api/v1/nodes/{node.name}") is not None:
            return
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node.name, "labels": {"kubernetes.io/hostname": node.name,
                                                           "nvidia.com/gpu.present": "true"}},
                "status": {"capacity": {"cpu": self.node_cpu, "memory": self.node_memory, "pods": "250"},
                           "allocatable": {"cpu": self.node_cpu, "memory": self.node_memory, "pods": "250"}}}
        self._http.post("/api/v1/nodes", content=orjson.dumps(body), headers={"Content-Type": "application/json"})

    def _prepare_node(self, node: NodeProcs) -> None:
        node.dir.mkdir(parents=True, exist_ok=True)
        node.kubelet_dir.mkdir(parents=True, exist_ok=True)
        node.hook_path.mkdir(parents=True, exist_ok=True)
        self.ensure_node_object(node)

    def start_node(self, node: NodeProcs, timeout: float = 60.0) -> None:
        """Start a node's kubelet stand-in, then its device plugin; wait until its GPUs are published."""
        self._prepare_node(node)
        assert node.kubelet is not None and node.plugin is not None
        node.kubelet.start()
        self.wait(f"kubelet stand-in of {node.name}", lambda: self._kubelet_ready(node), timeout,
                  procs=[node.kubelet])
        node.plugin.start()
        self.wait(f"GPUs of {node.name}", lambda: self.node_ready(node.name), timeout,
                  procs=[node.kubelet, node.plugin])

    def _kubelet_ready(self, node: NodeProcs) -> bool:
        from vgpu.testbed import compat

        return compat.kubelet_ready(node.kubelet_dir)

    def node_ready(self, name: str) -> bool:
        """The node publishes an inventory and kubelet advertises vgpu-number (DRA mode: its ResourceSlice is
        published and its kubelet stand-in registered the driver)."""
        from vgpu import keys

        if self.dra:
            return self._dra_node_ready(name)

        node = self.api_get(f"/api/v1/nodes/{name}")
        if not node:
            return False
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        try:
            count = int(allocatable.get("volcano.sh/vgpu-number", "0"))
        except ValueError:
            count = 0
        return bool(annotations.get(keys.NODE_REGISTER)) and count > 0

    def _dra_node_ready(self, name: str) -> bool:
        slices = (self.api_get("/apis/resource.k8s.io/v1/resourceslices") or {}).get("items") or []
        published = any((s.get("spec") or {}).get("nodeName") == name and (s.get("spec") or {}).get("devices")
                        for s in slices)
        node = next((n for n in self.nodes if n.name == name), None)
        registered = node is not None and bool(self.dra_status(node).get("drivers"))
        return published and registered

    def resource_get(self, kind: str, namespace: str | None = None) -> list[dict]:
        """Every object of a resource.k8s.io/v1 kind (`resourceslices`, `resourceclaims`, ...)."""
        where = f"/namespaces/{namespace}" if namespace else ""
        return (self.api_get(f"/apis/resource.k8s.io/v1{where}/{kind}") or {}).get("items") or []

    def start_extender(self, timeout: float = 30.0) -> None:
        """Start (or restart) `vgpu scheduler` and wait for /readyz."""
        self.extender.start()

        def ready() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{self.extender_port}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        self.wait("the extender", ready, timeout, procs=[self.extender])

    def start_webhook(self, timeout: float = 30.0) -> None:
        """Start (or restart) `vgpu webhook`, wait for its /healthz over HTTPS, and register it (once)."""
        assert self.webhook is not None
        self.webhook.start()
        ca = self.webhook_pki["ca"]

        def ready() -> bool:
            try:
                return httpx.get(f"https://127.0.0.1:{self.webhook_port}/healthz", timeout=2,
                                 verify=ssl.create_default_context(cafile=str(ca))).status_code == 200
            except httpx.HTTPError:
                return False

        self.wait("the webhook", ready, timeout, procs=[self.webhook])
        assert self.webhook_configuration is not None
        doc = copy.deepcopy(self.webhook_configuration)
        path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
        if self.api_get(f"{path}/{doc['metadata']['name']}") is None:
            bundle = base64.b64encode(ca.read_bytes()).decode()
            for hook in doc.get("webhooks") or ():
                where = (hook.get("clientConfig") or {}).get("service") or {}
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{self.webhook_port}{where.get('path', '/')}",
                                        "caBundle": bundle}
            self.api_post(path, doc)

    def start_driver(self, timeout: float = 30.0) -> None:
        """Start (or restart) the kube-scheduler stand-in and wait for its `ready` line."""
        size = self.driver.log_path.stat().st_size if self.driver.log_path.exists() else 0
        self.driver.start()

        def ready() -> bool:
            try:
                with open(self.driver.log_path, "rb") as handle:
                    handle.seek(size)
                    return b"\nready " in b"\n" + handle.read()
            except OSError:
                return False

        self.wait("the scheduler driver", ready, timeout, procs=[self.driver])

    def start(self) -> LocalCluster:
        """Start everything, in dependency order (independent pieces in parallel)."""
        try:
            self.start_apiserver()
            for doc in self.admission_policies or ():
                self.api_post(f"/apis/admissionregistration.k8s.io/v1/{POLICY_PLURALS[doc['kind']]}", doc)
            if self.webhook is not None:
                self.start_webhook()
            self.extender.start()
            for node in self.nodes:
                self._prepare_node(node)
                assert node.kubelet is not None
                node.kubelet.start()
            for node in self.nodes:
                self.wait(f"kubelet stand-in of {node.name}", partial(self._kubelet_ready, node), 60,
                          procs=[node.kubelet])
            for node in self.nodes:
                assert node.plugin is not None
                node.plugin.start()
            for node in self.nodes:
                self.wait(f"GPUs of {node.name}", partial(self.node_ready, node.name), 60,
                          procs=[node.kubelet, node.plugin])
            self.start_extender()
            self.start_driver()
        except BaseException:
            self.stop()
            raise
        return self

    def processes(self) -> list[Proc]:
        """Every process of the cluster."""
        procs = [self.apiserver, self.extender, self.driver, *([self.webhook] if self.webhook else [])]
        for node in self.nodes:
            procs += [p for p in (node.kubelet, node.plugin) if p is not None]
        return procs

    def stop(self) -> None:
        """Stop every process (scheduler side first, the API server last); never raises."""
        order = [self.driver, self.extender, *([self.webhook] if self.webhook else [])]
        for node in self.nodes:
            order += [p for p in (node.plugin, node.kubelet) if p is not None]
        order.append(self.apiserver)
        for proc in order:
            try:
                proc.stop(timeout=5)
            except Exception:
                log.exception("stopping %s", proc.name)
        for node in self.nodes:
            self.kill_orphan_pods(node)
        for port in (self.scheduler_metrics_port, *(node.metrics_port for node in self.nodes)):
            release_port(port)
        self._http.close()

    def kill_orphan_pods(self, node: NodeProcs) -> None:
        """Kill pod processes a killed kubelet stand-in left behind (from its state files)."""
        for state in (node.dir / "pods").glob("*.json"):
            try:
                pids = orjson.loads(state.read_bytes()).get("pids") or {}
            except (OSError, orjson.JSONDecodeError):
                continue
            for pid in pids.values():
                try:
                    os.killpg(int(pid), signal.SIGKILL)
                except (ProcessLookupError, PermissionError, ValueError):
                    pass

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def nvml_env(self, node: NodeProcs) -> dict[str, str]:
        """The environment under which a process sees all of `node`'s GPUs through the simulated
        libnvidia-ml.so.1: the test bed's description of the node and the node's simulated GPU state."""
        from vgpu.testbed.build import ensure_sim_built
        from vgpu.testbed.machine import simgpu_env

        env = simgpu_env(node.gpus, node.dir / "simgpu")
        env["LD_LIBRARY_PATH"] = str(ensure_sim_built().sim_dir)
        return env

    # -- fault injection
    def inject_gpu_fault(self, node: NodeProcs, gpu: int | str, command: str = "xid", code: int = 79) -> None:
        """Through the node's simulated NVML: an Xid event (`xid`), the GPU falling off the bus (`lost`) or coming
        back (`recover`); `gpu` is an NVML index or a UUID."""
        import ctypes

        from vgpu.testbed.build import ensure_sim_built

        uuid = node.gpus[int(gpu)].uuid if isinstance(gpu, int) or str(gpu).isdigit() else str(gpu)
        os.environ["SIMGPU_STATE"] = self.nvml_env(node)["SIMGPU_STATE"]
        nvml = ctypes.CDLL(str(ensure_sim_built().sim_libnvml))
        nvml.simgpu_fault.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint]
        if nvml.simgpu_fault(uuid.encode(), command.encode(), code):
            raise RuntimeError(f"simulated NVML: no GPU {uuid} on {node.name}")

    def dra_status(self, node: NodeProcs) -> dict[str, Any]:
        """What the node's kubelet stand-in reports of DRA (`<node dir>/dra-status.json`): registered drivers,
        rejected plugin sockets, per pod the prepared claims and container edits, pending unprepares."""
        try:
            status: dict[str, Any] = orjson.loads((node.dir / "dra-status.json").read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        return status

    def read_trace(self) -> list[dict]:
        """The JSON lines the driver and the kubelets appended to the trace file."""
        if not self.trace.exists():
            return []
        out = []
        for line in self.trace.read_bytes().splitlines():
            try:
                out.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue
        return out
