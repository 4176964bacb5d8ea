"""A CDC-service window's merged transactions as the sink's chunks, through the PostgreSQL collector.

:class:`~.merge.WindowMerge` yields whole transactions in commit order. Each is fed to the
PostgreSQL source's :class:`~..postgres.stream.WindowCollector` as the messages yboutput would
send for it: a Begin/Commit pair at its commit hybrid time (the commit "LSN" of a hybrid-time
window, :mod:`.position`), a Relation message whenever a table's DDL record describes a new
column set (a new table version, as on the logical-replication source) and the Insert/Update/Delete
messages :mod:`.records` builds. Buffers, codecs, chunking by ``max_changes_per_chunk``, key
changes, the transaction side table and the stats are therefore the PostgreSQL source's.

What differs is the ``source`` block: the Debezium YugabyteDB gRPC connector's (connector
``yugabytedb``; ``txId`` a string, empty for a single-shard write; ``lsn`` the record's ``OpId``
text ``term:index:key:write_id:0``; ``sequence`` ``[previous commit, lsn]``), plus the extensions
``commit_time`` (the commit hybrid time: events apply in ``(commit_time, transaction.total_order)``
order, as ``commit_lsn`` on PostgreSQL), ``record_time`` and ``tablet_id`` (the tablet that sent the
change, which the connector's documentation names part of the metadata). Each row is buffered with
an index into this chunk's row origins as its "LSN", and the ``source`` column is rebuilt from
them when the chunk is flushed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from airflow_provider_cdc import __version__
from airflow_provider_cdc.cdc.basics.errors import DecodingError
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.events.envelope import SOURCE_COMMON_FIELDS
from airflow_provider_cdc.cdc.sources.postgres.decoder import Begin, Commit, Relation, RelationColumn
from airflow_provider_cdc.cdc.sources.postgres.stream import FlushFn, StreamStats, WindowCollector
from airflow_provider_cdc.cdc.sources.postgres.tables import TableInfo
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import ht_to_unix_us
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import op_id_text
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.records import (
    ddl_key_columns,
    ddl_table,
    relation_columns,
    relation_oid,
    row_image,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.transactions import Change, Item, TxBegin, TxEnd, TxKey

CONNECTOR = "yugabytedb"

YB_SOURCE_BLOCK = pa.struct(
    [
        *SOURCE_COMMON_FIELDS,
        pa.field("txId", pa.string()),
        pa.field("lsn", pa.string()),
        pa.field("xmin", pa.int64()),
        # Extensions: the commit hybrid time (the apply order with transaction.total_order), the
        # record's own hybrid time, and the tablet that sent it.
        pa.field("commit_time", pa.int64()),
        pa.field("record_time", pa.int64()),
        pa.field("tablet_id", pa.string()),
    ]
)
_SOURCE_INDEX = {f.name: i for i, f in enumerate(YB_SOURCE_BLOCK)}


def record_lsn(record: pb.CDCSDKProtoRecordPB) -> str:
    """A record's ``source.lsn``: its op id as the connector's ``OpId`` text."""
    op = record.cdc_sdk_op_id
    return op_id_text(op.term, op.index, op.write_id_key, op.write_id, 0)


class YbCdcWindowCollector(WindowCollector):
    """:class:`WindowCollector` fed :class:`~.merge.WindowMerge` items (see the module docstring).

    ``tables``: the catalog's description of captured tables where known (it gives columns their
    type modifiers); ``captured``: every captured table: one the catalog did not describe is
    described from its DDL record. ``record_type``: the stream's ``CDCRecordType``."""

    def __init__(
        self,
        *,
        captured: Iterable[TableRef],
        record_type: int = pb.CHANGE,
        flush: FlushFn,
        tables: dict[TableRef, TableInfo] | None = None,
        **kwargs: Any,
    ) -> None:
        self._downstream = flush
        super().__init__(tables=dict(tables or {}), flush=self._flush_with_source, **kwargs)
        self._captured = frozenset(captured)
        self._record_type = record_type
        self._fed: dict[int, pb.RowMessage] = {}  # relation oid → the DDL record its Relation came from
        # per buffered row: (tablet, lsn text, record time, txId, previous commit); the row's "LSN"
        # in the buffers is its index here
        self._origins: list[tuple[str, str, int, str, int | None]] = []
        self._key: TxKey | None = None

    # -- feeding -----------------------------------------------------------------------------

    def consume_items(self, items: Iterable[Item]) -> None:
        """Feed a window's merged items (all of them: the merge ends the window itself)."""
        for item in items:
            if type(item) is Change:
                self._change(item)
            elif type(item) is TxBegin:
                self._begin(item.key)
            elif type(item) is TxEnd:
                self._end(item.key)
            else:
                raise DecodingError(f"unexpected merge item {item!r}")
        self.done = True

    def _begin(self, key: TxKey) -> None:
        if self._tx is not None:
            raise DecodingError(f"transaction {key.id} began inside {self._key.id if self._key else '?'}")
        if self._on_message(Begin(key.commit_time, ht_to_unix_us(key.commit_time), 0), key.commit_time):
            raise DecodingError(f"transaction {key.id} is past the end of {self.window.describe()}")
        tx = self._tx
        if tx is None:
            raise RuntimeError(f"transaction {key.id} began but was not opened")
        # The transaction side table's id is YB's (TxKey.id), not pgoutput's "<xid>:<lsn>".
        tx.id = key.id
        self._chunk_txs[-1] = tx.entry()
        self._key = key

    def _end(self, key: TxKey) -> None:
        if self._key != key:
            raise DecodingError(f"end of transaction {key.id} without its begin")
        counted = self.stats.transactions
        commit_us = ht_to_unix_us(key.commit_time)
        self._on_message(Commit(0, key.commit_time, key.commit_time, commit_us), key.commit_time)
        if self.stats.transactions != counted:
            self.stats.last_tx_id = key.txid or key.id
        self._key = None

    def _change(self, change: Change) -> None:
        key = self._key
        if key is None or change.key != key:
            raise DecodingError(f"change of transaction {change.key.id} outside it")
        row = change.record.row_message
        oid = relation_oid(row.table_id)
        schema = change.schema
        if schema is not None and (fed := self._fed.get(oid)) is not schema:
            # Each tablet sends its own DDL record: an equal one (most tablet switches) needs no
            # new Relation, only the identity check's fast path next time.
            if fed is not None and fed == schema:
                self._fed[oid] = schema
            else:
                self._relation_of(oid, schema)
        relation = self._relations.get(oid)
        if relation is None:
            if oid in self._relations:
                return  # a table not captured
            raise DecodingError(f"change of {row.pgschema_name}.{row.table} before any schema record of it")
        encoder = relation[0]
        image = row_image(row, encoder.relation_columns, encoder.table.key_columns, self._record_type)
        origin = (change.tablet_id, record_lsn(change.record), row.record_time, key.txid, self.previous_commit_lsn)
        self._origins.append(origin)
        self._row(image.payload(oid), len(self._origins) - 1)

    def _relation_of(self, oid: int, ddl: pb.RowMessage) -> None:
        """The Relation message yboutput would send for the table version ``ddl`` describes."""
        self._fed[oid] = ddl
        ref = ddl_table(ddl)
        table = self.tables.get(ref)
        columns = relation_columns(ddl, self.types, table)
        keys = table.key_columns if table is not None else ddl_key_columns(ddl)
        if table is None and ref in self._captured:
            table = TableInfo(ref, oid, columns, keys, "c", bool(keys))
            self.tables[ref] = table
        message = Relation(
            oid,
            ref.schema,
            ref.name,
            "c",
            tuple(RelationColumn(c.name, c.type.oid, c.type.modifier, c.name in keys) for c in columns),
        )
        self._on_message(message, 0)

    # -- the source block --------------------------------------------------------------------

    def _flush_chunk(self) -> None:
        super()._flush_chunk()
        self._origins = []  # every buffered row was flushed

    def _flush_with_source(self, batches: dict[str, list[pa.RecordBatch]], transactions: pa.RecordBatch | None) -> None:
        origins = _origin_arrays(self._origins)
        self._downstream({t: [yb_source_batch(b, origins) for b in bs] for t, bs in batches.items()}, transactions)

    def finish(self) -> StreamStats:
        if self._key is not None:
            raise DecodingError(f"the window ended inside transaction {self._key.id}")
        return super().finish()


