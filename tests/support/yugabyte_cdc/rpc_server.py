"""YB RPC over real TCP sockets: one listener per emulated server, a thread per connection.

The server side of the product's own framing code: ``FrameDecoder(expect_connection_header=True)``
checks the ``"YB\\x01"`` header and cuts frames; ``parse_request`` reads the header and body;
responses go out through ``encode_response`` / ``encode_error_response``. Calls on one
connection are answered in order. An idle connection gets an empty frame (a heartbeat) every
``heartbeat_interval`` seconds, as YB servers send them (``yb_rpc.cc``); clients skip them.

TLS, when the server has a context (``tls``), as YB's ``SecureRefiner::ProcessHeader``
(``src/yb/rpc/secure_stream.cc``) decides it: the first two bytes a client sends are looked at;
``0x16 0x03`` (a TLS handshake record) starts TLS, with the ``YB\\x01`` header and every frame
inside the session; anything else is a plaintext connection, served only while
``allow_insecure_connections`` (YB's default: true) and dropped otherwise. Without a context the
server is plaintext only: a TLS handshake is read as a bad connection header and dropped, as a YB
server without TLS does.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Callable

from google.protobuf.message import Message

from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import framing
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.errors import ProtocolError

log = logging.getLogger(__name__)
_CODES = pb.ErrorStatusPB


class RpcFailure(Exception):
    """An RPC-layer refusal: the response is ``is_error`` with an ErrorStatusPB."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


#: (service name, method name, request body) -> response message; raises RpcFailure.
Dispatch = Callable[[str, str, bytes], Message]


class RpcServer:
    """Listens on 127.0.0.1:<port> and answers every call through ``dispatch``."""

    def __init__(
        self,
        name: str,
        dispatch: Dispatch,
        *,
        heartbeat_interval: float = 1.0,
        port: int = 0,
        tls: ssl.SSLContext | None = None,
        allow_insecure_connections: bool = True,
    ) -> None:
        self.name = name
        self.dispatch = dispatch
        self.heartbeat_interval = heartbeat_interval
        self.tls = tls
        self.allow_insecure_connections = allow_insecure_connections
        self._listener = socket.create_server(("127.0.0.1", port))
        self.host, self.port = self._listener.getsockname()[:2]
        self._stop = threading.Event()
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True, name=f"yb-cdc-{name}")

    def start(self) -> RpcServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            for conn in list(self._connections):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._connections.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True, name=f"yb-cdc-{self.name}-conn").start()

    def _secure(self, conn: socket.socket) -> socket.socket | None:
        """The connection to serve: TLS if the client starts a handshake (and the server has
        TLS), the plain one if the client speaks plaintext and that is allowed, else None."""
        if self.tls is None:
            return conn
        conn.settimeout(5.0)
        first = b""
        while len(first) < 2:  # ProcessHeader waits for two bytes
            first = conn.recv(2, socket.MSG_PEEK)
            if not first:
                return None
            if len(first) < 2:
                self._stop.wait(0.01)
        if first == b"\x16\x03":
            secure = self.tls.wrap_socket(conn, server_side=True)  # the handshake, on this thread
            with self._lock:
                self._connections.discard(conn)
                self._connections.add(secure)
            return secure
        if not self.allow_insecure_connections:
            log.info("%s: dropping an insecure connection (header %s)", self.name, first.hex())
            return None
        return conn

    def _serve(self, conn: socket.socket) -> None:
        decoder = framing.FrameDecoder(expect_connection_header=True)
        try:
            secure = self._secure(conn)
            if secure is None:
                return
            conn = secure
            conn.settimeout(self.heartbeat_interval)
            while not self._stop.is_set():
                try:
                    data = conn.recv(128 * 1024)
                except TimeoutError:
                    conn.sendall(framing.HEARTBEAT)
                    continue
                if not data:
                    return
                for payload in decoder.feed(data):
                    conn.sendall(self._answer(payload))
        except ProtocolError as error:
            log.info("%s: dropping a connection: %s", self.name, error)  # as YB does on a bad stream
        except OSError:
            pass
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()

    def _answer(self, payload: bytes) -> bytes:
        request = framing.parse_request(payload)
        try:
            response = self.dispatch(request.service, request.method, request.body)
        except RpcFailure as failure:
            return framing.encode_error_response(request.call_id, failure.code, failure.message)
        except Exception as error:  # a stand-in bug: tell the client instead of hanging it
            log.exception("%s: %s.%s failed", self.name, request.service, request.method)
            return framing.encode_error_response(request.call_id, _CODES.ERROR_APPLICATION, f"stand-in error: {error}")
        return framing.encode_response(request.call_id, response)


def parse_body(message_cls: type[Message], body: bytes) -> Message:
    """The request body, or the RPC-layer error YB answers for one that does not parse."""
    message = message_cls()
    try:
        message.ParseFromString(body)
    except Exception as error:
        message = f"Invalid argument: Unable to parse request: {error}"
        raise RpcFailure(_CODES.FATAL_DESERIALIZING_REQUEST, message) from None
    return message
