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
from typing import Any

import pyarrow as pa

from airflow_provider_cdc import __version__
from airflow_provider_cdc.cdc.column_plan import ColumnPlan
from airflow_provider_cdc.cdc.envelope import (
    SOURCE_COMMON_FIELDS,
    TRANSACTION_BLOCK,
    TRUNCATE_FLAGS,
    UNCHANGED_LIST,
    Op,
)
from airflow_provider_cdc.cdc.event_settings import EventContext, EventSettings, read_event_ts_ms
from airflow_provider_cdc.cdc.sources.sqlserver.admin import SqlColumn, TableInfo, quote
from airflow_provider_cdc.cdc.sources.sqlserver.types import Codec, codec_for, text_codec
from airflow_provider_cdc.cdc.tables import SQLSERVER_NAMES

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
    layout = encoder.layout
    after = layout.value_struct(encoder.typed(values), None)
    n = len(after)
    return layout.assemble(
        before=pa.nulls(n, layout.value_type),
        after=after,
        source=pa.repeat(pa.scalar(source, SOURCE_BLOCK), n),
        op=pa.repeat(pa.scalar(Op.READ), n),
        ts_ms=read_event_ts_ms(context, source),
        transaction=None,
        window_id=context.window_id,
    )


class StreamEventBuffer:
    """The change events of one table in one chunk, as rows of Python values until flushed."""

    def __init__(self, encoder: TableEncoder, context: EventContext):
        self.encoder = encoder
        self.context = context
        self.ops: list[str] = []
        self.before: list[Sequence[Any] | None] = []
        self.after: list[Sequence[Any] | None] = []
        self.sources: list[dict[str, Any]] = []
        self.transactions: list[dict[str, Any]] = []
        self.old_keys: list[Sequence[Any] | None] = []
        self.new_keys: list[Sequence[Any] | None] = []

    def __len__(self) -> int:
        return len(self.ops)

    def add(
        self,
        op: str,
        before: Sequence[Any] | None,
        after: Sequence[Any] | None,
        source: dict[str, Any],
        transaction: dict[str, Any],
        *,
        old_key: Sequence[Any] | None = None,
        new_key: Sequence[Any] | None = None,
    ) -> None:
        self.ops.append(op)
        self.before.append(before)
        self.after.append(after)
        self.sources.append(source)
        self.transactions.append(transaction)
        self.old_keys.append(old_key)
        self.new_keys.append(new_key)

    def to_batch(self) -> pa.RecordBatch:
        layout = self.encoder.layout
        n = len(self.ops)
        width = len(self.encoder.columns)
        has_keys = bool(layout.key_columns)
        key_change = any(k is not None for k in self.old_keys) or any(k is not None for k in self.new_keys)
        return layout.assemble(
            before=self._image(self.before, width),
            after=self._image(self.after, width),
            source=pa.array(self.sources, SOURCE_BLOCK),
            op=pa.array(self.ops, pa.string()),
            ts_ms=self.context.ts_ms,
            transaction=pa.array(self.transactions, TRANSACTION_BLOCK),
            window_id=self.context.window_id,
            old_key=self._key(self.old_keys) if has_keys and key_change else None,
            new_key=self._key(self.new_keys) if has_keys and key_change else None,
            unchanged=pa.nulls(n, UNCHANGED_LIST),
            truncate=pa.nulls(n, TRUNCATE_FLAGS),
        )

    def _image(self, rows: list[Sequence[Any] | None], width: int) -> pa.Array:
        present = [r is not None for r in rows]
        columns = [[None if r is None else r[k] for r in rows] for k in range(width)]
        return self.encoder.layout.value_struct(self.encoder.typed(columns), present)

    def _key(self, keys: list[Sequence[Any] | None]) -> pa.Array:
        encoder = self.encoder
        present = [k is not None for k in keys]
        children = []
        for j, index in enumerate(encoder.key_indexes):
            values = [None if k is None else k[j] for k in keys]
            children.append(encoder.codecs[index].to_arrow(values))
        return encoder.layout.key_struct(children, present)
