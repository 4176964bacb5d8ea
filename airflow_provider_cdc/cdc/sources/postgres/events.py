"""PostgreSQL change events: Debezium's PostgreSQL ``source`` block and event assembly.

Snapshot partitions build whole record batches at once (:func:`snapshot_batch`); the stream
accumulates rows per table in a :class:`StreamEventBuffer` and turns them into a batch when a
chunk is flushed. Both convert text values with :func:`types.cast_text` through the same
:class:`EventLayout`, which is what makes snapshot rows and stream rows identical.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from airflow_provider_cdc import __version__
from airflow_provider_cdc.cdc.envelope import TRANSACTION_BLOCK, EventLayout, Op
from airflow_provider_cdc.cdc.errors import DecodingError
from airflow_provider_cdc.cdc.sources.postgres.decoder import UNCHANGED_TOAST, TupleData
from airflow_provider_cdc.cdc.sources.postgres.tables import Column, TableInfo
from airflow_provider_cdc.cdc.sources.postgres.types import arrow_type, cast_text

CONNECTOR = "postgresql"
#: Debezium's default ``unavailable.value.placeholder`` for unchanged TOASTed values.
UNAVAILABLE_VALUE_PLACEHOLDER = b"__debezium_unavailable_value"

SOURCE_BLOCK = pa.struct(
    [
        pa.field("version", pa.string()),
        pa.field("connector", pa.string()),
        pa.field("name", pa.string()),
        pa.field("ts_ms", pa.int64()),
        pa.field("snapshot", pa.string()),
        pa.field("db", pa.string()),
        pa.field("sequence", pa.string()),
        pa.field("schema", pa.string()),
        pa.field("table", pa.string()),
        pa.field("txId", pa.int64()),
        pa.field("lsn", pa.int64()),
        pa.field("xmin", pa.int64()),
        # Extension: LSN of the transaction's commit record. Events apply in
        # (commit_lsn, transaction.total_order) order; change LSNs interleave across transactions.
        pa.field("commit_lsn", pa.int64()),
    ]
)


def event_layout(table: TableInfo, columns: Sequence[Column] | None = None) -> EventLayout:
    """Layout of a table's events; ``columns`` overrides the catalog's (a Relation message's)."""
    cols = tuple(columns) if columns is not None else table.columns
    names = {c.name for c in cols}
    return EventLayout(
        value_fields=tuple(pa.field(c.name, arrow_type(c.type)) for c in cols),
        key_columns=tuple(k for k in table.key_columns if k in names),
        source_type=SOURCE_BLOCK,
    )


@dataclass(frozen=True)
class EventContext:
    """Values shared by every event of one window."""

    topic_prefix: str
    database: str
    window_id: str
    ts_ms: int  # the window's planned time: fixed, so a re-run writes identical rows


def typed_children(text_columns: Sequence[pa.Array], columns: Sequence[Column], table: TableInfo) -> list[pa.Array]:
    name = table.ref.data_collection
    return [cast_text(arr, col.type, column=col.name, table=name) for arr, col in zip(text_columns, columns)]


def snapshot_batch(
    layout: EventLayout,
    table: TableInfo,
    text_columns: Sequence[pa.Array],
    *,
    context: EventContext,
    snapshot_lsn: int,
    snapshot_xmin: int | None,
    snapshot_ts_ms: int,
) -> pa.RecordBatch:
    """``op = r`` events for rows read by a snapshot partition (all text columns).

    The snapshot's reading transactions are read-only and have no transaction id, so ``txId``
    is null; ``xmin`` carries the snapshot's xmin (transactions from there on are not in it).
    """
    length = len(text_columns[0]) if text_columns else 0
    after = layout.value_struct(typed_children(text_columns, table.columns, table), None)
    source = {
        "version": __version__,
        "connector": CONNECTOR,
        "name": context.topic_prefix,
        "ts_ms": snapshot_ts_ms,
        "snapshot": "true",
        "db": context.database,
        "sequence": sequence(None, snapshot_lsn),
        "schema": table.ref.schema,
        "table": table.ref.name,
        "txId": None,
        "lsn": snapshot_lsn,
        "xmin": snapshot_xmin,
        "commit_lsn": snapshot_lsn,
    }
    return layout.assemble(
        before=pa.nulls(length, layout.value_type),
        after=after,
        source=pa.repeat(pa.scalar(source, SOURCE_BLOCK), length),
        op=pa.repeat(pa.scalar(Op.READ), length),
        ts_ms=context.ts_ms,
        transaction=None,
        window_id=context.window_id,
    )


def sequence(last_commit_lsn: int | None, lsn: int) -> str:
    """Debezium's ``source.sequence``: ``["<last committed LSN>","<LSN>"]`` as compact JSON."""
    return json.dumps([None if last_commit_lsn is None else str(last_commit_lsn), str(lsn)], separators=(",", ":"))


class StreamEventBuffer:
    """Rows of one table (at one relation version) waiting to become a record batch."""

    def __init__(self, table: TableInfo, columns: Sequence[Column], context: EventContext):
        self.table = table
        self.columns = tuple(columns)
        self.layout = event_layout(table, self.columns)
        self.context = context
        self._null_tuple: TupleData = (None,) * len(self.columns)
        self._string_columns = {i for i, c in enumerate(self.columns) if pa.types.is_string(arrow_type(c.type))}
        self._ops: list[str] = []
        self._before: list[TupleData | None] = []
        self._after: list[TupleData | None] = []
        self._source: list[tuple] = []
        self._transaction: list[tuple | None] = []

    def __len__(self) -> int:
        return len(self._ops)

    def add(
        self,
        op: str,
        before: TupleData | None,
        after: TupleData | None,
        *,
        lsn: int,
        xid: int,
        commit_lsn: int,
        commit_ts_ms: int,
        previous_commit_lsn: int | None,
        transaction: tuple[str, int, int],
    ) -> None:
        self._ops.append(op)
        self._before.append(before)
        self._after.append(after)
        self._source.append((commit_ts_ms, previous_commit_lsn, xid, lsn, commit_lsn))
        self._transaction.append(transaction)

    def to_batch(self) -> pa.RecordBatch:
        n = len(self._ops)
        before = self._value_column(self._before)
        after = self._value_column(self._after)
        ts, prev_commit, xids, lsns, commit_lsns = (list(c) for c in zip(*self._source))
        ref = self.table.ref
        source = pa.StructArray.from_arrays(
            [
                pa.repeat(pa.scalar(__version__), n),
                pa.repeat(pa.scalar(CONNECTOR), n),
                pa.repeat(pa.scalar(self.context.topic_prefix), n),
                pa.array(ts, pa.int64()),
                pa.repeat(pa.scalar("false"), n),
                pa.repeat(pa.scalar(self.context.database), n),
                pa.array(
                    [f'[{"null" if p is None else json.dumps(str(p))},"{lsn}"]' for p, lsn in zip(prev_commit, lsns)],
                    pa.string(),
                ),
                pa.repeat(pa.scalar(ref.schema), n),
                pa.repeat(pa.scalar(ref.name), n),
                pa.array(xids, pa.int64()),
                pa.array(lsns, pa.int64()),
                pa.nulls(n, pa.int64()),
                pa.array(commit_lsns, pa.int64()),
            ],
            fields=list(SOURCE_BLOCK),
        )
        tx_ids, total, per_table = zip(*self._transaction)
        transaction = pa.StructArray.from_arrays(
            [pa.array(tx_ids, pa.string()), pa.array(total, pa.int64()), pa.array(per_table, pa.int64())],
            fields=list(TRANSACTION_BLOCK),
        )
        return self.layout.assemble(
            before=before,
            after=after,
            source=source,
            op=pa.array(self._ops, pa.string()),
            ts_ms=self.context.ts_ms,
            transaction=transaction,
            window_id=self.context.window_id,
        )

    def _value_column(self, rows: list[TupleData | None]) -> pa.Array:
        present = [r is not None for r in rows]
        if not any(present):
            return pa.nulls(len(rows), self.layout.value_type)
        null_tuple = self._null_tuple
        filled = [r if r is not None else null_tuple for r in rows]
        width = len(self.columns)
        for i, row in enumerate(filled):
            if len(row) != width:
                raise DecodingError(
                    f"{self.table.ref}: a row has {len(row)} values but the relation has {width} columns"
                )
            if UNCHANGED_TOAST in row:
                filled[i] = self._replace_unchanged_toast(row)
        text_columns = [pa.array(col, pa.binary()).cast(pa.string()) for col in zip(*filled)]
        children = typed_children(text_columns, self.columns, self.table)
        return self.layout.value_struct(children, present)

    def _replace_unchanged_toast(self, row: TupleData) -> TupleData:
        # Unchanged TOASTed values are not in the WAL. Text columns carry Debezium's placeholder;
        # other types have no room for it and stay null.
        return tuple(
            (UNAVAILABLE_VALUE_PLACEHOLDER if i in self._string_columns else None) if v is UNCHANGED_TOAST else v
            for i, v in enumerate(row)
        )
