"""Running one PostgreSQL window: the engine's entry point (no Airflow here).

``run_job(spec)`` moves exactly the data of ``spec.window`` into the sink and publishes its
commit-log entry. It never stores offsets and never acknowledges the slot: the operator does
that afterwards, in that order (write → commit → offset → acknowledge).
"""

from __future__ import annotations

import functools
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from airflow_provider_cdc.cdc.basics import faults
from airflow_provider_cdc.cdc.basics.errors import CdcError, CdcStateError, OffsetMismatchError
from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.reading.incremental_run import drop_emitted_chunks
from airflow_provider_cdc.cdc.reading.snapshot_tasks import write_partitions
from airflow_provider_cdc.cdc.reading.window_job import SparkProvider, recorded_run, run_window
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry
from airflow_provider_cdc.cdc.sinks.parquet import ParquetSink
from airflow_provider_cdc.cdc.sources.postgres import admin, sql_session, sql_window
from airflow_provider_cdc.cdc.sources.postgres.chunks import PgChunkReader, Watermarks, emit_chunk
from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo, connect, decoding_settings
from airflow_provider_cdc.cdc.sources.postgres.events import EventContext, EventSettings, TableEncoder
from airflow_provider_cdc.cdc.sources.postgres.incremental import XidSnapshot
from airflow_provider_cdc.cdc.sources.postgres.incremental_run import incremental_run
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.replication import ReplicationConnection
from airflow_provider_cdc.cdc.sources.postgres.snapshot import (
    BlockRange,
    SnapshotPoint,
    import_snapshot,
    plan_block_ranges,
    read_partition,
    snapshot_facts,
)
from airflow_provider_cdc.cdc.sources.postgres.spec import PostgresJobSpec
from airflow_provider_cdc.cdc.sources.postgres.stream import MARKER_PREFIX, WindowCollector
from airflow_provider_cdc.cdc.sources.postgres.tables import TableInfo, quote_ident
from airflow_provider_cdc.cdc.sources.postgres.types import TypeCache
from airflow_provider_cdc.cdc.sources.postgres.window_batches import BatchWindowCollector

log = logging.getLogger(__name__)


def run_job(spec: PostgresJobSpec, spark_provider: SparkProvider | None = None) -> CommitEntry:
    """Run the window of ``spec`` and return its commit-log entry."""
    return run_window(spec, spark_provider, snapshot=_run_snapshot, stream=_run_stream)


def topics_of(spec: PostgresJobSpec, tables: Any) -> list[Topic]:
    """The datasets a window of ``spec`` writes: one per table, then the side tables."""
    topics = [Topic.for_table(spec.topic_prefix, ref.schema, ref.name) for ref in tables]
    prefix = spec.topic_prefix
    return [*topics, Topic.transactions(prefix), Topic.messages(prefix), Topic.gaps(prefix)]


@dataclass(frozen=True)
class StreamFlavour:
    """What a stream window's job does differently on a PostgreSQL-protocol source (YugabyteDB):
    how the source is checked before reading (and the window's end made visible), which collector
    reads the frames, and the ``START_REPLICATION`` options."""

    check_source: Callable[[Any, Any], dict]
    collector: type[WindowCollector] = WindowCollector
    start_options: tuple[tuple[str, str], ...] = (("messages", "true"),)
    incremental: bool = True  # the source runs incremental snapshots (needs pg_current_snapshot())
    start_error: Callable[[str, Exception], Exception] | None = None  # classify a failed START_REPLICATION
    # The source has the logical decoding SQL functions and the plain WindowCollector's rules, so a
    # window may be read through SQL into BatchWindowCollector (sql_window.py).
    sql_window: bool = False
    # The decoding sessions raise logical_decoding_work_mem to the capture's decoding_work_mem_bytes.
    decoding_memory: bool = False


def _run_stream(spec: PostgresJobSpec, spark_provider: SparkProvider) -> CommitEntry:
    return run_stream(
        spec, spark_provider, StreamFlavour(check_source=_check_stream_source, sql_window=True, decoding_memory=True)
    )


