"""An encoder for pgoutput messages (the inverse of the decoder), for tests only.

Written from PostgreSQL's "Logical Replication Message Formats", independently of the decoder.
"""

from __future__ import annotations

import struct

from airflow_provider_cdc.cdc.sources.postgres.decoder import (
    PG_EPOCH_OFFSET_US,
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Relation,
    Truncate,
    TypeInfo,
    Update,
)


def cstring(text: str) -> bytes:
    return text.encode() + b"\0"


def tuple_data(values) -> bytes:
    out = struct.pack("!h", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value is UNCHANGED_TOAST:
            out += b"u"
        else:
            out += b"t" + struct.pack("!i", len(value)) + value
    return out


def encode(message: Message) -> bytes:
    if isinstance(message, Begin):
        return b"B" + struct.pack("!QqI", message.final_lsn, message.commit_ts_us - PG_EPOCH_OFFSET_US, message.xid)
    if isinstance(message, Commit):
        return b"C" + struct.pack(
            "!BQQq", message.flags, message.commit_lsn, message.end_lsn, message.commit_ts_us - PG_EPOCH_OFFSET_US
        )
    if isinstance(message, Origin):
        return b"O" + struct.pack("!Q", message.origin_lsn) + cstring(message.name)
    if isinstance(message, Relation):
        out = b"R" + struct.pack("!I", message.oid) + cstring(message.namespace) + cstring(message.name)
        out += message.replica_identity.encode() + struct.pack("!h", len(message.columns))
        for col in message.columns:
            out += bytes([1 if col.is_replica_identity else 0]) + cstring(col.name)
            out += struct.pack("!Ii", col.type_oid, col.type_modifier)
        return out
    if isinstance(message, TypeInfo):
        return b"Y" + struct.pack("!I", message.oid) + cstring(message.namespace) + cstring(message.name)
    if isinstance(message, Insert):
        return b"I" + struct.pack("!I", message.relation_oid) + b"N" + tuple_data(message.new)
    if isinstance(message, Update):
        out = b"U" + struct.pack("!I", message.relation_oid)
        if message.old_kind is not None:
            out += message.old_kind.encode() + tuple_data(message.old)
        return out + b"N" + tuple_data(message.new)
    if isinstance(message, Delete):
        return b"D" + struct.pack("!I", message.relation_oid) + message.old_kind.encode() + tuple_data(message.old)
    if isinstance(message, Truncate):
        options = (1 if message.cascade else 0) | (2 if message.restart_identity else 0)
        return b"T" + struct.pack(
            f"!IB{len(message.relation_oids)}I", len(message.relation_oids), options, *message.relation_oids
        )
    if isinstance(message, LogicalMessage):
        return (
            b"M"
            + struct.pack("!BQ", 1 if message.transactional else 0, message.lsn)
            + cstring(message.prefix)
            + struct.pack("!i", len(message.content))
            + message.content
        )
    raise TypeError(message)
