"""Query-based extraction on PostgreSQL: the band's ``COPY`` in one ``REPEATABLE READ`` snapshot,
the cursor types, and the events' source block. The extraction itself is the core's
(:mod:`cdc.query_extract`, re-exported here)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.events.envelope import Op
from airflow_provider_cdc.cdc.reading.query_extract import (
    OFFSET_FORMAT,
    QUERY_CONNECTOR,
    QueryExtraction,
    QueryOffset,
    seen_topic,
)
from airflow_provider_cdc.cdc.reading.query_extract import run_query_window as _run_query_window
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry
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
from airflow_provider_cdc.cdc.sources.postgres.tables import TableInfo, pg_identifier

__all__ = [
    "OFFSET_FORMAT",
    "QUERY_CONNECTOR",
    "PgQuerySource",
    "QueryExtraction",
    "QueryOffset",
    "run_query_window",
    "seen_topic",
]

_TEMPORAL = ("timestamp with time zone", "timestamp without time zone", "date")
_NUMERIC = ("smallint", "integer", "bigint", "numeric")


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


class PgQuerySource:
    """The core's :class:`~cdc.query_extract.QuerySource` on PostgreSQL."""

    def __init__(self, info: PgConnectionInfo, settings: EventSettings):
        self.info = info
        self.settings = settings

    @contextmanager
    def read(self, extraction: QueryExtraction, watermark: str | None, window: Window) -> Iterator[_PgRead]:
        with connect(self.info) as conn:
            plan = _plan(conn, extraction, self.settings)
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            high, xmin, ts_ms = conn.execute(_high_statement(plan, extraction, watermark)).fetchone()
            yield _PgRead(conn, plan, extraction, watermark, window, self.info, high, xmin, ts_ms)
            conn.execute("COMMIT")


@dataclass
class _PgRead:
    conn: Any
    plan: _Plan
    extraction: QueryExtraction
    watermark: str | None
    window: Window
    info: PgConnectionInfo
    high: str | None
    xmin: int | None
    ts_ms: int

    def batches(self) -> Iterator[tuple[list[pa.Array], pa.Array, pa.Array, pa.Array]]:
        if self.high is None:
            return
        width = len(self.plan.encoder.columns)
        statement = _statement(self.plan, self.extraction, self.watermark, self.high)
        with self.conn.cursor() as cur:
            for columns in copy_text_columns(cur, statement, width + 3):
                overlap, band, created = columns[width:]
                yield columns[:width], overlap, band, created

    def events(self, values: list[pa.Array], created: pa.Array) -> pa.RecordBatch:
        return _events(self.plan, values, created, self.xmin, self.ts_ms, self.window, self.extraction, self.info)


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
    """The core's extraction of one window from PostgreSQL."""
    source = PgQuerySource(info, settings or EventSettings())
    return _run_query_window(extraction, source, sink_path, window, offset, spark_provider=spark_provider, run=run)


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
