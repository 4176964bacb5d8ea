"""A pure decoder for PostgreSQL's ``pgoutput`` logical replication protocol (version 1).

Hand-written because no maintained Python library decodes pgoutput: psycopg and psycopg2 stop
at the replication transport. The format is specified in PostgreSQL's documentation,
"Logical Replication Message Formats". Each message is one ``bytes`` payload of an XLogData
frame; :func:`decode_message` maps it to a small immutable value and has no side effects, so it
is trivially testable (see ``tests/unit/cdc/postgres/test_decoder.py``, property-based).

Tuple column values stay in PostgreSQL's text output form (``bytes``); turning them into typed
values is the job of :mod:`.types`, shared with the snapshot path so both produce identical
values.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Union

from airflow_provider_cdc.cdc.basics.errors import DecodingError

# Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01 UTC).
PG_EPOCH_OFFSET_US = 946_684_800 * 1_000_000

_INT16 = struct.Struct("!h")
_INT32 = struct.Struct("!i")
_UINT32 = struct.Struct("!I")
_BEGIN = struct.Struct("!QqI")
_COMMIT = struct.Struct("!BQQq")
_TRUNCATE_HEAD = struct.Struct("!IB")
_MESSAGE_HEAD = struct.Struct("!BQ")
_RELATION_COLUMN_TAIL = struct.Struct("!Ii")


class MessageType(bytes, enum.Enum):
    """First byte of a pgoutput message."""

    BEGIN = b"B"
    COMMIT = b"C"
    ORIGIN = b"O"
    RELATION = b"R"
    TYPE = b"Y"
    INSERT = b"I"
    UPDATE = b"U"
    DELETE = b"D"
    TRUNCATE = b"T"
    MESSAGE = b"M"

    @classmethod
    def for_byte(cls, code: int) -> MessageType:
        try:
            return _BY_CODE[code]
        except KeyError:
            raise DecodingError(
                f"unsupported pgoutput message type {bytes([code])!r}; only protocol version 1 "
                "messages are requested (no streaming of in-progress transactions)"
            ) from None


_BY_CODE = {member.value[0]: member for member in MessageType}


class _UnchangedToast:
    """Marker for a TOASTed column value that the update did not change and the WAL omits."""

    _instance: _UnchangedToast | None = None

    def __new__(cls) -> _UnchangedToast:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST = _UnchangedToast()

#: One column of a replicated row: ``None`` for SQL NULL, UNCHANGED_TOAST, or the text form.
ColumnValue = Union[bytes, None, _UnchangedToast]  # noqa: UP007 (a runtime alias on 3.10)
TupleData = tuple[ColumnValue, ...]


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int  # LSN of the transaction's commit record
    commit_ts_us: int  # Unix epoch microseconds
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class Origin:
    origin_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    name: str
    type_oid: int
    type_modifier: int
    is_replica_identity: bool


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    namespace: str
    name: str
    replica_identity: str  # 'd' default, 'n' nothing, 'f' full, 'i' index; YugabyteDB: 'c' change
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class TypeInfo:
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    relation_oid: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    relation_oid: int
    old_kind: str | None  # 'K' old key, 'O' old row (REPLICA IDENTITY FULL), None
    old: TupleData | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    relation_oid: int
    old_kind: str  # 'K' or 'O'
    old: TupleData


@dataclass(frozen=True, slots=True)
class Truncate:
    relation_oids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


Message = Union[  # noqa: UP007 (a runtime alias on 3.10)
    Begin, Commit, Origin, Relation, TypeInfo, Insert, Update, Delete, Truncate, LogicalMessage
]


def decode_message(payload: bytes) -> Message:
    """Decode one pgoutput message. Raises :class:`DecodingError` on malformed input."""
    if not payload:
        raise DecodingError("empty pgoutput message")
    try:
        kind = MessageType.for_byte(payload[0])
        return _DECODERS[kind](payload)
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
        raise DecodingError(f"malformed pgoutput {chr(payload[0])!r} message ({len(payload)} bytes): {exc}") from exc


def pg_timestamp_to_unix_us(pg_us: int) -> int:
    return pg_us + PG_EPOCH_OFFSET_US


def _decode_begin(buf: bytes) -> Begin:
    final_lsn, ts, xid = _BEGIN.unpack_from(buf, 1)
    _expect_end(buf, 1 + _BEGIN.size)
    return Begin(final_lsn, pg_timestamp_to_unix_us(ts), xid)


def _decode_commit(buf: bytes) -> Commit:
    flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(buf, 1)
    _expect_end(buf, 1 + _COMMIT.size)
    return Commit(flags, commit_lsn, end_lsn, pg_timestamp_to_unix_us(ts))


def _decode_origin(buf: bytes) -> Origin:
    (origin_lsn,) = struct.unpack_from("!Q", buf, 1)
    name, pos = _read_cstring(buf, 9)
    _expect_end(buf, pos)
    return Origin(origin_lsn, name)


def _decode_relation(buf: bytes) -> Relation:
    (oid,) = _UINT32.unpack_from(buf, 1)
    namespace, pos = _read_cstring(buf, 5)
    name, pos = _read_cstring(buf, pos)
    replica_identity = chr(buf[pos])
    (ncols,) = _INT16.unpack_from(buf, pos + 1)
    pos += 3
    columns = []
    for _ in range(ncols):
        flags = buf[pos]
        column_name, pos = _read_cstring(buf, pos + 1)
        type_oid, type_modifier = _RELATION_COLUMN_TAIL.unpack_from(buf, pos)
        pos += _RELATION_COLUMN_TAIL.size
        columns.append(RelationColumn(column_name, type_oid, type_modifier, bool(flags & 1)))
    _expect_end(buf, pos)
    return Relation(oid, namespace, name, replica_identity, tuple(columns))


def _decode_type(buf: bytes) -> TypeInfo:
    (oid,) = _UINT32.unpack_from(buf, 1)
    namespace, pos = _read_cstring(buf, 5)
    name, pos = _read_cstring(buf, pos)
    _expect_end(buf, pos)
    return TypeInfo(oid, namespace, name)


def _decode_insert(buf: bytes) -> Insert:
    (relation_oid,) = _UINT32.unpack_from(buf, 1)
    if buf[5] != 0x4E:  # 'N'
        raise DecodingError(f"insert: expected new tuple marker 'N', got {bytes([buf[5]])!r}")
    new, pos = _read_tuple(buf, 6)
    _expect_end(buf, pos)
    return Insert(relation_oid, new)


def _decode_update(buf: bytes) -> Update:
    (relation_oid,) = _UINT32.unpack_from(buf, 1)
    pos = 5
    old_kind: str | None = None
    old: TupleData | None = None
    if buf[pos] in (0x4B, 0x4F):  # 'K' | 'O'
        old_kind = chr(buf[pos])
        old, pos = _read_tuple(buf, pos + 1)
    if buf[pos] != 0x4E:
        raise DecodingError(f"update: expected new tuple marker 'N', got {bytes([buf[pos]])!r}")
    new, pos = _read_tuple(buf, pos + 1)
    _expect_end(buf, pos)
    return Update(relation_oid, old_kind, old, new)


def _decode_delete(buf: bytes) -> Delete:
    (relation_oid,) = _UINT32.unpack_from(buf, 1)
    if buf[5] not in (0x4B, 0x4F):
        raise DecodingError(f"delete: expected 'K' or 'O' tuple marker, got {bytes([buf[5]])!r}")
    old, pos = _read_tuple(buf, 6)
    _expect_end(buf, pos)
    return Delete(relation_oid, chr(buf[5]), old)


def _decode_truncate(buf: bytes) -> Truncate:
    count, options = _TRUNCATE_HEAD.unpack_from(buf, 1)
    pos = 1 + _TRUNCATE_HEAD.size
    oids = struct.unpack_from(f"!{count}I", buf, pos)
    _expect_end(buf, pos + 4 * count)
    return Truncate(tuple(oids), bool(options & 1), bool(options & 2))


def _decode_message(buf: bytes) -> LogicalMessage:
    flags, lsn = _MESSAGE_HEAD.unpack_from(buf, 1)
    prefix, pos = _read_cstring(buf, 1 + _MESSAGE_HEAD.size)
    (length,) = _INT32.unpack_from(buf, pos)
    pos += 4
    content = bytes(buf[pos : pos + length])
    if len(content) != length:
        raise DecodingError("message: content shorter than its declared length")
    _expect_end(buf, pos + length)
    return LogicalMessage(bool(flags & 1), lsn, prefix, content)


def _read_cstring(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.index(0, pos)
    return buf[pos:end].decode("utf-8"), end + 1


def _read_tuple(buf: bytes, pos: int) -> tuple[TupleData, int]:
    (ncols,) = _INT16.unpack_from(buf, pos)
    pos += 2
    values: list[ColumnValue] = []
    append = values.append
    unpack_int32 = _INT32.unpack_from
    for _ in range(ncols):
        kind = buf[pos]
        pos += 1
        if kind == 0x74:  # 't' text
            (length,) = unpack_int32(buf, pos)
            pos += 4
            end = pos + length
            if end > len(buf) or length < 0:
                raise DecodingError("tuple: text value runs past the end of the message")
            append(buf[pos:end])
            pos = end
        elif kind == 0x6E:  # 'n' null
            append(None)
        elif kind == 0x75:  # 'u' unchanged TOAST
            append(UNCHANGED_TOAST)
        elif kind == 0x62:  # 'b' binary: only sent when the 'binary' option is requested
            raise DecodingError("tuple: binary column values were not requested")
        else:
            raise DecodingError(f"tuple: unknown column kind {bytes([kind])!r}")
    return tuple(values), pos


def encode_tuple(values: TupleData) -> bytes:
    """The pgoutput form of a tuple: the inverse of the decoder's tuple reading."""
    parts = [_INT16.pack(len(values))]
    for value in values:
        if value is None:
            parts.append(b"n")
        elif value is UNCHANGED_TOAST:
            parts.append(b"u")
        else:
            parts.append(b"t" + _INT32.pack(len(value)) + bytes(value))
    return b"".join(parts)


