"""A blocking connection to one YugabyteDB master or tablet server, one call at a time.

What it does is what YB's own client does on the wire (``TabletClient.java``): TLS first (on by
default, see :class:`TlsOptions`), then the ``"YB\\x01"`` connection header, then request frames
with increasing call ids (starting at 0) and the caller's deadline in
``RequestHeader.timeout_millis``; heartbeats are skipped. No retries, leader lookups or business
logic here: errors come out typed (:mod:`.errors`) for the caller to decide.

Each response frame is read into one buffer allocated for it once its length is known and found
within the method's cap (:attr:`.methods.Method.max_response_bytes`): a larger frame fails the
call before any of it is read or allocated. The body is parsed from a view of that buffer.

A call that times out leaves the stream in an unknown state (its response may still come), so
the connection is closed and the next call reconnects; so does a refused frame.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf.message import Message

from .errors import FrameTooLarge, ProtocolError, RpcConnectionError, RpcTimeout, RpcTlsError, TruncatedFrame
from .framing import (
    CONNECTION_HEADER,
    DEFAULT_MAX_MESSAGE_SIZE,
    LENGTH_PREFIX_SIZE,
    Response,
    decode_body,
    encode_request,
)
from .framing import parse_response as _parse_response
from .methods import Method

M = TypeVar("M", bound=Message)

_UINT32 = struct.Struct(">I")


@dataclass(frozen=True)
class TlsOptions:
    """TLS for the RPC port (server's ``use_node_to_node_encryption`` / ``use_client_to_server_encryption``).

    The default, ``TlsOptions()``, is TLS with the server verified against the system's CA store
    and its certificate checked to name the address connected to. ``ca_file`` verifies the server
    against that root instead; ``cert_file``/``key_file`` are the client certificate for servers
    that require one. ``server_hostname`` is checked against the certificate unless
    ``check_hostname`` is off (YB certificates often name IPs only: ``verify-ca``).
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


#: What a connection uses when the caller does not choose: TLS, verified (system CA store).
DEFAULT_TLS = TlsOptions()


class RpcConnection:
    """One TCP connection speaking YB's RPC protocol, inside TLS unless ``tls`` is None (plaintext:
    an explicit choice; the default is :data:`DEFAULT_TLS`). Not thread-safe.

    ``max_message_size`` is the absolute frame limit (YB's ``rpc_max_message_size``); each call
    is further capped by its method's ``max_response_bytes`` or the caller's ``max_response_bytes``.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout: float = 10.0,
        tls: TlsOptions | None = DEFAULT_TLS,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    ) -> None:
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self.tls = tls
        self.max_message_size = max_message_size
        self._sock: socket.socket | None = None
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
                sock = self._start_tls(sock)
            sock.sendall(CONNECTION_HEADER)
        except RpcTlsError:
            sock.close()
            raise
        except (OSError, ssl.SSLError) as error:
            sock.close()
            raise RpcConnectionError(f"cannot open an RPC session with {self.host}:{self.port}: {error}") from error
        self._sock = sock
        self._next_call_id = 0

    def _start_tls(self, sock: socket.socket) -> ssl.SSLSocket:
        """The TLS handshake, first thing on the connection: a YB server looks at the first two
        bytes a client sends and starts TLS on ``0x16 0x03`` (a TLS handshake record), else treats
        the connection as plaintext if ``allow_insecure_connections`` (default true) lets it
        (``SecureRefiner::ProcessHeader``, ``src/yb/rpc/secure_stream.cc``, yugabyte-db
        010a1110). So the handshake goes before the ``YB\\x01`` header, which travels inside the
        session with every frame; a client that sends the header first is served in plaintext
        even by a TLS-enabled server. A server without TLS reads the handshake as a bad
        connection header and drops the connection: that is a configuration error, never a
        reason to fall back to plaintext."""
        if self.tls is None:
            raise RuntimeError("TLS handshake asked for on a plaintext connection")
        hostname = self.tls.server_hostname or self.host
        where = f"{self.host}:{self.port}"
        try:
            context = self.tls.context()
        except (OSError, ssl.SSLError) as error:
            raise RpcTlsError(f"TLS for {where}: cannot load the certificate files: {error}") from error
        try:
            return context.wrap_socket(sock, server_hostname=hostname)
        except ssl.SSLCertVerificationError as error:
            trust = f"the root certificate {self.tls.ca_file}" if self.tls.ca_file else "the system's CA store"
            raise RpcTlsError(
                f"TLS with {where}: the server's certificate is not trusted ({error.verify_message}; checked "
                f"against {trust}, host name {hostname!r}). Give the cluster's root certificate "
                "(rpc_ssl_root_cert), or rpc_sslmode=verify-ca for certificates that do not name this address"
            ) from error
        except TimeoutError as error:
            raise RpcTlsError(
                f"TLS with {where}: no TLS handshake answer within {self.connect_timeout:g}s. {_PLAIN_HINT}"
            ) from error
        except (OSError, ssl.SSLError) as error:
            raise RpcTlsError(
                f"TLS with {where}: the handshake failed ({error}); the server closed the connection or "
                f"answered without TLS. {_PLAIN_HINT}"
            ) from error

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
        *,
        max_response_bytes: int | None = None,
    ) -> M:
        """Send one request and return its parsed response body.

        Raises :class:`RemoteRpcError` subclasses for RPC-layer errors. A service's own error
        (the response's ``error`` field) is returned as part of the response: check it with
        :func:`.errors.raise_for_service_error`.
        """
        response = self.call_raw(service, method, request, timeout, max_response_bytes=max_response_bytes)
        return decode_body(response, response_cls)

    def invoke(
        self, method: Method, request: Message, timeout: float = 60.0, *, max_response_bytes: int | None = None
    ) -> Message:
        """:meth:`call` for a :class:`.methods.Method`, capped at its ``max_response_bytes``
        unless the caller gives another cap."""
        cap = method.max_response_bytes if max_response_bytes is None else max_response_bytes
        return self.call(method.service, method.name, request, method.response, timeout, max_response_bytes=cap)

    def call_raw(
        self,
        service: str,
        method: str,
        request: Message | bytes,
        timeout: float = 60.0,
        *,
        max_response_bytes: int | None = None,
    ) -> Response:
        """Send one request and return the raw response (header fields, body, sidecars: views of
        the frame's buffer). A response frame above ``max_response_bytes`` (default: the
        connection's ``max_message_size``) fails with :class:`FrameTooLarge` before it is read."""
        self.connect()
        if self._sock is None:
            raise RuntimeError(f"connection to {self.host} is not open")
        what = f"{service}.{method}"
        limit = self.max_message_size if max_response_bytes is None else min(max_response_bytes, self.max_message_size)
        deadline = time.monotonic() + timeout
        call_id = self._next_call_id
        # call_id is an int32 and must increase (rpc README); wrap long before it overflows.
        self._next_call_id = (call_id + 1) % 0x7FFFFFFF
        frame = encode_request(call_id, service, method, request, timeout_ms=int(timeout * 1000))
        try:
            self._sock.settimeout(max(deadline - time.monotonic(), 0.001))
            self._sock.sendall(frame)
            response = self._read_response(deadline, what, limit)
        except TimeoutError as error:
            self.close()
            raise RpcTimeout(f"{what} to {self.host}:{self.port}: no response in {timeout:g}s") from error
        except (ProtocolError, RpcConnectionError):
            self.close()
            raise
        except (OSError, ssl.SSLError) as error:
            self.close()
            raise RpcConnectionError(f"{what} to {self.host}:{self.port}: {error}") from error
        if response.call_id != call_id:
            # One call at a time: another id means the stream is not ours.
            self.close()
            raise ProtocolError(f"{what}: response for call {response.call_id}, expected only {call_id}")
        return response

    def _read_response(self, deadline: float, what: str, limit: int) -> Response:
        """The next frame that is not a heartbeat, read into one buffer of exactly its size."""
        prefix = bytearray(LENGTH_PREFIX_SIZE)
        while True:
            self._read_into(memoryview(prefix), deadline, what, in_frame=False)
            (length,) = _UINT32.unpack(prefix)
            if not length:
                continue  # an empty frame: a heartbeat
            total = length + LENGTH_PREFIX_SIZE
            if total > limit:
                raise FrameTooLarge(
                    f"{what} from {self.host}:{self.port}: the response is a frame of {total} bytes, above this "
                    f"client's cap of {limit} bytes for {what}; nothing of it was read and the connection is closed"
                )
            payload = bytearray(length)
            self._read_into(memoryview(payload), deadline, what, in_frame=True)
            return _parse_response(memoryview(payload))

    def _read_into(self, view: memoryview, deadline: float, what: str, *, in_frame: bool) -> None:
        """Fill ``view`` from the socket (``recv_into``: no intermediate chunks)."""
        if self._sock is None:
            raise RuntimeError(f"connection to {self.host} is not open")
        size, filled = len(view), 0
        while filled < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(what)
            self._sock.settimeout(remaining)
            count = self._sock.recv_into(view[filled:])
            if not count:
                if in_frame or filled:
                    raise TruncatedFrame(f"{what}: connection closed inside a frame ({size - filled} bytes unread)")
                raise RpcConnectionError(f"{what}: {self.host}:{self.port} closed the connection")
            filled += count


_PLAIN_HINT = (
    "A YugabyteDB server without TLS on its RPC port (use_node_to_node_encryption / "
    "use_client_to_server_encryption off) drops a TLS handshake; the client never falls back to "
    "plaintext by itself: enable TLS on the cluster, or set rpc_sslmode=disable on the connection to "
    "speak plaintext explicitly"
)
