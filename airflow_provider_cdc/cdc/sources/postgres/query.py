"""Query-based watermark extraction: for tables or views without log-based capture.

Each run reads, in one ``REPEATABLE READ`` snapshot, the rows whose cursor column (a timestamp,
or a monotonically increasing number) lies in ``(watermark - lookback, max(cursor)]``, and moves
the watermark to that maximum. The lookback re-reads a band below the watermark so rows of
transactions that committed late (their cursor value was taken before commit, so it can be below
a watermark already passed) are still picked up. Rows of the band that an earlier run already
emitted unchanged are dropped: each run stores the exact text of the rows it emitted inside the
next run's band ("seen" rows), committed with the window.

Deletes are invisible to this mode, and a row changed twice between runs is seen once, in its
last state. Rows are events in the same envelope as the log-based capture: ``op = "r"`` (or, with
a ``created_column``, ``"c"`` for rows created after the previous watermark and ``"u"`` for the
others), ``source.snapshot = "query"``, no LSN and no transaction.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc import __version__
from airflow_provider_cdc.cdc.envelope import Op
from airflow_provider_cdc.cdc.errors import CdcConfigurationError, InvalidOffsetError
from airflow_provider_cdc.cdc.naming import Topic, topic_directory
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry
from airflow_provider_cdc.cdc.sinks.parquet import ParquetSink
from airflow_provider_cdc.cdc.sources.postgres import admin
from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo, connect
from airflow_provider_cdc.cdc.sources.postgres.events import (
    EventContext,
    EventSettings,
    TableEncoder,
    read_events,
    read_source,
)
from airflow_provider_cdc.cdc.sources.postgres.snapshot import copy_text_columns
from airflow_provider_cdc.cdc.sources.postgres.tables import TableInfo, TableRef, pg_identifier
from airflow_provider_cdc.cdc.window import Window

log = logging.getLogger(__name__)

QUERY_CONNECTOR = "postgresql-query"
OFFSET_FORMAT = 1
_TEMPORAL = ("timestamp with time zone", "timestamp without time zone", "date")
_NUMERIC = ("smallint", "integer", "bigint", "numeric")


@dataclass(frozen=True)
class QueryExtraction:
    """What to extract and how (validated without I/O)."""

    topic_prefix: str
    table: TableRef
    cursor_column: str
    key_columns: tuple[str, ...] = ()  # default: the table's primary key (required for views)
    lookback: float = 0.0  # seconds for a temporal cursor, units for a numeric one
    created_column: str | None = None

    def __post_init__(self) -> None:
        if not self.cursor_column:
            raise CdcConfigurationError("cursor_column is required")
        if isinstance(self.lookback, bool) or not isinstance(self.lookback, (int, float)) or self.lookback < 0:
            raise CdcConfigurationError(f"lookback must be a number of seconds (or units) ≥ 0, got {self.lookback!r}")


@dataclass(frozen=True)
class QueryOffset:
    """The stored progress of one extraction: the watermark (PostgreSQL text of the cursor's last
    maximum) and the last committed window. Kept under its own topic prefix."""

    topic_prefix: str
    table: TableRef
    cursor_column: str
    watermark: str | None = None
    window_seq: int = 0
    seen_path: str | None = None  # the rows of the next run's band emitted so far
    revision: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": OFFSET_FORMAT,
                "connector": QUERY_CONNECTOR,
                "topic_prefix": self.topic_prefix,
                "table": self.table.to_json(),
                "cursor_column": self.cursor_column,
                "watermark": self.watermark,
                "window_seq": self.window_seq,
                "seen_path": self.seen_path,
                "revision": self.revision,
                "provider_version": __version__,
                **({"extra": self.extra} if self.extra else {}),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str, *, source: str = "offset store") -> QueryOffset:
        try:
            data = json.loads(text)
            if data.get("connector") != QUERY_CONNECTOR:
                raise InvalidOffsetError(
                    f"{source}: the stored offset belongs to connector {data.get('connector')!r}, not a query "
                    "extraction; give the extraction its own topic_prefix"
                )
            if int(data.get("format", 0)) > OFFSET_FORMAT:
                raise InvalidOffsetError(f"{source}: offset format {data['format']} is newer than this provider")
            return cls(
                topic_prefix=data["topic_prefix"],
                table=TableRef(*data["table"]),
                cursor_column=data["cursor_column"],
                watermark=data.get("watermark"),
                window_seq=int(data.get("window_seq", 0)),
                seen_path=data.get("seen_path"),
                revision=int(data.get("revision", 0)),
                extra=dict(data.get("extra") or {}),
            )
        except InvalidOffsetError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidOffsetError(f"{source}: malformed query extraction offset ({exc})") from None

    def check(self, extraction: QueryExtraction, *, source: str) -> None:
        if (self.table, self.cursor_column) != (extraction.table, extraction.cursor_column):
            raise InvalidOffsetError(
                f"{source}: the stored watermark is for {self.table}.{self.cursor_column}, not "
                f"{extraction.table}.{extraction.cursor_column}; delete it to start this extraction over"
            )

    def after(self, entry: CommitEntry) -> QueryOffset:
        """The offset that records ``entry`` (a committed query window)."""
        stats = entry.stats.get("query") or {}
        return replace(
            self, watermark=stats.get("watermark"), window_seq=entry.window.seq, seen_path=stats.get("seen_path")
        )


def seen_topic(prefix: str, ref: TableRef) -> Topic:
    """Where a run keeps the rows it emitted inside the next run's lookback band (not a topic)."""
    return Topic(
        f"{prefix}:query-seen:{ref.data_collection}", topic_directory(prefix, "_query_seen", ref.schema, ref.name)
    )


