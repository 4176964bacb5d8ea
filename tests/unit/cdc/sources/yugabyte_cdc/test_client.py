"""RpcConnection against a tiny in-test server on loopback that speaks YB's framing.

The server reads the "YB\\x01" header and request frames with the same decoder a YB server's
parser follows (binary_call_parser.cc), and answers with frames as yb_rpc.cc writes them.
"""

from __future__ import annotations

import datetime
import socket
import ssl
import struct
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import errors, framing, methods
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.client import RpcConnection, TlsOptions
from tests.support.yugabyte_cdc.certificates import CaFiles, make_ca
from tests.support.yugabyte_cdc.rpc_server import RpcServer

#: A handler answers one request with the bytes to send back, in pieces (a None piece closes the
#: connection there); returning None sends nothing.
Handler = Callable[[framing.Request], "list[bytes | None] | None"]


class TinyServer:
    """Accepts connections one after another and answers each request through ``handler``."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.requests: list[framing.Request] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(5)
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            if self._stop.is_set():
                conn.close()
                return
            with conn:
                try:
                    if self.tls is not None:
                        conn = self.tls.wrap_socket(conn, server_side=True)
                    self._session(conn)
                except (OSError, ssl.SSLError, errors.ProtocolError):  # a TLS hello is a bad header here
                    continue

    def _session(self, conn: socket.socket) -> None:
        decoder = framing.FrameDecoder(expect_connection_header=True)
        conn.settimeout(5)
        while not self._stop.is_set():
            data = conn.recv(65536)
            if not data:
                return
            for payload in decoder.feed(data):
                request = framing.parse_request(payload)
                self.requests.append(request)
                pieces = self.handler(request)
                if pieces is None:
                    continue
                for piece in pieces:
                    if piece is None:
                        return  # the caller's `with conn` closes it, mid-frame if so arranged
                    conn.sendall(piece)
                    time.sleep(0.01)  # separate TCP segments: the client must reassemble

    def close(self) -> None:
        self._stop.set()
        try:  # wake the accept() the server thread may be blocked in
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            pass
        self._listener.close()
        self._thread.join(5)


@pytest.fixture
def serve() -> Iterator[Callable[..., TinyServer]]:
    servers: list[TinyServer] = []

    def start(handler: Handler, tls: ssl.SSLContext | None = None) -> TinyServer:
        servers.append(TinyServer(handler, tls))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def changes_response() -> pb.GetChangesResponsePB:
    response = pb.GetChangesResponsePB(record_type=pb.CHANGE, record_format=pb.PROTO, safe_hybrid_time=7_000)
    for op in (pb.RowMessage.BEGIN, pb.RowMessage.INSERT, pb.RowMessage.COMMIT):
        record = response.cdc_sdk_proto_records.add()
        record.row_message.op = op
        record.row_message.transaction_id = b"t" * 16
        record.row_message.commit_time = 6_999
        record.cdc_sdk_op_id.term, record.cdc_sdk_op_id.index = 1, 5
    insert = response.cdc_sdk_proto_records[1].row_message
    insert.table, insert.pgschema_name = "orders", "public"
    insert.new_tuple.add(column_name="id", column_type=20, datum_int64=42)
    insert.new_tuple.add(column_name="note", column_type=25, datum_string="hello")
    response.cdc_sdk_checkpoint.term, response.cdc_sdk_checkpoint.index = 1, 5
    return response


def split_in_three(frame: bytes) -> list[bytes]:
    return [frame[:3], frame[3:11], frame[11:]]


def test_get_changes_then_an_error_response_then_more(serve):
    def handler(request: framing.Request) -> list[bytes]:
        if request.method == "GetChanges":
            frame = framing.encode_response(request.call_id, changes_response())
            return [framing.HEARTBEAT, *split_in_three(frame)]
        return [framing.encode_error_response(request.call_id, pb.ErrorStatusPB.ERROR_SERVER_TOO_BUSY, "busy")]

    server = serve(handler)
    request = pb.GetChangesRequestPB(db_stream_id=b"d540f5e4890c4d3b812933cbfd703ed3", tablet_id=b"tablet-1")
    request.from_cdc_sdk_checkpoint.term, request.from_cdc_sdk_checkpoint.index = 1, 4
    with RpcConnection("127.0.0.1", server.port, connect_timeout=5, tls=None) as connection:
        response = connection.invoke(methods.GET_CHANGES, request, timeout=5)
        assert [r.row_message.op for r in response.cdc_sdk_proto_records] == [
            pb.RowMessage.BEGIN,
            pb.RowMessage.INSERT,
            pb.RowMessage.COMMIT,
        ]
        assert response.cdc_sdk_proto_records[1].row_message.new_tuple[1].datum_string == "hello"
        assert (response.cdc_sdk_checkpoint.term, response.cdc_sdk_checkpoint.index) == (1, 5)

        with pytest.raises(errors.ServerTooBusy, match="busy") as caught:
            connection.call(
                "yb.cdc.CDCService", "GetCheckpoint", pb.GetCheckpointRequestPB(), pb.GetCheckpointResponsePB
            )
        assert caught.value.retriable
        assert connection.connected  # an RPC-level error leaves the stream intact

        again = connection.invoke(methods.GET_CHANGES, request, timeout=5)
        assert len(again.cdc_sdk_proto_records) == 3

    first, second, third = server.requests
    assert [r.call_id for r in server.requests] == [0, 1, 2]  # increasing, from 0 (TabletClient.java)
    assert (first.service, first.method) == ("yb.cdc.CDCService", "GetChanges")
    assert first.timeout_ms == 5000
    sent = pb.GetChangesRequestPB.FromString(first.body)
    assert sent.tablet_id == b"tablet-1" and sent.from_cdc_sdk_checkpoint.index == 4
    assert (second.method, third.method) == ("GetCheckpoint", "GetChanges")


def test_a_service_error_comes_back_in_the_response(serve):
    def handler(request: framing.Request) -> list[bytes]:
        body = pb.GetChangesResponsePB()
        body.error.code = pb.CDCErrorPB.TABLET_SPLIT
        body.error.status.code = pb.AppStatusPB.TABLET_SPLIT
        body.error.status.message = "Tablet Split detected on tablet-1"
        return [framing.encode_response(request.call_id, body)]

    server = serve(handler)
    with RpcConnection("127.0.0.1", server.port, tls=None) as connection:
        response = connection.invoke(methods.GET_CHANGES, pb.GetChangesRequestPB(tablet_id=b"tablet-1"), timeout=5)
    with pytest.raises(errors.TabletSplit, match="Tablet Split detected"):
        errors.raise_for_service_error(response)


def test_no_answer_is_a_timeout_and_the_connection_is_dropped(serve):
    server = serve(lambda request: None)
    connection = RpcConnection("127.0.0.1", server.port, tls=None)
    started = time.monotonic()
    with pytest.raises(errors.RpcTimeout, match=r"no response in 0\.3s"):
        connection.invoke(methods.GET_CHECKPOINT, pb.GetCheckpointRequestPB(), timeout=0.3)
    assert time.monotonic() - started < 3
    assert not connection.connected
    assert server.requests[0].timeout_ms == 300


def test_a_connection_cut_inside_a_frame_is_a_truncated_frame(serve):
    def handler(request: framing.Request) -> list[bytes | None]:
        return [framing.encode_response(request.call_id, changes_response())[:20], None]

    server = serve(handler)
    connection = RpcConnection("127.0.0.1", server.port, tls=None)
    with pytest.raises(errors.TruncatedFrame, match="inside a frame"):
        connection.invoke(methods.GET_CHANGES, pb.GetChangesRequestPB(), timeout=5)
    assert not connection.connected


def test_a_server_that_hangs_up_is_a_connection_error_worth_a_retry(serve):
    server = serve(lambda request: [None])  # close between frames, without answering
    connection = RpcConnection("127.0.0.1", server.port, tls=None)
    with pytest.raises(errors.RpcConnectionError, match="closed the connection") as caught:
        connection.invoke(methods.GET_CHECKPOINT, pb.GetCheckpointRequestPB(), timeout=5)
    assert caught.value.retriable and caught.value.rediscover
    assert not connection.connected


def test_nothing_listening_is_a_connection_error():
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    with pytest.raises(errors.RpcConnectionError, match="cannot connect"):
        RpcConnection("127.0.0.1", port, connect_timeout=1).connect()


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "node.crt", tmp_path / "node.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def test_tls_wraps_the_connection_header_and_the_frames(serve, tmp_path):
    cert, key = self_signed(tmp_path)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)

    server = serve(
        lambda request: [framing.encode_response(request.call_id, pb.GetCheckpointResponsePB())], server_context
    )
    tls = TlsOptions(ca_file=str(cert), server_hostname="localhost")
    with RpcConnection("127.0.0.1", server.port, tls=tls) as connection:
        response = connection.invoke(methods.GET_CHECKPOINT, pb.GetCheckpointRequestPB(tablet_id=b"t"), timeout=5)
    assert not response.HasField("error")
    assert server.requests[0].method == "GetCheckpoint"

    untrusted = RpcConnection("127.0.0.1", server.port, tls=TlsOptions(server_hostname="localhost"))
    with pytest.raises(errors.RpcTlsError, match="certificate is not trusted"):
        untrusted.connect()


# --- TLS by default --------------------------------------------------------------------------------
# Against the stand-in's own RPC server (tests/support/yugabyte_cdc/rpc_server.py), which decides
# TLS as YB's SecureRefiner::ProcessHeader does: a TLS handshake record first starts TLS, anything
# else is plaintext (if allow_insecure_connections), and without TLS a handshake is a bad header.


def checkpoint_server(**options) -> tuple[RpcServer, list[str]]:
    """A stand-in RPC server answering every call with an empty GetCheckpoint response; the list
    collects the methods it was asked."""
    asked: list[str] = []

    def dispatch(service: str, method: str, body: bytes) -> pb.GetCheckpointResponsePB:
        asked.append(method)
        return pb.GetCheckpointResponsePB()

    return RpcServer("tls-test", dispatch, heartbeat_interval=0.5, **options).start(), asked


def server_tls(ca: CaFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(ca.server_cert, ca.server_key)
    return context


def ask(connection: RpcConnection) -> pb.GetCheckpointResponsePB:
    return connection.invoke(methods.GET_CHECKPOINT, pb.GetCheckpointRequestPB(tablet_id=b"t"), timeout=5)


def test_without_a_choice_the_client_speaks_tls_and_verifies_the_server(tmp_path):
    pytest.importorskip("cryptography")
    ca = make_ca(tmp_path / "ca")
    # YB's default server: TLS, and plaintext clients allowed too (allow_insecure_connections)
    server, asked = checkpoint_server(tls=server_tls(ca), allow_insecure_connections=True)
    try:
        # No TLS options given: TLS, verified against the system's CA store, which does not know
        # the test CA. Refused before anything is sent, although the server would take plaintext.
        default = RpcConnection("127.0.0.1", server.port, connect_timeout=5)
        assert default.tls == TlsOptions()
        with pytest.raises(errors.RpcTlsError, match=r"certificate is not trusted.*system's CA store") as caught:
            ask(default)
        assert not caught.value.retriable and not default.connected
        assert asked == []

        # The cluster's root given: verified, the host name (127.0.0.1) checked, the call inside TLS.
        with RpcConnection("127.0.0.1", server.port, tls=TlsOptions(ca_file=str(ca.root_cert))) as connection:
            assert isinstance(connection._sock, ssl.SSLSocket)
            assert connection._sock.version() in ("TLSv1.2", "TLSv1.3")
            assert not ask(connection).HasField("error")
        assert asked == ["GetCheckpoint"]

        # Plaintext only when asked for explicitly (tls=None); this server lets it in, as YB does
        # by default, which is why the choice must be the client's.
        with RpcConnection("127.0.0.1", server.port, tls=None) as plain:
            assert not isinstance(plain._sock, ssl.SSLSocket)
            ask(plain)
        assert asked == ["GetCheckpoint", "GetCheckpoint"]
    finally:
        server.stop()


def test_a_certificate_for_another_name_fails_verify_full_and_passes_verify_ca(tmp_path):
    pytest.importorskip("cryptography")
    ca = make_ca(tmp_path / "ca", names=("node1.yb.example",))
    server, asked = checkpoint_server(tls=server_tls(ca), allow_insecure_connections=False)
    try:
        full = RpcConnection("127.0.0.1", server.port, tls=TlsOptions(ca_file=str(ca.root_cert)))
        with pytest.raises(errors.RpcTlsError, match=r"not trusted.*127\.0\.0\.1"):
            ask(full)
        verify_ca = TlsOptions(ca_file=str(ca.root_cert), check_hostname=False)
        with RpcConnection("127.0.0.1", server.port, tls=verify_ca) as connection:
            ask(connection)
        assert asked == ["GetCheckpoint"]
        # This server refuses plaintext (allow_insecure_connections=false): dropped, never served.
        with pytest.raises(errors.RpcConnectionError, match=r"closed the connection|reset by peer"):
            ask(RpcConnection("127.0.0.1", server.port, tls=None))
        assert asked == ["GetCheckpoint"]
    finally:
        server.stop()


def test_a_plaintext_server_is_a_clear_error_never_a_downgrade():
    # A server without TLS (a YB cluster without use_client_to_server_encryption) reads the TLS
    # handshake as a bad connection header and drops the connection.
    server, asked = checkpoint_server()
    try:
        connection = RpcConnection("127.0.0.1", server.port, connect_timeout=5)
        with pytest.raises(errors.RpcTlsError, match=r"without TLS.*rpc_sslmode=disable") as caught:
            ask(connection)
        assert not caught.value.retriable and not connection.connected
        assert asked == []  # nothing was sent in plaintext
        # The same server, asked in plaintext on purpose, answers.
        with RpcConnection("127.0.0.1", server.port, tls=None) as plain:
            ask(plain)
        assert asked == ["GetCheckpoint"]
    finally:
        server.stop()


# --- frame caps -------------------------------------------------------------------------------------

MIB = methods.MIB


class AnnouncingServer:
    """Answers the first request with a bare 4-byte length prefix announcing ``announce`` bytes
    (and a few bytes of it), then keeps the connection open: a server that would send a huge frame."""

    def __init__(self, announce: int) -> None:
        self.announce = announce
        self.received = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        with conn:
            conn.settimeout(10)
            decoder = framing.FrameDecoder(expect_connection_header=True)
            try:
                while not decoder.feed(conn.recv(65536)):
                    pass
                conn.sendall(struct.pack(">I", self.announce) + b"\x00" * 64)
                while conn.recv(65536):  # until the client hangs up
                    pass
            except OSError:
                pass

    def close(self) -> None:
        self._listener.close()
        self._thread.join(5)


def test_a_frame_above_the_methods_cap_is_refused_before_it_is_read_or_allocated():
    announced = 200 * MIB  # below YB's rpc_max_message_size (255 MB), far above GetChanges' 64 MiB cap
    server = AnnouncingServer(announced)
    connection = RpcConnection("127.0.0.1", server.port, tls=None)
    try:
        started = time.monotonic()
        tracemalloc.start()
        try:
            with pytest.raises(errors.FrameTooLarge) as caught:
                connection.invoke(methods.GET_CHANGES, pb.GetChangesRequestPB(tablet_id=b"t"), timeout=10)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        message = str(caught.value)
        assert "yb.cdc.CDCService.GetChanges" in message
        assert f"a frame of {announced + 4} bytes" in message
        assert f"cap of {methods.GET_CHANGES_MAX_BYTES} bytes" in message
        assert time.monotonic() - started < 5  # refused at the length prefix, not after a timeout
        assert peak < MIB  # the 200 MiB were never allocated
        assert not caught.value.retriable and not connection.connected
    finally:
        connection.close()
        server.close()


def test_each_method_has_its_own_cap_and_the_caller_may_set_another():
    assert methods.GET_CHANGES.max_response_bytes == methods.GET_CHANGES_MAX_BYTES == 64 * MIB
    assert methods.GET_CHECKPOINT.max_response_bytes == methods.SET_CDC_CHECKPOINT.max_response_bytes == MIB
    assert methods.MASTER_GET_TABLE_LOCATIONS.max_response_bytes == methods.LISTING_MAX_BYTES
    server = AnnouncingServer(2 * MIB)  # a 2 MiB answer to GetCheckpoint, capped at 1 MiB
    try:
        connection = RpcConnection("127.0.0.1", server.port, tls=None)
        with pytest.raises(errors.FrameTooLarge, match=rf"GetCheckpoint.*cap of {MIB} bytes"):
            connection.invoke(methods.GET_CHECKPOINT, pb.GetCheckpointRequestPB(), timeout=5)
    finally:
        server.close()
    server = AnnouncingServer(3 * MIB)
    try:
        connection = RpcConnection("127.0.0.1", server.port, tls=None)
        with pytest.raises(errors.FrameTooLarge, match=rf"cap of {2 * MIB} bytes"):
            connection.invoke(methods.GET_CHANGES, pb.GetChangesRequestPB(), timeout=5, max_response_bytes=2 * MIB)
    finally:
        server.close()


def test_a_large_response_is_read_into_one_buffer_without_copies(serve):
    big = changes_response()
    big.cdc_sdk_proto_records[1].row_message.new_tuple[1].datum_string = "x" * (12 * MIB)
    frame = framing.encode_response(0, big)
    pieces = [frame[: 3 * MIB], frame[3 * MIB : 7 * MIB], frame[7 * MIB :]]  # built before measuring
    server = serve(lambda request: pieces)
    with RpcConnection("127.0.0.1", server.port, tls=None) as connection:
        tracemalloc.start()
        try:
            response = connection.invoke(methods.GET_CHANGES, pb.GetChangesRequestPB(), timeout=20)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert len(response.cdc_sdk_proto_records[1].row_message.new_tuple[1].datum_string) == 12 * MIB
    # One buffer of the frame's size: no growing read buffer, no copy of the frame or of its body.
    assert peak < 1.2 * len(frame), (peak, len(frame))
