"""SQL Server change events: Debezium's ``source`` block for SQL Server and the table encoder.

The ``source`` block carries SQL Server's fields as Debezium's SQL Server connector names them:
``change_lsn`` (the change's ``__$seqval``), ``commit_lsn`` (its transaction's ``__$start_lsn``)
and ``event_serial_no``, the LSNs in Debezium's ``vlf:block:slot`` text form; ``ts_ms`` is the
commit time from ``cdc.lsn_time_mapping``. Values come from pyodbc as Python values of each
column's select expression and become Arrow through the column's codec (:mod:`.types`), the same
way in the snapshot and in the stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import pyarrow as pa

from airflow_provider_cdc import __version__
from airflow_provider_cdc.cdc.basics.tables import SQLSERVER_NAMES
from airflow_provider_cdc.cdc.events.column_plan import ColumnPlan
from airflow_provider_cdc.cdc.events.envelope import (
    SOURCE_COMMON_FIELDS,
    TRANSACTION_BLOCK,
    TRUNCATE_FLAGS,
    UNCHANGED_LIST,
)
from airflow_provider_cdc.cdc.events.settings import EventContext, EventSettings, read_event_ts_ms
from airflow_provider_cdc.cdc.sources.sqlserver.connection import quote
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import lsn_texts
from airflow_provider_cdc.cdc.sources.sqlserver.tables import SqlColumn, TableInfo
from airflow_provider_cdc.cdc.sources.sqlserver.types import Codec, codec_for, text_codec

CONNECTOR = "sqlserver"

SOURCE_BLOCK = pa.struct(
    [
        *SOURCE_COMMON_FIELDS,
        pa.field("change_lsn", pa.string()),
        pa.field("commit_lsn", pa.string()),
        pa.field("event_serial_no", pa.int64()),
    ]
)


class TableEncoder:
    """The captured columns of one capture instance → typed event columns (selection, codecs,
    masks) and the T-SQL select list that reads them."""

    def __init__(self, table: TableInfo, columns: Sequence[SqlColumn], settings: EventSettings):
        self.table = table
        plan: ColumnPlan[SqlColumn, Codec] = ColumnPlan.build(
            table.ref,
            columns,
            table.key_columns,
            settings.columns,
            name=lambda c: c.name,
            codec=lambda c, as_text: (
                text_codec(c.type, settings.modes) if as_text else codec_for(c.type, settings.modes)
            ),
            source_type=SOURCE_BLOCK,
            names=SQLSERVER_NAMES,
        )
        self.columns = plan.columns
        self.codecs = plan.codecs
        self.masks = plan.masks
        self.key_columns = plan.key_columns
        self.key_indexes = plan.key_indexes
        self.layout = plan.layout

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def select_list(self) -> str:
        """``<expression> AS [column]`` for every kept column, in order."""
        return ", ".join(
            f"{codec.select(quote(c.name))} AS {quote(c.name)}" for c, codec in zip(self.columns, self.codecs)
        )

    def typed(self, values: Sequence[Sequence[Any]]) -> list[pa.Array]:
        """One Arrow array per kept column from its column of Python values."""
        out = []
        for column, codec, mask, column_values in zip(self.columns, self.codecs, self.masks, values):
            array = codec.to_arrow(column_values)
            out.append(array if mask is None else mask.apply(array, _char_length(column)))
        return out


def _char_length(column: SqlColumn) -> int | None:
    """Characters of a (n)char/(n)varchar column: masks' hashes are cut to it, like Debezium."""
    kind = column.type.name
    if kind in ("char", "varchar") and column.type.max_length > 0:
        return column.type.max_length
    if kind in ("nchar", "nvarchar") and column.type.max_length > 0:
        return column.type.max_length // 2
    return None


def source_block(
    context: EventContext,
    schema: str,
    table: str,
    *,
    snapshot: str,
    ts_ms: int,
    change_lsn: str | None,
    commit_lsn: str | None,
    event_serial_no: int | None,
) -> dict[str, Any]:
    return {
        "version": __version__,
        "connector": CONNECTOR,
        "name": context.topic_prefix,
        "ts_ms": ts_ms,
        "snapshot": snapshot,
        "db": context.database,
        "sequence": None,
        "schema": schema,
        "table": table,
        "change_lsn": change_lsn,
        "commit_lsn": commit_lsn,
        "event_serial_no": event_serial_no,
    }


def read_events(
    encoder: TableEncoder, values: Sequence[Sequence[Any]], source: dict[str, Any], context: EventContext
) -> pa.RecordBatch:
    """``op = r`` events of rows read by a query (snapshot, incremental chunk): one ``source``."""
    after = encoder.layout.value_struct(encoder.typed(values), None)
    return encoder.layout.query_events(
        after, source, ts_ms=read_event_ts_ms(context, source), window_id=context.window_id
    )


class StreamTransaction(Protocol):
    """What an event takes from its transaction (the window reader's open transaction)."""

    @property
    def commit_lsn(self) -> int: ...

    @property
    def transaction_id(self) -> str: ...

    @property
    def ts_ms(self) -> int: ...


#: One buffered event: op, before, after, change LSN, index of its transaction in the buffer,
#: transaction.total_order, transaction.data_collection_order.
_Row = tuple[str, Sequence[Any] | None, Sequence[Any] | None, int, int, int, int]


