"""Options of `vgpu dra-plugin`: flags (some with an environment variable), their defaults and their checks.

`DRAConfig.from_flags` is the only way a configuration is built; every bad value raises ConfigError whose message
starts with the flag, so the CLI prints one line and exits 2. The derived paths (sockets, checkpoint) live here too,
so that every module agrees on them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vgpu.dra import DRIVER
from vgpu.errors import ConfigError
from vgpu.node.backends import BackendSettings
from vgpu.node.backends.sim import parse_sim_spec
from vgpu.node.host import STORAGE_KINDS

__all__ = ["BACKENDS", "DRAConfig", "parse_bool"]

Backend = Literal["nvml", "sim"]
BACKENDS: tuple[Backend, ...] = ("nvml", "sim")
# sun_path of a unix socket holds 108 bytes including the terminating NUL, but gRPC's server (grpcio 1.85) already
# refuses a 106-byte path ("Path name should not have more than 107 characters"; tried: 105 binds, 106 does not)
_SOCKET_PATH_MAX = 105


def parse_bool(text: str, flag: str) -> bool:
    """true/false (also 1/0, yes/no); ConfigError naming `flag` otherwise."""
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise ConfigError(f"{flag}: expected true or false, got {text!r}")


def _directory(text: str | None, flag: str) -> Path:
    if not text or not text.strip():
        raise ConfigError(f"{flag}: empty path")
    path = Path(text.strip())
    if not path.is_absolute():
        raise ConfigError(f"{flag}: must be an absolute path, got {text!r}")
    return path


@dataclass(frozen=True, slots=True)
class DRAConfig:
    """Everything the DRA kubelet plugin needs."""

    node_name: str
    kubeconfig: str | None
    backend: Backend
    sim_gpus: str
    sim_control: str | None
    plugins_dir: Path
    registry_dir: Path
    cdi_dir: Path
    hook_path: Path
    lock_dir: Path
    container_storage: str
    isolation_fail_open: bool
    xid_recovery_seconds: float
    pace_seconds: float = 1.0

    @classmethod
    def from_flags(cls, flags: Mapping[str, str | None], environ: Mapping[str, str]) -> DRAConfig:
        """The configuration from raw flag texts (None: not given) and the environment; raises ConfigError."""

        def given(name: str, env: str | None = None, default: str | None = None) -> str | None:
            value = flags.get(name)
            if value is None and env is not None and environ.get(env, "") != "":
                value = environ[env]
            return default if value is None else value

        node = (given("node_name", "NODE_NAME") or "").strip()
        if not node:
            raise ConfigError("--node-name: required (or $NODE_NAME)")
        backend_text = (given("backend", default="nvml") or "").strip()
        backend = next((b for b in BACKENDS if b == backend_text), None)
        if backend is None:
            raise ConfigError(f"--backend: unknown value {backend_text!r} (expected {' or '.join(BACKENDS)})")
        sim_gpus = (given("sim_gpus") or "").strip()
        if backend == "sim" and not sim_gpus:
            raise ConfigError("--sim-gpus: required with --backend sim (e.g. 2xA100-40GB)")
        if backend != "sim" and sim_gpus:
            raise ConfigError(f"--sim-gpus: only meaningful with --backend sim (backend is {backend})")
        if sim_gpus:
            try:
                parse_sim_spec(sim_gpus)
            except ConfigError as exc:
                raise ConfigError(f"--sim-gpus {sim_gpus}: {str(exc).removeprefix('sim_gpus: ')}") from None
        sim_control = given("sim_control")
        if sim_control is not None and backend != "sim":
            raise ConfigError(f"--sim-control: only meaningful with --backend sim (backend is {backend})")
        storage = given("container_storage", "CONTAINER_STORAGE", "directory") or ""
        if storage not in STORAGE_KINDS:
            raise ConfigError(f"--container-storage: expected one of {', '.join(STORAGE_KINDS)}, got {storage!r}")
        recovery_text = given("xid_recovery_seconds", default="60") or ""
        try:
            recovery = float(recovery_text)
        except ValueError:
            raise ConfigError(f"--xid-recovery-seconds: not a number: {recovery_text!r}") from None
        if not math.isfinite(recovery) or recovery <= 0:
            raise ConfigError(f"--xid-recovery-seconds: must be above 0, got {recovery_text!r}")
        pace_text = given("pace_seconds", "PACE_SECONDS", "1") or ""
        try:
            pace = float(pace_text)
        except ValueError:
            raise ConfigError(f"--pace-seconds: not a number: {pace_text!r}") from None
        if not math.isfinite(pace) or pace < 0:
            raise ConfigError(f"--pace-seconds: must be 0 (off) or above, got {pace_text!r}")
        config = cls(
            node_name=node,
            kubeconfig=given("kubeconfig"),
            backend=backend,
            sim_gpus=sim_gpus,
            sim_control=sim_control,
            plugins_dir=_directory(given("plugins_dir", default="/var/lib/kubelet/plugins"), "--plugins-dir"),
            registry_dir=_directory(given("registry_dir", default="/var/lib/kubelet/plugins_registry"),
                                    "--registry-dir"),
            cdi_dir=_directory(given("cdi_dir", default="/var/run/cdi"), "--cdi-dir"),
            hook_path=_directory(given("hook_path", "HOOK_PATH", "/usr/local"), "--hook-path"),
            lock_dir=_directory(given("lock_dir", default="/tmp/vgpulock"), "--lock-dir"),
            container_storage=storage,
            isolation_fail_open=parse_bool(given("isolation_fail_open", default="false") or "",
                                           "--isolation-fail-open"),
            xid_recovery_seconds=recovery,
            pace_seconds=pace,
        )
        for flag, socket in (("--plugins-dir", config.dra_socket), ("--registry-dir", config.registration_socket)):
            if len(str(socket).encode()) > _SOCKET_PATH_MAX:
                raise ConfigError(f"{flag}: socket path {socket} is longer than the {_SOCKET_PATH_MAX} bytes gRPC "
                                  "binds a unix socket at")
        return config

    @property
    def driver_dir(self) -> Path:
        """`<plugins dir>/<driver>`: the DRA socket and the checkpoint."""
        return self.plugins_dir / DRIVER

    @property
    def dra_socket(self) -> Path:
        """The socket of the DRA node service (the endpoint told to kubelet)."""
        return self.driver_dir / "dra.sock"

    @property
    def checkpoint_path(self) -> Path:
        """The file of prepared claims, beside the DRA socket."""
        return self.driver_dir / "checkpoint.json"

    @property
    def registration_socket(self) -> Path:
        """The socket kubelet's plugin watcher finds in its registry directory."""
        return self.registry_dir / f"{DRIVER}-reg.sock"

    def backend_settings(self) -> BackendSettings:
        """What the GPU backend reads (`make_backend`); Xids and the driver root as the device plugin's defaults."""
        return BackendSettings(backend=self.backend, node_name=self.node_name, sim_gpus=self.sim_gpus,
                               sim_control=self.sim_control, xid_recovery_seconds=self.xid_recovery_seconds)
