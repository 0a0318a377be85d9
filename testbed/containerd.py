"""TEST INFRASTRUCTURE: containerd, the container runtime a real kubelet of the real-Kubernetes tier talks CRI to.

One `Containerd` per kubelet node, each with everything of its own under `root`: content, snapshots, state, the
CRI socket `<root>/containerd.sock` (and `.ttrpc` beside it), network namespaces, a CNI configuration with its
address store and the runc state, so two of them run side by side on one machine. The programs come from
`testbed/upstream/build.sh` (`bin_dir`: containerd, its runc shim, ctr, crictl, the CNI plugins; runc is Debian's,
found on PATH, or the program `runc` names). `prefix` is an argv prefix containerd runs under (e.g. `nsenter
--mount=...` into a node's mount namespace); its mounts are then looked for and undone there.

What it is set up as:
  * runc through the `io.containerd.runc.v2` shim with cgroupfs (SystemdCgroup = false), as kubelet's
    `cgroupDriver: cgroupfs` expects;
  * the `native` snapshotter (each container's root filesystem a copy of its image's), for the CRI plugin and the
    image import alike: the images are a few files, and it works whatever filesystem `root` is on (overlayfs
    cannot take an overlayfs, as in many CI containers, for its upper layers). The import runs in ctr (`--local`):
    containerd's transfer service unpacks only for the snapshotters its `unpack_config` lists (overlayfs by default);
  * CDI on, reading the spec directories given (and no others), so `CDIDevices` and `cdi.k8s.io/*` annotations of a
    container resolve against specs a test writes;
  * pod networks (not host network): `lo` up (containerd's own loopback network) and an `eth0` that is a tap
    device nobody reads, with an address from host-local IPAM in 198.18.0.0/16 (a range kept for benchmarks,
    never routed): pods have an IP that is reachable from nowhere, and nothing is added to the host's network.
    containerd requires a network besides its loopback one (else NetworkReady is false) and an address on `eth0`
    (a loopback-only network fails every sandbox: "failed to find network info for sandbox"); a tap, as the
    kernels this runs on may lack dummy devices. Every instance hands out the same range;
  * images: none is pulled; `start` imports the archives of `testbed/upstream/images.py` from `images_dir` into the
    CRI namespace `k8s.io`, and the pause image is the pinned sandbox image;
  * no oom_score_adj below containerd's own (`restrict_oom_score_adj`): lowering it takes CAP_SYS_RESOURCE, which
    root may lack (as in a container), and runc then fails every sandbox (the pause container asks for -998);
  * NRI and tracing are off (NRI's socket is one per machine).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["BASE_IMAGE", "NAMESPACE", "POD_SUBNET", "SANDBOX_IMAGE", "SNAPSHOTTER", "Containerd", "unavailable"]

SANDBOX_IMAGE = "localhost/vgpu-testbed/pause:1"
BASE_IMAGE = "localhost/vgpu-testbed/base:1"
NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin keeps its images, sandboxes and containers in
SNAPSHOTTER = "native"
POD_SUBNET = "198.18.0.0/16"
_PROGRAMS = ("containerd", "containerd-shim-runc-v2", "ctr", "crictl", "loopback", "tap", "host-local")
_IMAGE_ARCHIVES = ("pause.tar", "base.tar")
_SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL
_SHIM = "containerd-shim-runc-v2"
_READY_CONDITIONS = ("RuntimeReady", "NetworkReady")  # what kubelet waits for (others are warnings)


def unavailable(bin_dir: Path) -> str:
    """Why containerd cannot run here from `bin_dir` ("" when it can)."""
    if os.geteuid() != 0:
        return "containerd runs containers here only as root"
    if shutil.which("runc") is None:
        return "runc is not installed (Debian package runc)"
    lacking = [name for name in _PROGRAMS if not os.access(Path(bin_dir) / name, os.X_OK)]
    if lacking:
        return f"{', '.join(lacking)} missing from {bin_dir} (testbed/upstream/build.sh builds them)"
    return ""


def _alive(pid: int) -> bool:
    """Process `pid` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _toml(value: object) -> str:
    """A TOML value: strings, booleans and string lists have the same spelling in JSON."""
    return json.dumps(value)


