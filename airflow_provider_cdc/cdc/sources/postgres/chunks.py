"""Incremental snapshot chunks on PostgreSQL: watermark messages, the chunk SQL, visibility.

The chunk framework is the core's (:mod:`cdc.chunks`); this module is PostgreSQL's part of it:
the watermarks (non-transactional logical messages, or signal-table rows), the keyset-paginated
``COPY`` of one chunk in a REPEATABLE READ transaction whose snapshot is recorded, how stream
events compare with the watermarks (commit LSNs, transaction ids against that snapshot), and the
``op = r`` events of a chunk with PostgreSQL's source block.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.events.envelope import EventLayout
from airflow_provider_cdc.cdc.planning.row_filter import render
from airflow_provider_cdc.cdc.reading.chunks import (
    CHUNK_ID_FIELD,
    ChunkPlan,
    ChunkRead,
    is_staged_topic,
    staged_topic,
    surviving_rows,
)
from airflow_provider_cdc.cdc.reading.chunks import ChunkKeyWatch as _ChunkKeyWatch
from airflow_provider_cdc.cdc.sources.postgres.attached_code import (
    signal_table_write_problems,
    unsafe_signal_table_message,
)
from airflow_provider_cdc.cdc.sources.postgres.events import (
    SOURCE_BLOCK,
    EventContext,
    read_events,
    read_source,
)
from airflow_provider_cdc.cdc.sources.postgres.incremental import (
    WATERMARK_CLOSE,
    WATERMARK_OPEN,
    StagedChunk,
    XidSnapshot,
)
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.snapshot import copy_text_columns, refusing_row_security
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef, pg_identifier

__all__ = [
    "CHUNK_ID_FIELD",
    "ChunkKeyWatch",
    "PgChunkPositions",
    "PgChunkReader",
    "Watermarks",
    "emit_chunk",
    "is_staged_topic",
    "staged_topic",
    "surviving_rows",
]


# -- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Watermarks:
    """How a chunk's low and high watermarks are written: ``message`` (a non-transactional
    logical decoding message, no table needed) or Debezium's signal-table rows
    (``insert_insert``: an open and a close row; ``insert_delete``: the open row is deleted).

    The signal table is usually another role's, who could attach code to it that runs as the
    capture role when the capture writes (a trigger, a rule, a default calling its function; see
    :mod:`.attached_code`). Each row is written in a transaction that first locks the table
    ``ROW EXCLUSIVE`` (so none can be attached until it ends) and checks that none is: otherwise
    nothing is written, and the table's incremental snapshot fails naming the fix."""

    mode: str = "message"
    signal_table: TableRef | None = None

    def open(self, conn: Any, chunk_id: str) -> int:
        if self.mode == "message":
            return _emit(conn, WATERMARK_OPEN, chunk_id)
        self._insert(conn, f"{chunk_id}-open", "snapshot-window-open", chunk_id)
        return _insert_lsn(conn)

    def close(self, conn: Any, chunk_id: str) -> int:
        if self.mode == "message":
            return _emit(conn, WATERMARK_CLOSE, chunk_id)
        if self.mode == "insert_insert":
            self._insert(conn, f"{chunk_id}-close", "snapshot-window-close", chunk_id)
        else:
            from psycopg import sql

            table = self._table()
            self._write(
                conn,
                sql.SQL("DELETE FROM {} WHERE id = {}").format(pg_identifier(table), sql.Literal(f"{chunk_id}-open")),
            )
        return _insert_lsn(conn)

    def _table(self) -> TableRef:
        if self.signal_table is None:
            raise CdcConfigurationError(f"incremental_watermarks={self.mode!r} needs a signal_table")
        return self.signal_table

    def _insert(self, conn: Any, row_id: str, kind: str, chunk_id: str) -> None:
        import json

        from psycopg import sql

        table = self._table()
        data = json.dumps({"chunk": chunk_id, "windowTimestamp": int(time.time() * 1000)})
        self._write(
            conn,
            sql.SQL("INSERT INTO {} (id, type, data) VALUES (%s, %s, %s)").format(pg_identifier(table)),
            (row_id, kind, data),
        )

    def _write(self, conn: Any, statement: Any, params: tuple | None = None) -> None:
        """``statement`` on the signal table, once the table is locked and holds no code that would
        run as the capture role (see the class doc)."""
        from psycopg import sql

        table = self._table()
        with conn.transaction():
            conn.execute(sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(pg_identifier(table)))
            problems = signal_table_write_problems(conn, table)
            if problems:
                raise CdcConfigurationError(unsafe_signal_table_message(table, self.mode, problems))
            conn.execute(statement, params)


