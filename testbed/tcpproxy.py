"""TEST INFRASTRUCTURE: a TCP forwarder that can cut the path it carries the way a network partition does.

One component's connections to the API server go through a `PartitionProxy`; `cut()` makes every connection,
open or new, hang (nothing is relayed and nothing is refused or reset: the packets are lost, as on a partition
between networks), and `heal()` closes the connections that hung, as TCP gives up on them, and relays new ones
again. It imports nothing of the product.
"""

from __future__ import annotations

import select
import socket
import threading

__all__ = ["PartitionProxy"]

_CHUNK = 65536


class PartitionProxy:
    """Relays 127.0.0.1:`port` to `target`; see the module text."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()  # every socket open, relayed or held
        self._thread = threading.Thread(target=self._accept, name=f"partition-proxy-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        """The address to give a client instead of the target's (https)."""
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> PartitionProxy:
        self._thread.start()
        return self

    def cut(self) -> None:
        """From now on nothing passes: open connections hang, new ones are accepted and hang."""
        self._cut.set()

    def heal(self) -> None:
        """Close every connection that hung and relay again."""
        with self._lock:
            hung, self._sockets = self._sockets, set()
            self._cut.clear()
        for sock in hung:
            _close(sock)

    def stop(self) -> None:
        self._stopped.set()
        _close(self._listener)
        self.heal()

    def _track(self, *sockets: socket.socket) -> bool:
        with self._lock:
            if self._stopped.is_set():
                return False
            self._sockets.update(sockets)
            return True

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                self._track(client)  # held open, never answered
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            if self._track(client, upstream):
                threading.Thread(target=self._relay, args=(client, upstream), daemon=True).start()

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        peers = {client: upstream, upstream: client}
        try:
            while not self._stopped.is_set():
                if self._cut.is_set():
                    if self._stopped.wait(0.1):
                        break
                    with self._lock:
                        if client not in self._sockets:  # healed: this connection was closed
                            break
                    continue
                readable, _, _ = select.select(list(peers), [], [], 0.1)
                for sock in readable:
                    if self._cut.is_set():
                        break
                    data = sock.recv(_CHUNK)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except OSError:
            return
        finally:
            for sock in (client, upstream):
                _close(sock)
            with self._lock:
                self._sockets.discard(client)
                self._sockets.discard(upstream)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
