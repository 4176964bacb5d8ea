"""PostgreSQL wire-protocol framing shared by the stand-ins' proxies (tests only)."""

from __future__ import annotations

import socket
import struct

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