def _origin_arrays(origins: list[tuple[str, str, int, str, int | None]]) -> Mapping[str, pa.Array]:
    tablets, lsns, record_times, txids, previous = (list(c) for c in zip(*origins)) if origins else ([],) * 5
    sequences = [
        json.dumps([None if p is None else str(p), lsn], separators=(",", ":")) for p, lsn in zip(previous, lsns)
    ]
    return {
        "tablet_id": pa.array(tablets, pa.string()),
        "lsn": pa.array(lsns, pa.string()),
        "record_time": pa.array(record_times, pa.int64()),
        "txId": pa.array(txids, pa.string()),
        "sequence": pa.array(sequences, pa.string()),
    }


def yb_source_batch(batch: pa.RecordBatch, origins: Mapping[str, pa.Array]) -> pa.RecordBatch:
    """``batch`` (events built with PostgreSQL's ``source``, whose ``lsn`` indexes ``origins``)
    with the YugabyteDB gRPC connector's ``source`` block."""
    index = batch.schema.get_field_index("source")
    pg = batch.column(index)
    rows = pg.field("lsn")
    n = len(batch)
    fields = {
        "version": pa.repeat(pa.scalar(__version__), n),
        "connector": pa.repeat(pa.scalar(CONNECTOR), n),
        "commit_time": pg.field("commit_lsn"),
        "xmin": pa.nulls(n, pa.int64()),
        **{name: origins[name].take(rows) for name in ("tablet_id", "lsn", "record_time", "txId", "sequence")},
    }
    children = [fields.get(f.name, pg.field(f.name) if f.name in _PG_KEPT else None) for f in YB_SOURCE_BLOCK]
    source = pa.StructArray.from_arrays(children, fields=list(YB_SOURCE_BLOCK))
    return batch.set_column(index, pa.field("source", YB_SOURCE_BLOCK, nullable=False), source)


# What PostgreSQL's block already holds with the same meaning.
_PG_KEPT = frozenset(("name", "ts_ms", "snapshot", "db", "schema", "table"))


__all__ = ["CONNECTOR", "YB_SOURCE_BLOCK", "YbCdcWindowCollector", "record_lsn", "yb_source_batch"]
