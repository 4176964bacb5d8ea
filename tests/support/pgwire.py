"""PostgreSQL wire-protocol framing shared by the stand-ins' proxies (tests only)."""

from __future__ import annotations

import socket
import struct
import threading

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104


def message(kind: bytes, body: bytes) -> bytes:
    """One backend/frontend message: type byte, length, body."""
    return kind + struct.pack("!I", len(body) + 4) + body


def error_response(sqlstate: str, text: str, severity: str = "ERROR", *, hint: str | None = None) -> bytes:
    fields = [(b"S", severity), (b"V", severity), (b"C", sqlstate), (b"M", text)]
    if hint:
        fields.append((b"H", hint))
    return message(b"E", b"".join(code + value.encode() + b"\0" for code, value in fields) + b"\0")


def error_fields(body: bytes) -> dict[bytes, str]:
    """The fields of an ErrorResponse body, by their one-byte code."""
    fields = {}
    for part in body.rstrip(b"\0").split(b"\0"):
        if part:
            fields[part[:1]] = part[1:].decode(errors="replace")
    return fields


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def read_message(sock: socket.socket) -> tuple[bytes, bytes]:
    """(type byte, body) of the next typed message."""
    kind = recv_exact(sock, 1)
    length = struct.unpack("!I", recv_exact(sock, 4))[0]
    return kind, recv_exact(sock, length - 4)


def read_startup(sock: socket.socket, refuse_ssl) -> bytes:
    """The client's StartupMessage (length included); SSL and GSSAPI encryption requests are
    answered 'N' via ``refuse_ssl``."""
    while True:
        length = struct.unpack("!I", recv_exact(sock, 4))[0]
        body = recv_exact(sock, length - 4)
        if struct.unpack("!I", body[:4])[0] in (SSL_REQUEST, GSSENC_REQUEST):
            refuse_ssl(b"N")
            continue
        return struct.pack("!I", length) + body


def startup_parameters(startup: bytes) -> dict[str, str]:
    parts = startup[8:].split(b"\0")
    return {parts[i].decode(): parts[i + 1].decode() for i in range(0, len(parts) - 1, 2) if parts[i]}


def close_quietly(*socks: socket.socket) -> None:
    for sock in socks:
        # shutdown first: close() alone leaves the connection open while another thread is still
        # in recv() on it, so PostgreSQL would never see a killed client go.
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            sock.close()
        except OSError:
            pass


def connect_pair(client: socket.socket, upstream_host: str, upstream_port: int) -> socket.socket:
    """The upstream socket for a proxied client; small protocol messages on both: no Nagle delays."""
    server = socket.create_connection((upstream_host, upstream_port))
    for sock in (client, server):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return server


class Listener:
    """Accepts on 127.0.0.1:<port> (``port``) and runs ``serve(client)`` in a thread per client."""

    def __init__(self, serve, name: str):
        self._serve = serve
        self._name = name
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True, name=name)

    def start(self):
        self._thread.start()
        return self

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True, name=f"{self._name}-c2s").start()

    def stop(self) -> None:
        self._closed = True
        close_quietly(self._listener)