def use_system_allocator() -> None:
    """Allocate this process's Arrow buffers with malloc instead of Arrow's default pool (mimalloc).

    A window's batches are allocated on the fetch thread and freed on the main thread, and mimalloc
    keeps what one thread frees of another's: peak RSS of a 200 k-change window in chunks of 10 000
    measured 211 → 165 MiB streaming and 260 → 181 MiB through SQL, at equal CPU
    (docs/benchmarks.md). Buffers already allocated keep their own pool; the task process is the
    window's own."""
    if pa.default_memory_pool().backend_name != "system":
        pa.set_memory_pool(pa.system_memory_pool())


def run_stream(spec: PostgresJobSpec, spark_provider: SparkProvider, flavour: StreamFlavour) -> CommitEntry:
    """Read one stream window from the slot into the sink and publish its commit-log entry."""
    info = spec.connection
    window = spec.window
    use_system_allocator()
    if window.from_lsn is None or window.to_lsn is None:
        raise CdcStateError(f"stream window {window.describe()} has no start or end position: its job spec is broken")
    # This session also resolves the types of columns added while the window is read.
    with connect(info) as catalog:
        tables = flavour.check_source(catalog, spec)
        # Transactions still in flight now may commit inside this window unseen by a chunk read
        # at its end (see IncrementalRun.unseen).
        baseline = (
            XidSnapshot.parse(catalog.execute("SELECT pg_current_snapshot()::text").fetchone()[0])
            if flavour.incremental
            else XidSnapshot.parse("1:1:")
        )
        log.info(
            "reading %s from slot %r (%d positions)",
            window.describe(),
            spec.slot_name,
            window.to_lsn - window.from_lsn,
        )
        incremental = incremental_run(spec, tables, baseline)
        sink = ParquetSink.for_spec(spec, spark_provider)
        writer = sink.open_window(window, [*topics_of(spec, incremental.tables), *incremental.staged_topics])
        known = {(c.type.oid, c.type.modifier): c.type for t in tables.values() for c in t.columns}
        context = EventContext.of_window(spec.topic_prefix, spec.connection.dbname, spec.window)
        through_sql = not window.is_empty_range and sql_window.use_sql(
            spec.options.window_reader, supported=flavour.sql_window, span_bytes=window.to_lsn - window.from_lsn
        )
        # The SQL path's batches go to the columnar collector (the same events, without Python per change);
        # only PostgreSQL's flavour reads through SQL, and its collector is the plain WindowCollector.
        collector = (BatchWindowCollector if through_sql else flavour.collector)(
            window=window,
            tables=tables,
            context=context,
            topic_prefix=spec.topic_prefix,
            previous_commit_lsn=spec.previous_commit_lsn,
            max_changes_per_chunk=spec.options.max_changes_per_chunk,
            flush=incremental.wrap(writer.write_chunk),
            settings=spec.events,
            types=TypeCache(catalog, known),
            uncounted=incremental.uncounted,
        )
        try:
            if not window.is_empty_range:
                options = {
                    "proto_version": "1",
                    "publication_names": quote_ident(spec.publication_name),
                    **dict(flavour.start_options),
                }
                if through_sql:
                    _read_sql(spec, catalog, collector, options, flavour)
                else:
                    _read_streaming(spec, flavour, collector, options)
            stats = collector.finish()
            faults.point("window.read_done")
            incremental_stats = incremental.finish(
                PgChunkReader(catalog, Watermarks(spec.incremental_watermarks, spec.signal_table)),
                encoder_for=lambda table: TableEncoder(table, table.columns, spec.events),
                emit=lambda chunk, rows: emit_chunk(chunk, rows, context),
                window_id=context.window_id,
                position=str(window.to_lsn),
                writer=writer,
                sink=sink,
            )
        finally:
            writer.close()  # no writer thread outlives a failed read; commit() still sees write errors
    entry = stats.commit(
        writer,
        window,
        messages=stats.messages,
        messages_skipped=stats.messages_skipped,
        **collector.extra_stats(),
        **incremental_stats,
        **recorded_run(spec),
    )
    drop_emitted_chunks(sink, incremental.emitted)
    return entry


