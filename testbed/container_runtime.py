"""TEST INFRASTRUCTURE: a real container runtime as a judge: Debian's podman (4.3) with runc, run as root.

The pod runner stands in for kubelet plus a runtime by running processes and translating mounts into env; that
translation is our reading. This module hands what kubelet would hand a runtime to a real one instead, so the
device plugin's envs and mounts and the DRA plugin's CDI specs meet a runtime we did not write:

  * env: kubelet builds a container's list with the device plugins' variables first and the spec's `env` after
    them (kubernetes `pkg/kubelet/kubelet_pods.go` `GenerateRunContainerOptions`: `opts.Envs` from the device
    manager, then `makeEnvironmentVariables`); containerd (`WithEnv`, `oci/spec_opts.go` `replaceOrAppendEnvValues`),
    CRI-O and podman keep the last value of a name. Passed here as repeated `--env` in that order;
  * mounts: `--volume host:container[:ro]`; a missing host path fails the start (runc cannot bind it), as in
    containerd and CRI-O;
  * CDI: `--device vendor/class=name` resolved by podman's own CDI library (v0.5.x in podman 4.3) from the spec
    directories `/etc/cdi` and `/var/run/cdi` (podman 4.3 has no `cdi_spec_dirs` setting); the library refuses a
    spec whose `cdiVersion` it does not know ("unresolvable CDI devices") and applies a device's env over the
    container's own. containerd applies CDI after `WithEnv` (`WithCDIDevices` last in its spec options), so there too
    CDI env comes last and wins;
  * the image: an empty root filesystem imported from a local tarball (no registry); `/usr/bin`, `/usr/lib`,
    `/usr/lib64` and `/etc/alternatives` of the host are mounted read-only so the host's python3 runs inside, in the
    container's own PID, mount, IPC and UTS namespaces, without network.

Podman keeps its images and containers in a private storage directory (`root`), so tests leave nothing in the
host's podman state. Not modelled: image layers and pulls, user namespaces, seccomp profiles (podman's default
applies), cgroup limits of the pod.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

__all__ = ["CDI_SPEC_DIR", "IMAGE", "Podman", "ordered_env", "unavailable"]

IMAGE = "localhost/vgpu-testbed-base:1"
CDI_SPEC_DIR = Path("/var/run/cdi")  # one of the CDI library's default spec directories
_HOST_READ_ONLY = ("/usr/bin", "/usr/lib", "/usr/lib64", "/etc/alternatives")
_ROOTFS_DIRS = ("etc", "proc", "sys", "dev", "tmp", "run", "usr/local", "opt", "var/tmp")
_ROOTFS_LINKS = {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "sbin": "usr/bin"}


def unavailable() -> str:
    """Why podman cannot run containers here ("" when it can)."""
    if os.geteuid() != 0:
        return "podman runs containers here only as root"
    for command in ("podman", "runc"):
        if shutil.which(command) is None:
            return f"{command} is not installed (Debian packages podman, runc)"
    return ""


def _rootfs_tar() -> bytes:
    """An empty root filesystem: the directories a container needs and the usrmerge links of Debian."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in _ROOTFS_DIRS:
            parts = name.split("/")
            for depth in range(1, len(parts) + 1):
                info = tarfile.TarInfo("/".join(parts[:depth]))
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if parts[0] == "tmp" else 0o755
                tar.addfile(info)
        for name in ("usr/bin", "usr/lib", "usr/lib64"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, target in _ROOTFS_LINKS.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buffer.getvalue()


class Podman:
    """podman with runc and cgroupfs, its storage under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        storage = self.root / "storage.conf"
        storage.write_text(f'[storage]\ndriver = "vfs"\nrunroot = "{self.root}/run"\ngraphroot = "{self.root}/graph"\n')
        conf = self.root / "containers.conf"
        conf.write_text('[engine]\nevents_logger = "none"\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n')
        self.env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(storage), "CONTAINERS_CONF": str(conf)}

    def _podman(self, *args: str, stdin: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(["podman", *args], input=stdin, capture_output=True, env=self.env, timeout=timeout)

    def ensure_image(self) -> None:
        """Import the base image once."""
        if self._podman("image", "exists", IMAGE).returncode == 0:
            return
        done = self._podman("import", "-", IMAGE, stdin=_rootfs_tar())
        if done.returncode != 0:
            raise RuntimeError(f"podman import failed: {done.stderr.decode(errors='replace').strip()}")

    def run(self, argv: Sequence[str], env: Iterable[tuple[str, str]] = (),
            mounts: Iterable[tuple[str, str, bool]] = (), cdi_devices: Sequence[str] = (),
            name: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a container to its end: `env` in kubelet's order (later names win), `mounts` as (container path,
        host path, read-only), `cdi_devices` as fully qualified CDI names. Returns podman's completed process (the
        container's exit status, stdout and stderr; a start podman refused has its own message on stderr)."""
        args = self.run_command(argv, env, mounts, cdi_devices, name)
        return subprocess.run(args, capture_output=True, env=self.env, timeout=timeout)

    def run_command(self, argv: Sequence[str], env: Iterable[tuple[str, str]] = (),
                    mounts: Iterable[tuple[str, str, bool]] = (), cdi_devices: Sequence[str] = (),
                    name: str | None = None) -> list[str]:
        """The `podman run` command line of `run` (to start it in the foreground with `self.env` as environment:
        its exit status is the container's)."""
        self.ensure_image()
        args = ["podman", "run", "--rm", "--network=none", "--ulimit", "nofile=1024:1024",
                "--ulimit", "nproc=4096:4096"]
        if name:
            args += ["--name", name]
        for path in _HOST_READ_ONLY:
            if Path(path).exists():
                args += ["--volume", f"{path}:{path}:ro"]
        for container_path, host_path, read_only in mounts:
            args += ["--volume", f"{host_path}:{container_path}" + (":ro" if read_only else "")]
        for key, value in env:
            args += ["--env", f"{key}={value}"]
        for device in cdi_devices:
            args += ["--device", device]
        return [*args, IMAGE, *argv]

    def kill(self, name: str) -> None:
        """Kill and remove the container `name` (gone already: nothing happens)."""
        self._podman("rm", "--force", "--time", "0", name, timeout=60)

    def forget(self) -> None:
        """Remove the private storage (containers and the image)."""
        self._podman("system", "reset", "--force", timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)


def ordered_env(plugin_envs: Mapping[str, str], spec_env: Mapping[str, str]) -> list[tuple[str, str]]:
    """A container's env as kubelet hands it to the runtime: the device plugins' variables, then the spec's."""
    return [*plugin_envs.items(), *spec_env.items()]
