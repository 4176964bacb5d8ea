"""Incremental snapshot chunks on SQL Server: signal-table watermarks, the chunk T-SQL, positions.

The chunk framework is the core's (:mod:`cdc.chunks`); this is SQL Server's part, as Debezium's
SQL Server connector does it: the watermarks are rows written into the signal table, which must
itself be CDC-enabled (``insert_insert``: an open and a close row; ``insert_delete``: the open row,
then its delete), and their positions are the commit LSNs the capture job gives those rows in the
signal table's change table. The capture job is asynchronous, so after a run's chunks are read
:meth:`SqlServerChunkReader.settle` waits (once per run, bounded) until it has captured the last
watermark, and takes every chunk's low and high LSN from there.

A chunk is one ``SELECT TOP (n)`` after the last key, in key order, as a locking READ COMMITTED
read (``READCOMMITTEDLOCK``, also under READ_COMMITTED_SNAPSHOT): a transaction whose commit LSN
precedes the open watermark has released its locks by the time the read reaches its rows, so the
chunk saw it, and DBLog's rule (changes committed between the watermarks supersede chunk rows) is
all the next window needs. Keys are kept as text, converted by the server both ways.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcStateError
from airflow_provider_cdc.cdc.basics.tables import SQLSERVER_NAMES, TableRef
from airflow_provider_cdc.cdc.events.envelope import EventLayout
from airflow_provider_cdc.cdc.events.settings import EventContext, read_event_ts_ms
from airflow_provider_cdc.cdc.planning.incremental import StagedChunk
from airflow_provider_cdc.cdc.planning.row_filter import render
from airflow_provider_cdc.cdc.reading.chunks import ChunkPlan, ChunkRead
from airflow_provider_cdc.cdc.sources.sqlserver.connection import quote
from airflow_provider_cdc.cdc.sources.sqlserver.events import SOURCE_BLOCK, source_block
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn
from airflow_provider_cdc.cdc.sources.sqlserver.tables import SqlColumn

_FETCH_ROWS = 10_000
_POLL_SECONDS = 0.5

# How a key column is kept as text and read back, by its type: (to text, from text) T-SQL with
# {} for the column or the parameter. Types not listed cannot page chunks (a surrogate key can).
_TEMPORAL = ("date", "datetime", "datetime2", "smalldatetime", "time")
_PLAIN = ("tinyint", "smallint", "int", "bigint", "decimal", "numeric", "bit")
_STRINGS = ("char", "varchar", "nchar", "nvarchar")


def _key_text(column: SqlColumn) -> tuple[str, str]:
    kind = column.type.name
    declared = column.type.declared()
    if kind in _TEMPORAL:
        return "CONVERT(nvarchar(40), {}, 121)", f"CONVERT({declared}, {{}}, 121)"
    if kind in ("binary", "varbinary") and column.type.max_length != -1:
        return "CONVERT(nvarchar(max), {}, 1)", f"CONVERT({declared}, {{}}, 1)"
    if kind in _PLAIN or kind == "uniqueidentifier" or (kind in _STRINGS and column.type.max_length != -1):
        return "CAST({} AS nvarchar(4000))", f"CAST({{}} AS {declared})"
    raise CdcConfigurationError(
        f"column {column.name!r} ({declared}) cannot order incremental snapshot chunks: give the signal a "
        "surrogate-key of an integer, decimal, string, uniqueidentifier, binary or date/time column"
    )


@dataclass(frozen=True)
class SignalTable:
    """The signal table and the capture instance whose change table records its rows."""

    ref: TableRef
    instance: str

    @property
    def quoted(self) -> str:
        return self.ref.quoted(SQLSERVER_NAMES)


def _source_sql(plan: ChunkPlan) -> tuple[str, list[Any]]:
    """The table, or with a filter (Debezium's additional-conditions) the table filtered in a
    derived table, the filter written from its parsed form (:mod:`cdc.row_filter`): bracketed names
    of the table's own columns, and its values as parameters, never the filter's text."""
    table = f"{plan.ref.quoted(SQLSERVER_NAMES)} WITH (READCOMMITTEDLOCK)"
    parsed = plan.row_filter(None)  # bare names match as the usual case-insensitive collations do
    if parsed is None:
        return table, []
    node, names = parsed
    speller = _TsqlSpeller()
    condition = render(node, names, speller)
    return f"(SELECT * FROM {table} WHERE {condition}) AS {quote(plan.ref.name)}", speller.params


class _TsqlSpeller:
    """A filter as T-SQL text with ``?`` parameters (collected in order) for its values."""

    def __init__(self) -> None:
        self.params: list[Any] = []

    def column(self, name: str) -> str:
        return quote(name)

    def value(self, value: Any) -> str:
        self.params.append(int(value) if isinstance(value, bool) else value)
        return "?"

    def keyword(self, text: str) -> str:
        return text

    def join(self, parts: Sequence[str]) -> str:
        return "".join(parts)


def _bound(plan: ChunkPlan, operator: str, values: Sequence[str], *, inclusive: bool) -> tuple[str, list[str]]:
    """``(c1, c2, ...) <op> (v1, v2, ...)`` spelled out, since T-SQL has no row values: c1 <op> v1,
    or c1 = v1 and c2 <op> v2, ...; the last column's comparison takes ``=`` too when inclusive."""
    columns = [quote(c) for c in plan.order_columns]
    casts = [_key_text(plan.table.column(c))[1].format("?") for c in plan.order_columns]
    terms: list[str] = []
    params: list[str] = []
    for i in range(len(columns)):
        last = operator + ("=" if inclusive and i == len(columns) - 1 else "")
        parts = [f"{columns[j]} = {casts[j]}" for j in range(i)] + [f"{columns[i]} {last} {casts[i]}"]
        terms.append("(" + " AND ".join(parts) + ")")
        params += [*values[:i], values[i]]
    return "(" + " OR ".join(terms) + ")", params


def _not_null(plan: ChunkPlan) -> str:
    return " AND ".join(f"{quote(c)} IS NOT NULL" for c in plan.order_columns)


def _order(plan: ChunkPlan, descending: bool = False) -> str:
    return ", ".join(f"{quote(c)}{' DESC' if descending else ''}" for c in plan.order_columns)


def _key_select(plan: ChunkPlan) -> str:
    return ", ".join(
        f"{_key_text(plan.table.column(c))[0].format(quote(c))} AS {quote(f'__cdc_key{i}')}"
        for i, c in enumerate(plan.order_columns)
    )


def max_key_statement(plan: ChunkPlan) -> tuple[str, list[Any]]:
    source, params = _source_sql(plan)
    statement = (
        f"SELECT TOP (1) {_key_select(plan)} FROM {source} WHERE {_not_null(plan)} "
        f"ORDER BY {_order(plan, descending=True)}"
    )
    return statement, params


def chunk_statement(plan: ChunkPlan, limit: int) -> tuple[str, list[str]]:
    """The chunk after the last key, up to the max key, in key order; its key texts last."""
    progress = plan.progress
    if progress.max_key is None:
        raise RuntimeError(f"chunk of {progress.table} planned without its max key")
    source, params = _source_sql(plan)  # its parameters come first, as in the text
    upper, more = _bound(plan, "<", progress.max_key, inclusive=True)
    clauses = [upper]
    params += more
    if progress.last_key is not None:
        lower, more = _bound(plan, ">", progress.last_key, inclusive=False)
        clauses.append(lower)
        params += more
    statement = (
        f"SELECT TOP ({int(limit)}) {plan.encoder.select_list()}, {_key_select(plan)} FROM {source} "
        f"WHERE {' AND '.join(clauses)} ORDER BY {_order(plan)}"
    )
    return statement, params


class SqlServerChunkReader:
    """The core's :class:`~cdc.chunks.ChunkReader` on one SQL Server session (autocommit)."""

    def __init__(self, conn: Any, signal: SignalTable, mode: str, *, wait_seconds: float):
        self.conn = conn
        self.signal = signal
        self.mode = mode
        self.wait_seconds = wait_seconds

    def _execute(self, statement: str, *params: Any) -> Any:
        cursor = self.conn.cursor()
        cursor.execute(statement, *params)
        return cursor

    def max_key(self, plan: ChunkPlan) -> tuple[str, ...] | None:
        statement, params = max_key_statement(plan)
        cursor = self._execute(statement, *params)
        try:
            row = cursor.fetchone()
        finally:
            cursor.close()
        return None if row is None else tuple(str(v) for v in row)

    def read(self, plan: ChunkPlan, chunk_id: str, limit: int) -> ChunkRead:
        statement, params = chunk_statement(plan, limit)
        width = len(plan.encoder.columns)
        keys = len(plan.order_columns)
        self._watermark(f"{chunk_id}-open", "snapshot-window-open", chunk_id)
        read_ts_ms = int(time.time() * 1000)
        after: list[pa.Array] = []
        last_key: tuple[str, ...] | None = None
        rows = 0
        cursor = self._execute(statement, *params)
        try:
            while True:
                page = cursor.fetchmany(_FETCH_ROWS)
                if not page:
                    break
                columns = [[row[k] for row in page] for k in range(width)]
                after.append(plan.encoder.layout.value_struct(plan.encoder.typed(columns), None))
                last_key = tuple(str(page[-1][width + i]) for i in range(keys))
                rows += len(page)
        finally:
            cursor.close()
        if self.mode == "insert_insert":
            self._watermark(f"{chunk_id}-close", "snapshot-window-close", chunk_id)
        else:
            self._execute(f"DELETE FROM {self.signal.quoted} WHERE id = ?", f"{chunk_id}-open").close()
        return ChunkRead(after, rows, last_key, None, None, None, read_ts_ms)

    def _watermark(self, row_id: str, kind: str, chunk_id: str) -> None:
        data = json.dumps({"chunk": chunk_id, "windowTimestamp": int(time.time() * 1000)})
        self._execute(f"INSERT INTO {self.signal.quoted} (id, type, data) VALUES (?, ?, ?)", row_id, kind, data).close()

    def settle(self, chunks: list[StagedChunk]) -> list[StagedChunk]:
        """Every chunk's watermark LSNs, once the capture job has captured them (see module doc)."""
        if not chunks:
            return chunks
        wanted = {c.chunk_id: c for c in chunks}
        ids = [f"{c}-open" for c in wanted] + ([f"{c}-close" for c in wanted] if self.mode == "insert_insert" else [])
        table = quote(f"{self.signal.instance}_CT")
        marks = ", ".join("?" for _ in ids)
        statement = f"SELECT [id], __$start_lsn, __$operation FROM cdc.{table} WHERE [id] IN ({marks})"
        deadline = time.monotonic() + self.wait_seconds
        while True:
            low: dict[str, int] = {}
            high: dict[str, int] = {}
            cursor = self._execute(statement, *ids)
            try:
                for row_id, start_lsn, operation in cursor.fetchall():
                    chunk_id, _, end = str(row_id).rpartition("-")
                    lsn = int(SqlServerLsn(bytes(start_lsn)))
                    if end == "open" and int(operation) == 2:
                        low[chunk_id] = lsn
                    elif (end == "close" and int(operation) == 2) or (end == "open" and int(operation) == 1):
                        high[chunk_id] = lsn
            finally:
                cursor.close()
            if all(c in low and c in high for c in wanted):
                return [replace(c, low_lsn=low[c.chunk_id], high_lsn=high[c.chunk_id]) for c in chunks]
            if time.monotonic() >= deadline:
                raise CdcStateError(
                    f"the capture job did not capture the incremental snapshot's watermark rows in "
                    f"{self.signal.quoted} within {self.wait_seconds:g} s (capture instance {self.signal.instance!r}): "
                    "is SQL Server Agent's capture job running? Nothing was committed; the window is retried. Raise "
                    "incremental_watermark_wait_seconds if the capture job is just slow"
                )
            time.sleep(_POLL_SECONDS)

    def table_failure(self, exc: BaseException) -> bool:
        import pyodbc

        if isinstance(exc, (pyodbc.OperationalError, pyodbc.InterfaceError)):
            return False  # the session died
        return isinstance(exc, pyodbc.Error)


class SqlServerChunkPositions:
    """Stream events against chunk watermarks: commit LSNs in Debezium's fixed-width text, which
    sorts like the LSN. Every transaction before the open watermark was seen (see module doc)."""

    def commits(self, source: pa.Array) -> pa.Array:
        return pc.struct_field(source, "commit_lsn")

    def bound(self, position: int) -> pa.Scalar:
        return pa.scalar(str(SqlServerLsn(position)), pa.string())

    def unseen(self, source: pa.Array, chunk: StagedChunk) -> np.ndarray | None:
        return None


def emit_chunk(chunk: StagedChunk, after: pa.Array, context: EventContext) -> pa.RecordBatch:
    """``op = r`` events of a chunk's surviving rows, positioned at its high watermark."""
    ref = chunk.table
    source = source_block(
        context,
        ref.schema,
        ref.name,
        snapshot="incremental",
        ts_ms=chunk.read_ts_ms,
        change_lsn=None,
        commit_lsn=str(SqlServerLsn(chunk.high_lsn)),
        event_serial_no=None,
    )
    layout = EventLayout(value_fields=tuple(after.type), key_columns=chunk.key_columns, source_type=SOURCE_BLOCK)
    return layout.query_events(after, source, ts_ms=read_event_ts_ms(context, source), window_id=context.window_id)