class Containerd:
    """A containerd under `root` with the programs of `bin_dir`, the images of `images_dir` and CDI specs read from
    `cdi_dirs`."""

    def __init__(self, root: Path, bin_dir: Path, images_dir: Path, cdi_dirs: Sequence[Path] = (),
                 prefix: Sequence[str] = (), runc: str = "") -> None:
        self.root = Path(root).absolute()
        self.bin_dir = Path(bin_dir).absolute()
        self.images_dir = Path(images_dir).absolute()
        self.cdi_dirs = [Path(path).absolute() for path in cdi_dirs]
        self.prefix = list(prefix)
        self.runc = runc
        self.socket = self.root / "containerd.sock"
        if len(os.fsencode(f"{self.socket}.ttrpc")) > _SOCKET_PATH_MAX:
            raise ValueError(f"root {self.root} is too long for a unix socket path under it")
        self.log = self.root / "containerd.log"
        self.env = {**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}
        self._process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        """The CRI endpoint, for kubelet's --container-runtime-endpoint (and crictl's)."""
        return f"unix://{self.socket}"

    def config(self) -> str:
        """containerd's configuration file (format version 4, containerd 2.3's own: older ones are migrated with a
        warning at every start)."""
        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        return "\n".join([
            "version = 4",
            f"root = {_toml(str(self.root / 'lib'))}",
            f"state = {_toml(str(self.root / 'run'))}",
            "disabled_plugins = ['io.containerd.nri.v1.nri', 'io.containerd.tracing.processor.v1.otlp',"
            " 'io.containerd.internal.v1.tracing']",
            "[plugins.'io.containerd.server.v1.grpc']",
            f"address = {_toml(str(self.socket))}",
            "[plugins.'io.containerd.server.v1.ttrpc']",
            f"address = {_toml(f'{self.socket}.ttrpc')}",
            "[plugins.'io.containerd.internal.v1.opt']",
            f"path = {_toml(str(self.root / 'opt'))}",
            "[plugins.'io.containerd.cri.v1.images']",
            f"snapshotter = {_toml(SNAPSHOTTER)}",
            "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
            f"sandbox = {_toml(SANDBOX_IMAGE)}",
            f"[{runtime}]",
            "enable_cdi = true",
            f"cdi_spec_dirs = {_toml([str(path) for path in self.cdi_dirs])}",
            "netns_mounts_under_state_dir = true",
            "restrict_oom_score_adj = true",
            f"[{runtime}.containerd]",
            "default_runtime_name = 'runc'",
            f"[{runtime}.containerd.runtimes.runc]",
            "runtime_type = 'io.containerd.runc.v2'",
            f"[{runtime}.containerd.runtimes.runc.options]",
            "SystemdCgroup = false",
            *([f"BinaryName = {_toml(self.runc)}"] if self.runc else []),
            f"Root = {_toml(str(self.root / 'runc'))}",
            f"[{runtime}.cni]",
            f"bin_dirs = {_toml([str(self.bin_dir)])}",
            f"conf_dir = {_toml(str(self.root / 'cni'))}",
            "",
        ])

    def start(self, timeout: float = 60) -> None:
        """Start containerd, wait until its CRI reports the runtime and the network ready, import the images."""
        if self._process is not None:
            raise RuntimeError("containerd is already started")
        (self.root / "cni").mkdir(parents=True, exist_ok=True)
        (self.root / "config.toml").write_text(self.config())
        ipam = {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]], "dataDir": str(self.root / "ipam")}
        network = {"cniVersion": "1.0.0", "name": "vgpu-testbed", "plugins": [{"type": "tap", "ipam": ipam}]}
        (self.root / "cni" / "10-vgpu-testbed.conflist").write_text(json.dumps(network, indent=1) + "\n")
        (self.root / "crictl.yaml").write_text(
            f"runtime-endpoint: {self.endpoint}\nimage-endpoint: {self.endpoint}\ntimeout: 60\n")
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                [*self.prefix, str(self.bin_dir / "containerd"), "--config", str(self.root / "config.toml")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self._process.poll() is not None:
                raise RuntimeError(f"containerd exited with status {self._process.returncode}: {self._log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not become ready in {timeout:.0f} s: {self._log_tail()}")
            time.sleep(0.2)
        for archive in _IMAGE_ARCHIVES:
            done = self.ctr("images", "import", "--local", "--snapshotter", SNAPSHOTTER, str(self.images_dir / archive))
            if done.returncode != 0:
                raise RuntimeError(f"ctr images import {archive} failed: {done.stderr.strip()}")

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """ctr against this containerd, in the CRI namespace."""
        return subprocess.run([str(self.bin_dir / "ctr"), "--address", str(self.socket), "--namespace", NAMESPACE,
                               *args], capture_output=True, text=True, env=self.env, timeout=timeout)

    def crictl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """crictl against this containerd's CRI endpoint."""
        return subprocess.run([str(self.bin_dir / "crictl"), "--config", str(self.root / "crictl.yaml"), *args],
                              capture_output=True, text=True, env=self.env, timeout=timeout)

    def _ready(self) -> bool:
        if not self.socket.is_socket():
            return False
        done = self.crictl("info", timeout=30)
        if done.returncode != 0:
            return False
        status = json.loads(done.stdout).get("status", {})
        conditions = {item["type"]: item["status"] for item in status.get("conditions", [])}
        return all(conditions.get(name) for name in _READY_CONDITIONS)

    def _log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else "(no log)"

    def stop(self) -> None:
        """Remove every pod sandbox and container, end containerd and every shim and container process it started,
        and unmount what is still mounted under `root`. Where containerd could not remove them (it died, or a
        removal failed) runc deletes what its state under `root` still lists, processes and cgroups, and the shims
        are killed."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self.crictl("rmp", "--force", "--all", timeout=120)
        self._process.terminate()
        try:
            self._process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None
        for state in sorted((self.root / "runc").glob("*/*/state.json")):
            subprocess.run([*self.prefix, "runc", "--root", str(state.parent.parent), "delete", "--force",
                            state.parent.name], capture_output=True, env=self.env, timeout=60)
        leftovers = self._shim_trees()
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in leftovers) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._unmount()

    def _shim_trees(self) -> set[int]:
        """The shims serving this containerd and all their descendants (the containers' processes)."""
        parents: dict[int, int] = {}
        shims = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
            if os.path.basename(argv[0]) == _SHIM.encode() and os.fsencode(str(self.socket)) in argv:
                shims.add(int(entry.name))
        tree = set(shims)
        while True:
            children = {pid for pid, parent in parents.items() if parent in tree} - tree
            if not children:
                return tree
            tree |= children

    def _unmount(self) -> None:
        """Detach every mount under `root` in containerd's mount namespace, the deepest first."""
        mountinfo = subprocess.run([*self.prefix, "cat", "/proc/self/mountinfo"], capture_output=True, text=True,
                                   timeout=30).stdout
        under = f"{self.root}/"
        points = [re.sub(r"\\([0-7]{3})", lambda code: chr(int(code[1], 8)), line.split()[4])  # space is \040
                  for line in mountinfo.splitlines()]
        for point in sorted((p for p in points if p.startswith(under)), key=lambda p: p.count("/"), reverse=True):
            subprocess.run([*self.prefix, "umount", "--lazy", point], capture_output=True, timeout=30)
