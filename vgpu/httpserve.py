"""Serving HTTP(S) with uvicorn, as the extender and the admission webhook do: listen addresses, TLS files checked
before serving, and connections that must send their request headers in time."""

from __future__ import annotations

import ssl
from typing import Any

from vgpu.errors import ConfigError, VGPUError

__all__ = ["HEADER_SECONDS", "check_tls_files", "make_uvicorn_server", "parse_listen"]

# Seconds a client has to send a request's headers, from the connection's start.
HEADER_SECONDS = 10.0


def parse_listen(value: str, default_port: int) -> tuple[str, int]:
    """'HOST:PORT', ':PORT' or 'HOST' -> (host, port); an empty host means all interfaces."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = value, str(default_port)
    host = host.strip("[]") or "0.0.0.0"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise VGPUError(f"listen address {value!r}: port must be 0..65535")
    return host, int(port)


def check_tls_files(cert_file: str, key_file: str | None, client_ca_file: str | None,
                    key_flag: str = "--tls-key-file") -> None:
    """Load the TLS files as the server will; raises ConfigError naming the flag (`key_flag`: the key file's) and
    file that cannot be used."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--tls-cert-file {cert_file} with {key_flag} {key_file}: cannot be used: {exc}") from exc
    if client_ca_file:
        try:
            context.load_verify_locations(client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--tls-client-ca-file {client_ca_file}: cannot be used: {exc}") from exc


def make_uvicorn_server(app: Any, host: str, port: int, *, tls_cert_file: str | None = None,
                        tls_key_file: str | None = None, tls_client_ca_file: str | None = None,
                        key_flag: str = "--tls-key-file") -> Any:
    """A uvicorn.Server for `app` (quiet, no access log; uvloop/httptools when installed), over HTTPS with the TLS
    files, requiring a client certificate signed by `tls_client_ca_file` when given. The TLS files are loaded here
    once (check_tls_files), so that an unusable one is a ConfigError now rather than a traceback when serving."""
    import uvicorn

    tls: dict[str, Any] = {}
    if tls_cert_file:
        check_tls_files(tls_cert_file, tls_key_file, tls_client_ca_file, key_flag)
        tls = {"ssl_certfile": tls_cert_file, "ssl_keyfile": tls_key_file}
        if tls_client_ca_file:
            tls.update(ssl_ca_certs=tls_client_ca_file, ssl_cert_reqs=ssl.CERT_REQUIRED)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            timeout_keep_alive=75, http=_with_header_deadline(), **tls)
    return uvicorn.Server(config)


def _with_header_deadline() -> type:
    """uvicorn's HTTP protocol (httptools when installed, else h11) closing a connection that has not sent a
    request's headers within HEADER_SECONDS of its start (uvicorn itself times out only idle keep-alive
    connections, so a client that connects and sends nothing, or half a header, would hold its socket for ever)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class HeaderDeadline(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._header_deadline = self.loop.call_later(HEADER_SECONDS, self._no_request_yet)

        def _no_request_yet(self) -> None:
            if self.cycle is None and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._header_deadline.cancel()
            super().connection_lost(exc)

    return HeaderDeadline
