"""YugabyteDB's RPC wire format as pure functions: no sockets, no clocks.

The layout, from ``src/yb/rpc/serialization.cc`` (``SerializeHeader``, ``SerializeMessage``,
``ParseYBHeader``), ``src/yb/rpc/yb_rpc.cc`` and ``src/yb/rpc/binary_call_parser.cc``:

* a client opens the connection with the 3 bytes ``"YB\\x01"`` (``kConnectionHeaderBytes``);
* every call and every response is one frame::

      uint32 big-endian   length of everything after these 4 bytes
      varint32            length of the header protobuf
      bytes               RequestHeader (client -> server) or ResponseHeader (server -> client)
      varint32            length of the body protobuf plus all sidecars
      bytes               the body protobuf (request, response, or ErrorStatusPB when is_error)
      bytes               sidecars, back to back; ResponseHeader.sidecar_offsets gives where each
                          starts, counted from the first byte of the body

* a frame whose length is 0 is a heartbeat and carries nothing (``kEmptyMsgLengthPrefix``); both
  ends skip it.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from . import yb_cdc_pb2 as pb
from .errors import FrameTooLarge, ProtocolError, TruncatedFrame, rpc_error

#: Sent once by the client, first thing on a connection (inside TLS when TLS is used).
CONNECTION_HEADER = b"YB\x01"
#: ``kMsgLengthPrefixLength`` (src/yb/rpc/constants.h).
LENGTH_PREFIX_SIZE = 4
#: ``rpc_max_message_size``'s default (255 MB, yb_rpc.cc); frames above it are refused.
DEFAULT_MAX_MESSAGE_SIZE = 255 * 1024 * 1024
#: An empty frame: a keep-alive either end may send at any time (yb_rpc.cc ``HeartbeatOutboundData``).
HEARTBEAT = b"\x00" * LENGTH_PREFIX_SIZE

_MAX_VARINT32_BYTES = 5
_UINT32 = struct.Struct(">I")

M = TypeVar("M", bound=Message)


# --- varints -----------------------------------------------------------------------------------


def encode_varint(value: int) -> bytes:
    """Base-128 varint of a non-negative integer (protobuf's encoding)."""
    if value < 0:
        raise ValueError(f"varint of a negative number: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_varint32(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Read a varint32 (YB's length delimiters) at ``pos``; returns (value, position after it)."""
    result = 0
    for shift_index in range(_MAX_VARINT32_BYTES):
        if pos >= len(data):
            raise ProtocolError("Invalid packet: varint runs past the end of the frame")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << (7 * shift_index)
        if not byte & 0x80:
            if result >= 1 << 32:
                raise ProtocolError(f"Invalid packet: varint32 out of range ({result})")
            return result, pos
    raise ProtocolError("Invalid packet: varint32 longer than 5 bytes")


# --- encoding ----------------------------------------------------------------------------------


def encode_frame(header: bytes, body: bytes, sidecars: Sequence[bytes] = ()) -> bytes:
    """One frame from a serialized header, a serialized body and its sidecars (SerializeRequest)."""
    additional = sum(len(car) for car in sidecars)
    rest = b"".join([encode_varint(len(header)), header, encode_varint(len(body) + additional), body, *sidecars])
    return _UINT32.pack(len(rest)) + rest


def encode_request(
    call_id: int,
    service: str,
    method: str,
    body: bytes | Message,
    timeout_ms: int | None = None,
) -> bytes:
    """A request frame: RequestHeader{call_id, remote_method, timeout_millis} then the body."""
    header = pb.RequestHeader(call_id=call_id)
    header.remote_method.service_name = service
    header.remote_method.method_name = method
    if timeout_ms is not None:
        header.timeout_millis = max(0, min(int(timeout_ms), 0xFFFFFFFF))
    return encode_frame(header.SerializeToString(), _serialized(body))


def encode_response(
    call_id: int,
    body: bytes | Message,
    *,
    is_error: bool = False,
    sidecars: Sequence[bytes] = (),
) -> bytes:
    """A response frame as a YB server writes it (yb_rpc.cc ``SerializeResponseBuffer``)."""
    body_bytes = _serialized(body)
    header = pb.ResponseHeader(call_id=call_id, is_error=is_error)
    offset = len(body_bytes)
    for car in sidecars:  # Sidecars::MoveOffsetsTo: each offset shifted by the body's size
        header.sidecar_offsets.append(offset)
        offset += len(car)
    return encode_frame(header.SerializeToString(), body_bytes, sidecars)


def encode_error_response(call_id: int, code: int, message: str) -> bytes:
    """An RPC-layer failure (``RespondFailure``): is_error and an ErrorStatusPB body."""
    return encode_response(call_id, pb.ErrorStatusPB(message=message, code=code), is_error=True)


# --- decoding ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A parsed call, as a server sees it."""

    call_id: int
    service: str
    method: str
    timeout_ms: int | None
    body: bytes


@dataclass(frozen=True)
class Response:
    """A parsed response, as a client sees it. Parsed from a ``memoryview`` (what
    :class:`~.client.RpcConnection` reads frames into), ``body`` and ``sidecars`` are views of
    the frame's one buffer, not copies."""

    call_id: int
    is_error: bool
    body: bytes | memoryview
    sidecars: tuple[bytes | memoryview, ...] = ()


def split_call(payload: bytes | memoryview) -> tuple[bytes, bytes | memoryview]:
    """A frame's payload (after the 4-byte length) into (header bytes, main message).

    Follows ``ParseYBHeader``: the main message includes the sidecars, and nothing may follow it.
    The main message is a slice of ``payload``: a view, without a copy, when it is a memoryview.
    """
    header_len, pos = decode_varint32(payload, 0)
    if pos + header_len > len(payload):
        raise ProtocolError("Invalid packet: header too short")
    header = bytes(payload[pos : pos + header_len])
    pos += header_len
    main_len, pos = decode_varint32(payload, pos)
    if pos + main_len > len(payload):
        raise ProtocolError(f"Invalid packet: data too short, expected {main_len} byte main_msg")
    extra = len(payload) - (pos + main_len)
    if extra:
        raise ProtocolError(f"Invalid packet: {extra} extra bytes at end of packet")
    return header, payload[pos:]


def parse_response(payload: bytes | memoryview) -> Response:
    """A response frame's payload: header, body and sidecars (``DoParseYBMessage``)."""
    header_bytes, main = split_call(payload)
    header = _parse(pb.ResponseHeader, header_bytes, "ResponseHeader")
    if not header.HasField("call_id"):
        raise ProtocolError("RPC response doesn't have a call ID")
    offsets = list(header.sidecar_offsets)
    if not offsets:
        return Response(header.call_id, header.is_error, main)
    bounds = [*offsets, len(main)]
    if any(later < earlier for earlier, later in itertools.pairwise(bounds)):
        raise ProtocolError(f"Invalid sidecar offsets {offsets} for a {len(main)}-byte message")
    sidecars = tuple(main[start:end] for start, end in itertools.pairwise(bounds))
    return Response(header.call_id, header.is_error, main[: offsets[0]], sidecars)


def parse_request(payload: bytes | memoryview) -> Request:
    """A request frame's payload; what a server (the test stand-in) reads."""
    header_bytes, main = split_call(payload)
    header = _parse(pb.RequestHeader, header_bytes, "RequestHeader")
    if not header.HasField("remote_method"):
        raise ProtocolError("Non-connection context request header must specify remote_method")
    timeout = header.timeout_millis if header.HasField("timeout_millis") else None
    body = main[: header.sidecar_offsets[0]] if header.sidecar_offsets else main
    return Request(
        header.call_id,
        header.remote_method.service_name,
        header.remote_method.method_name,
        timeout,
        bytes(body),
    )


def check_response(response: Response) -> Response:
    """Raise the typed RPC-layer error if the response is an ErrorStatusPB; else return it."""
    if response.is_error:
        raise rpc_error(_parse(pb.ErrorStatusPB, response.body, "ErrorStatusPB"))
    return response


def decode_body(response: Response, message_cls: type[M]) -> M:
    """The response body as ``message_cls``, after checking for an RPC-layer error."""
    return _parse(message_cls, check_response(response).body, message_cls.__name__)


class FrameDecoder:
    """Cuts a byte stream into frame payloads, whatever the read sizes were (a server's side:
    the test stand-in; :class:`~.client.RpcConnection` reads each frame straight into one buffer).

    ``feed`` takes any chunk and returns the payloads of the frames it completed (heartbeats
    dropped); a partial frame stays buffered. ``close`` says whether the stream ended cleanly.
    With ``expect_connection_header`` (a server's side) the stream must start with ``"YB\\x01"``.
    """

    def __init__(
        self,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        *,
        expect_connection_header: bool = False,
    ) -> None:
        self.max_message_size = max_message_size
        self._buffer = bytearray()
        self._need_header = expect_connection_header

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        self._buffer += data
        frames: list[bytes] = []
        if self._need_header:
            if len(self._buffer) < len(CONNECTION_HEADER):
                return frames
            if not self._buffer.startswith(CONNECTION_HEADER):
                raise ProtocolError(f"Invalid connection header: {bytes(self._buffer[:3]).hex()}")
            del self._buffer[: len(CONNECTION_HEADER)]
            self._need_header = False
        pos = 0
        while len(self._buffer) - pos >= LENGTH_PREFIX_SIZE:
            (length,) = _UINT32.unpack_from(self._buffer, pos)
            total = length + LENGTH_PREFIX_SIZE
            if total > self.max_message_size:
                raise FrameTooLarge(
                    f"The frame had a length of {total}, but we only support messages up to "
                    f"{self.max_message_size} bytes long."
                )
            if len(self._buffer) - pos < total:
                break
            if length:  # empty frames are heartbeats
                frames.append(bytes(self._buffer[pos + LENGTH_PREFIX_SIZE : pos + total]))
            pos += total
        del self._buffer[:pos]
        return frames

    def close(self) -> None:
        """The stream ended: fine between frames, an error inside one."""
        if self._buffer:
            raise TruncatedFrame(f"Connection closed inside a frame ({len(self._buffer)} bytes unread)")


# --- helpers -----------------------------------------------------------------------------------


def _serialized(body: bytes | Message) -> bytes:
    return bytes(body) if isinstance(body, bytes | bytearray) else body.SerializeToString()


def _parse(message_cls: type[M], data: bytes | memoryview, what: str) -> M:
    message = message_cls()
    try:
        message.ParseFromString(data)
    except DecodeError as error:
        raise ProtocolError(f"Invalid {what}: {error}") from error
    return message
