"""YugabyteDB-style identifiers, hash partitions and hybrid times for the CDC-service stand-in.

Namespace and table ids embed the real PostgreSQL oids exactly as YB lays them out
(``src/yb/common/entity_ids.cc``: database oid in bytes 0-3, table oid in bytes 12-15, UUID
version 3 in byte 6, variant bits in byte 8), so a client can map them to ``pg_database`` /
``pg_class``. Tablet, stream and server ids are stable 32-hex strings.
"""

from __future__ import annotations

import hashlib

# The id layout is a fact of YB's (entity_ids.cc): one implementation, the product's.
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.ids import namespace_id, table_id  # noqa: F401

#: yb_hash_code's range: tablets split [0, 65536) into [start, end) ranges.
HASH_SPACE = 65536


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
