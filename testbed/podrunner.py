"""TEST INFRASTRUCTURE: runs an admitted pod's containers as local processes, as kubelet + a container runtime would.

Called by the kubelet stand-in once a pod is admitted (GetPreferredAllocation + Allocate done for every container).
Without a container runtime we cannot mount, so the runner turns what the device plugin answered into what the
process sees through its environment instead, faithfully to what the container would see:

  * env: the envs of every ContainerAllocateResponse, then the container's `env` (plain values and the downward-API
    fields kubelet resolves), in kubelet's order: it lists the device plugins' variables first and the spec's after
    them, and the runtime keeps the last value of a name, so a container's own `env` wins; the CDI edits of the
    container's DRA devices (testbed/cdi.py) come last, as the runtime applies them to the finished spec;
  * a path in an env value that lies under a mount's container path is rewritten to the mount's host path, so
    `CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/vgpu/<uuid4>.cache` becomes
    `$HOOK_PATH/vgpu/containers/<podUID>_<container>/<uuid4>.cache` (the file the node monitor reads);
  * the `/etc/ld.so.preload` mount cannot be bind-mounted without privileges: its host file is read, each listed
    library is mapped through the mounts (`/usr/local/vgpu/libvgpu.so` -> its host path, where the device plugin
    installs it) and put in `LD_PRELOAD`. No such mount (the plugin omits it when the container sets
    CUDA_DISABLE_CONTROL) means no preload, as in a real container. A read-only mount whose host file is missing
    fails the container's start (StartError), as a container runtime refuses to bind-mount it;
  * the `/usr/local/vgpu/limits.env` mount (the plugin's read-only copy of the container's variables, which
    libvgpu.so reads instead of the environment where it exists) cannot be bind-mounted either: the runner writes
    the host file's lines, container paths mapped to host paths as for env values, to a file of its own under the
    simulated state directory and names it in `VGPU_LIMITS_FILE`, which the library reads only where that path is
    absent, as it is for these processes; set after the spec's env, since in a container the pod cannot remove the
    mount;
  * the GPU: the node's GPUs are the test bed's own description of it (testbed/machine.py, from `--gpus`), never
    what a plugin published. `NVIDIA_VISIBLE_DEVICES` selects which of them the process's `libcuda.so.1` and
    `libnvidia-ml.so.1` (testbed/build/simgpu, first in `LD_LIBRARY_PATH`) expose, each with its UUID and PCI bus
    number on the node, as the NVIDIA container runtime exposes the named devices whatever order they are listed
    in: NVML then enumerates them by bus and CUDA in its own order (`CUDA_DEVICE_ORDER`). A UUID the node does not
    have fails the container's start, as nvidia-container-cli refuses an unknown device.
    Processes on one node share one simulated state file (`<workdir>/simgpu/node.state`, GPUs keyed by UUID), so
    they contend for a GPU's memory and kernel timeline as processes on one real GPU do;
  * with a cgroup root (`--cgroup-root`, a directory of a cgroup v2 hierarchy), each container runs in its own
    cgroup `<root>/kubepods/pod<uid>/standin-<pid>`, as a runtime would place it (removed when it exits).

With `--runtime podman` (testbed/container_runtime.py) each container of a device-plugin pod runs instead as a real
container through podman and runc: the device plugin's envs, then the spec's, and its mounts exactly as answered
(the `/etc/ld.so.preload` bind included, no translation), the node's simulated driver and GPU state mounted where
they are on the host, the test bed's checkout and virtual environment read-only so its Python runs inside. DRA pods
are refused in that mode (podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi, not the node's own
directory), as are cgroup roots.

Pod status is patched through the API server: Running when every container has started (init containers first,
one at a time), then Succeeded or Failed with each container's exit code. Logs go to `<workdir>/logs/`
(`<namespace>_<pod>_<container>.log`, what the container wrote; `.launch.json` beside it, what was started).
A pod removed from the API server (or `stop_pod`) has its process groups killed at once. A pod being deleted
gracefully (metadata.deletionTimestamp, from an API server that deletes pods gracefully) is ended as kubelet ends
it (`terminate_pod`): SIGTERM to each container's main process (a container runtime's stop signal to the
container's first process), SIGKILL to its process group once the grace period is over (pkg/kubelet/pod_workers.go
`calculateEffectiveGracePeriod`: deletionGracePeriodSeconds, at least 1 s, only ever shortened;
pkg/kubelet/kuberuntime/kuberuntime_container.go `killContainer`); then its devices are released and its final
status written (containers terminated with their exit codes, phase Succeeded when all exited 0, else Failed:
pkg/kubelet/kubelet_pods.go `getPhase` of a terminal pod), and last the DELETE with gracePeriodSeconds 0 and the
pod's UID as precondition that removes it (pkg/kubelet/status/status_manager.go `syncPod`, `canBeDeleted`).
"""

from __future__ import annotations

import errno
import logging
import os
import platform
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from vgpu.testbed.container_runtime import Podman, ordered_env
from vgpu.testbed.kubeclient import api_client, read_json
from vgpu.testbed.machine import MachineGPU, UnknownDevice, machine, simgpu_env, visible
from vgpu.testbed.podlogs import ContainerLogServer

__all__ = [
    "ContainerAllocation",
    "PodRunner",
    "handed_out",
    "map_to_host",
    "translate_env",
]

log = logging.getLogger(__name__)

# where the device plugin mounts a container's limits file (the wire contract; isolation/src/env.c reads it)
LIMITS_PATH = "/usr/local/vgpu/limits.env"

Obj = dict[str, Any]
NODE_LEASE_NAMESPACE = "kube-node-lease"  # where kubelets keep their node's Lease
NODE_LEASE_SECONDS = 40  # kubelet's default nodeLeaseDurationSeconds

