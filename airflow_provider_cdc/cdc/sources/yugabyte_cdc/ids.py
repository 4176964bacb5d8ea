"""YugabyteDB's ids of YSQL databases and tables, from their PostgreSQL oids.

YB lays a YSQL namespace or table id out as a version-3 UUID that embeds the oids
(``src/yb/common/entity_ids.cc``, ``GetPgsqlNamespaceId`` / ``GetPgsqlTableId``): the database oid
in bytes 0-3, the table oid in bytes 12-15, the version in byte 6 and the RFC 4122 variant in
byte 8. The capture maps the tables it reads over YSQL to the ids a stream lists, and refuses a
stream of another database, without any call YSQL lacks.
"""

from __future__ import annotations


def namespace_id(database_oid: int) -> str:
    """``GetPgsqlNamespaceId``: the database oid in a nil UUID, version 3, variant 1."""
    return _pg_uuid(database_oid, 0)


def table_id(database_oid: int, table_oid: int) -> str:
    """``GetPgsqlTableId`` of a user table."""
    return _pg_uuid(database_oid, table_oid)


def _pg_uuid(database_oid: int, table_oid: int) -> str:
    data = bytearray(16)
    data[0:4] = database_oid.to_bytes(4, "big")
    data[12:16] = table_oid.to_bytes(4, "big")
    data[8] = (data[8] & 0xBF) | 0x80  # RFC 4122 variant
    data[6] = (data[6] & 0x0F) | 0x30  # version 3, "repurposed to embed Postgres oids"
    return data.hex()


__all__ = ["namespace_id", "table_id"]
