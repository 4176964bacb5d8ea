"""A blocking connection to one YugabyteDB master or tablet server, one call at a time.

What it does is what YB's own client does on the wire (``TabletClient.java``): optional TLS
first, then the ``"YB\\x01"`` connection header, then request frames with increasing call ids
(starting at 0) and the caller's deadline in ``RequestHeader.timeout_millis``; heartbeats are
skipped. No retries, leader lookups or business logic here: errors come out typed
(:mod:`.errors`) for the caller to decide.

A call that times out leaves the stream in an unknown state (its response may still come), so
the connection is closed and the next call reconnects.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections import deque
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf.message import Message

from .errors import ProtocolError, RpcConnectionError, RpcTimeout
from .framing import CONNECTION_HEADER, DEFAULT_MAX_MESSAGE_SIZE, FrameDecoder, Response, decode_body, encode_request
from .framing import parse_response as _parse_response
from .methods import Method

M = TypeVar("M", bound=Message)

_RECV_SIZE = 128 * 1024  # yb_rpc.cc kBigPacket: the read size YB itself uses


@dataclass(frozen=True)
class TlsOptions:
    """TLS for the RPC port (server's ``use_node_to_node_encryption`` / ``use_client_to_server_encryption``).

    ``ca_file`` verifies the server; ``cert_file``/``key_file`` are the client certificate for
    servers that require one. ``server_hostname`` is checked against the certificate unless
    ``check_hostname`` is off (YB certificates often name IPs only).
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_hostname: str | None = None
    check_hostname: bool = True
    verify: bool = True

    def context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        # The connector docs say the CDC APIs work with TLSv1.2 only; never offer less.
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.verify:
            context.check_hostname = self.check_hostname
            context.verify_mode = ssl.CERT_REQUIRED
            if self.ca_file:
                context.load_verify_locations(cafile=self.ca_file)
            else:
                context.load_default_certs()
        else:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


class RpcConnection:
    """One TCP (or TLS) connection speaking YB's RPC protocol. Not thread-safe."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout: float = 10.0,
        tls: TlsOptions | None = None,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    ) -> None:
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self.tls = tls
        self.max_message_size = max_message_size
        self._sock: socket.socket | None = None
        self._decoder = FrameDecoder(max_message_size)
        self._pending: deque[bytes] = deque()
        self._next_call_id = 0

    # --- lifecycle -----------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> None:
        """Open the socket (and TLS) and send the connection header; no-op when connected."""
        if self._sock is not None:
            return
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        except OSError as error:
            raise RpcConnectionError(f"cannot connect to {self.host}:{self.port}: {error}") from error
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                # TLS wraps the whole stream: the server sniffs 0x16 0x03 (a TLS handshake) as the
                # first bytes (secure_stream.cc), so the YB header goes inside the TLS session.
                hostname = self.tls.server_hostname or self.host
                sock = self.tls.context().wrap_socket(sock, server_hostname=hostname)
            sock.sendall(CONNECTION_HEADER)
        except (OSError, ssl.SSLError) as error:
            sock.close()
            raise RpcConnectionError(f"cannot open an RPC session with {self.host}:{self.port}: {error}") from error
        self._sock = sock
        self._decoder = FrameDecoder(self.max_message_size)
        self._pending.clear()
        self._next_call_id = 0

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def __enter__(self) -> RpcConnection:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- calls ---------------------------------------------------------------------------------

    def call(
        self,
        service: str,
        method: str,
        request: Message,
        response_cls: type[M],
        timeout: float = 60.0,
    ) -> M:
        """Send one request and return its parsed response body.

        Raises :class:`RemoteRpcError` subclasses for RPC-layer errors. A service's own error
        (the response's ``error`` field) is returned as part of the response: check it with
        :func:`.errors.raise_for_service_error`.
        """
        return decode_body(self.call_raw(service, method, request, timeout), response_cls)

    def invoke(self, method: Method, request: Message, timeout: float = 60.0) -> Message:
        """:meth:`call` for a :class:`.methods.Method`."""
        return self.call(method.service, method.name, request, method.response, timeout)

    def call_raw(self, service: str, method: str, request: Message | bytes, timeout: float = 60.0) -> Response:
        """Send one request and return the raw response (header fields, body bytes, sidecars)."""
        self.connect()
        assert self._sock is not None
        deadline = time.monotonic() + timeout
        call_id = self._next_call_id
        # call_id is an int32 and must increase (rpc README); wrap long before it overflows.
        self._next_call_id = (call_id + 1) % 0x7FFFFFFF
        frame = encode_request(call_id, service, method, request, timeout_ms=int(timeout * 1000))
        try:
            self._sock.settimeout(max(deadline - time.monotonic(), 0.001))
            self._sock.sendall(frame)
            return self._await(call_id, deadline, f"{service}.{method}")
        except TimeoutError as error:
            self.close()
            raise RpcTimeout(f"{service}.{method} to {self.host}:{self.port}: no response in {timeout:g}s") from error
        except (ProtocolError, RpcConnectionError):
            self.close()
            raise
        except (OSError, ssl.SSLError) as error:
            self.close()
            raise RpcConnectionError(f"{service}.{method} to {self.host}:{self.port}: {error}") from error

    def _await(self, call_id: int, deadline: float, what: str) -> Response:
        assert self._sock is not None
        while not self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(what)
            self._sock.settimeout(remaining)
            chunk = self._sock.recv(_RECV_SIZE)
            if not chunk:
                self._decoder.close()  # raises TruncatedFrame if a frame was cut
                raise RpcConnectionError(f"{what}: {self.host}:{self.port} closed the connection")
            self._pending.extend(self._decoder.feed(chunk))
        response = _parse_response(self._pending.popleft())
        if response.call_id != call_id or self._pending:
            # One call at a time: another id, or a second frame, means the stream is not ours.
            raise ProtocolError(f"{what}: response for call {response.call_id}, expected only {call_id}")
        return response