@dataclass(frozen=True)
class _Plan:
    table: TableInfo
    encoder: TableEncoder
    cursor_type: str
    keys: tuple[str, ...]


def _plan(conn: Any, extraction: QueryExtraction, settings: EventSettings) -> _Plan:
    table = admin.describe_tables(conn, [extraction.table], kinds="rpvmf")[extraction.table]
    keys = extraction.key_columns or table.key_columns
    if not keys:
        raise CdcConfigurationError(
            f"{extraction.table} has no primary key: give key_columns (the columns that identify a row)"
        )
    table = replace(table, key_columns=tuple(keys))
    names = [c.name for c in table.columns]
    wanted = [extraction.cursor_column, *keys] + ([extraction.created_column] if extraction.created_column else [])
    missing = [c for c in wanted if c not in names]
    if missing:
        raise CdcConfigurationError(f"column(s) {', '.join(missing)} do not exist in {extraction.table}")
    cursor_type = table.column(extraction.cursor_column).type.name
    if _family(cursor_type) is None:
        raise CdcConfigurationError(
            f"cursor column {extraction.table}.{extraction.cursor_column} is {cursor_type}: use a timestamp, date or "
            "an increasing integer/numeric column"
        )
    if extraction.created_column:
        created_type = table.column(extraction.created_column).type.name
        if _family(created_type) != _family(cursor_type):
            raise CdcConfigurationError(
                f"created_column {extraction.table}.{extraction.created_column} is {created_type}, the cursor "
                f"{extraction.cursor_column} is {cursor_type}: the created column is compared with the cursor's "
                "watermark, so both must be timestamps/dates or both numbers"
            )
    encoder = TableEncoder(table, table.columns, settings)
    for column in wanted:
        if column not in [c.name for c in encoder.columns]:
            raise CdcConfigurationError(f"{extraction.table}.{column} is excluded by the column filters")
    return _Plan(table, encoder, cursor_type, tuple(keys))


def _family(type_name: str) -> str | None:
    """How a cursor of this type is compared and looked back: ``temporal``, ``numeric`` or not at all."""
    if type_name.startswith(_TEMPORAL):
        return "temporal"
    if type_name in _NUMERIC or type_name.startswith("numeric"):
        return "numeric"
    return None