def _emit(conn: Any, prefix: str, content: str) -> int:
    row = conn.execute("SELECT pg_logical_emit_message(false, %s, %s)::text", (prefix, content)).fetchone()
    return int(Lsn(row[0]))


def _insert_lsn(conn: Any) -> int:
    return int(Lsn(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]))


# format_type(oid, NULL) names these as their one-character defaults (char(1), bit(1)) when
# written back: cast to the unconstrained base types instead, or key bounds get truncated.
_UNCONSTRAINED = {"character": "bpchar", "bit": '"bit"', "character[]": "bpchar[]", "bit[]": '"bit"[]'}


def _cast_type(name: str) -> str:
    return _UNCONSTRAINED.get(name, name)


def _key_sql(plan: ChunkPlan, values: Sequence[str]):  # -> sql.Composed
    """``ROW(<text>::type, ...)`` for key values kept in PostgreSQL's text form."""
    from psycopg import sql

    casts = [
        sql.SQL("CAST({} AS {})").format(sql.Literal(v), sql.SQL(_cast_type(plan.table.column(c).type.name)))
        for c, v in zip(plan.order_columns, values)
    ]
    return sql.SQL("ROW({})").format(sql.SQL(", ").join(casts))


def _order_sql(plan: ChunkPlan, descending: bool = False):
    from psycopg import sql

    direction = sql.SQL(" DESC") if descending else sql.SQL("")
    return sql.SQL(", ").join(sql.SQL("{}{}").format(sql.Identifier(c), direction) for c in plan.order_columns)


def _row_sql(plan: ChunkPlan):
    from psycopg import sql

    return sql.SQL("ROW({})").format(sql.SQL(", ").join(sql.Identifier(c) for c in plan.order_columns))


def _source_sql(plan: ChunkPlan):
    """The table, or with a filter (Debezium's additional-conditions) the table filtered in a
    subquery, the filter written from its parsed form (:mod:`cdc.row_filter`): quoted names of the
    table's own columns and literal values, never the filter's text."""
    from psycopg import sql

    parsed = plan.row_filter(_fold_unquoted)
    if parsed is None:
        return pg_identifier(plan.table.ref)
    node, names = parsed
    return sql.SQL("(SELECT * FROM {} WHERE {}) AS {}").format(
        pg_identifier(plan.table.ref), render(node, names, _PgSpeller()), sql.Identifier(plan.table.ref.name)
    )


def _fold_unquoted(name: str) -> str:
    """PostgreSQL lowercases unquoted names (ASCII letters only, as its scanner does)."""
    return name.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


class _PgSpeller:
    """A filter as psycopg composables: ``Identifier`` and ``Literal``, so psycopg quotes both."""

    def column(self, name: str):
        from psycopg import sql

        return sql.Identifier(name)

    def value(self, value: Any):
        from psycopg import sql

        return sql.Literal(value)

    def keyword(self, text: str):
        from psycopg import sql

        return sql.SQL(text)

    def join(self, parts: Sequence[Any]):
        from psycopg import sql

        return sql.Composed(list(parts))


def _not_null_sql(plan: ChunkPlan):
    from psycopg import sql

    return sql.SQL(" AND ").join(sql.SQL("{} IS NOT NULL").format(sql.Identifier(c)) for c in plan.order_columns)


def max_key_statement(plan: ChunkPlan):
    from psycopg import sql

    # Aliased: an output column named like the key would make ORDER BY sort the text. Rows with a
    # NULL (surrogate) key cannot be paged by key: they are left out, not taken as the maximum.
    return sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT 1").format(
        sql.SQL(", ").join(
            sql.SQL("{}::text AS {}").format(sql.Identifier(c), sql.Identifier(f"__cdc_key{i}"))
            for i, c in enumerate(plan.order_columns)
        ),
        _source_sql(plan),
        _not_null_sql(plan),
        _order_sql(plan, descending=True),
    )


def chunk_statement(plan: ChunkPlan, limit: int):
    """``COPY (SELECT <columns> ... ORDER BY <key> LIMIT n)`` after the last key, up to the max key."""
    from psycopg import sql

    progress = plan.progress
    if progress.max_key is None:
        raise RuntimeError(f"chunk of {progress.table} planned without its max key")
    bounds = [sql.SQL("{} <= {}").format(_row_sql(plan), _key_sql(plan, progress.max_key))]
    if progress.last_key is not None:
        bounds.append(sql.SQL("{} > {}").format(_row_sql(plan), _key_sql(plan, progress.last_key)))
    return sql.SQL("COPY (SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT {}) TO STDOUT (FORMAT csv)").format(
        sql.SQL(", ").join(sql.Identifier(c.name) for c in plan.encoder.columns),
        _source_sql(plan),
        sql.SQL(" AND ").join(bounds),
        _order_sql(plan),
        sql.Literal(int(limit)),
    )


