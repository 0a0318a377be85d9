"""TEST INFRASTRUCTURE: container logs as `kubectl logs` reads them, both halves of the path.

The kubelet stand-in's half (`ContainerLogServer`): kubelet's read-only endpoint `GET /containerLogs/{namespace}/
{pod}/{container}` (pkg/kubelet/server/server.go `getContainerLogs`), serving what the container wrote (the pod
runner's `<namespace>_<pod>_<container>.log`), with `tailLines` and `limitBytes` applied in that order as kubelet's
log reader does; a container with no log yet answers 400 `container "c" in pod "p" is waiting to start:
ContainerCreating` (pkg/kubelet/kuberuntime/kuberuntime_container.go, via the server's BadRequest). Its port goes
into the Node's `status.daemonEndpoints.kubeletEndpoint.Port`.

The API server's half (`log_location`, `fetch_log`): `GET pods/{name}/log` is pkg/registry/core/pod/rest/log.go
`LogREST.Get` with pkg/registry/core/pod/strategy.go `LogLocation` and `validateContainer`: no `container` names the
only container, or fails with 400 `a container name must be specified for pod P, choose one of: [a b]` (all
containers, init containers first, Go's slice print); a name the pod lacks is 400 `container C is not valid for pod
P`; a pod not bound to a node has an empty log (no location, an empty 200 stream); else the node's kubelet endpoint
is asked (its InternalIP, the daemon endpoint's port) and its answer streamed back as text/plain, a non-2xx one
turned into a Status by apiserver/pkg/registry/generic/rest/response_checker.go (400 BadRequest and 500 InternalError
with the kubelet's text as message, 404 NotFound).
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

__all__ = ["ContainerLogServer", "LogError", "fetch_log", "log_location", "read_log"]

Obj = dict[str, Any]
_FORWARDED = ("tailLines", "limitBytes")


class LogError(Exception):
    """A pods/log request the API server refuses: HTTP code, Status reason, message."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def read_log(path: Path, tail_lines: int | None = None, limit_bytes: int | None = None) -> bytes:
    """A log file's bytes: its last `tail_lines` lines, then at most `limit_bytes` bytes of them."""
    data = path.read_bytes()
    if tail_lines is not None:
        lines = data.splitlines(keepends=True)
        data = b"".join(lines[-tail_lines:]) if tail_lines > 0 else b""
    if limit_bytes is not None:
        data = data[:limit_bytes]
    return data


def _number(query: dict[str, list[str]], name: str) -> int | None:
    value = (query.get(name) or [""])[-1]
    return int(value) if value.lstrip("-").isdigit() else None


class ContainerLogServer:
    """kubelet's container-log endpoint over the files in `logs` (`<namespace>_<pod>_<container>.log`)."""

    def __init__(self, logs: Path, host: str = "127.0.0.1") -> None:
        self.logs = logs
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                parts = url.path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self._answer(404, b"404 page not found\n")
                    return
                namespace, pod, container = parts[1:]
                path = server.logs / f"{namespace}_{pod}_{container}.log"
                if not path.is_file():
                    self._answer(400, f'container "{container}" in pod "{pod}" is waiting to start: '
                                      "ContainerCreating".encode())
                    return
                query = parse_qs(url.query)
                self._answer(200, read_log(path, _number(query, "tailLines"), _number(query, "limitBytes")))

            def _answer(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:  # quiet: the node's log is for its own events
                return

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="container-logs", daemon=True)

    def start(self) -> ContainerLogServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _container(pod: Obj, container: str | None) -> str:
    """The container a log request reads (validateContainer)."""
    spec = pod.get("spec") or {}
    name = (pod.get("metadata") or {}).get("name") or ""
    main = [str(c.get("name")) for c in spec.get("containers") or ()]
    every = [str(c.get("name")) for f in ("initContainers", "containers", "ephemeralContainers")
             for c in spec.get(f) or ()]
    if not container:
        if len(main) == 1:
            return main[0]
        if not main:
            raise LogError(400, "BadRequest", f"a container name must be specified for pod {name}")
        raise LogError(400, "BadRequest",
                       f"a container name must be specified for pod {name}, choose one of: [{' '.join(every)}]")
    if container not in every:
        raise LogError(400, "BadRequest", f"container {container} is not valid for pod {name}")
    return container


def log_location(pod: Obj, node: Obj | None, query: dict[str, str]) -> str | None:
    """The kubelet URL a pods/log request reads, or None when the pod is on no node (an empty log)."""
    container = _container(pod, query.get("container"))
    node_name = (pod.get("spec") or {}).get("nodeName")
    if not node_name:
        return None
    status = (node or {}).get("status") or {}
    port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
    address = next((a.get("address") for a in status.get("addresses") or () if a.get("type") == "InternalIP"), None)
    if node is None or not port or not address:
        raise LogError(500, "InternalError", f"node {node_name} has no kubelet endpoint to read logs from")
    meta = pod.get("metadata") or {}
    params = urlencode({k: query[k] for k in _FORWARDED if k in query})
    path = "/".join(quote(str(p), safe="") for p in (meta.get("namespace"), meta.get("name"), container))
    return f"http://{address}:{port}/containerLogs/{path}" + (f"?{params}" if params else "")


def fetch_log(url: str, name: str, timeout: float = 10.0) -> bytes:
    """The kubelet's answer for `url`; a non-2xx one as the LogError the API server answers with."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        if exc.code == 400:
            raise LogError(400, "BadRequest", text) from None
        if exc.code == 404:
            raise LogError(404, "NotFound",
                           f"the server could not find the requested resource ( pods/log {name})") from None
        raise LogError(exc.code, "InternalError", text) from None
    except (urllib.error.URLError, OSError) as exc:
        raise LogError(500, "InternalError", f"Get \"{url}\": {getattr(exc, 'reason', exc)}") from None
