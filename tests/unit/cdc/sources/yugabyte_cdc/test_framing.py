"""YB RPC framing: byte-level fixtures built from YugabyteDB's own sources, round trips, bad input.

Each fixture names the yugabyte/yugabyte-db file it follows. The bytes are written out by hand
(not produced by the code under test) so that a wrong encoder cannot agree with itself.
"""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import framing
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.errors import (
    FrameTooLarge,
    NoSuchMethod,
    ProtocolError,
    ServerTooBusy,
    TruncatedFrame,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.framing import (
    CONNECTION_HEADER,
    HEARTBEAT,
    FrameDecoder,
)

STREAM_ID = b"d540f5e4890c4d3b812933cbfd703ed3"  # the example DB stream id of the connector docs (seed 004)


def only_frame(data: bytes, **decoder_args: object) -> bytes:
    (payload,) = FrameDecoder(**decoder_args).feed(data)  # type: ignore[arg-type]
    return payload


# --- fixtures from YB's sources --------------------------------------------------------------


def test_connection_header_is_yb_then_one():
    # src/yb/rpc/yb_rpc.cc: kConnectionHeaderBytes[] = "YB\1";
    # java/yb-client/.../TabletClient.java: RPC_HEADER = new byte[] { 'Y', 'B', 1 }.
    yb_then_one = bytes([ord("Y"), ord("B"), 1])
    assert yb_then_one == CONNECTION_HEADER


def test_request_frame_follows_serialization_cc_step_by_step():
    # src/yb/rpc/serialization.cc, SerializeHeader then SerializeMessage, with the header a
    # RequestHeader (rpc_header.proto: call_id = 1, remote_method = 2, timeout_millis = 3;
    # RemoteMethodPB: service_name = 1, method_name = 2) and the body a GetChangesRequestPB
    # (cdc_service.proto: tablet_id = 2, db_stream_id = 6), as GetChangesRequest.java sends it.
    remote_method = (
        b"\x0a\x11"
        + b"yb.cdc.CDCService"  # service_name, 17 bytes
        + b"\x12\x0a"
        + b"GetChanges"  # method_name, 10 bytes
    )
    header = (
        b"\x08\x07"  # call_id = 7
        + b"\x12"
        + bytes([len(remote_method)])
        + remote_method
        + b"\x18\xe0\xd4\x03"  # timeout_millis = 60000 (varint e0 d4 03)
    )
    body = b"\x12\x08" + b"tablet-1" + b"\x32\x20" + STREAM_ID
    # "2. The varint-prefixed RequestHeader PB" and the varint-prefixed body ...
    rest = bytes([len(header)]) + header + bytes([len(body)]) + body
    # "1. The length for the whole request, not including the 4-byte length prefix."
    expected = struct.pack(">I", len(rest)) + rest

    request = pb.GetChangesRequestPB(tablet_id=b"tablet-1", db_stream_id=STREAM_ID)
    assert framing.encode_request(7, "yb.cdc.CDCService", "GetChanges", request, timeout_ms=60_000) == expected

    parsed = framing.parse_request(only_frame(CONNECTION_HEADER + expected, expect_connection_header=True))
    assert parsed == framing.Request(7, "yb.cdc.CDCService", "GetChanges", 60_000, body)


def test_response_with_sidecars_follows_yb_rpc_cc():
    # src/yb/rpc/yb_rpc.cc SerializeResponseBuffer: ResponseHeader{call_id, is_error (always set),
    # sidecar_offsets}; sidecars.cc MoveOffsetsTo shifts each offset by the body's size, so the
    # offsets count from the body's first byte (the diagram in src/yb/rpc/README); the body's
    # varint covers body + sidecars (SerializeMessage's additional_size).
    body = b"\x50\x05"  # GetChangesResponsePB{safe_hybrid_time = 5} (field 10, varint)
    sidecars = [b"abc", b"de"]
    header = b"\x08\x07" + b"\x10\x00" + b"\x18\x02" + b"\x18\x05"  # call_id 7, is_error false, offsets 2, 5
    rest = bytes([len(header)]) + header + bytes([len(body) + 5]) + body + b"abc" + b"de"
    expected = struct.pack(">I", len(rest)) + rest

    assert framing.encode_response(7, pb.GetChangesResponsePB(safe_hybrid_time=5), sidecars=sidecars) == expected

    response = framing.parse_response(only_frame(expected))
    assert response == framing.Response(7, False, body, (b"abc", b"de"))
    assert framing.decode_body(response, pb.GetChangesResponsePB).safe_hybrid_time == 5


def test_packet_capture_from_the_rpc_readme():
    # src/yb/rpc/README, "Example packet capture" (an strace of rpc-test.cc). Its framing is
    # today's; its header predates today's RequestHeader (field 3 was the method name then), so
    # only call_id is read from it. The body is yb.rpc_test.AddRequestPB{x = 1, y = 2}.
    capture = (
        b"\x00\x00\x00\x17"  # total_size: 23 bytes to follow
        + b"\x09"  # RequestHeader varint: 9 bytes
        + b"\x08\x0a\x1a\x03\x41\x64\x64\x20\x01"
        + b"\x0c"  # request parameter varint: 12 bytes
        + b"\x08\xd4\x90\x80\x91\x01\x10\xf8\xcf\xc4\xed\x04"
    )
    header, body = framing.split_call(only_frame(capture))
    assert pb.RequestHeader.FromString(header).call_id == 10
    assert body[0] == 0x08
    x, pos = framing.decode_varint32(body, 1)
    assert body[pos] == 0x10
    y, pos = framing.decode_varint32(body, pos + 1)
    assert (x, y, pos) == (304089172, 1303455736, len(body))


def test_empty_frames_are_heartbeats():
    # yb_rpc.cc HeartbeatOutboundData sends kEmptyMsgLengthPrefix (4 zero bytes); the parser
    # skips them (binary_call_parser.cc, SkipEmptyMessages) and so does the Java client
    # (CallResponse.isEmpty in TabletClient.decode).
    assert HEARTBEAT == b"\x00\x00\x00\x00"
    frame = framing.encode_response(1, b"")
    decoder = FrameDecoder()
    assert decoder.feed(HEARTBEAT + frame + HEARTBEAT + HEARTBEAT) == [frame[4:]]
    assert decoder.buffered == 0


def test_error_response_becomes_a_typed_error():
    # yb_rpc.cc RespondFailure: is_error = true and the body is ErrorStatusPB{message = 1, code = 2}.
    body = b"\x0a\x04busy" + b"\x10\x04"  # ERROR_SERVER_TOO_BUSY = 4
    header = b"\x08\x03\x10\x01"  # call_id 3, is_error true
    rest = bytes([len(header)]) + header + bytes([len(body)]) + body
    frame = struct.pack(">I", len(rest)) + rest
    assert framing.encode_error_response(3, pb.ErrorStatusPB.ERROR_SERVER_TOO_BUSY, "busy") == frame

    response = framing.parse_response(only_frame(frame))
    with pytest.raises(ServerTooBusy) as caught:
        framing.decode_body(response, pb.GetChangesResponsePB)
    assert caught.value.retriable and caught.value.message == "busy"

    no_method = framing.parse_response(
        only_frame(framing.encode_error_response(4, pb.ErrorStatusPB.ERROR_NO_SUCH_METHOD, "no GetChangez"))
    )
    with pytest.raises(NoSuchMethod) as caught_method:
        framing.check_response(no_method)
    assert not caught_method.value.retriable


def test_varints_match_protobuf():
    for value in (0, 1, 127, 128, 300, 2**31 - 1, 2**32 - 1):
        encoded = framing.encode_varint(value)
        assert pb.OpIdPB(term=value).SerializeToString() == b"\x08" + encoded
        assert framing.decode_varint32(encoded, 0) == (value, len(encoded))


# --- round trips with arbitrary read boundaries ----------------------------------------------

responses = st.builds(
    lambda call_id, body, sidecars, is_error: framing.Response(call_id, is_error, body, tuple(sidecars)),
    st.integers(0, 2**31 - 1),
    st.binary(max_size=300),
    st.lists(st.binary(max_size=60), max_size=3),
    st.booleans(),
)


def cut(data: bytes, points: list[int]) -> list[bytes]:
    bounds = sorted({0, len(data), *(p % (len(data) + 1) for p in points)})
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(responses, st.booleans()), min_size=1, max_size=6),
    st.lists(st.integers(0, 10_000), max_size=12),
)
def test_responses_survive_any_split_of_the_stream(items, points):
    stream = b"".join(
        (HEARTBEAT if heartbeat else b"")
        + framing.encode_response(r.call_id, r.body, is_error=r.is_error, sidecars=r.sidecars)
        for r, heartbeat in items
    )
    decoder = FrameDecoder()
    payloads = [p for chunk in cut(stream, points) for p in decoder.feed(chunk)]
    decoder.close()
    assert [framing.parse_response(p) for p in payloads] == [r for r, _ in items]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**31 - 1),
            st.text(min_size=1, max_size=40),
            st.text(min_size=1, max_size=40),
            st.one_of(st.none(), st.integers(0, 2**32 - 1)),
            st.binary(max_size=200),
        ),
        min_size=1,
        max_size=5,
    ),
    st.lists(st.integers(0, 10_000), max_size=12),
)
def test_requests_survive_any_split_of_the_stream(calls, points):
    stream = CONNECTION_HEADER + b"".join(
        framing.encode_request(call_id, service, method, body, timeout_ms=timeout)
        for call_id, service, method, timeout, body in calls
    )
    decoder = FrameDecoder(expect_connection_header=True)
    payloads = [p for chunk in cut(stream, points) for p in decoder.feed(chunk)]
    decoder.close()
    assert [framing.parse_request(p) for p in payloads] == [framing.Request(*call) for call in calls]


