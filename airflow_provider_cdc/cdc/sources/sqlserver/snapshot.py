"""The snapshot of SQL Server tables: key-range partitions read in parallel Spark tasks.

SQL Server cannot share one transaction's snapshot between sessions (PostgreSQL exports one),
so the snapshot is positioned by LSN instead: the job reads ``sys.fn_cdc_get_max_lsn()`` before
any partition starts, the stream continues after it, and each partition is one query (under
``SNAPSHOT`` isolation by default: a consistent view of that partition). A row changed after the
snapshot's LSN can appear in the snapshot with its newer values *and* as a change event after it;
applying events in order (the current-state fold) gives the source's state either way. That is
Debezium's behaviour around the snapshot boundary too (``snapshot.isolation.mode``, see
docs/sqlserver.md for what each mode guarantees).

Partitions: a table with a single integer key is split into ranges of the key by value (about
``rows / partitions`` rows each when keys are dense); any other table is read as one partition.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from airflow_provider_cdc.cdc.basics.tables import SQLSERVER_NAMES
from airflow_provider_cdc.cdc.events.settings import EventContext, EventSettings
from airflow_provider_cdc.cdc.sources.sqlserver import admin
from airflow_provider_cdc.cdc.sources.sqlserver.connection import SqlServerConnectionInfo, connect, quote
from airflow_provider_cdc.cdc.sources.sqlserver.events import TableEncoder, read_events, source_block
from airflow_provider_cdc.cdc.sources.sqlserver.tables import TableInfo

FETCH_ROWS = 10_000
_INTEGER_KEYS = ("tinyint", "smallint", "int", "bigint")
#: About this many rows per partition when a table is split (fewer partitions for small tables).
ROWS_PER_PARTITION = 250_000


@dataclass(frozen=True)
class KeyRange:
    """One partition of a table: key values in ``[low, high)`` (None: unbounded), or the whole table."""

    index: int
    key: str | None
    low: int | None = None
    high: int | None = None

    def where(self) -> tuple[str, list[Any]]:
        if self.key is None:
            return "", []
        clauses, params = [], []
        if self.low is not None:
            clauses.append(f"{quote(self.key)} >= ?")
            params.append(self.low)
        if self.high is not None:
            clauses.append(f"{quote(self.key)} < ?")
            params.append(self.high)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


@dataclass(frozen=True)
class SnapshotPoint:
    """Where the snapshot stands: the stream continues after ``lsn``; ``ts_ms`` is when it was taken."""

    lsn: int
    ts_ms: int
    isolation: str  # "snapshot" or "read_committed"


def plan_key_ranges(conn: Any, table: TableInfo, *, max_partitions: int, parallelism: int) -> list[KeyRange]:
    """Split a table with a single integer key into value ranges; others are one partition."""
    if len(table.key_columns) != 1 or table.column(table.key_columns[0]).type.name not in _INTEGER_KEYS:
        return [KeyRange(0, None)]
    key = table.key_columns[0]
    low, high, count = admin.rows(
        conn, f"SELECT MIN({quote(key)}), MAX({quote(key)}), COUNT_BIG(*) FROM {table.ref.quoted(SQLSERVER_NAMES)}"
    )[0]
    if low is None or count is None:
        return [KeyRange(0, None)]
    wanted = max(1, min(max_partitions, -(-int(count) // ROWS_PER_PARTITION)))
    if wanted > 1:  # whole waves of the session's parallelism
        wanted = min(max_partitions, -(-wanted // max(parallelism, 1)) * max(parallelism, 1))
    span = int(high) - int(low) + 1
    parts = max(1, min(wanted, span))
    step = -(-span // parts)
    bounds = [int(low) + i * step for i in range(1, parts)]
    edges = [None, *bounds, None]
    return [KeyRange(i, key, edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


def read_partition(
    info: SqlServerConnectionInfo,
    point: SnapshotPoint,
    table: TableInfo,
    part: KeyRange,
    context: EventContext,
    settings: EventSettings,
) -> Iterator[pa.RecordBatch]:
    """The ``op = r`` events of one partition (runs in a Spark Python worker)."""
    encoder = TableEncoder(table, table.columns, settings)
    where, params = part.where()
    order = f" ORDER BY {quote(part.key)}" if part.key is not None else ""
    statement = f"SELECT {encoder.select_list()} FROM {table.ref.quoted(SQLSERVER_NAMES)}{where}{order}"
    source = source_block(
        context,
        table.ref.schema,
        table.ref.name,
        snapshot="true",
        ts_ms=point.ts_ms,
        change_lsn=None,
        commit_lsn=str(_lsn(point.lsn)),
        event_serial_no=None,
    )
    conn = connect(info.with_password_from_env(), autocommit=point.isolation != "snapshot")
    try:
        cursor = conn.cursor()
        if point.isolation == "snapshot":
            cursor.execute("SET TRANSACTION ISOLATION LEVEL SNAPSHOT")
        cursor.execute(statement, *params)
        width = len(encoder.columns)
        while True:
            page = cursor.fetchmany(FETCH_ROWS)
            if not page:
                break
            yield read_events(encoder, [[row[k] for row in page] for k in range(width)], source, context)
        cursor.close()
        if point.isolation == "snapshot":
            conn.commit()
    finally:
        conn.close()


def _lsn(value: int):
    from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn

    return SqlServerLsn(value)
