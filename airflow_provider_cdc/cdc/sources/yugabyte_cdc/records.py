"""CDC-service records as the rows pgoutput would send for the same change, and DDL records as table versions.

The YugabyteDB logical-replication source receives yboutput's Insert/Update/Delete messages and
turns them into events through the PostgreSQL source's buffers, codecs and encoders
(:class:`~..postgres.stream_events.StreamEventBuffer`, :class:`~..postgres.events.TableEncoder`). A
``RowMessage`` of the CDC service carries the same change; :func:`row_image` maps it to the very
tuples (and :meth:`RowImage.payload` to the very message bytes) yboutput sends for it, so the same
pipeline makes identical events: the same values under every handling mode, the same
``unchanged_toast_columns`` for columns not sent (the current-state fold's patches), the same key
handling. Values become text through :mod:`.values`.

What each record type puts in a record's tuples (``cdcsdk_producer.cc``: ``AddTuple``,
``PopulateBeforeImage*``; the reference's §2.5), and the pgoutput message it maps to:

================================  =====================================  ==============================
record type                       UPDATE                                 DELETE
================================  =====================================  ==============================
``CHANGE``                        new: key + changed columns             old: key → ``'K'``
                                  → ``'N'`` with ``'u'`` for the rest
``FULL_ROW_NEW_IMAGE``,           new: every column → ``'N'``            old: the row → ``'O'``
``PG_DEFAULT``, ``PG_NOTHING``                                           (``PG_*``: key → ``'K'``)
``MODIFIED_COLUMNS_OLD_AND_NEW``  new as ``CHANGE``; old: key + the      old: key → ``'K'``
``_IMAGES``, ``PG_CHANGE_OLD_NEW``  changed columns' old values → ``'O'``
                                  with ``'u'`` for the rest
``ALL``, ``PG_FULL``              old: the row → ``'O'``; new: the row   old: the row → ``'O'``
================================  =====================================  ==============================

An INSERT's new tuple holds every column (a non-packed insert omits NULL columns: absent means
NULL there). YB pads every tuple with empty entries (no column name) to the other's length; they
are ignored. A before image YB could not read (``cdc_send_null_before_image_if_not_exists``)
leaves only the key, or nothing: the message then has the key (``'K'``) or no old tuple, as
yboutput's "before image unavailable". Key updates arrive as DELETE + INSERT (DocDB rewrites the
row), as on yboutput.

A DDL record carries the table's columns (name, type OID, key flag) in DocDB's order (key columns
first) without type modifiers; :func:`relation_columns` gives them the catalog's order and
modifiers, so an unchanged table compares equal to the version the stream started with and a
schema change starts a new table version, as a Relation message does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_provider_cdc.cdc.basics.errors import DecodingError
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.events.envelope import Op as EventOp
from airflow_provider_cdc.cdc.sources.postgres.decoder import (
    UNCHANGED_TOAST,
    ColumnValue,
    TupleData,
    encode_delete,
    encode_insert,
    encode_update,
)
from airflow_provider_cdc.cdc.sources.postgres.tables import Column, TableInfo
from airflow_provider_cdc.cdc.sources.postgres.types import TypeCache
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.carried_types import stored_oid
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.values import column_value

Op = pb.RowMessage

#: Record types whose DELETE carries the whole old row.
FULL_DELETE_BEFORE = frozenset((pb.ALL, pb.FULL_ROW_NEW_IMAGE, pb.PG_FULL))
#: Record types whose UPDATE carries an old image (the row, or the changed columns and key).
UPDATE_BEFORE = frozenset((pb.ALL, pb.PG_FULL, pb.MODIFIED_COLUMNS_OLD_AND_NEW_IMAGES, pb.PG_CHANGE_OLD_NEW))
RECORD_TYPES = frozenset(pb.CDCRecordType.values())


@dataclass(frozen=True)
class RowImage:
    """One change as pgoutput tuples, in the table version's column order."""

    op: str  # Debezium's op: "c", "u" or "d"
    new: TupleData | None
    old: TupleData | None = None
    old_kind: str | None = None  # "K": the key, other columns NULL; "O": the old row

    def payload(self, relation_oid: int) -> bytes:
        """The pgoutput Insert/Update/Delete message of this change."""
        if self.op == EventOp.CREATE:
            if self.new is None:
                raise DecodingError("an insert record without its new row")
            return encode_insert(relation_oid, self.new)
        if self.op == EventOp.UPDATE:
            if self.new is None:
                raise DecodingError("an update record without its new row")
            return encode_update(relation_oid, self.old_kind, self.old, self.new)
        if self.old is None or self.old_kind is None:
            raise DecodingError("a delete record without its old row")
        return encode_delete(relation_oid, self.old_kind, self.old)


