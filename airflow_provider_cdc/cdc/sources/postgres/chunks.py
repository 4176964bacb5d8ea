"""Incremental snapshot chunks: reading them between watermarks, and emitting them a window later.

See :mod:`.incremental` for the algorithm. Reading happens at the end of a stream window's job
(after its stream, so the window's transactions are known); the chunk's rows are staged in the
sink with that window's commit. The next window's job watches its stream for changes to staged
keys (:class:`ChunkKeyWatch`) and then emits what survives (:func:`emit_chunk`).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc.cdc import faults
from airflow_provider_cdc.cdc.envelope import EventLayout, Op
from airflow_provider_cdc.cdc.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.naming import Topic, is_staged_topic, staged_topic
from airflow_provider_cdc.cdc.sources.postgres.events import (
    SOURCE_BLOCK,
    EventContext,
    EventSettings,
    TableEncoder,
    read_events,
    read_source,
)
from airflow_provider_cdc.cdc.sources.postgres.incremental import (
    WATERMARK_CLOSE,
    WATERMARK_OPEN,
    IncrementalState,
    StagedChunk,
    TableProgress,
    XidSnapshot,
)
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.snapshot import copy_text_columns
from airflow_provider_cdc.cdc.sources.postgres.tables import TableInfo, TableRef, pg_identifier

log = logging.getLogger(__name__)

CHUNK_ID_FIELD = "chunk_id"

__all__ = ["CHUNK_ID_FIELD", "is_staged_topic", "staged_topic"]


# -- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Watermarks:
    """How a chunk's low and high watermarks are written: ``message`` (a non-transactional
    logical decoding message, no table needed) or Debezium's signal-table rows
    (``insert_insert``: an open and a close row; ``insert_delete``: the open row is deleted)."""

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

            assert self.signal_table is not None
            conn.execute(
                sql.SQL("DELETE FROM {} WHERE id = {}").format(
                    pg_identifier(self.signal_table), sql.Literal(f"{chunk_id}-open")
                )
            )
        return _insert_lsn(conn)

    def _insert(self, conn: Any, row_id: str, kind: str, chunk_id: str) -> None:
        import json

        from psycopg import sql

        if self.signal_table is None:
            raise CdcConfigurationError(f"incremental_watermarks={self.mode!r} needs a signal_table")
        data = json.dumps({"chunk": chunk_id, "windowTimestamp": int(time.time() * 1000)})
        conn.execute(
            sql.SQL("INSERT INTO {} (id, type, data) VALUES (%s, %s, %s)").format(pg_identifier(self.signal_table)),
            (row_id, kind, data),
        )


def _emit(conn: Any, prefix: str, content: str) -> int:
    row = conn.execute("SELECT pg_logical_emit_message(false, %s, %s)::text", (prefix, content)).fetchone()
    return int(Lsn(row[0]))


def _insert_lsn(conn: Any) -> int:
    return int(Lsn(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]))


@dataclass(frozen=True)
class ChunkPlan:
    """What to read next for one table."""

    table: TableInfo
    encoder: TableEncoder
    progress: TableProgress

    @property
    def order_columns(self) -> tuple[str, ...]:
        """The columns chunks are ordered and paginated by."""
        if self.progress.surrogate_key:
            return (self.progress.surrogate_key,)
        return self.table.key_columns

    @property
    def match_columns(self) -> tuple[str, ...]:
        """What identifies a row when a stream change supersedes a chunk row: the key, or the
        surrogate key for a table without one."""
        return self.table.key_columns or self.order_columns

    def check(self) -> None:
        """Fail with a clear message when this table cannot be chunked as asked."""
        names = [c.name for c in self.encoder.columns]
        ref = self.table.ref
        if not self.order_columns:
            raise CdcConfigurationError(
                f"{ref} has no primary key: an incremental snapshot needs one, or a surrogate-key column"
            )
        missing = [c for c in (*self.order_columns, *self.match_columns) if c not in names]
        if missing:
            raise CdcConfigurationError(
                f"column(s) {', '.join(missing)} of {ref} are not captured (or do not exist); the incremental "
                "snapshot orders and matches rows by them"
            )


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
    """The table, or with Debezium's additional-conditions (a WHERE fragment written by the
    signal's author) the table filtered in a subquery: whatever the fragment says, it cannot
    reach the key bounds and ORDER BY around it. ``_check_condition`` proves it one statement."""
    from psycopg import sql

    if not plan.progress.condition:
        return pg_identifier(plan.table.ref)
    return sql.SQL("(SELECT * FROM {} WHERE ({})) AS {}").format(
        pg_identifier(plan.table.ref), sql.SQL(plan.progress.condition), sql.Identifier(plan.table.ref.name)
    )


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
    assert progress.max_key is not None
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


@dataclass(frozen=True)
class ChunkRead:
    after: list[pa.Array]  # typed value structs, in key order
    rows: int
    last_key: tuple[str, ...] | None
    low_lsn: int
    high_lsn: int
    snapshot: XidSnapshot
    read_ts_ms: int


def read_chunk(conn: Any, plan: ChunkPlan, chunk_id: str, *, limit: int, watermarks: Watermarks) -> ChunkRead:
    """One chunk between its watermarks, in a REPEATABLE READ, READ ONLY transaction whose
    snapshot is recorded (the next window drops rows changed by transactions it did not see)."""
    low = watermarks.open(conn, chunk_id)
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        text, ts_ms = conn.execute(
            "SELECT pg_current_snapshot()::text, (extract(epoch FROM statement_timestamp()) * 1000)::bigint"
        ).fetchone()
        snapshot = XidSnapshot.parse(text)
        names = [c.name for c in plan.encoder.columns]
        positions = [names.index(c) for c in plan.order_columns]
        after: list[pa.Array] = []
        last_key = None
        rows = 0
        with conn.cursor() as cur:
            for columns in copy_text_columns(cur, chunk_statement(plan, limit), len(names)):
                after.append(plan.encoder.layout.value_struct(plan.encoder.typed(columns), None))
                last_key = tuple(columns[i][-1].as_py() for i in positions)
                rows += len(columns[0])
        conn.execute("COMMIT")
    except BaseException:
        if not conn.closed:
            conn.execute("ROLLBACK")
        raise
    high = watermarks.close(conn, chunk_id)
    return ChunkRead(after, rows, last_key, low, high, snapshot, int(ts_ms))


def read_max_key(conn: Any, plan: ChunkPlan) -> tuple[str, ...] | None:
    conn.execute("BEGIN READ ONLY")
    try:
        _check_condition(conn, plan)
        row = conn.execute(max_key_statement(plan)).fetchone()
        conn.execute("COMMIT")
    except BaseException:
        if not conn.closed:
            conn.execute("ROLLBACK")
        raise
    return None if row is None else tuple(row)


def _check_condition(conn: Any, plan: ChunkPlan) -> None:
    """An additional-conditions fragment must be one expression, not more statements: the
    extended protocol (forced by a parameter) refuses several commands in one query, and the
    chunk reads embed the same text in the same place."""
    if not plan.progress.condition:
        return
    from psycopg import sql

    # A parameter forces the extended protocol; the fragment's own % signs are escaped for it.
    statement = sql.SQL("SELECT 1 FROM {} WHERE ({}) LIMIT %s").format(
        pg_identifier(plan.table.ref), sql.SQL(plan.progress.condition.replace("%", "%%"))
    )
    conn.execute(statement, (0,))


def read_chunks(
    conn: Any,
    state: IncrementalState,
    tables: dict[TableRef, TableInfo],
    *,
    settings: EventSettings,
    window_id: str,
    chunk_size: int,
    max_chunks: int,
    watermarks: Watermarks,
    stage: Callable[[TableRef, pa.RecordBatch], str],
    unseen: Callable[[TableRef, XidSnapshot], bool] = lambda ref, snapshot: False,
) -> tuple[IncrementalState, list[str]]:
    """Read up to ``max_chunks`` chunks of the active tables, in order, staging each with
    ``stage(table, batch) -> dataset path``. A table that cannot be read (a bad condition, a
    missing column, no key, dropped) is marked failed and the others continue.

    ``unseen(table, snapshot)``: does this window hold a change of ``table`` by a transaction the
    chunk's snapshot did not see? Such a change precedes the chunk's watermarks, so it could not
    be matched later: the chunk is not kept, and the table retries it in the next run."""
    import psycopg

    notes: list[str] = []
    staged = list(state.staged)
    budget = max_chunks
    for progress in state.active:
        if budget <= 0:
            break
        table = tables.get(progress.table)
        try:
            if table is None:
                raise CdcConfigurationError(f"{progress.table} is not captured any more")
            plan = ChunkPlan(table, TableEncoder(table, table.columns, settings), progress)
            plan.check()
            if progress.max_key is None:
                max_key = read_max_key(conn, plan)
                if max_key is None:
                    progress = replace(progress, status="done")
                    notes.append(f"incremental snapshot of {table.ref}: no rows to read")
                    state = state.with_table(progress)
                    continue
                progress = replace(progress, status="running", max_key=max_key)
                plan = replace(plan, progress=progress)
            while budget > 0 and progress.active:
                # Unique across retries of the window and captures sharing a signal table.
                chunk_id = f"{window_id}-{len(staged) + 1:04d}-{secrets.token_hex(4)}"
                read = read_chunk(conn, plan, chunk_id, limit=chunk_size, watermarks=watermarks)
                budget -= 1
                if unseen(table.ref, read.snapshot):
                    notes.append(
                        f"chunk {chunk_id} of {table.ref} not kept: a committed change was not yet visible "
                        "to its read (a commit waiting for a synchronous standby?); it is read again in the next run"
                    )
                    budget = 0
                    break
                # Done when the chunk came back short, or ended at the max key (no empty last read).
                done = read.rows < chunk_size or read.last_key == progress.max_key
                if read.rows:
                    batch = _staged_batch(chunk_id, read.after)
                    path = stage(table.ref, batch)
                    faults.point("incremental.chunk_staged")
                    staged.append(
                        StagedChunk(
                            chunk_id=chunk_id,
                            table=table.ref,
                            signal_id=progress.signal_id,
                            path=path,
                            rows=read.rows,
                            low_lsn=read.low_lsn,
                            high_lsn=read.high_lsn,
                            snapshot=read.snapshot.to_text(),
                            match_columns=plan.match_columns,
                            key_columns=plan.encoder.key_columns,
                            read_ts_ms=read.read_ts_ms,
                        )
                    )
                progress = replace(
                    progress,
                    status="done" if done else "running",
                    last_key=read.last_key or progress.last_key,
                    chunks=progress.chunks + (1 if read.rows else 0),
                    rows=progress.rows + read.rows,
                )
                plan = replace(plan, progress=progress)
            state = state.with_table(progress)
            if not progress.active:
                notes.append(f"incremental snapshot of {table.ref}: all {progress.rows} rows read")
        except (CdcConfigurationError, psycopg.errors.DatabaseError) as exc:
            if isinstance(exc, psycopg.OperationalError) and not isinstance(exc, psycopg.errors.QueryCanceled):
                raise  # the session died: the run fails and retries, nothing is lost
            message = " ".join(str(exc).split())
            log.warning("incremental snapshot of %s failed: %s", progress.table, message)
            notes.append(f"incremental snapshot of {progress.table} failed: {message}")
            state = state.with_table(replace(progress, status="failed", error=message))
    return replace(state, staged=tuple(staged)), notes


def _staged_batch(chunk_id: str, after: list[pa.Array]) -> pa.RecordBatch:
    values = pa.concat_arrays(after) if len(after) > 1 else after[0]
    return pa.RecordBatch.from_arrays(
        [pa.repeat(pa.scalar(chunk_id), len(values)), values], names=[CHUNK_ID_FIELD, "after"]
    )


# -- emitting ----------------------------------------------------------------------------------


class ChunkKeyWatch:
    """Watches a window's events for changes that supersede rows of staged chunks.

    A chunk row is superseded when its key is changed by a transaction that commits before the
    chunk's high watermark and either commits after its low watermark (DBLog's rule) or was not
    visible to the chunk's SELECT (a commit still in flight when the chunk was read). A TRUNCATE
    under the same condition supersedes every row of the chunk."""

    def __init__(self, chunks: Sequence[StagedChunk], topic_prefix: str):
        self._by_topic: dict[str, list[StagedChunk]] = {}
        for chunk in chunks:
            topic = Topic.for_table(topic_prefix, chunk.table.schema, chunk.table.name).name
            self._by_topic.setdefault(topic, []).append(chunk)
        self._keys: dict[str, list[pa.Table]] = {c.chunk_id: [] for c in chunks}
        self.truncated: set[str] = set()

    def observe(self, batches: dict[str, list[pa.RecordBatch]]) -> None:
        for topic, chunks in self._by_topic.items():
            for batch in batches.get(topic, ()):
                self._observe(batch, chunks)

    def _observe(self, batch: pa.RecordBatch, chunks: list[StagedChunk]) -> None:
        source = batch.column("source")
        commit = pc.struct_field(source, "commit_lsn").to_numpy(zero_copy_only=False)
        xids = pc.struct_field(source, "txId").fill_null(0).to_numpy(zero_copy_only=False)
        for chunk in chunks:
            inside = (commit < chunk.high_lsn) & (
                (commit >= chunk.low_lsn) | ~XidSnapshot.parse(str(chunk.snapshot)).sees(xids)
            )
            if not inside.any():
                continue
            mask = pa.array(inside)
            ops = pc.filter(batch.column("op"), mask)
            if pc.any(pc.equal(ops, Op.TRUNCATE)).as_py():
                self.truncated.add(chunk.chunk_id)
            before, after = (pc.filter(batch.column(n), mask) for n in ("before", "after"))
            self._keys[chunk.chunk_id].append(
                pa.table({f"k{i}": _field(after, before, c) for i, c in enumerate(chunk.match_columns)})
            )

    def superseded(self, chunk: StagedChunk) -> pa.Table | None:
        """Distinct keys of ``chunk``'s table changed inside its watermark window."""
        tables = [t for t in self._keys.get(chunk.chunk_id, ()) if t.num_rows]
        if not tables:
            return None
        keys = pa.concat_tables(tables, promote_options="permissive")
        keys = keys.filter(pc.invert(pc.is_null(keys.column(0))))  # truncates carry no key
        return keys.group_by(keys.column_names).aggregate([])