def read_chunk(conn: Any, plan: ChunkPlan, chunk_id: str, *, limit: int, watermarks: Watermarks) -> ChunkRead:
    """One chunk between its watermarks, in a REPEATABLE READ, READ ONLY transaction whose
    snapshot is recorded (the next window drops rows changed by transactions it did not see)."""
    names = plan.column_names
    statement = chunk_statement(plan, limit)  # a filter that does not apply fails before the watermark
    low = watermarks.open(conn, chunk_id)
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        text, ts_ms = conn.execute(
            "SELECT pg_current_snapshot()::text, (extract(epoch FROM statement_timestamp()) * 1000)::bigint"
        ).fetchone()
        snapshot = XidSnapshot.parse(text)
        positions = [names.index(c) for c in plan.order_columns]
        after: list[pa.Array] = []
        last_key = None
        rows = 0
        with conn.cursor() as cur:
            for columns in copy_text_columns(cur, statement, len(names)):
                after.append(plan.encoder.layout.value_struct(plan.encoder.typed(columns), None))
                last_key = tuple(columns[i][-1].as_py() for i in positions)
                rows += len(columns[0])
        conn.execute("COMMIT")
    except BaseException:
        if not conn.closed:
            conn.execute("ROLLBACK")
        raise
    high = watermarks.close(conn, chunk_id)
    return ChunkRead(after, rows, last_key, low, high, snapshot.to_text(), int(ts_ms))


def read_max_key(conn: Any, plan: ChunkPlan) -> tuple[str, ...] | None:
    statement = max_key_statement(plan)  # a filter that does not apply fails here, before the transaction
    conn.execute("BEGIN READ ONLY")
    try:
        with refusing_row_security(conn):
            row = conn.execute(statement).fetchone()
        conn.execute("COMMIT")
    except BaseException:
        if not conn.closed:
            conn.execute("ROLLBACK")
        raise
    return None if row is None else tuple(row)


# -- emitting ----------------------------------------------------------------------------------


class PgChunkReader:
    """The core's :class:`~cdc.chunks.ChunkReader` on one PostgreSQL session."""

    def __init__(self, conn: Any, watermarks: Watermarks):
        self.conn = conn
        self.watermarks = watermarks

    def max_key(self, plan: ChunkPlan) -> tuple[str, ...] | None:
        return read_max_key(self.conn, plan)

    def read(self, plan: ChunkPlan, chunk_id: str, limit: int) -> ChunkRead:
        return read_chunk(self.conn, plan, chunk_id, limit=limit, watermarks=self.watermarks)

    def settle(self, chunks: list[StagedChunk]) -> list[StagedChunk]:
        return chunks  # the watermark LSNs are known when they are written

    def table_failure(self, exc: BaseException) -> bool:
        import psycopg

        if isinstance(exc, psycopg.OperationalError) and not isinstance(exc, psycopg.errors.QueryCanceled):
            return False  # the session died
        return isinstance(exc, psycopg.errors.DatabaseError)


class PgChunkPositions:
    """Stream events against chunk watermarks: commit LSNs, and transaction ids against the
    chunk's recorded snapshot (a transaction it did not see supersedes its rows too)."""

    def commits(self, source: pa.Array) -> pa.Array:
        return pc.struct_field(source, "commit_lsn")

    def bound(self, position: int) -> pa.Scalar:
        return pa.scalar(position, pa.int64())

    def unseen(self, source: pa.Array, chunk: StagedChunk) -> np.ndarray | None:
        xids = pc.struct_field(source, "txId").fill_null(0).to_numpy(zero_copy_only=False)
        return ~XidSnapshot.parse(str(chunk.snapshot)).sees(xids)


class ChunkKeyWatch(_ChunkKeyWatch):
    """The core's watch with PostgreSQL's positions."""

    def __init__(self, chunks: Sequence[StagedChunk], topic_prefix: str):
        super().__init__(chunks, topic_prefix, PgChunkPositions())


def emit_chunk(chunk: StagedChunk, after: pa.Array, context: EventContext) -> pa.RecordBatch:
    """``op = r`` events of a chunk's surviving rows, positioned at its high watermark."""
    layout = EventLayout(value_fields=tuple(after.type), key_columns=chunk.key_columns, source_type=SOURCE_BLOCK)
    ref = chunk.table
    source = read_source(
        context,
        ref.schema,
        ref.name,
        "incremental",
        chunk.read_ts_ms,
        chunk.high_lsn,
        XidSnapshot.parse(str(chunk.snapshot)).xmin,
    )
    return read_events(layout, after, source, context)