def _read_streaming(
    spec: PostgresJobSpec, flavour: StreamFlavour, collector: Any, options: dict[str, str], *, start: int | None = None
) -> None:
    """The window over the replication protocol, from ``START_REPLICATION`` at its start (or at
    ``start``, inside it, where the SQL reader stopped: the walsender then sends what commits
    from there on, as a slot copy advanced to it does)."""
    with ReplicationConnection(spec.connection) as replication:
        if flavour.decoding_memory:
            replication.apply_settings(decoding_settings(spec.options.decoding_work_mem_bytes))
        try:
            replication.start_logical(spec.slot_name, spec.window.from_lsn if start is None else start, options)
        except CdcError as exc:
            if flavour.start_error is None:
                raise
            raise flavour.start_error(spec.slot_name, exc) from None
        faults.point("window.streaming")
        collector.consume(replication.frames(idle_timeout=spec.options.idle_timeout_seconds))


def _read_sql(
    spec: PostgresJobSpec, catalog: Any, collector: Any, options: dict[str, str], flavour: StreamFlavour
) -> None:
    """The window through ``peek`` up to its end (see sql_window.py; a large window in two ranges
    whose results the server builds at once), into the collector. Under ``window_reader="auto"``,
    what the server cannot materialise (temporary files over ``temp_file_limit``, a full disk)
    streams instead: the error comes before the first row of the window, or of its second range,
    and streaming starts there."""
    window = spec.window
    status = admin.require_slot(catalog, spec.slot_name, spec.connection.dbname)
    confirmed = int(status.confirmed_flush_lsn) if status.confirmed_flush_lsn is not None else int(window.from_lsn)
    sql_window.flush_through(catalog, int(window.to_lsn), timeout=spec.options.idle_timeout_seconds)
    log.info("reading %s through the logical decoding SQL functions", window.describe())
    received = 0
    resume: int | None = None
    try:
        settings = decoding_settings(spec.options.decoding_work_mem_bytes if flavour.decoding_memory else None)
        with sql_window.SqlWindowReader(spec.connection, settings=settings) as reader:
            start, end = int(window.from_lsn), int(window.to_lsn)
            split = reader.split_point(start, end, confirmed_flush=confirmed)
            batches = reader.batches(spec.slot_name, start, end, options, confirmed_flush=confirmed, split_at=split)
            faults.point("window.streaming")
            try:
                for batch in batches:
                    received += 1
                    collector.consume_batches((batch,))
                    if collector.done:
                        break
            finally:
                resume = reader.resume_lsn
    except sql_session.SqlWindowUnavailable as exc:
        if spec.options.window_reader != "auto" or (received and resume is None):
            raise
        log.warning("%s; streaming %s from %s instead", exc, window.describe(), Lsn(resume or int(window.from_lsn)))
        _read_streaming(spec, flavour, collector, options, start=resume)


def _check_stream_source(conn: Any, spec: PostgresJobSpec) -> dict:
    """Tables, publication and slot are as the window needs them; emit the end marker."""
    window = spec.window
    refs = list(spec.tables)
    if spec.signal_table is not None and spec.signal_table not in refs:
        refs.append(spec.signal_table)  # its inserts are signals, read from the stream like Debezium
    tables = admin.describe_tables(conn, refs)
    for table in tables.values():  # fail on bad filters or masks before reading anything
        TableEncoder(table, table.columns, spec.events)
    admin.verify_publication(conn, spec.publication_name, refs)
    status = admin.require_slot(conn, spec.slot_name, spec.connection.dbname)
    if status.confirmed_flush_lsn is None or window.from_lsn is None:
        raise CdcStateError(
            f"replication slot {spec.slot_name!r} has no confirmed position, or {window.describe()} has no start"
        )
    if status.confirmed_flush_lsn > window.from_lsn:
        raise OffsetMismatchError(
            f"slot {spec.slot_name!r} is confirmed up to {status.confirmed_flush_lsn}, past the start "
            f"of {window.describe()}: the window's changes are no longer in the slot"
        )
    if not window.is_empty_range:
        # A non-transactional message after the target: the walsender sends it as soon as it
        # decodes it, which proves it has passed the target even if nothing was captured.
        conn.execute("SELECT pg_logical_emit_message(false, %s, %s)", (MARKER_PREFIX, window.window_id))
    return tables