class StreamEventBuffer:
    """The change events of one table in one chunk, kept as rows of Python values until flushed.

    Adding an event is one tuple append: everything that becomes a column is built at the flush,
    a column at a time (per-row ``source``/``transaction`` dicts and LSN texts cost more than the
    rest of an event). The ``source`` fields are constant per buffer (one table) or per
    transaction (commit LSN, ts_ms): those are built once per transaction and gathered with
    ``take``. Key changes and serial numbers other than 1, which are rare, are kept sparse."""

    def __init__(self, encoder: TableEncoder, context: EventContext):
        self.encoder = encoder
        self.context = context
        self._rows: list[_Row] = []
        self._transactions: list[StreamTransaction] = []
        self._key_changes: dict[int, tuple[Sequence[Any] | None, Sequence[Any] | None]] = {}
        self._serials: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def add(
        self,
        op: str,
        before: Sequence[Any] | None,
        after: Sequence[Any] | None,
        change_lsn: int,
        transaction: StreamTransaction,
        total_order: int,
        data_collection_order: int,
        *,
        event_serial_no: int = 1,
        old_key: Sequence[Any] | None = None,
        new_key: Sequence[Any] | None = None,
    ) -> None:
        """One event; ``before``/``after``: values of the encoder's columns (None: no image)."""
        transactions = self._transactions
        if not transactions or transactions[-1] is not transaction:
            transactions.append(transaction)  # a transaction's events are consecutive
        if event_serial_no != 1:
            self._serials[len(self._rows)] = event_serial_no
        if old_key is not None or new_key is not None:
            self._key_changes[len(self._rows)] = (old_key, new_key)
        self._rows.append((op, before, after, change_lsn, len(transactions) - 1, total_order, data_collection_order))

    def to_batch(self) -> pa.RecordBatch:
        layout = self.encoder.layout
        n = len(self._rows)
        if n:
            ops, before, after, change_lsns, txs, totals, orders = zip(*self._rows)
        else:
            ops = before = after = change_lsns = txs = totals = orders = ()
        tx = pa.array(txs, pa.int32())
        transaction_ids = pa.array([t.transaction_id for t in self._transactions], pa.string())
        old_key = new_key = None
        if self._key_changes and layout.key_columns:
            changes = self._key_changes
            old_key = self._key([changes[i][0] if i in changes else None for i in range(n)])
            new_key = self._key([changes[i][1] if i in changes else None for i in range(n)])
        return layout.assemble(
            before=self._image(before),
            after=self._image(after),
            source=self._source(change_lsns, tx),
            op=pa.array(ops, pa.string()),
            ts_ms=self.context.ts_ms,
            transaction=pa.StructArray.from_arrays(
                [transaction_ids.take(tx), pa.array(totals, pa.int64()), pa.array(orders, pa.int64())],
                fields=list(TRANSACTION_BLOCK),
            ),
            window_id=self.context.window_id,
            old_key=old_key,
            new_key=new_key,
            unchanged=pa.nulls(n, UNCHANGED_LIST),
            truncate=pa.nulls(n, TRUNCATE_FLAGS),
        )

    def _source(self, change_lsns: Sequence[int], tx: pa.Array) -> pa.StructArray:
        """The ``source`` column: what :func:`source_block` gives each event, built by column."""
        n = len(tx)
        context, ref, transactions = self.context, self.encoder.table.ref, self._transactions
        serials = self._serials
        columns = {
            "version": _repeat(__version__, pa.string(), n),
            "connector": _repeat(CONNECTOR, pa.string(), n),
            "name": _repeat(context.topic_prefix, pa.string(), n),
            "ts_ms": pa.array([t.ts_ms for t in transactions], pa.int64()).take(tx),
            "snapshot": _repeat("false", pa.string(), n),
            "db": _repeat(context.database, pa.string(), n),
            "sequence": pa.nulls(n, pa.string()),
            "schema": _repeat(ref.schema, pa.string(), n),
            "table": _repeat(ref.name, pa.string(), n),
            "change_lsn": lsn_texts(change_lsns),
            "commit_lsn": lsn_texts([t.commit_lsn for t in transactions]).take(tx),
            "event_serial_no": (
                pa.array([serials.get(i, 1) for i in range(n)], pa.int64()) if serials else _repeat(1, pa.int64(), n)
            ),
        }
        return pa.StructArray.from_arrays([columns[f.name] for f in SOURCE_BLOCK], fields=list(SOURCE_BLOCK))

    def _image(self, rows: Sequence[Sequence[Any] | None]) -> pa.Array:
        encoder = self.encoder
        present = [r is not None for r in rows]
        if not any(present):  # e.g. ``before`` of a chunk of inserts: no values to convert
            return pa.nulls(len(rows), encoder.layout.value_type)
        if not all(present):
            absent = (None,) * len(encoder.columns)
            rows = [absent if r is None else r for r in rows]
        columns = [list(column) for column in zip(*rows)]  # the transpose, in C
        return encoder.layout.value_struct(encoder.typed(columns), present)

    def _key(self, keys: list[Sequence[Any] | None]) -> pa.Array:
        encoder = self.encoder
        present = [k is not None for k in keys]
        children = []
        for j, index in enumerate(encoder.key_indexes):
            values = [None if k is None else k[j] for k in keys]
            children.append(encoder.codecs[index].to_arrow(values))
        return encoder.layout.key_struct(children, present)


def _repeat(value: Any, arrow_type: pa.DataType, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(value, arrow_type), n)