# SM counts of the simulated models (what NVML would report); unknown cards get 80.
@dataclass(slots=True)
class ContainerAllocation:
    """What kubelet got from the device plugins for one container: envs and mounts (host/container paths)."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)  # (container_path, host_path, read_only)
    runtime_envs: dict[str, str] = field(default_factory=dict)  # set by the runtime (CDI) after the spec's env

    def add_cdi(self, edits: Any) -> None:
        """Add the merged CDI edits of the container's DRA devices (testbed/cdi.py ContainerEdits) as a runtime
        applies them: env after the container's own (a name already set is replaced), a mount on a container path
        already mounted replaces that mount."""
        self.runtime_envs = edits.apply_env(self.runtime_envs)
        for mount in edits.mounts:
            self.mounts = [m for m in self.mounts if m[0] != mount.container_path]
            self.mounts.append((mount.container_path, mount.host_path, mount.read_only))

    def merge(self, response: Any) -> None:
        """Add one ContainerAllocateResponse (protobuf message or dict with envs / mounts)."""
        if isinstance(response, Mapping):
            envs = response.get("envs") or {}
            mounts = response.get("mounts") or []
            self.envs.update({str(k): str(v) for k, v in envs.items()})
            for m in mounts:
                self.mounts.append((m.get("container_path") or m.get("containerPath"),
                                    m.get("host_path") or m.get("hostPath"),
                                    bool(m.get("read_only") or m.get("readOnly"))))
            return
        self.envs.update({str(k): str(v) for k, v in response.envs.items()})
        for m in response.mounts:
            self.mounts.append((m.container_path, m.host_path, bool(m.read_only)))


def handed_out(alloc: ContainerAllocation) -> dict[str, Any]:
    """The limits the device plugin (or its DRA devices' CDI edits) handed a container, from its env: GPU UUIDs in
    CUDA order, MiB on each, and the SM percentage (empty when the container got no GPU)."""
    envs = {**alloc.envs, **alloc.runtime_envs}
    gpus = [u for u in (envs.get("NVIDIA_VISIBLE_DEVICES") or "").split(",") if u and u not in ("all", "none")]
    memory = []
    for i in range(len(gpus)):
        raw = envs.get(f"CUDA_DEVICE_MEMORY_LIMIT_{i}", "")
        memory.append(int(raw[:-1]) if raw.endswith("m") and raw[:-1].isdigit() else 0)
    cores = envs.get("CUDA_DEVICE_SM_LIMIT", "0")
    return {"gpus": gpus, "memory_mib": memory, "cores": int(cores) if cores.isdigit() else 0}


def map_to_host(path: str, mounts: Sequence[tuple[str, str, bool]]) -> str | None:
    """The host path of a container path through the longest matching mount, or None."""
    best: tuple[str, str] | None = None
    for cpath, hpath, _ in mounts:
        if not cpath or not hpath:
            continue
        cpath = cpath.rstrip("/") or "/"
        if (path == cpath or path.startswith(cpath + "/")) and (best is None or len(cpath) > len(best[0])):
            best = (cpath, hpath)
    if best is None:
        return None
    return best[1].rstrip("/") + path[len(best[0]):] if path != best[0] else best[1]


def _downward(pod: Obj, path: str) -> str:
    meta = pod.get("metadata") or {}
    table = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
             "metadata.uid": meta.get("uid"), "spec.nodeName": (pod.get("spec") or {}).get("nodeName"),
             "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName"),
             "status.hostIP": "127.0.0.1", "status.podIP": "127.0.0.1"}
    if path.startswith("metadata.annotations['"):
        return ((meta.get("annotations") or {}).get(path[len("metadata.annotations['"):-2])) or ""
    if path.startswith("metadata.labels['"):
        return ((meta.get("labels") or {}).get(path[len("metadata.labels['"):-2])) or ""
    return str(table.get(path) or "")


def translate_env(pod: Obj, container: Obj, alloc: ContainerAllocation, sim_dir: Path | None,
                  gpus: Sequence[MachineGPU], state_dir: Path) -> dict[str, str]:
    """The environment of the local process standing for `container` on a node with `gpus` (see the module
    docstring); raises FileNotFoundError for a read-only mount whose host file is missing, as a container runtime
    refuses it, and UnknownDevice for a GPU the node does not have."""
    for cpath, hpath, read_only in alloc.mounts:
        if read_only and hpath and not Path(hpath).exists():
            raise FileNotFoundError(f"mount {cpath}: host path {hpath} does not exist")
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TERM") if k in os.environ}
    env["HOSTNAME"] = str((pod.get("metadata") or {}).get("name") or "")
    env["PYTHONUNBUFFERED"] = "1"
    for key, value in alloc.envs.items():
        if value.startswith("/"):
            value = map_to_host(value, alloc.mounts) or value
        env[key] = value
    env.update(_spec_env(pod, container))
    for key, value in alloc.runtime_envs.items():  # CDI edits: the runtime applies them to the finished spec
        env[key] = (map_to_host(value, alloc.mounts) or value) if value.startswith("/") else value
    limits_host = map_to_host(LIMITS_PATH, alloc.mounts)
    if limits_host is not None:
        lines = []
        for line in Path(limits_host).read_text().splitlines():
            name, sep, value = line.partition("=")
            if value.startswith("/"):
                value = map_to_host(value, alloc.mounts) or value
            lines.append(f"{name}{sep}{value}")
        copy = state_dir / "limits" / f"{(pod.get('metadata') or {}).get('uid', '')}_{container.get('name', '')}.env"
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text("".join(f"{line}\n" for line in lines))
        env["VGPU_LIMITS_FILE"] = str(copy)
    # /etc/ld.so.preload -> LD_PRELOAD
    preload_host = map_to_host("/etc/ld.so.preload", alloc.mounts)
    if preload_host is not None:
        libs = []
        for entry in Path(preload_host).read_text().split():
            host = map_to_host(entry, alloc.mounts)
            if host and Path(host).exists():
                libs.append(host)
        if libs:
            env["LD_PRELOAD"] = ":".join(libs + ([env["LD_PRELOAD"]] if env.get("LD_PRELOAD") else []))
    # the simulated GPU behind libcuda.so.1
    if sim_dir is not None:
        env["LD_LIBRARY_PATH"] = str(sim_dir) + (os.pathsep + env["LD_LIBRARY_PATH"]
                                                 if env.get("LD_LIBRARY_PATH") else "")
    env.update(simgpu_env(visible(gpus, _device_names(env.get("NVIDIA_VISIBLE_DEVICES"))), state_dir))
    return env


def _spec_env(pod: Obj, container: Obj) -> dict[str, str]:
    """The container's own `env`: plain values and the downward-API fields kubelet resolves."""
    env: dict[str, str] = {}
    for item in container.get("env") or ():
        name = item.get("name")
        if not name:
            continue
        if "value" in item:
            env[name] = str(item.get("value") or "")
        elif ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath"):
            env[name] = _downward(pod, item["valueFrom"]["fieldRef"]["fieldPath"])
    return env


def _device_names(value: str | None) -> list[str]:
    """The entries of an `NVIDIA_VISIBLE_DEVICES` value."""
    return [u.strip() for u in (value or "").split(",") if u.strip()]


def _argv(container: Obj) -> list[str]:
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    argv = [str(a) for a in command + args] if command or args else ["sleep", "infinity"]
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    if argv[0] in ("sh", "/bin/sh", "bash", "/bin/bash") and len(argv) >= 3 and argv[1] == "-c":
        argv[2] = argv[2].replace("python3 ", shlex.quote(sys.executable) + " ")
    return argv


def _container_name(pod_uid: str, container: str) -> str:
    """The runtime's name of a pod's container (unique per pod UID)."""
    return f"pod-{pod_uid}-{container}"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class _Running:
    pod: Obj
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    statuses: dict[str, Obj] = field(default_factory=dict)
    init_statuses: dict[str, Obj] = field(default_factory=dict)
    adopted_pids: dict[str, int] = field(default_factory=dict)
    stopping: bool = False
    thread: threading.Thread | None = None
    terminating: bool = False  # being deleted gracefully: its final status is followed by the final DELETE
    finished: bool = False  # its final status is written
    kill_at: float = 0.0  # monotonic time of the SIGKILL once terminating
    changed: threading.Event = field(default_factory=threading.Event)  # the grace period was shortened
    signalled: set[int] = field(default_factory=set)  # process groups sent the stop signal


class PodRunner:
    """Runs admitted pods of one node as local processes and reports their phase to the API server."""

    def __init__(self, node_name: str, workdir: str | os.PathLike[str], kubeconfig: str | None = None,
                 api: Any = None, gpus: Sequence[MachineGPU] = (), trace: str | None = None,
                 on_exit: Callable[[Obj, str], None] | None = None, cgroup_root: str | None = None,
                 sim_dir: str | os.PathLike[str] | None = None, runtime: Podman | None = None) -> None:
        self.node_name = node_name
        self.cgroup_root = Path(cgroup_root) if cgroup_root else None
        self.workdir = Path(workdir)
        self.logs = self.workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.state_dir = self.workdir / "simgpu"
        self.pod_state_dir = self.workdir / "pods"
        self.pod_state_dir.mkdir(parents=True, exist_ok=True)
        self.gpus = list(gpus)  # the node's GPUs, as the test bed describes the node
        self._kubeconfig = kubeconfig
        self._api = api
        self.sim_dir = Path(sim_dir) if sim_dir else None  # the node's (simulated) libcuda.so.1, libnvidia-ml.so.1
        self.runtime = runtime  # None: containers run as local processes
        self.pods: dict[str, _Running] = {}
        self.lock = threading.Lock()
        self.on_exit = on_exit
        self._trace = open(trace, "ab", buffering=0) if trace else None  # noqa: SIM115 - closed in close()

    # -- API access
    def _core(self) -> Any:
        if self._api is None:
            from kubernetes import client as k8s

            self._api = k8s.CoreV1Api(api_client(self._kubeconfig, pool_size=32))
        return self._api

    def _patch_status(self, pod: Obj, status: Obj) -> None:
        meta = pod.get("metadata") or {}
        for attempt in range(20):
            try:
                self._core().patch_namespaced_pod_status(meta["name"], meta.get("namespace") or "default",
                                                          {"status": status}, _preload_content=False)
                return
            except Exception as exc:
                code = getattr(exc, "status", 0)
                if code == 404:
                    return
                time.sleep(min(2.0, 0.1 * (attempt + 1)))
        log.warning("pod status not written pod=%s/%s", meta.get("namespace"), meta.get("name"))

    def _record(self, **fields: Any) -> None:
        if self._trace is not None:
            fields.setdefault("t", time.time())
            self._trace.write(orjson.dumps(fields) + b"\n")

    # -- running pods
    def run_pod(self, pod: Obj, allocations: Mapping[str, ContainerAllocation]) -> None:
        """Start the pod's containers (init containers first) with the allocations made for them by name."""
        uid = (pod.get("metadata") or {}).get("uid") or ""
        with self.lock:
            if uid in self.pods:
                return
            running = self.pods[uid] = _Running(pod=pod)
        self._record(ev="admitted", uid=uid, pod=_key(pod), node=self.node_name,
                     limits={name: handed_out(alloc) for name, alloc in allocations.items()})
        running.thread = threading.Thread(target=self._lifecycle, args=(running, dict(allocations)),
                                          name=f"pod-{_key(pod)}", daemon=True)
        running.thread.start()

    def _exit_file(self, uid: str, container: str) -> Path:
        return self.pod_state_dir / f"{uid}_{container}.exit"

    def _container_command(self, pod: Obj, container: Obj, alloc: ContainerAllocation,
                           name: str) -> tuple[list[str], dict[str, str]]:
        """The `podman run` command and its environment for one container (see the module docstring)."""
        assert self.runtime is not None
        if alloc.runtime_envs:
            raise OSError(errno.ENOTSUP, "the podman runtime of the test bed runs device-plugin pods, not CDI devices")
        hardware = simgpu_env(visible(self.gpus, _device_names(alloc.envs.get("NVIDIA_VISIBLE_DEVICES"))),
                              self.state_dir)
        if self.sim_dir is not None:
            hardware["LD_LIBRARY_PATH"] = str(self.sim_dir)
        env = [*ordered_env(alloc.envs, _spec_env(pod, container)), *hardware.items(), ("PYTHONUNBUFFERED", "1")]
        # the test bed's Python inside: its interpreter's installation, the virtual environment, the checkout
        here = sorted({str(Path(p).resolve()) for p in (sys.base_prefix, sys.prefix, Path(__file__).parents[1])})
        mounts = [*alloc.mounts, *((p, p, True) for p in here), (str(self.state_dir), str(self.state_dir), False)]
        if self.sim_dir is not None:
            mounts.append((str(self.sim_dir), str(self.sim_dir), True))
        return self.runtime.run_command(_argv(container), env, mounts, name=name), self.runtime.env

    def _spawn(self, pod: Obj, container: Obj, alloc: ContainerAllocation) -> subprocess.Popen[bytes]:
        meta = pod.get("metadata") or {}
        if self.runtime is not None:
            name = _container_name(meta.get("uid") or "", container.get("name") or "")
            command, env = self._container_command(pod, container, alloc, name)
        else:
            env = translate_env(pod, container, alloc, self.sim_dir, self.gpus, self.state_dir)
            command = _argv(container)
        log_path = self.logs / f"{meta.get('namespace') or 'default'}_{meta.get('name')}_{container.get('name')}.log"
        for _cpath, hpath, read_only in alloc.mounts:
            if not read_only and hpath and not Path(hpath).suffix:
                Path(hpath).mkdir(parents=True, exist_ok=True)  # hostPath DirectoryOrCreate
        exit_file = self._exit_file(meta.get("uid") or "", container.get("name") or "")
        exit_file.unlink(missing_ok=True)
        # a shell keeps the exit status in a file, so that a restarted kubelet stand-in can adopt the "container"
        argv = ["/bin/sh", "-c", 'f=$1; shift; "$@"; rc=$?; echo $rc > "$f"; exit $rc', "sh", str(exit_file),
                *command]
        # what was started, beside the log (the log holds only what the container writes, as `kubectl logs` shows)
        shown = {k: v for k, v in env.items() if k != "PATH"} if self.runtime is None else {}
        log_path.with_suffix(".launch.json").write_bytes(orjson.dumps({"argv": command, "env": shown}))
        with open(log_path, "ab") as out:
            return subprocess.Popen(argv, env=env, cwd=str(self.workdir), stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=None if self.runtime else self._enter_cgroup(meta.get("uid") or ""))

    def _leave_cgroup(self, pod: Obj, pid: int) -> None:
        """Remove an exited container's cgroup (and its pod's, once empty); best effort."""
        if self.cgroup_root is None:
            return
        pod_dir = self.cgroup_root / "kubepods" / f"pod{(pod.get('metadata') or {}).get('uid') or ''}"
        for path in (pod_dir / f"standin-{pid}", pod_dir):
            try:
                path.rmdir()
            except OSError:
                return

    def _enter_cgroup(self, uid: str) -> Callable[[], None] | None:
        """What the child runs before exec to move into its own cgroup (None without a cgroup root)."""
        if self.cgroup_root is None:
            return None
        pod_dir = self.cgroup_root / "kubepods" / f"pod{uid}"

        def enter() -> None:
            ctr = pod_dir / f"standin-{os.getpid()}"
            ctr.mkdir(parents=True, exist_ok=True)
            (ctr / "cgroup.procs").write_text(str(os.getpid()))

        return enter

    def _save_state(self, running: _Running) -> None:
        """Record the pod's processes so that a restarted kubelet stand-in can adopt them."""
        meta = running.pod.get("metadata") or {}
        state = {"uid": meta.get("uid"), "pod": _key(running.pod),
                 "pids": {name: proc.pid for name, proc in running.procs.items()},
                 "statuses": running.statuses, "init_statuses": running.init_statuses}
        path = self.pod_state_dir / f"{meta.get('uid')}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(state))
        os.replace(tmp, path)

    def admitted_before(self, pod: Obj) -> bool:
        """Whether a previous run of this kubelet stand-in already started this pod (its state file exists)."""
        uid = (pod.get("metadata") or {}).get("uid") or ""
        return (self.pod_state_dir / f"{uid}.json").exists()

    def adopt(self, pod: Obj) -> bool:
        """Take over the processes a previous kubelet stand-in started for `pod`; False if there is nothing."""
        uid = (pod.get("metadata") or {}).get("uid") or ""
        path = self.pod_state_dir / f"{uid}.json"
        try:
            state = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return False
        with self.lock:
            if uid in self.pods:
                return True
            running = self.pods[uid] = _Running(pod=pod)
        running.statuses = dict(state.get("statuses") or {})
        running.init_statuses = dict(state.get("init_statuses") or {})
        pids = {name: int(pid) for name, pid in (state.get("pids") or {}).items()}
        running.adopted_pids = pids
        running.thread = threading.Thread(target=self._watch_adopted, args=(running, pids),
                                          name=f"adopt-{_key(pod)}", daemon=True)
        running.thread.start()
        return True

    def _watch_adopted(self, running: _Running, pids: dict[str, int]) -> None:
        uid = (running.pod.get("metadata") or {}).get("uid") or ""
        spec = running.pod.get("spec") or {}
        names = [c.get("name") for c in spec.get("containers") or ()]
        while not running.stopping and any(_pid_alive(pids[n]) for n in names if n in pids):
            time.sleep(0.5)
        if running.stopping:
            return
        for ctr in spec.get("containers") or ():
            name = ctr.get("name")
            try:
                code = int(self._exit_file(uid, name).read_text().strip())
            except (OSError, ValueError):
                code = 137  # killed without a word: what a runtime reports for SIGKILL
            started = ((running.statuses.get(name) or {}).get("state") or {}).get("running", {}).get("startedAt",
                                                                                                      _now())
            running.statuses[name] = _terminated(name, ctr, code, "Completed" if code == 0 else "Error", "", started)
        self._finish(running, _now(), failed=any(s["state"]["terminated"]["exitCode"] != 0
                                                  for s in running.statuses.values()))

    def _lifecycle(self, running: _Running, allocations: dict[str, ContainerAllocation]) -> None:
        pod = running.pod
        spec = pod.get("spec") or {}
        start_time = _now()
        ok = True
        for ctr in spec.get("initContainers") or ():
            name = ctr.get("name")
            if running.stopping:
                return
            if running.terminating:  # no further container starts in a pod being deleted
                ok = False
                break
            try:
                proc = self._spawn(pod, ctr, allocations.get(name) or ContainerAllocation())
            except (OSError, UnknownDevice) as exc:
                running.init_statuses[name] = _terminated(name, ctr, 128, "StartError", str(exc), start_time)
                ok = False
                break
            running.procs[name] = proc
            started = _now()
            self._patch_status(pod, {"phase": "Pending", "startTime": start_time, "initContainerStatuses": [
                _running_status(name, ctr, started, proc.pid)]})
            code = proc.wait()
            self._leave_cgroup(pod, proc.pid)
            running.init_statuses[name] = _terminated(name, ctr, code, "Completed" if code == 0 else "Error", "",
                                                      started)
            if code != 0:
                ok = False
                break
        if not ok:
            self._finish(running, start_time, failed=True)
            return
        for ctr in spec.get("containers") or ():
            name = ctr.get("name")
            try:
                proc = self._spawn(pod, ctr, allocations.get(name) or ContainerAllocation())
            except (OSError, UnknownDevice) as exc:
                running.statuses[name] = _terminated(name, ctr, 128, "StartError", str(exc), _now())
                continue
            running.procs[name] = proc
            running.statuses[name] = _running_status(name, ctr, _now(), proc.pid)
        if running.stopping:
            self._kill(running)
            return
        if running.terminating:  # deleted while its containers were being started
            self._stop_signal(running)
        self._save_state(running)
        self._patch_status(pod, {
            "phase": "Running", "hostIP": "127.0.0.1", "podIP": "127.0.0.1", "startTime": start_time,
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": _now()}
                           for t in ("Initialized", "ContainersReady", "Ready")],
            "initContainerStatuses": list(running.init_statuses.values()),
            "containerStatuses": list(running.statuses.values()),
        })
        self._record(ev="running", uid=(pod.get("metadata") or {}).get("uid"), pod=_key(pod), node=self.node_name)
        for ctr in spec.get("containers") or ():
            name = ctr.get("name")
            waited = running.procs.get(name)
            if waited is None:
                continue
            code = waited.wait()
            self._leave_cgroup(running.pod, waited.pid)
            started = running.statuses[name]["state"].get("running", {}).get("startedAt", start_time)
            reason = "Completed" if code == 0 else ("Error" if code > 0 else f"Signal {-code}")
            running.statuses[name] = _terminated(name, ctr, code if code >= 0 else 128 - code, reason, "", started)
        self._finish(running, start_time, failed=any(s["state"]["terminated"]["exitCode"] != 0
                                                      for s in running.statuses.values()))

    def _finish(self, running: _Running, start_time: str, failed: bool) -> None:
        pod = running.pod
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        for name in list(running.statuses) + list(running.init_statuses):
            self._exit_file(uid, name).unlink(missing_ok=True)
        if running.stopping:
            with self.lock:
                self.pods.pop(uid, None)
            return
        phase = "Failed" if failed else "Succeeded"
        if self.on_exit is not None:
            self.on_exit(pod, phase)  # kubelet frees the devices before anyone can see the pod finished
        self._patch_status(pod, {
            "phase": phase, "startTime": start_time,
            "conditions": [{"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": _now()}
                           for t in ("ContainersReady", "Ready")],
            "initContainerStatuses": list(running.init_statuses.values()),
            "containerStatuses": list(running.statuses.values()),
        })
        self._record(ev="finished", uid=uid, pod=_key(pod), node=self.node_name, phase=phase)
        (self.pod_state_dir / f"{uid}.json").unlink(missing_ok=True)
        with self.lock:
            running.finished = True
            terminating = running.terminating
        if terminating:
            self.delete_final(pod)

    @staticmethod
    def _alive_groups(running: _Running) -> list[int]:
        """The process groups (the shells' pids) of the pod's containers that still run."""
        groups = [proc.pid for proc in running.procs.values() if proc.poll() is None]
        return groups + [pid for pid in running.adopted_pids.values() if _pid_alive(pid)]

    def _kill(self, running: _Running) -> None:
        for pgid in self._alive_groups(running):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        uid = (running.pod.get("metadata") or {}).get("uid") or ""
        if self.runtime is not None:  # the container outlives its podman client: remove it by name
            for ctr in [*((running.pod.get("spec") or {}).get("initContainers") or ()),
                        *((running.pod.get("spec") or {}).get("containers") or ())]:
                self.runtime.kill(_container_name(uid, ctr.get("name") or ""))
        (self.pod_state_dir / f"{uid}.json").unlink(missing_ok=True)

    def terminate_pod(self, pod: Obj, grace: int) -> bool:
        """The pod is being deleted gracefully (see the module docstring): stop signal now, SIGKILL after `grace`
        seconds (at least 1; a later call may only shorten it), the final status and DELETE once its containers
        are gone. False when this runner does not run the pod."""
        uid = (pod.get("metadata") or {}).get("uid") or ""
        deadline = time.monotonic() + max(1, grace)
        with self.lock:
            running = self.pods.get(uid)
            if running is None:
                return False
            first = not running.terminating
            running.terminating = True
            running.kill_at = deadline if first else min(running.kill_at, deadline)
            finished = running.finished
        running.changed.set()
        if not first:
            return True
        log.info("event=pod_terminating pod=%s grace=%d finished=%s", _key(pod), max(1, grace), finished)
        self._record(ev="terminating", uid=uid, pod=_key(pod), node=self.node_name, grace=max(1, grace))
        if finished:  # it ended by itself: only the final DELETE is left
            threading.Thread(target=self.delete_final, args=(running.pod,), daemon=True).start()
            return True
        self._stop_signal(running)
        threading.Thread(target=self._kill_after_grace, args=(running,), name=f"grace-{_key(pod)}",
                         daemon=True).start()
        return True

    def _stop_signal(self, running: _Running) -> None:
        """SIGTERM to the main process of each running container not yet signalled."""
        for group in self._alive_groups(running):
            with self.lock:
                if group in running.signalled:
                    continue
                running.signalled.add(group)
            try:
                os.kill(_main_pid(group), signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass

    def _kill_after_grace(self, running: _Running) -> None:
        """SIGKILL what is left of the pod once its grace period is over."""
        while not running.stopping and self._alive_groups(running):
            left = running.kill_at - time.monotonic()
            if left <= 0:
                log.info("event=grace_period_over pod=%s action=SIGKILL", _key(running.pod))
                self._kill(running)
                return
            running.changed.wait(min(left, 0.2))
            running.changed.clear()

    def delete_final(self, pod: Obj) -> None:
        """status_manager.go syncPod: the pod's containers are gone, its resources released and its terminal
        status written, so it is deleted with gracePeriodSeconds 0 and its UID as precondition (a pod of the same
        name created since is left alone)."""
        meta = pod.get("metadata") or {}
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                "preconditions": {"uid": meta.get("uid")}}
        for attempt in range(20):
            try:
                self._core().delete_namespaced_pod(meta["name"], meta.get("namespace") or "default", body=body,
                                                   _preload_content=False)
                log.info("event=pod_deleted pod=%s uid=%s", _key(pod), meta.get("uid"))
                return
            except Exception as exc:
                if getattr(exc, "status", 0) in (404, 409):  # gone already, or another pod of that name
                    return
                time.sleep(min(2.0, 0.1 * (attempt + 1)))
        log.warning("event=final_delete_failed pod=%s uid=%s", _key(pod), meta.get("uid"))

    def end_unstarted(self, pod: Obj) -> None:
        """A pod deleted before it ran here (not admitted yet, or waiting for its claims): status_manager.go
        TerminatePod's status (a container not terminated is reported terminated with reason ContainerStatusUnknown
        and exit code 137, a phase not terminal becomes Failed), then the final DELETE."""
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        if status.get("phase") not in ("Succeeded", "Failed"):
            known = {s.get("name"): s for s in status.get("containerStatuses") or ()}
            statuses = [known[c.get("name")] if ((known.get(c.get("name")) or {}).get("state") or {}).get("terminated")
                        else _terminated(c.get("name"), c, 137, "ContainerStatusUnknown",
                                         "The container could not be located when the pod was terminated", None)
                        for c in spec.get("containers") or ()]
            self._patch_status(pod, {"phase": "Failed", "containerStatuses": statuses})
        self.delete_final(pod)

    def stop_pod(self, uid: str) -> None:
        """The pod was deleted: kill its processes (no status is written for a deleted pod)."""
        with self.lock:
            running = self.pods.pop(uid, None)
        if running is None:
            return
        running.stopping = True
        self._kill(running)

    def known(self, uid: str) -> bool:
        """Whether the pod was handed to this runner (and not stopped)."""
        with self.lock:
            return uid in self.pods

    def close(self) -> None:
        """Kill every process this runner started."""
        with self.lock:
            pods = list(self.pods.values())
            self.pods.clear()
        for running in pods:
            running.stopping = True
            self._kill(running)
        if self._trace is not None:
            self._trace.close()
            self._trace = None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1][1:2] not in (b"Z", b"X")
    except OSError:
        return False


