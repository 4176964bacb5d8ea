"""YugabyteDB's snapshot: every table read in hash ranges, all at the slot's consistent hybrid time.

YugabyteDB has no exported snapshots and no heap blocks; instead any session can read the
database as of a hybrid time (``SET LOCAL yb_read_time TO '<ht> ht'``), so partitions are
independent: each opens its own read-only transaction at the slot's consistent point (the
slot's ``yb_restart_commit_ht`` right after it was created with ``USE_SNAPSHOT``, which keeps the
history). The stream continues with the commits after that point.

A hash-sharded table is split by ``yb_hash_code(<its hash columns>)`` into ranges of
``[0, 65536)``. YSQL pushes the function down to the tablets only when its arguments are exactly
the hash columns (docs, ``func_yb_hash_code``), which are the first
``yb_table_properties(oid).num_hash_key_columns`` primary-key columns: ``PRIMARY KEY (a, b)`` is
``(a HASH, b ASC)``. A range-sharded table (no hash column), or one without a primary key (sharded
on the hidden ``ybrowid``), is read in one partition: any hash filter would make every partition
scan the whole table. Rows are read with the PostgreSQL source's binary ``COPY``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo
from airflow_provider_cdc.cdc.sources.postgres.events import EventContext, EventSettings
from airflow_provider_cdc.cdc.sources.postgres.snapshot import SnapshotPoint, read_partition
from airflow_provider_cdc.cdc.sources.postgres.tables import TableInfo
from airflow_provider_cdc.cdc.sources.yugabyte.admin import enter_read_time, wait_for_read_time

HASH_SPACE = 65536
#: Below this many (estimated) rows a table is read in one partition.
MIN_SPLIT_ROWS = 100_000
ROWS_PER_PARTITION = 1_000_000


@dataclass(frozen=True)
class HashRange:
    """Rows whose ``yb_hash_code(key)`` is in ``[first, end)``; no key: the whole table."""

    key: tuple[str, ...]
    first: int
    end: int

    def conditions(self) -> list[Any]:
        from psycopg import sql

        if not self.key or (self.first == 0 and self.end >= HASH_SPACE):
            return []
        code = sql.SQL("yb_hash_code({})").format(sql.SQL(", ").join(sql.Identifier(c) for c in self.key))
        return [
            sql.SQL("{} >= {}").format(code, sql.Literal(self.first)),
            sql.SQL("{} < {}").format(code, sql.Literal(self.end)),
        ]

    @property
    def file_name(self) -> str:
        return f"part-{self.first:05d}.parquet"


def partition_count(estimated_rows: float, *, max_partitions: int, parallelism: int) -> int:
    """One partition for a small table; else whole waves of ``parallelism`` tasks of about
    ``ROWS_PER_PARTITION`` rows each (an unanalysed table, ``reltuples < 0``, gets one wave)."""
    if 0 <= estimated_rows < MIN_SPLIT_ROWS:
        return 1
    parallelism = max(1, parallelism)
    waves = 1 if estimated_rows < 0 else math.ceil(estimated_rows / (ROWS_PER_PARTITION * parallelism))
    return max(1, min(max_partitions, waves * parallelism))


def hash_ranges(key: tuple[str, ...], count: int) -> list[HashRange]:
    """``count`` contiguous ranges covering ``[0, 65536)`` exactly."""
    if not key or count <= 1:
        return [HashRange(key, 0, HASH_SPACE)]
    bounds = [round(i * HASH_SPACE / count) for i in range(count + 1)]
    return [HashRange(key, a, b) for a, b in itertools.pairwise(bounds) if b > a]


def hash_columns(conn: Any, table: TableInfo) -> tuple[str, ...]:
    """The primary-key columns that decide a row's tablet (none: range-sharded, or no primary key)."""
    if not table.has_primary_key:
        return ()
    (count,) = conn.execute("SELECT num_hash_key_columns FROM yb_table_properties(%s::oid)", (table.oid,)).fetchone()
    return tuple(table.key_columns[: int(count or 0)])


def plan_hash_ranges(conn: Any, table: TableInfo, *, max_partitions: int, parallelism: int) -> list[HashRange]:
    key = hash_columns(conn, table)
    if not key:
        return hash_ranges(key, 1)
    (estimate,) = conn.execute("SELECT reltuples FROM pg_class WHERE oid = %s::oid", (table.oid,)).fetchone()
    count = partition_count(float(estimate), max_partitions=max_partitions, parallelism=parallelism)
    return hash_ranges(key, count)


def _enter_read_time(procedure: str | None, conn: Any, point: SnapshotPoint) -> None:
    # Each partition's session may be on a node whose clock is behind the one the driver waited on.
    wait_for_read_time(conn, int(point.snapshot_name))
    enter_read_time(conn, int(point.snapshot_name), procedure)


def read_hash_range(
    info: PgConnectionInfo,
    point: SnapshotPoint,
    procedure: str | None,
    table: TableInfo,
    context: EventContext,
    settings: EventSettings,
    hash_range: HashRange,
) -> Iterator[pa.RecordBatch]:
    """``op = r`` event batches of one hash range, read at the snapshot's hybrid time (in Spark's
    Python workers)."""
    import functools

    return read_partition(
        info,
        point,
        table,
        hash_range,
        context,
        settings,
        enter_snapshot=functools.partial(_enter_read_time, procedure),
    )


def hash_range_file(hash_range: HashRange) -> str:
    return hash_range.file_name
