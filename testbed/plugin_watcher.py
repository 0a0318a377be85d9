"""TEST INFRASTRUCTURE: kubelet's plugin watcher (plugin registration over `pluginregistration.Registration`).

Watches a plugin-registry directory (kubelet's `<root>/plugins_registry`) for unix sockets, as kubelet's plugin
manager does: a socket that appears (or is replaced: a new inode or modification time at the same path) is asked
`GetInfo`; the handler of the announced plugin type validates and registers it; the plugin is told the outcome with
`NotifyRegistrationStatus(plugin_registered, error)`. A socket that disappears is deregistered from its handler.
Files whose name starts with `.` are ignored. A socket whose server does not answer GetInfo yet is asked again on
the next passes (`get_info_attempts` in all) before it is rejected. Scanning is by polling (`interval` seconds),
which keeps the stand-in free of inotify while observing the same transitions.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc

from vgpu.proto.pluginregistration.v1 import api_pb2 as reg
from vgpu.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc

__all__ = ["PluginHandler", "PluginWatcher", "RegisteredPlugin"]

log = logging.getLogger(__name__)


class PluginHandler(Protocol):
    """What a plugin type's handler does with registrations (kubelet's PluginHandler)."""

    def validate_plugin(self, name: str, endpoint: str, versions: list[str]) -> None:
        """Raise ValueError when the plugin cannot be registered."""

    def register_plugin(self, name: str, endpoint: str, versions: list[str], socket: Path) -> None:
        """Take the plugin into use; raise ValueError when that fails."""

    def deregister_plugin(self, name: str, socket: Path) -> None:
        """The plugin's registration socket is gone."""


@dataclass(frozen=True, slots=True)
class RegisteredPlugin:
    """A plugin registered through a socket of the registry directory."""

    socket: Path
    type: str
    name: str
    endpoint: str
    versions: tuple[str, ...]


class PluginWatcher:
    """Registers the plugins whose sockets appear in `directory` with the handler of their type."""

    def __init__(self, directory: str | Path, handlers: dict[str, PluginHandler], interval: float = 0.1,
                 rpc_timeout: float = 5.0, get_info_attempts: int = 20) -> None:
        self.dir = Path(directory)
        self.handlers = handlers
        self.interval = interval
        self.rpc_timeout = rpc_timeout
        self.plugins: dict[Path, RegisteredPlugin] = {}
        self.rejected: dict[Path, str] = {}  # socket -> why it was not registered (until it changes or goes)
        self.cond = threading.Condition()
        self._seen: dict[Path, tuple[int, int]] = {}  # socket -> (inode, mtime) last handled
        self._attempts: dict[Path, int] = {}  # socket -> GetInfo attempts that found no answer
        self.get_info_attempts = get_info_attempts
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PluginWatcher:
        """Create the directory and start watching (sockets already there are handled first)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="plugin-watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (registrations stay with their handlers)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.scan()
            except Exception:
                log.exception("event=plugin-scan-failed dir=%s", self.dir)
            self._stop.wait(self.interval)

    def scan(self) -> None:
        """One pass: deregister vanished or replaced sockets, register new ones."""
        present: dict[Path, tuple[int, int]] = {}
        try:
            for entry in self.dir.iterdir():
                if entry.name.startswith("."):
                    continue
                try:
                    st = entry.lstat()
                except OSError:
                    continue
                if entry.is_socket():
                    present[entry] = (st.st_ino, st.st_mtime_ns)
        except OSError:
            pass
        for path in [p for p, ident in self._seen.items() if present.get(p) != ident]:
            del self._seen[path]
            self._deregister(path)
        for path, ident in present.items():
            if path not in self._seen:
                # a socket may exist a moment before its server answers: GetInfo is tried again on later passes
                attempts = self._attempts.get(path, 0) + 1
                done = self._register(path, last_try=attempts >= self.get_info_attempts)
                if done:
                    self._seen[path] = ident
                    self._attempts.pop(path, None)
                else:
                    self._attempts[path] = attempts
        for path in [p for p in self._attempts if p not in present]:
            del self._attempts[path]

    def _deregister(self, path: Path) -> None:
        with self.cond:
            plugin = self.plugins.pop(path, None)
            self.rejected.pop(path, None)
            self.cond.notify_all()
        if plugin is not None:
            log.info("event=plugin-deregistered type=%s name=%s socket=%s", plugin.type, plugin.name, path)
            self.handlers[plugin.type].deregister_plugin(plugin.name, path)

    def _register(self, path: Path, last_try: bool) -> bool:
        """Handle a new socket; False when GetInfo got no answer and it should be tried again."""
        channel = grpc.insecure_channel(f"unix://{path}")
        try:
            stub = reg_grpc.RegistrationStub(channel)
            try:
                info = stub.GetInfo(reg.InfoRequest(), timeout=self.rpc_timeout)
            except grpc.RpcError as exc:
                if not last_try:
                    return False
                self._reject(path, f"GetInfo failed: {exc.code().name}")
                return True
            versions = list(info.supported_versions)
            error = ""
            handler = self.handlers.get(info.type)
            try:
                if handler is None:
                    raise ValueError(f"no handler registered for plugin type: {info.type!r}")
                handler.validate_plugin(info.name, info.endpoint, versions)
                handler.register_plugin(info.name, info.endpoint, versions, path)
            except ValueError as exc:
                error = str(exc)
            plugin = RegisteredPlugin(path, info.type, info.name, info.endpoint, tuple(versions))
            if error:
                self._reject(path, error)  # recorded before the plugin hears it
            else:
                with self.cond:
                    self.plugins[path] = plugin
                    self.cond.notify_all()
            try:
                stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=not error, error=error),
                                              timeout=self.rpc_timeout)
            except grpc.RpcError as exc:
                log.info("event=plugin-notify-failed socket=%s code=%s", path, exc.code().name)
                if not error:  # a plugin that cannot hear it is registered is not kept
                    self._deregister(path)
                    self._reject(path, f"NotifyRegistrationStatus failed: {exc.code().name}")
                return True
            if not error:
                log.info("event=plugin-registered type=%s name=%s endpoint=%s", info.type, info.name, info.endpoint)
            return True
        finally:
            channel.close()

    def _reject(self, path: Path, error: str) -> None:
        log.info("event=plugin-rejected socket=%s error=%s", path, error)
        with self.cond:
            self.rejected[path] = error
            self.cond.notify_all()
