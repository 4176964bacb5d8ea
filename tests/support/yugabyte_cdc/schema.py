"""Tables as the CDC service sees them: columns, primary key, schema versions, CDCSDKSchemaPB.

The first primary-key column is the hash column (YSQL's default ``PRIMARY KEY (a, b)`` is
``(a HASH, b ASC)``); the rest of the key is range. Schema versions are added when the real
stream's Relation message shows different columns (docs/yugabytedb-cdc-standin.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg

from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

# Stored type oid -> YB's PersistentDataType for CDCSDKColumnInfoPB.type (unverified beyond the
# obvious ones). CDCSDKColumnInfoPB.oid is the column's *stored* oid (`stored_oid`), as YB's
# `SetColumnInfo` sets it: `column_info->set_oid(column.pg_type_oid())`.
_QL_TYPES = {
    16: pb.BOOL,
    17: pb.BINARY,
    19: pb.STRING,
    20: pb.INT64,
    21: pb.INT16,
    23: pb.INT32,
    25: pb.STRING,
    700: pb.FLOAT,
    701: pb.DOUBLE,
    1042: pb.STRING,
    1043: pb.STRING,
    1082: pb.INT32,
    1083: pb.INT64,
    1114: pb.INT64,
    1184: pb.INT64,
    1700: pb.DECIMAL,
}

_RECORD, _ANYENUM, _ANYRANGE = 2249, 3500, 3831
_FIRST_NORMAL_OID = 16384  # built-in types: all in YB's type table (yb_type.c YbTypeEntityTable)


def stored_oid(conn: psycopg.Connection, type_oid: int) -> int:
    """The type oid DocDB stores for a column of ``type_oid`` (the DocDB column's ``pg_type_oid``).

    ``CreateTableAddColumn`` (ybccmds.c) passes ``YbDataTypeFromOidMod(attnum, atttypid)``, and
    ``PgCreateTable::AddColumn`` stores its ``attr_type->type_oid``. ``YbDataTypeFromOidMod``
    (yb_type.c): a type in the type table keeps its oid; else a base type gets an untyped entity
    (``YBCVarLenByRefTypeEntity``, ``type_oid = InvalidOid``), and ``YbGetPrimitiveTypeOid`` maps
    a composite to RECORDOID, a domain to its base type (again through the table), an enum to
    ANYENUMOID, a range to ANYRANGEOID."""
    while True:
        row = conn.execute(
            "SELECT typtype, typbasetype::int FROM pg_catalog.pg_type WHERE oid = %s", (type_oid,)
        ).fetchone()
        if row is None:
            return 0
        typtype, basetype = row
        if typtype == "d":
            type_oid = basetype
            continue
        if typtype == "c":
            return _RECORD  # built-in row types are not in the type table either
        if type_oid < _FIRST_NORMAL_OID:
            return type_oid
        return {"e": _ANYENUM, "r": _ANYRANGE}.get(typtype, 0)


#: Schemas whose tables never get tablets (the emulations' own state).
INTERNAL_SCHEMAS = ("pg_catalog", "information_schema", "yb_standin", "yb_cdc_standin")


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    type_name: str  # format_type(): casts the snapshot's typed key comparisons
    is_key: bool
    is_hash_key: bool
    nullable: bool
    # DocDB's stored type oid (`stored_oid`); None: not read (a column only a Relation message
    # named), taken as its own oid when built-in, else untyped (a guess)
    yb_oid: int | None = None

    @property
    def stored_oid(self) -> int:
        if self.yb_oid is not None:
            return self.yb_oid
        return self.type_oid if self.type_oid < _FIRST_NORMAL_OID else 0


@dataclass(frozen=True)
class TableSchema:
    version: int
    columns: tuple[Column, ...]
    since_ht: int  # first hybrid time this version was seen at (0: at registration)

    @property
    def key_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.is_key)

    @property
    def hash_column(self) -> Column:
        return next(c for c in self.columns if c.is_hash_key)

    def signature(self) -> tuple[tuple[str, int], ...]:
        return tuple((c.name, c.type_oid) for c in self.columns)


@dataclass
class Table:
    relid: int
    table_id: str
    schema_name: str
    name: str
    versions: list[TableSchema] = field(default_factory=list)
    num_tablets: int = 0  # active (not split) tablets
    relfilenode: int = 0  # what its DocDB table id is built from

    @property
    def schema(self) -> TableSchema:
        return self.versions[-1]

    def schema_at(self, ht: int) -> TableSchema:
        """The version in effect at hybrid time ``ht``."""
        chosen = self.versions[0]
        for version in self.versions:
            if version.since_ht <= ht:
                chosen = version
        return chosen


def read_table(conn: psycopg.Connection, relid: int, version: int = 0, since_ht: int = 0):
    """(schema name, table name, TableSchema) of a user table with a primary key, else None."""
    row = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.relnamespace WHERE c.oid = %s AND c.relkind IN ('r', 'p')",
        (relid,),
    ).fetchone()
    if row is None or row[0] in INTERNAL_SCHEMAS or row[0].startswith("pg_"):
        return None
    keys = conn.execute(
        "SELECT a.attname FROM pg_catalog.pg_index i "
        "CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
        "JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
        "WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord",
        (relid,),
    ).fetchall()
    if not keys:
        return None  # YB's CDC refuses tables without a primary key
    key_names = [k[0] for k in keys]
    columns = tuple(
        Column(name, type_oid, type_name, name in key_names, name == key_names[0], nullable, stored_oid(conn, type_oid))
        for name, type_oid, type_name, nullable in conn.execute(
            "SELECT attname, atttypid::int, format_type(atttypid, atttypmod), NOT attnotnull "
            "FROM pg_catalog.pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped "
            "ORDER BY attnum",
            (relid,),
        ).fetchall()
    )
    return row[0], row[1], TableSchema(version, columns, since_ht)


def relfilenodes(conn: psycopg.Connection, relids: list[int]) -> dict[int, int]:
    """Each table's relfilenode: YB's DocDB table id is built from it, not from the oid
    (pg_yb_utils.h YbGetRelfileNodeId: "In YB, the relfilenode OID maps to the relation's DocDB
    table ID"), so a table rewrite (ALTER COLUMN TYPE, ADD PRIMARY KEY, TRUNCATE...) makes a new one."""
    rows = conn.execute(
        "SELECT oid::int, relfilenode::int FROM pg_catalog.pg_class WHERE oid = ANY(%s)", (relids,)
    ).fetchall()
    return {relid: node or relid for relid, node in rows}


def capturable_tables(conn: psycopg.Connection) -> list[int]:
    """Oids of the user tables with a primary key (the ones a new stream covers)."""
    return [
        r[0]
        for r in conn.execute(
            "SELECT c.oid::int FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') AND n.nspname <> ALL(%s) AND n.nspname NOT LIKE 'pg\\_%%' "
            "AND EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisprimary) "
            "ORDER BY c.oid",
            (list(INTERNAL_SCHEMAS),),
        ).fetchall()
    ]


def version_from_relation(
    catalog: TableSchema, relation_columns: list[tuple[str, int]], version: int, since_ht: int
) -> TableSchema | None:
    """A version with the columns the stream's Relation message names (the catalog may already
    be further ahead), keys and nullability taken from the catalog by name; None without the key."""
    by_name = {c.name: c for c in catalog.columns}
    columns = []
    for name, type_oid in relation_columns:
        known = by_name.get(name)
        if known is not None and known.type_oid == type_oid:
            columns.append(known)
        else:
            columns.append(Column(name, type_oid, "text", False, False, True))
    if not any(c.is_hash_key for c in columns):
        return None
    return TableSchema(version, tuple(columns), since_ht)


def schema_pb(schema: TableSchema, num_tablets: int) -> pb.CDCSDKSchemaPB:
    """The schema a DDL record carries."""
    message = pb.CDCSDKSchemaPB()
    for column in schema.columns:
        info = message.column_info.add(
            name=column.name,
            is_key=column.is_key,
            is_hash_key=column.is_hash_key,
            is_nullable=column.nullable,
            oid=column.stored_oid,
        )
        info.type.main = _QL_TYPES.get(column.stored_oid, pb.BINARY)
    message.tab_info.default_time_to_live = 0
    message.tab_info.num_tablets = num_tablets
    message.tab_info.is_ysql_catalog_table = False
    return message