def _field(after: pa.Array, before: pa.Array, name: str) -> pa.Array:
    def get(struct: pa.Array) -> pa.Array | None:
        try:
            return pc.struct_field(struct, name)
        except (KeyError, pa.ArrowInvalid):
            return None

    new, old = get(after), get(before)
    if new is None or old is None:
        return new if new is not None else old if old is not None else pa.nulls(len(after))
    return pc.coalesce(new, old.cast(new.type)) if old.type != new.type else pc.coalesce(new, old)


def surviving_rows(chunk: StagedChunk, after: pa.Array, watch: ChunkKeyWatch) -> pa.Array:
    """The chunk's rows whose keys no stream change superseded."""
    if chunk.chunk_id in watch.truncated:
        return after.slice(0, 0)
    keys = watch.superseded(chunk)
    if keys is None or not len(after):
        return after
    rows = pa.table({f"k{i}": pc.struct_field(after, c) for i, c in enumerate(chunk.match_columns)})
    rows = rows.append_column("__row", pa.array(np.arange(len(after))))
    keys = pa.table(
        [keys.column(i).cast(rows.column(i).type) for i in range(keys.num_columns)], names=keys.column_names
    )
    try:
        kept = rows.join(keys, keys=keys.column_names, join_type="left anti").column("__row").combine_chunks()
        return after.take(pc.take(kept, pc.sort_indices(kept)))  # the join does not keep row order
    except pa.ArrowNotImplementedError:  # key types Arrow's hash join does not support
        changed = set(zip(*(keys.column(i).to_pylist() for i in range(keys.num_columns))))
        values = zip(*(rows.column(i).to_pylist() for i in range(keys.num_columns)))
        return after.filter(pa.array([v not in changed for v in values]))


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


def staged_rows(read_dataset: Callable[[str, str], pa.Table], chunk: StagedChunk) -> pa.Array:
    """The staged rows of one chunk, in key order."""
    table = read_dataset(chunk.path, chunk.chunk_id)
    rows = table.filter(pc.equal(table.column(CHUNK_ID_FIELD), chunk.chunk_id)).column("after")
    return rows.combine_chunks() if isinstance(rows, pa.ChunkedArray) else rows


def iter_chunk_events(
    chunks: Sequence[StagedChunk],
    watch: ChunkKeyWatch,
    context: EventContext,
    read_dataset: Callable[[str, str], pa.Table],
) -> Iterator[tuple[StagedChunk, pa.RecordBatch, int]]:
    """For each staged chunk: its events and how many rows the stream superseded."""
    for chunk in chunks:
        after = staged_rows(read_dataset, chunk)
        kept = surviving_rows(chunk, after, watch)
        yield chunk, emit_chunk(chunk, kept, context), len(after) - len(kept)