# --- truncated and garbage input ---------------------------------------------------------------


@given(st.data())
@settings(max_examples=50, deadline=None)
def test_a_stream_cut_inside_a_frame_is_refused(data):
    frame = framing.encode_response(5, b"\x50\x05", sidecars=[b"xyz"])
    keep = data.draw(st.integers(1, len(frame) - 1))
    decoder = FrameDecoder()
    assert decoder.feed(frame[:keep]) == []
    with pytest.raises(TruncatedFrame, match="inside a frame"):
        decoder.close()


def test_a_frame_above_the_limit_is_refused_before_it_is_read():
    with pytest.raises(FrameTooLarge, match="only support messages up to 1024 bytes"):
        FrameDecoder(max_message_size=1024).feed(struct.pack(">I", 2000))
    with pytest.raises(FrameTooLarge):
        FrameDecoder().feed(b"\xff\xff\xff\xf0")


def test_a_wrong_connection_header_is_refused():
    # yb_rpc.cc: "Invalid connection header: ..." when the first bytes are not "YB\1".
    decoder = FrameDecoder(expect_connection_header=True)
    assert decoder.feed(b"YB") == []
    with pytest.raises(ProtocolError, match="Invalid connection header"):
        decoder.feed(b"\x02")


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "varint runs past the end"),
        (b"\x80\x80\x80\x80\x80\x01", "longer than 5 bytes"),
        (b"\x05\x08\x01", "header too short"),
        (b"\x02\x08\x01\x05\x00", "data too short"),
        (b"\x02\x08\x01\x01\x00\xaa", "1 extra bytes at end of packet"),
        (b"\x02\x10\x00\x00", "doesn't have a call ID"),
        (b"\x03\x08\x01\xff\x00", "Invalid ResponseHeader"),
        # sidecar offsets 3 then 1: not increasing
        (b"\x06\x08\x01\x18\x03\x18\x01\x04abcd", "Invalid sidecar offsets"),
        # sidecar offset 9 past a 4-byte message
        (b"\x04\x08\x01\x18\x09\x04abcd", "Invalid sidecar offsets"),
    ],
)
def test_garbage_payloads_are_refused_with_a_clear_error(payload, message):
    # The Corruption messages of serialization.cc ParseYBHeader, and CallResponse.java's checks.
    with pytest.raises(ProtocolError, match=message):
        framing.parse_response(payload)


def test_a_garbled_error_body_is_a_protocol_error():
    response = framing.Response(1, True, b"\x0a\xff")
    with pytest.raises(ProtocolError, match="Invalid ErrorStatusPB"):
        framing.check_response(response)