def _run_snapshot(spec: PostgresJobSpec, spark_provider: SparkProvider) -> CommitEntry:
    info = spec.connection
    started = time.monotonic()
    with connect(info) as conn:
        tables = admin.describe_tables(conn, list(spec.tables))
    encoders = {ref: TableEncoder(table, table.columns, spec.events) for ref, table in tables.items()}
    sink = ParquetSink.for_spec(spec, spark_provider)
    writer = sink.open_window(spec.window, topics_of(spec, tables))
    spark = spark_provider()
    context = EventContext.of_window(spec.topic_prefix, spec.connection.dbname, spec.window)
    with ReplicationConnection(info) as replication:
        creation = replication.create_slot(_temporary_slot_name(), temporary=True, export_snapshot=True)
        if creation.snapshot_name is None:
            raise CdcStateError("the server exported no snapshot for the snapshot's temporary slot")
        faults.point("snapshot.exported")
        with connect(info) as conn:
            import_snapshot(conn, creation.snapshot_name)
            xmin, ts_ms = snapshot_facts(conn)
            plans = {
                ref: plan_block_ranges(
                    conn,
                    table,
                    partition_bytes=spec.options.snapshot_partition_bytes,
                    max_partitions=spec.options.snapshot_max_partitions,
                    parallelism=spark.sparkContext.defaultParallelism,
                )
                for ref, table in tables.items()
            }
            conn.execute("COMMIT")
        point = SnapshotPoint(creation.snapshot_name, int(creation.consistent_point), xmin, ts_ms)
        log.info(
            "snapshot %s exported at %s; reading %d table(s) in %d partition(s)",
            point.snapshot_name,
            creation.consistent_point,
            len(tables),
            sum(len(p) for p in plans.values()),
        )
        rows = write_snapshot_tables(
            spark,
            writer,
            sink,
            spec,
            {ref: encoders[ref].layout.schema for ref in tables},
            plans,
            lambda ref: functools.partial(_read_range, info, point, tables[ref], context, spec.events),
            file_name=_range_file,
        )
    # The exported snapshot and the temporary slot end with the replication connection.
    return commit_snapshot(
        writer, spec, creation.consistent_point, started=started, rows=rows, stats={"snapshot_xmin": xmin}
    )


def write_snapshot_tables(
    spark: Any,
    writer: Any,
    sink: ParquetSink,
    spec: PostgresJobSpec,
    schemas: dict,
    plans: dict,
    reader_for: Callable[[Any], Any],
    *,
    file_name: Callable[[Any], str],
) -> dict[str, int]:
    """Every table's partitions as Spark tasks into its topic; the rows written per topic."""
    rows: dict[str, int] = {}
    for ref, schema in schemas.items():
        topic = Topic.for_table(spec.topic_prefix, ref.schema, ref.name)
        rows[topic.name] = write_partitions(
            spark,
            writer,
            topic,
            plans[ref],
            reader_for(ref),
            file_name=file_name,
            schema=schema,
            arrow_writes=sink.arrow_writes,
        )
        log.info("snapshot of %s: %d rows", ref, rows[topic.name])
        faults.point("snapshot.table_written")
    return rows


def commit_snapshot(
    writer: Any, spec: PostgresJobSpec, end: Any, *, started: float, rows: dict[str, int], stats: dict[str, Any]
) -> CommitEntry:
    """Commit a snapshot window ending at ``end`` (where the stream continues), with its gap, if any."""
    if spec.gap is not None:
        # Committed with the snapshot, so the gap and the rows that restart history are one unit.
        writer.write_batches(Topic.gaps(spec.topic_prefix), [spec.gap.to_batch(spec.window.window_id)])
    return writer.commit(
        spec.window.with_end(end),
        stats={
            **({"gap": spec.gap.to_dict()} if spec.gap is not None else {}),
            "rows": rows,
            "seconds": round(time.monotonic() - started, 3),
            **stats,
            "job_pid": os.getpid(),
            **recorded_run(spec),
        },
    )


def _read_range(
    info: PgConnectionInfo,
    point: SnapshotPoint,
    table: TableInfo,
    context: EventContext,
    settings: EventSettings,
    block_range: BlockRange,
) -> Iterator[pa.RecordBatch]:
    # Runs in Spark's Python workers: one block range of the exported snapshot.
    return read_partition(info, point, table, block_range, context, settings)


def _range_file(block_range: BlockRange) -> str:
    return f"part-{block_range.first:010d}.parquet"


def _temporary_slot_name() -> str:
    return f"cdc_snapshot_{os.getpid()}_{uuid.uuid4().hex[:12]}"