def row_image(
    row: pb.RowMessage,
    columns: Sequence[Column],
    key_columns: Sequence[str],
    record_type: int = pb.CHANGE,
) -> RowImage:
    """The pgoutput form of an INSERT, UPDATE or DELETE record of a table whose current version
    has ``columns`` (see the module docstring for each ``record_type``)."""
    if record_type not in RECORD_TYPES:
        raise DecodingError(f"unknown CDC record type {record_type}")
    table = row.table or row.table_id
    if row.op == Op.INSERT:
        new = _values(row.new_tuple, columns, table)
        return RowImage(EventOp.CREATE, tuple(new.get(c.name) for c in columns))
    if row.op == Op.UPDATE:
        new = _values(row.new_tuple, columns, table)
        after = tuple(new.get(c.name, UNCHANGED_TOAST) for c in columns)
        old = _values(row.old_tuple, columns, table) if record_type in UPDATE_BEFORE else {}
        if not old:
            return RowImage(EventOp.UPDATE, after)
        return RowImage(EventOp.UPDATE, after, tuple(old.get(c.name, UNCHANGED_TOAST) for c in columns), "O")
    if row.op == Op.DELETE:
        old = _values(row.old_tuple, columns, table)
        if record_type in FULL_DELETE_BEFORE and all(c.name in old for c in columns):
            return RowImage(EventOp.DELETE, None, tuple(old[c.name] for c in columns), "O")
        missing = [k for k in key_columns if k not in old]
        if missing or not key_columns:
            raise DecodingError(
                f"delete from {table}: the record does not carry the key ({', '.join(missing) or 'no key columns'})"
            )
        keys = set(key_columns)
        return RowImage(EventOp.DELETE, None, tuple(old[c.name] if c.name in keys else None for c in columns), "K")
    raise DecodingError(f"a {Op.Op.Name(row.op)} record is not a row change")


def _values(datums: Sequence[pb.DatumMessagePB], columns: Sequence[Column], table: str) -> dict[str, ColumnValue]:
    """Column name → value of a tuple's entries (YB's padding entries, without a name, skipped)."""
    types = {c.name: c.type for c in columns}
    values: dict[str, ColumnValue] = {}
    for datum in datums:
        name = datum.column_name
        if not name:
            continue
        pg_type = types.get(name)
        if pg_type is None:
            raise DecodingError(
                f"{table}: column {name!r} is not in the table's schema ({', '.join(types)}); "
                "a schema record is missing"
            )
        value = column_value(datum, pg_type)
        if name in values and values[name] != value:
            raise DecodingError(f"{table}: column {name!r} appears twice in one image with different values")
        values[name] = value
    return values


# -- schema records ------------------------------------------------------------------------------


def relation_columns(ddl: pb.RowMessage, types: TypeCache, catalog: TableInfo | None = None) -> tuple[Column, ...]:
    """The columns of the table version a DDL record describes: the catalog's order and type
    modifiers for the columns it knows (same name and type), then the others in the record's
    order with no modifier."""
    if ddl.op != Op.DDL or not ddl.schema.column_info:
        raise DecodingError(f"not a schema record of a table: {Op.Op.Name(ddl.op)} with no columns")
    known = {c.name: (i, c) for i, c in enumerate(catalog.columns)} if catalog is not None else {}
    ordered = []
    for position, info in enumerate(ddl.schema.column_info):
        catalog_column = known.get(info.name)
        # info.oid is DocDB's stored oid (an enum's is anyenum, a domain's its base type's): matched by name
        same_type = catalog_column is not None and info.oid in (
            stored_oid(catalog_column[1].type),
            catalog_column[1].type.oid,
        )
        pg_type = catalog_column[1].type if same_type else types.get(info.oid, -1)
        place = (0, catalog_column[0]) if catalog_column is not None else (1, position)
        ordered.append((place, Column(info.name, pg_type)))
    return tuple(column for _, column in sorted(ordered, key=lambda item: item[0]))


def ddl_key_columns(ddl: pb.RowMessage) -> tuple[str, ...]:
    """The key columns a DDL record names, in DocDB's order (hash, then range: the key's order)."""
    return tuple(info.name for info in ddl.schema.column_info if info.is_key)


def ddl_table(ddl: pb.RowMessage) -> TableRef:
    """The table a record belongs to (``pgschema_name``, ``table``)."""
    return TableRef(ddl.pgschema_name, ddl.table)


def relation_oid(table_id: str) -> int:
    """A YSQL table's OID from its YB table id (32 hex digits: database OID, a fixed middle,
    and the table OID in the last 8, ``GetPgsqlTableId``)."""
    if len(table_id) != 32:
        raise DecodingError(f"not a YSQL table id: {table_id!r}")
    try:
        return int(table_id[-8:], 16)
    except ValueError:
        raise DecodingError(f"not a YSQL table id: {table_id!r}") from None


__all__ = [
    "FULL_DELETE_BEFORE",
    "UPDATE_BEFORE",
    "RowImage",
    "ddl_key_columns",
    "ddl_table",
    "relation_columns",
    "relation_oid",
    "row_image",
]