def encode_insert(relation_oid: int, new: TupleData) -> bytes:
    return b"I" + _UINT32.pack(relation_oid) + b"N" + encode_tuple(new)


def encode_update(relation_oid: int, old_kind: str | None, old: TupleData | None, new: TupleData) -> bytes:
    head = b"U" + _UINT32.pack(relation_oid)
    if old_kind is not None and old is not None:
        head += old_kind.encode() + encode_tuple(old)
    return head + b"N" + encode_tuple(new)


def encode_delete(relation_oid: int, old_kind: str, old: TupleData) -> bytes:
    return b"D" + _UINT32.pack(relation_oid) + old_kind.encode() + encode_tuple(old)


def _expect_end(buf: bytes, pos: int) -> None:
    if pos != len(buf):
        raise DecodingError(f"{len(buf) - pos} unexpected trailing bytes")


_DECODERS = {
    MessageType.BEGIN: _decode_begin,
    MessageType.COMMIT: _decode_commit,
    MessageType.ORIGIN: _decode_origin,
    MessageType.RELATION: _decode_relation,
    MessageType.TYPE: _decode_type,
    MessageType.INSERT: _decode_insert,
    MessageType.UPDATE: _decode_update,
    MessageType.DELETE: _decode_delete,
    MessageType.TRUNCATE: _decode_truncate,
    MessageType.MESSAGE: _decode_message,
}
