"""YugabyteDB-style identifiers, hash partitions and hybrid times for the CDC-service stand-in.

Namespace and table ids embed the real PostgreSQL oids exactly as YB lays them out
(``src/yb/common/entity_ids.cc``: database oid in bytes 0-3, table oid in bytes 12-15, UUID
version 3 in byte 6, variant bits in byte 8), so a client can map them to ``pg_database`` /
``pg_class``. Tablet, stream and server ids are stable 32-hex strings.
"""

from __future__ import annotations

import hashlib

#: yb_hash_code's range: tablets split [0, 65536) into [start, end) ranges.
HASH_SPACE = 65536


def namespace_id(database_oid: int) -> str:
    """``GetPgsqlNamespaceId``: the database oid in a nil UUID, version 3, variant 1."""
    return _pg_uuid(database_oid, 0)


def table_id(database_oid: int, table_oid: int) -> str:
    """``GetPgsqlTableId`` for a user table (no PG-version byte)."""
    return _pg_uuid(database_oid, table_oid)


def _pg_uuid(database_oid: int, table_oid: int) -> str:
    data = bytearray(16)
    data[0:4] = database_oid.to_bytes(4, "big")
    data[12:16] = table_oid.to_bytes(4, "big")
    data[8] = (data[8] & 0xBF) | 0x80  # RFC 4122 variant
    data[6] = (data[6] & 0x0F) | 0x30  # version 3, "repurposed to embed Postgres oids"
    return data.hex()


def stable_id(*parts: object) -> str:
    """A 32-hex id that is the same for the same parts (tablets, tablet servers)."""
    return hashlib.md5("/".join(str(p) for p in parts).encode()).hexdigest()


def hash_ranges(count: int) -> list[tuple[int, int]]:
    """Equal ranges of the hash space, as YB's CreateHashPartitions cuts a table into tablets."""
    starts = [i * HASH_SPACE // count for i in range(count)]
    return list(zip(starts, [*starts[1:], HASH_SPACE]))


def partition_key(bound: int) -> bytes:
    """A tablet bound as YB's 2-byte big-endian partition key; the open ends are empty."""
    return b"" if bound in (0, HASH_SPACE) else bound.to_bytes(2, "big")


def ht_from_unix_us(micros: int) -> int:
    """A hybrid time: physical microseconds << 12 (logical bits zero)."""
    return micros << 12