def _statement(plan: _Plan, extraction: QueryExtraction, watermark: str | None, high: str):
    from psycopg import sql

    cursor = sql.Identifier(extraction.cursor_column)
    typed = sql.SQL(plan.cursor_type)
    temporal = _family(plan.cursor_type) == "temporal"
    lookback = (
        sql.SQL("make_interval(secs => {})").format(sql.Literal(float(extraction.lookback)))
        if temporal
        else sql.Literal(extraction.lookback)
    )

    def value(text: str):
        return sql.SQL("CAST({} AS {})").format(sql.Literal(text), typed)

    # Both ends inclusive: rows tied with the watermark (a date cursor, a coarse clock, or a later
    # commit with the same value) are read again and told apart by their text, never skipped.
    upper = sql.SQL("{} <= {}").format(cursor, value(high))
    lower = sql.SQL("{} >= {} - {}").format(cursor, value(watermark), lookback) if watermark is not None else None
    overlap = sql.SQL("{} <= {}").format(cursor, value(watermark)) if watermark is not None else sql.SQL("false")
    band = sql.SQL("{} >= {} - {}").format(cursor, value(high), lookback)
    created = (
        sql.SQL("{} > {}").format(sql.Identifier(extraction.created_column), value(watermark))
        if extraction.created_column and watermark is not None
        else sql.SQL("NULL::boolean")
    )
    columns = sql.SQL(", ").join(sql.Identifier(c.name) for c in plan.encoder.columns)
    where = upper if lower is None else sql.SQL("{} AND {}").format(lower, upper)
    return sql.SQL(
        "COPY (SELECT {columns}, ({overlap})::text, ({band})::text, ({created})::text FROM {table} WHERE {where} "
        "ORDER BY {cursor}) TO STDOUT (FORMAT csv)"
    ).format(
        columns=columns,
        overlap=overlap,
        band=band,
        created=created,
        table=pg_identifier(plan.table.ref),
        where=where,
        cursor=cursor,
    )


def _row_text(columns: list[pa.Array]) -> pa.Array:
    """Each row's exact text (all columns; nulls distinct from empty strings), for dedup."""
    marked = [pc.if_else(pc.is_null(c), "\x00N", pc.binary_join_element_wise("\x00V", c, "")) for c in columns]
    return pc.binary_join_element_wise(*marked, "\x1f")


def run_query_window(
    extraction: QueryExtraction,
    info: PgConnectionInfo,
    sink_path: str,
    window: Window,
    offset: QueryOffset | None,
    *,
    settings: EventSettings | None = None,
    spark_provider: Callable[[], Any] | None = None,
    run: dict[str, Any] | None = None,
) -> CommitEntry:
    """Extract one window and commit it; returns the commit entry (the caller stores the offset)."""
    settings = settings or EventSettings()
    started = time.monotonic()
    watermark = offset.watermark if offset else None
    sink = ParquetSink(sink_path, extraction.topic_prefix, spark_provider)
    ref = extraction.table
    topic = Topic.for_table(extraction.topic_prefix, ref.schema, ref.name)
    seen_out = seen_topic(extraction.topic_prefix, ref)
    writer = sink.open_window(window, [topic, seen_out])
    seen = _read_seen(sink, offset.seen_path) if offset and offset.seen_path else set()
    try:
        with connect(info) as conn:
            plan = _plan(conn, extraction, settings)
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            high, xmin, ts_ms = conn.execute(_high_statement(plan, extraction, watermark)).fetchone()
            rows = dropped = 0
            band_rows: list[pa.Array] = []
            seen_values = pa.array(sorted(seen), pa.string())
            if high is not None:
                width = len(plan.encoder.columns)
                statement = _statement(plan, extraction, watermark, high)
                with conn.cursor() as cur:
                    for columns in copy_text_columns(cur, statement, width + 3):
                        values, (overlap, band, created) = columns[:width], columns[width:]
                        text = _row_text(values)
                        repeated = pc.and_(pc.equal(overlap, "true"), pc.is_in(text, value_set=seen_values))
                        keep = pc.invert(pc.fill_null(repeated, False))
                        dropped += len(text) - pc.sum(keep.cast(pa.int64())).as_py()
                        # Every row of the next run's band, emitted now or before, is "seen" there.
                        band_rows.append(pc.filter(text, pc.equal(band, "true")))
                        values = [pc.filter(c, keep) for c in values]
                        if len(values[0]):
                            batch = _events(
                                plan, values, pc.filter(created, keep), xmin, ts_ms, window, extraction, info
                            )
                            writer.write_batches(topic, [batch])
                            rows += len(values[0])
            conn.execute("COMMIT")
    finally:
        writer.close()
    new_watermark = high if high is not None else watermark
    band_text = pa.concat_arrays(band_rows) if band_rows else pa.array([], pa.string())
    if high is None and seen:  # nothing new: the band is unchanged, so carry the seen rows over
        band_text = pa.array(sorted(seen), pa.string())
    seen_path = None
    if len(band_text):
        writer.write_batches(seen_out, [pa.RecordBatch.from_arrays([band_text], names=["row"])])
        seen_path = writer.dataset_path(seen_out)
    entry = writer.commit(
        window,
        stats={
            "query": {
                "table": ref.data_collection,
                "cursor_column": extraction.cursor_column,
                "previous_watermark": watermark,
                "watermark": new_watermark,
                "rows": rows,
                "duplicates_dropped": dropped,
                "seen_path": seen_path,
            },
            "seconds": round(time.monotonic() - started, 3),
            "job_pid": os.getpid(),
            **({"run": run} if run else {}),
        },
    )
    log.info(
        "query window %s of %s: %d rows (%d already emitted dropped), watermark %s → %s",
        window.window_id,
        ref,
        rows,
        dropped,
        watermark,
        new_watermark,
    )
    return entry


