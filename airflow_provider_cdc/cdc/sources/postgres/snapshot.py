"""Initial snapshot: every table read in parallel partitions, all pinned to one exported snapshot.

A temporary logical slot is created with ``EXPORT_SNAPSHOT``: its snapshot sees exactly the
transactions that committed before the slot's consistent point, and the capture's own slot
streams exactly those that commit at or after it (the next window starts there). No gap, no
overlap, no table locks. The exporting replication connection stays open, idle, until every
partition has been read.

Each partition reads a range of heap blocks (``ctid`` ranges, a TID range scan) with
``COPY (SELECT ...) TO STDOUT (FORMAT binary)`` in a ``REPEATABLE READ`` transaction that
imported the snapshot: fixed-width columns in their binary send form, every other column as its
text output (:mod:`.copy_plan`). The rows are framed in chunks with numpy (:mod:`.copy_binary`)
and converted by the same codecs as the stream (:mod:`.binary_values` for the send forms).
Partitions run as Spark tasks, in whole waves of the session's parallelism
(:func:`partition_count`).

:func:`copy_text_columns` reads a CSV ``COPY`` into text columns, for the readers that select
with SQL of their own (incremental chunks, query-based extraction).

Every read runs as the capture role with ``row_security = off`` (:mod:`.connection`): a table
whose row level security policies apply to that role is refused with an error naming the fix
(:func:`refusing_row_security`), never read through the policies (their expressions would run as
the capture role, and the rows they hide would be missing from the capture without a trace).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo, connect, row_security_refusal
from airflow_provider_cdc.cdc.sources.postgres.copy_binary import read_copy_chunks
from airflow_provider_cdc.cdc.sources.postgres.copy_plan import CopyPlan, PartitionRange
from airflow_provider_cdc.cdc.sources.postgres.events import EventContext, EventSettings, SnapshotBatches, TableEncoder
from airflow_provider_cdc.cdc.sources.postgres.tables import TableInfo

CSV_BLOCK_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class SnapshotPoint:
    """Where a snapshot stands: the stream continues at ``lsn``."""

    snapshot_name: str
    lsn: int
    xmin: int | None
    ts_ms: int


@dataclass(frozen=True)
class BlockRange:
    """Heap blocks ``[first, end)`` of one table; ``end`` None means "to the end"."""

    first: int
    end: int | None

    def conditions(self) -> list[Any]:
        from psycopg import sql

        where = []
        if self.first > 0:
            where.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({self.first},0)")))
        if self.end is not None:
            where.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({self.end},0)")))
        return where


def import_snapshot(conn: Any, snapshot_name: str) -> None:
    """Start a REPEATABLE READ, READ ONLY transaction on ``conn`` that sees ``snapshot_name``."""
    from psycopg import sql

    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))


def snapshot_facts(conn: Any) -> tuple[int | None, int]:
    """(xmin of the imported snapshot, server time in ms) inside an importing transaction."""
    row = conn.execute(
        "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, "
        "(extract(epoch FROM statement_timestamp()) * 1000)::bigint"
    ).fetchone()
    return row[0], row[1]


#: Below this many bytes per task, splitting a table further for parallelism costs more than it saves.
MIN_SPLIT_BYTES = 16 * 1024 * 1024


def partition_count(size: int, *, partition_bytes: int, max_partitions: int, parallelism: int = 1) -> int:
    """How many block ranges to read a heap of ``size`` bytes in.

    About ``partition_bytes`` each, but a whole number of waves of ``parallelism`` tasks: three
    partitions on two cores would leave one core idle for the last third of the table."""
    count = max(1, math.ceil(size / partition_bytes))
    parallelism = max(1, min(parallelism, size // MIN_SPLIT_BYTES))
    count = math.ceil(count / parallelism) * parallelism
    return max(1, min(max_partitions, count))


def plan_block_ranges(
    conn: Any, table: TableInfo, *, partition_bytes: int, max_partitions: int, parallelism: int = 1
) -> list[BlockRange]:
    """Split a table's heap into block ranges of about ``partition_bytes`` each (see
    :func:`partition_count`)."""
    size, block_size, kind = conn.execute(
        "SELECT pg_relation_size(%s::oid), current_setting('block_size')::int, relkind::text "
        "FROM pg_class WHERE oid = %s::oid",
        (table.oid, table.oid),
    ).fetchone()
    blocks = size // block_size
    if kind != "r" or blocks == 0:
        # Partitioned parents have no heap of their own; empty tables have nothing to split.
        return [BlockRange(0, None)]
    count = partition_count(
        size, partition_bytes=partition_bytes, max_partitions=max_partitions, parallelism=parallelism
    )
    step = math.ceil(blocks / count)
    ranges = [BlockRange(i * step, (i + 1) * step) for i in range(count)]
    # The last range is open: rows visible to the snapshot live in blocks that existed when it
    # was taken, but an open end costs nothing and guards against a stale size.
    ranges[-1] = BlockRange(ranges[-1].first, None)
    return [r for r in ranges if r.end is None or r.first < blocks]


def read_partition(
    info: PgConnectionInfo,
    point: SnapshotPoint,
    table: TableInfo,
    block_range: PartitionRange,
    context: EventContext,
    settings: EventSettings,
    *,
    enter_snapshot: Callable[[Any, SnapshotPoint], None] | None = None,
) -> Iterator[pa.RecordBatch]:
    """``op = r`` event batches for one partition, read inside the snapshot: the exported one
    (:func:`import_snapshot`), or whatever ``enter_snapshot(conn, point)`` begins (YugabyteDB
    reads at a hybrid time instead)."""
    encoder = TableEncoder(table, table.columns, settings)
    with connect(info) as conn:
        if enter_snapshot is None:
            import_snapshot(conn, point.snapshot_name)
        else:
            enter_snapshot(conn, point)
        plan = CopyPlan.of(conn, encoder)
        events = SnapshotBatches(
            encoder, context=context, snapshot_lsn=point.lsn, snapshot_xmin=point.xmin, snapshot_ts_ms=point.ts_ms
        )
        with refusing_row_security(conn):
            for chunk in read_copy_chunks(conn, plan.statement(encoder, block_range), len(encoder.columns)):
                yield events.batch(plan.values(chunk, encoder))
    # Leaving the connection block closes the session, ending its read-only transaction.


@contextmanager
def refusing_row_security(conn: Any) -> Iterator[None]:
    """Turn the server's refusal to read a table whose row level security applies to the capture
    role (``row_security = off``) into a configuration error that names the fix."""
    import psycopg

    try:
        yield
    except psycopg.errors.InsufficientPrivilege as exc:
        error = row_security_refusal(exc, conn.info.user)
        if error is None:
            raise
        raise error from None


def copy_text_columns(cursor: Any, statement: Any, width: int) -> Iterator[list[pa.Array]]:
    """Run ``COPY (SELECT ...) TO STDOUT (FORMAT csv)`` and yield the rows as text columns
    (one string array per selected column, nulls as nulls), in Arrow batches of ~4 MiB."""
    names = [f"c{i}" for i in range(width)]
    with refusing_row_security(cursor.connection), cursor.copy(statement) as copy:
        stream = io.BufferedReader(_CopyReader(copy), buffer_size=CSV_BLOCK_BYTES)
        if not stream.peek(1):  # no rows (Arrow refuses empty CSV input)
            return
        reader = pacsv.open_csv(
            stream,
            read_options=pacsv.ReadOptions(column_names=names, block_size=CSV_BLOCK_BYTES, use_threads=False),
            parse_options=pacsv.ParseOptions(newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(
                column_types={n: pa.string() for n in names},
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
                null_values=[""],
            ),
        )
        for batch in reader:
            if batch.num_rows:
                yield batch.columns


class _CopyReader(io.RawIOBase):
    """A readable binary stream over psycopg's ``COPY TO`` chunks, for Arrow's CSV reader."""

    def __init__(self, copy: Any):
        self._chunks = iter(copy)
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            try:
                self._pending = memoryview(next(self._chunks))
            except StopIteration:
                return 0
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n