def _main_pid(shell: int) -> int:
    """A container's main process: the child of the shell that keeps its exit status (the shell when it has none)."""
    try:
        children = Path(f"/proc/{shell}/task/{shell}/children").read_text().split()
    except OSError:
        return shell
    return int(children[0]) if children else shell


def _key(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def _running_status(name: str, ctr: Obj, started: str, pid: int) -> Obj:
    return {"name": name, "image": ctr.get("image") or "", "imageID": "", "containerID": f"standin://{pid}",
            "ready": True, "started": True, "restartCount": 0, "state": {"running": {"startedAt": started}}}


def _terminated(name: str, ctr: Obj, code: int, reason: str, message: str, started: str | None) -> Obj:
    term = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": _now()}
    if message:
        term["message"] = message
    return {"name": name, "image": ctr.get("image") or "", "imageID": "", "ready": False, "started": False,
            "restartCount": 0, "state": {"terminated": term}}


# ------------------------------------------------------------------------------------------------ node agent

class NodeAgent:
    """TEST INFRASTRUCTURE: the kubelet of one simulated node, as one process.

    Wraps the device-manager stand-in (testbed/kubelet.py, `KubeletStandIn`) with what kubelet's sync loop
    does around it: it watches the pods bound to this node, admits each new one (GetPreferredAllocation + Allocate
    per container, through `KubeletStandIn.admit`), hands the answers to the `PodRunner`, fails a pod that cannot be
    admitted with `UnexpectedAdmissionError` (as kubelet does), frees the devices of pods that ended or were deleted,
    and keeps the node's capacity/allocatable of every registered resource (healthy device count) in node status.
    A restarted agent adopts the processes its predecessor started (their state files under `<workdir>/pods`)
    instead of admitting those pods again, as kubelet does from its checkpoint.
    A pod being deleted gracefully (metadata.deletionTimestamp) is not admitted any more: the runner ends one it
    runs (`PodRunner.terminate_pod`), one that never ran gets the status kubelet's TerminatePod writes, its devices
    and claims released, and the final DELETE (`PodRunner.end_unstarted`).

    DRA (testbed/dra_kubelet.py): DRA plugins register through `plugins_registry` (default
    `<kubelet root>/plugins_registry`, the root being the device-plugin directory's parent). An admitted pod with
    `spec.resourceClaims` (or an extended-resource claim) has its claims prepared before its containers start, and
    each container gets its CDI edits (specs in `cdi_dirs`, default `<workdir>/cdi`) besides the device plugins'
    answers. A preparation that fails leaves the pod Pending (containers waiting in ContainerCreating, an event
    FailedPrepareDynamicResources) and is tried again every `dra_retry` seconds, as kubelet's pod worker does.
    Claims are unprepared once the pod's containers are gone.
    """

    def __init__(self, node_name: str, kubelet_dir: str | os.PathLike[str], workdir: str | os.PathLike[str],
                 kubeconfig: str | None, cpu: str = "64", memory: str = "256Gi", max_pods: str = "250",
                 trace: str | None = None, admit_grace: float = 10.0, gpus: Sequence[MachineGPU] = (),
                 cgroup_root: str | None = None, plugins_registry: str | None = None,
                 cdi_dirs: Sequence[str] | None = None, dra_retry: float = 1.0,
                 sim_dir: str | os.PathLike[str] | None = None, runtime: str = "processes") -> None:
        from kubernetes import client as k8s

        from vgpu.testbed.dra_kubelet import DRAKubelet
        from vgpu.testbed.informer import PodInformer
        from vgpu.testbed.kubelet import KubeletStandIn

        self.node_name = node_name
        self.base = {"cpu": cpu, "memory": memory, "pods": max_pods}
        self.admit_grace = admit_grace
        self.api_client = api_client(kubeconfig, pool_size=32)
        self.core: Any = k8s.CoreV1Api(self.api_client)  # raw JSON calls: the client's model types do not apply
        self.runner = PodRunner(node_name, workdir, api=self.core, trace=trace, on_exit=self._on_exit,
                                gpus=gpus, cgroup_root=cgroup_root, sim_dir=sim_dir,
                                runtime=Podman(Path(workdir) / "podman") if runtime == "podman" else None)
        self.kubelet = KubeletStandIn(kubelet_dir, on_admitted=self._on_admitted)
        registry = Path(plugins_registry) if plugins_registry else Path(kubelet_dir).parent / "plugins_registry"
        self.dra = DRAKubelet(registry, cdi_dirs or [str(Path(workdir) / "cdi")], self.api_client,
                              state_file=Path(workdir) / "dra_manager_state.json", node_name=node_name)
        self.dra_retry = dra_retry
        self.dra_waiting: dict[str, dict[str, ContainerAllocation]] = {}  # pod uid -> allocations, prepare failed
        self.dra_errors: dict[str, str] = {}  # pod uid -> last preparation error
        self._dra_status = b""
        self.cache = PodInformer(self.api_client, f"spec.nodeName={node_name}", on_add=self._on_pod,
                                 on_update=lambda _old, new: self._on_pod(new), on_delete=self._on_delete,
                                 name=f"kubelet-pods[{node_name}]")
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.handled: set[str] = set()
        self.terminated: set[str] = set()  # pods deleted before they ran here, whose final DELETE is sent
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self._published: Obj = {}
        self._known_resources: set[str] = set()
        self.log_server = ContainerLogServer(self.runner.logs)

    def start(self) -> NodeAgent:
        """Serve kubelet.sock, sync the pod cache, start admitting and publishing node status."""
        self._ensure_node()
        # a starting kubelet deletes every socket in the device-plugin directory; plugins notice and re-register
        plugin_dir = Path(self.kubelet.dir)
        if plugin_dir.is_dir():
            for entry in plugin_dir.iterdir():
                if entry.is_socket():
                    entry.unlink(missing_ok=True)
        self.kubelet.start()
        self.dra.start()
        self.cache.start()
        if not self.cache.wait_synced(30):
            raise RuntimeError(f"kubelet stand-in {self.node_name}: pod cache did not sync")
        self.log_server.start()
        for target, name in ((self._admit_loop, "admit"), (self._status_loop, "node-status"),
                             (self._dra_retry_loop, "dra-retry"), (self._lease_loop, "node-lease")):
            threading.Thread(target=target, name=name, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop everything and kill the pods' processes."""
        self.stop_event.set()
        self.queue.put(None)
        self.cache.stop()
        self.kubelet.stop()
        self.dra.stop()
        self.log_server.stop()
        self.runner.close()

    # -- node object and status
    def _ensure_node(self) -> None:
        try:
            node = read_json(self.core.read_node(self.node_name, _preload_content=False))
            capacity = (node.get("status") or {}).get("capacity") or {}
            self._known_resources = {n for n in capacity if "/" in n}
            return
        except Exception:
            pass
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.node_name, "labels": {"kubernetes.io/hostname": self.node_name}},
                "status": {"capacity": dict(self.base), "allocatable": dict(self.base)}}
        for _attempt in range(100):
            try:
                self.core.create_node(body, _preload_content=False)
                return
            except Exception as exc:
                if getattr(exc, "status", 0) == 409:
                    return
                time.sleep(0.2)

    def _write_dra_status(self) -> None:
        """Keep `<workdir>/dra-status.json` (registered drivers, rejected plugins, prepared claims and container
        edits per pod, pending unprepares) current for the demo and tests that watch the node from outside."""
        status = orjson.dumps(self.dra.status(), option=orjson.OPT_SORT_KEYS)
        if status != self._dra_status:
            path = self.runner.workdir / "dra-status.json"
            path.with_suffix(".tmp").write_bytes(status)
            os.replace(path.with_suffix(".tmp"), path)
            self._dra_status = status

    def _status_loop(self) -> None:
        while not self.stop_event.wait(0.3):
            self._write_dra_status()
            with self.kubelet.cond:
                capacity = {name: str(len(s.devices)) for name, s in self.kubelet.resources.items()}
                allocatable = {name: str(len(s.healthy()) if s.connected else 0)
                               for name, s in self.kubelet.resources.items()}
            for name in self._published.get("capacity", {}):
                if name in self.base:
                    continue
                capacity.setdefault(name, "0")
                allocatable.setdefault(name, "0")
            status = {"capacity": {**self.base, **capacity}, "allocatable": {**self.base, **allocatable}}
            if status == self._published:
                continue
            now = _now()
            patch = {"status": {**status, "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet stand-in is ready",
                "lastHeartbeatTime": now, "lastTransitionTime": now}],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                              {"type": "Hostname", "address": self.node_name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.log_server.port}},
                "nodeInfo": {"kubeletVersion": "v1.31.0-vgpu-testbed", "osImage": "vgpu-sharing test bed",
                             "kernelVersion": platform.release(), "operatingSystem": "linux",
                             "architecture": platform.machine(),
                             "containerRuntimeVersion": "vgpu-testbed://processes"}}}
            try:
                self.core.patch_node_status(self.node_name, patch, _preload_content=False)
                self._published = status
            except Exception as exc:
                log.info("node status patch failed node=%s error=%s", self.node_name, str(exc)[:200])

    def _lease_loop(self) -> None:
        """Keep the node's Lease (kube-node-lease/<node>) renewed, as kubelet's node lease controller does
        (component-helpers/apimachinery/lease/controller.go: holder the node, 40 s duration, owned by the Node,
        renewed every quarter of the duration; a failed renewal tried again after 0.2 s, doubling to 7 s)."""
        from kubernetes import client as k8s

        leases: Any = k8s.CoordinationV1Api(self.api_client)
        backoff = 0.2
        while not self.stop_event.is_set():
            try:
                self._renew_lease(leases)
                backoff, wait = 0.2, NODE_LEASE_SECONDS * 0.25
            except Exception as exc:
                log.info("node lease not renewed node=%s error=%s", self.node_name, str(exc)[:200])
                wait, backoff = backoff, min(backoff * 2, 7.0)
            self.stop_event.wait(wait)

    def _renew_lease(self, leases: Any) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # a MicroTime
        try:
            lease = read_json(leases.read_namespaced_lease(self.node_name, NODE_LEASE_NAMESPACE,
                                                           _preload_content=False))
        except Exception as exc:
            if getattr(exc, "status", 0) != 404:
                raise
            node = read_json(self.core.read_node(self.node_name, _preload_content=False))
            owner = {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": node["metadata"]["uid"]}
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.node_name, "namespace": NODE_LEASE_NAMESPACE,
                                 "ownerReferences": [owner]},
                    "spec": {"holderIdentity": self.node_name, "leaseDurationSeconds": NODE_LEASE_SECONDS,
                             "renewTime": now}}
            leases.create_namespaced_lease(NODE_LEASE_NAMESPACE, body, _preload_content=False)
            return
        lease["spec"] = {**(lease.get("spec") or {}), "holderIdentity": self.node_name,
                         "leaseDurationSeconds": NODE_LEASE_SECONDS, "renewTime": now}
        leases.replace_namespaced_lease(self.node_name, NODE_LEASE_NAMESPACE, lease, _preload_content=False)

    # -- pods
    def _on_pod(self, pod: Obj) -> None:
        uid = (pod.get("metadata") or {}).get("uid") or ""
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            self._terminate(pod)
            return
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            if not self.runner.known(uid):
                self.kubelet.release(uid)
                self.dra.manager.unprepare(uid)
            return
        with self.lock:
            if uid in self.handled:
                return
        self.queue.put(_key(pod))

    def _terminate(self, pod: Obj) -> None:
        """The pod is being deleted (pod_workers.go: it is terminating): the runner ends the pod it runs; one that
        never ran here is not admitted any more, its devices and claims are released, its final status and DELETE
        sent (once)."""
        meta = pod.get("metadata") or {}
        uid = meta.get("uid") or ""
        if not self.runner.known(uid) and self.runner.admitted_before(pod) and self.runner.adopt(pod):
            self._restore_devices(uid)  # started by this node's previous kubelet stand-in: end those processes
            with self.lock:
                self.handled.add(uid)
        if self.runner.terminate_pod(pod, int(meta.get("deletionGracePeriodSeconds") or 0)):
            return
        with self.lock:
            if uid in self.terminated:
                return
            self.terminated.add(uid)
            self.handled.add(uid)
            self.dra_waiting.pop(uid, None)
        self.kubelet.release(uid)
        self.dra.manager.unprepare(uid)
        (self.runner.pod_state_dir / f"{uid}.devices.json").unlink(missing_ok=True)
        threading.Thread(target=self.runner.end_unstarted, args=(pod,), daemon=True).start()

    def _on_delete(self, pod: Obj) -> None:
        uid = (pod.get("metadata") or {}).get("uid") or ""
        self.runner.stop_pod(uid)
        self.kubelet.release(uid)
        with self.lock:
            self.dra_waiting.pop(uid, None)
        self.dra.manager.unprepare(uid)  # the pod's processes are gone
        (self.runner.pod_state_dir / f"{uid}.devices.json").unlink(missing_ok=True)
        with self.lock:
            self.handled.discard(uid)
            self.terminated.discard(uid)

    def _on_exit(self, pod: Obj, phase: str) -> None:
        uid = (pod.get("metadata") or {}).get("uid") or ""
        self.kubelet.release(uid)
        self.dra.manager.unprepare(uid)
        (self.runner.pod_state_dir / f"{uid}.devices.json").unlink(missing_ok=True)

    def _on_admitted(self, pod: Obj, allocations: dict[str, list[Any]]) -> None:
        uid = (pod.get("metadata") or {}).get("uid") or ""
        admitted = self.kubelet.admitted.get(uid) or []
        checkpoint = {c.name: c.devices for c in admitted}
        (self.runner.pod_state_dir / f"{uid}.devices.json").write_bytes(orjson.dumps(checkpoint))
        merged: dict[str, ContainerAllocation] = {}
        for name, responses in allocations.items():
            alloc = merged[name] = ContainerAllocation()
            for response in responses:
                alloc.merge(response)
        if _uses_dra(pod):
            self._prepare_and_run(pod, merged)
            return
        self.runner.run_pod(pod, merged)

    def _prepare_and_run(self, pod: Obj, allocations: dict[str, ContainerAllocation]) -> bool:
        """Prepare the pod's claims, add each container's CDI edits and run it; on failure keep it waiting."""
        from vgpu.testbed.dra_kubelet import PrepareError

        uid = (pod.get("metadata") or {}).get("uid") or ""
        try:
            preparation = self.dra.manager.prepare(pod)
        except PrepareError as exc:
            message = f"prepare dynamic resources: {exc}"
            with self.lock:
                first = self.dra_errors.get(uid) != message
                self.dra_waiting[uid] = allocations
                self.dra_errors[uid] = message
            if first:
                log.info("event=dra-prepare-failed pod=%s error=%s", _key(pod), message)
                self._waiting_for_dra(pod, message)
            return False
        with self.lock:
            self.dra_waiting.pop(uid, None)
            self.dra_errors.pop(uid, None)
            deleted = uid not in self.handled
        if deleted:  # deleted while its claims were being prepared
            self.dra.manager.unprepare(uid)
            return False
        for name, edits in preparation.edits.items():
            allocations.setdefault(name, ContainerAllocation()).add_cdi(edits)
        self.runner.run_pod(pod, allocations)
        return True

    def _waiting_for_dra(self, pod: Obj, message: str) -> None:
        """Report a failed preparation as kubelet does: the pod stays Pending, its containers wait in
        ContainerCreating, and an event FailedPrepareDynamicResources carries the reason."""
        spec = pod.get("spec") or {}
        waiting = [{"name": c.get("name"), "image": c.get("image") or "", "imageID": "", "ready": False,
                    "started": False, "restartCount": 0,
                    "state": {"waiting": {"reason": "ContainerCreating", "message": message}}}
                   for c in spec.get("containers") or ()]
        self.runner._patch_status(pod, {"phase": "Pending", "containerStatuses": waiting})
        self.runner._record(ev="prepare-failed", uid=(pod.get("metadata") or {}).get("uid"), pod=_key(pod),
                            node=self.node_name, reason="FailedPrepareDynamicResources", message=message)
        meta = pod.get("metadata") or {}
        now = _now()
        event = {"metadata": {"generateName": f"{meta.get('name')}.", "namespace": meta.get("namespace") or "default"},
                 "involvedObject": {"kind": "Pod", "apiVersion": "v1", "name": meta.get("name"),
                                    "namespace": meta.get("namespace") or "default", "uid": meta.get("uid")},
                 "reason": "FailedPrepareDynamicResources",
                 "message": f"Failed to prepare dynamic resources: {message}",
                 "type": "Warning", "source": {"component": "kubelet", "host": self.node_name},
                 "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        try:
            self.core.create_namespaced_event(meta.get("namespace") or "default", event, _preload_content=False)
        except Exception as exc:
            log.info("event=event-not-written pod=%s error=%s", _key(pod), str(exc)[:200])

    def _dra_retry_loop(self) -> None:
        while not self.stop_event.wait(self.dra_retry):
            with self.lock:
                waiting = list(self.dra_waiting.items())
            for uid, allocations in waiting:
                pod = next((p for p in self.cache.list() if (p.get("metadata") or {}).get("uid") == uid), None)
                if pod is None or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    with self.lock:
                        self.dra_waiting.pop(uid, None)
                    continue
                with self.lock:
                    if uid not in self.dra_waiting:  # deleted meanwhile
                        continue
                self._prepare_and_run(pod, allocations)

    def _restore_devices(self, uid: str) -> None:
        try:
            checkpoint = orjson.loads((self.runner.pod_state_dir / f"{uid}.devices.json").read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return
        with self.kubelet.cond:
            for devices in checkpoint.values():
                for resource, ids in devices.items():
                    for device in ids:
                        self.kubelet.in_use.setdefault(resource, {})[device] = uid

    def _needed_resources(self, pod: Obj) -> set[str]:
        names: set[str] = set()
        spec = pod.get("spec") or {}
        for ctr in list(spec.get("initContainers") or []) + list(spec.get("containers") or []):
            res = ctr.get("resources") or {}
            for table in (res.get("limits") or {}, res.get("requests") or {}):
                names.update(n for n in table if "/" in n and not n.startswith(("kubernetes.io/", "hugepages")))
        return names

    def _fail(self, pod: Obj, reason: str, message: str) -> None:
        self.runner._patch_status(pod, {"phase": "Failed", "reason": reason, "message": message})
        self.runner._record(ev="admit-failed", uid=(pod.get("metadata") or {}).get("uid"), pod=_key(pod),
                            node=self.node_name, reason=reason, message=message)

    def _admit_loop(self) -> None:
        from vgpu.testbed.kubelet import AdmissionError

        backlog: list[tuple[str, str]] = []
        while not self.stop_event.is_set():
            # kubelet's HandlePodAdditions admits one pod at a time, oldest (creationTimestamp) first
            items: list[str | None] = []
            try:
                if not backlog:
                    items.append(self.queue.get())
                while True:
                    items.append(self.queue.get_nowait())
            except queue.Empty:
                pass
            if None in items:
                return
            for item in items:
                found = self.cache.get(item) if item else None
                if found is not None and item:
                    backlog.append((str((found.get("metadata") or {}).get("creationTimestamp") or ""), item))
            if not backlog:
                continue
            backlog = sorted(set(backlog))
            _, key = backlog.pop(0)
            pod = self.cache.get(key)
            if pod is None or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") \
                    or (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue
            uid = (pod.get("metadata") or {}).get("uid") or ""
            with self.lock:
                if uid in self.handled:
                    continue
                self.handled.add(uid)
            if self.runner.admitted_before(pod) and self.runner.adopt(pod):
                self._restore_devices(uid)
                continue
            if (pod.get("status") or {}).get("phase") == "Running":
                self._fail(pod, "ContainerLost", "the kubelet stand-in restarted and lost this pod's processes")
                continue
            # like kubelet after a restart, give device plugins a moment to (re-)register before admitting
            wanted = self._needed_resources(pod)

            def registered(wanted: set[str] = wanted) -> bool:  # evaluated under kubelet.cond
                known = self._known_resources | set(self.kubelet.resources)
                return all(self.kubelet.resources.get(n) is not None and self.kubelet.resources[n].connected
                           for n in wanted & known)

            self.kubelet.wait_for(registered, timeout=self.admit_grace)
            try:
                self.kubelet.admit(pod)
            except AdmissionError as exc:
                message = str(exc)
                reason = "UnexpectedAdmissionError" if "UnexpectedAdmissionError" in message else "OutOfDevices"
                log.info("admission failed pod=%s reason=%s message=%s", key, reason, message)
                self._fail(pod, reason, message)
            except Exception as exc:
                log.exception("admission crashed pod=%s", key)
                self._fail(pod, "UnexpectedAdmissionError", f"{type(exc).__name__}: {exc}")


def _uses_dra(pod: Obj) -> bool:
    """Whether the pod has ResourceClaims (its own, or the scheduler's claim for DRA-backed extended resources)."""
    return bool((pod.get("spec") or {}).get("resourceClaims")
                or ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get("resourceClaimName"))


def main(argv: list[str] | None = None) -> int:
    """Run one node's kubelet stand-in with the pod runner until SIGTERM / SIGINT."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m vgpu.testbed.podrunner",
                                 description="TEST INFRASTRUCTURE: kubelet stand-in that runs pods as processes")
    ap.add_argument("--node-name", required=True)
    ap.add_argument("--kubelet-dir", required=True, help="device-plugin directory (kubelet.sock is served here)")
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--workdir", required=True, help="pod logs, simulated GPU state and pod state files")
    ap.add_argument("--trace", default=None, help="append admission / running / finished events (JSON lines)")
    ap.add_argument("--gpus", default="",
                    help="the node's GPUs as the test bed describes them (testbed/machine.py), e.g. 4xA100-40GB")
    ap.add_argument("--runtime", choices=("processes", "podman"), default="processes",
                    help="run containers as local processes, or as real containers through podman and runc")
    ap.add_argument("--sim-dir", default=None,
                    help="directory of the simulated libcuda.so.1 and libnvidia-ml.so.1 the node's containers load")
    ap.add_argument("--cpu", default="64")
    ap.add_argument("--memory", default="256Gi")
    ap.add_argument("--max-pods", default="250")
    ap.add_argument("--admit-grace", type=float, default=10.0,
                    help="seconds to wait for a device plugin to (re-)register before failing an admission")
    ap.add_argument("--log-level", default="WARNING")
    ap.add_argument("--cgroup-root", default=None, help="run each container in a cgroup of its own under this dir")
    ap.add_argument("--plugins-registry", default=None,
                    help="where DRA plugins register (default: plugins_registry next to --kubelet-dir)")
    ap.add_argument("--cdi-dir", action="append", default=None,
                    help="CDI spec directory, lowest priority first (repeatable; default: WORKDIR/cdi)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    agent = NodeAgent(args.node_name, args.kubelet_dir, args.workdir, args.kubeconfig, cpu=args.cpu,
                      memory=args.memory, max_pods=args.max_pods, trace=args.trace, admit_grace=args.admit_grace,
                      gpus=machine(args.gpus, args.node_name) if args.gpus else (), cgroup_root=args.cgroup_root,
                      plugins_registry=args.plugins_registry, cdi_dirs=args.cdi_dir, sim_dir=args.sim_dir,
                      runtime=args.runtime)
    try:
        agent.start()
    except RuntimeError as exc:
        print(f"kubelet stand-in: {exc}", file=sys.stderr)
        return 1
    print(f"ready node={args.node_name} socket={agent.kubelet.socket}", flush=True)
    stop.wait()
    agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