def _high_statement(plan: _Plan, extraction: QueryExtraction, watermark: str | None):
    """The run's upper bound: the cursor's maximum, but never behind the watermark (the row
    holding the maximum may have been deleted) and, for timestamptz cursors, never in the future
    (a mistyped or clock-skewed value would otherwise jump the watermark past every later row;
    such rows wait until their time comes)."""
    from psycopg import sql

    high = sql.SQL("max({})").format(sql.Identifier(extraction.cursor_column))
    if plan.cursor_type == "timestamp with time zone":
        high = sql.SQL("LEAST({}, statement_timestamp())").format(high)
    if watermark is not None:
        high = sql.SQL("GREATEST({}, CAST({} AS {}))").format(high, sql.Literal(watermark), sql.SQL(plan.cursor_type))
    return sql.SQL(
        "SELECT {}::text, pg_snapshot_xmin(pg_current_snapshot())::text::bigint, "
        "(extract(epoch FROM statement_timestamp()) * 1000)::bigint FROM {}"
    ).format(high, pg_identifier(plan.table.ref))


def _read_seen(sink: ParquetSink, path: str) -> set[str]:
    uri = sink.storage.uri(path)
    if sink.is_local:
        import pyarrow.dataset as ds

        table = ds.dataset(uri, format="parquet").to_table()
    else:
        assert sink.spark_provider is not None
        table = sink.spark_provider().read.parquet(uri).toArrow()
    return set(table.column("row").to_pylist())


def _events(
    plan: _Plan,
    values: list[pa.Array],
    created: pa.Array,
    xmin: int | None,
    ts_ms: int,
    window: Window,
    extraction: QueryExtraction,
    info: PgConnectionInfo,
) -> pa.RecordBatch:
    after = plan.encoder.layout.value_struct(plan.encoder.typed(values), None)
    ref = plan.table.ref
    context = EventContext(extraction.topic_prefix, info.dbname, window.window_id, window.planned_at_ms)
    source = read_source(context, ref.schema, ref.name, "query", ts_ms, None, xmin)
    op = None
    if extraction.created_column:
        # created after the previous watermark: c; before: u; no previous watermark (first run): r
        is_new, is_old = (pc.fill_null(pc.equal(created, flag), False) for flag in ("true", "false"))
        op = pc.if_else(is_new, Op.CREATE, pc.if_else(is_old, Op.UPDATE, Op.READ))
    return read_events(plan.encoder.layout, after, source, context, op)
