"""The job of one SQL Server window (snapshot or stream), in-process or under ``spark-submit``."""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any

from airflow_provider_cdc.cdc.basics import faults
from airflow_provider_cdc.cdc.basics.errors import CdcStateError
from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.basics.tables import SQLSERVER_NAMES
from airflow_provider_cdc.cdc.events.settings import EventContext
from airflow_provider_cdc.cdc.reading.incremental_run import IncrementalRun, drop_emitted_chunks
from airflow_provider_cdc.cdc.reading.snapshot_tasks import write_partitions
from airflow_provider_cdc.cdc.reading.window_job import SparkProvider, recorded_run, run_window
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry
from airflow_provider_cdc.cdc.sinks.parquet import ParquetSink
from airflow_provider_cdc.cdc.sources.sqlserver import admin, server_clock
from airflow_provider_cdc.cdc.sources.sqlserver.change_queries import (
    changes_sql,
    check_retention,
    instance_ranges,
    readable,
)
from airflow_provider_cdc.cdc.sources.sqlserver.chunks import (
    SignalTable,
    SqlServerChunkPositions,
    SqlServerChunkReader,
    emit_chunk,
)
from airflow_provider_cdc.cdc.sources.sqlserver.commit_order import merged_changes
from airflow_provider_cdc.cdc.sources.sqlserver.connection import connect
from airflow_provider_cdc.cdc.sources.sqlserver.events import TableEncoder
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn
from airflow_provider_cdc.cdc.sources.sqlserver.snapshot import KeyRange, SnapshotPoint, plan_key_ranges, read_partition
from airflow_provider_cdc.cdc.sources.sqlserver.spec import SqlServerJobSpec
from airflow_provider_cdc.cdc.sources.sqlserver.stream import WindowReader
from airflow_provider_cdc.cdc.sources.sqlserver.tables import TableInfo

log = logging.getLogger(__name__)


def run_job(spec: SqlServerJobSpec, spark_provider: SparkProvider | None = None) -> CommitEntry:
    """Run the window of ``spec`` and return its commit-log entry."""
    spec = _with_password(spec)
    return run_window(spec, spark_provider, snapshot=_run_snapshot, stream=_run_stream)


def _with_password(spec: SqlServerJobSpec) -> SqlServerJobSpec:
    from dataclasses import replace

    if spec.connection.password is not None:
        return spec
    return replace(spec, connection=spec.connection.with_password_from_env())


def _topics(spec: SqlServerJobSpec) -> list[Topic]:
    prefix = spec.topic_prefix
    tables = [Topic.for_table(prefix, ref.schema, ref.name) for ref in spec.tables]
    return [*tables, Topic.transactions(prefix), Topic.gaps(prefix)]


def _describe(conn: Any, spec: SqlServerJobSpec, *, with_signal_table: bool = False) -> dict[str, TableInfo]:
    refs = list(spec.tables)
    if with_signal_table and spec.signal_table is not None and spec.signal_table not in refs:
        refs.append(spec.signal_table)  # its inserts are signals, read from its change table like Debezium
    found, problems = admin.describe_tables(conn, refs)
    admin.require_tables(found, refs, problems)
    for table in found.values():  # fail on bad filters or masks before reading anything
        TableEncoder(table, table.columns, spec.events)
    return {ref.data_collection: table for ref, table in found.items()}


def _run_stream(spec: SqlServerJobSpec, spark_provider: SparkProvider) -> CommitEntry:
    window = spec.window
    if window.from_lsn is None or window.to_lsn is None:
        raise CdcStateError(f"stream window {window.describe()} has no start or end position: its job spec is broken")
    low, high = SqlServerLsn(window.from_lsn), SqlServerLsn(window.to_lsn)
    info = spec.connection
    conn = connect(info)
    try:
        tables = _describe(conn, spec, with_signal_table=True)
        source_state = _source_state(spec, tables)
        ranges = instance_ranges(list(tables.values()), low, high)
        check_retention(conn, ranges, set(spec.known_instances), spec.known_starts)
        ranges = readable(ranges)
        log.info(
            "reading %s from %d capture instance(s): %s",
            window.describe(),
            len(ranges),
            ", ".join(f"{r.instance.name} [{r.low}, {r.high})" for r in ranges) or "none",
        )
        incremental = IncrementalRun(
            state=spec.incremental,
            tables={t.ref: t for t in tables.values() if t.ref in spec.tables},
            topic_prefix=spec.topic_prefix,
            signal_table=spec.signal_table,
            options=spec.options,
            positions=SqlServerChunkPositions(),
        )
        context = EventContext.of_window(spec.topic_prefix, spec.connection.database, spec.window)
        sink = ParquetSink.for_spec(spec, spark_provider)
        writer = sink.open_window(window, [*_topics(spec), *incremental.staged_topics])
        reader = WindowReader(
            tables=tables,
            context=context,
            settings=spec.events,
            max_changes_per_chunk=spec.options.max_changes_per_chunk,
            flush=incremental.wrap(writer.write_chunk),
            commit_times=functools.partial(admin.lsn_times, conn),
            server_time_zone=spec.server_time_zone,
            uncounted=incremental.uncounted,
            resolve_at=functools.partial(server_clock.resolve_at, conn, server_clock.zone_of(spec.server_time_zone)),
        )
        encoders = {r.instance.name: reader.encoder(r.instance) for r in ranges}
        try:
            rows = merged_changes(
                functools.partial(connect, info),
                ranges,
                lambda instance: changes_sql(instance, encoders[instance.name], spec.data_query_mode),
            )
            faults.point("window.streaming")
            stats = reader.read(rows, window)
            faults.point("window.read_done")
            # The cleanup job may have purged rows while they were read: the result would have a hole.
            check_retention(conn, ranges, {r.instance.name for r in ranges}, source_state["starts"])
            incremental_stats = incremental.finish(
                _chunk_reader(conn, spec, tables),
                encoder_for=lambda table: TableEncoder(table, table.columns, spec.events),
                emit=lambda chunk, rows: emit_chunk(chunk, rows, context),
                window_id=context.window_id,
                position=str(high),
                writer=writer,
                sink=sink,
            )
        finally:
            writer.close()
    finally:
        conn.close()
    entry = stats.commit(
        writer,
        window,
        # The instances the tables have now (an old one dropped after a switch is gone from here).
        source_state=source_state,
        **incremental_stats,
        **recorded_run(spec),
    )
    drop_emitted_chunks(sink, incremental.emitted)
    return entry


def _source_state(spec: SqlServerJobSpec, tables: dict[str, TableInfo]) -> dict[str, Any]:
    """What the next window checks: the capture instances the tables have now (an old one dropped
    after a switch is gone from here), and each one's start_lsn when a window first saw it."""
    instances = [i for t in tables.values() for i in t.instances]
    starts = {i.name: str(i.start_lsn) for i in instances if i.start_lsn is not None}
    starts.update({name: lsn for name, lsn in spec.known_starts.items() if name in starts})
    return {"instances": sorted(i.name for i in instances), "starts": dict(sorted(starts.items()))}


def _chunk_reader(conn: Any, spec: SqlServerJobSpec, tables: dict[str, TableInfo]) -> SqlServerChunkReader | None:
    """Chunks are read only with a signal table (their watermarks are its rows)."""
    signal = spec.signal_table
    if signal is None:
        return None
    described = tables[signal.data_collection]
    if not described.instances:
        raise CdcStateError(f"the signal table {signal.quoted(SQLSERVER_NAMES)} has no capture instance any more")
    return SqlServerChunkReader(
        conn,
        SignalTable(signal, described.instances[-1].name),
        spec.incremental_watermarks,
        wait_seconds=spec.incremental_watermark_wait_seconds,
    )


def _run_snapshot(spec: SqlServerJobSpec, spark_provider: SparkProvider) -> CommitEntry:
    info = spec.connection
    started = time.monotonic()
    conn = connect(info)
    try:
        described = _describe(conn, spec, with_signal_table=True)  # the signal table: for source_state only
        tables = {name: t for name, t in described.items() if t.ref in spec.tables}
        position = admin.max_lsn(conn)
        if position is None:
            raise CdcStateError(
                "sys.fn_cdc_get_max_lsn() is NULL: the capture job has not processed any transaction yet. Check that "
                "SQL Server Agent and the capture job run, then retry"
            )
        spark = spark_provider()
        parallelism = spark.sparkContext.defaultParallelism
        plans: dict[str, list[KeyRange]] = {
            name: plan_key_ranges(
                conn, table, max_partitions=spec.options.snapshot_max_partitions, parallelism=parallelism
            )
            for name, table in tables.items()
        }
    finally:
        conn.close()
    point = SnapshotPoint(int(position), spec.window.planned_at_ms, spec.snapshot_isolation_mode)
    log.info(
        "snapshot at %s (%s isolation): %d table(s) in %d partition(s)",
        position,
        spec.snapshot_isolation_mode,
        len(tables),
        sum(len(p) for p in plans.values()),
    )
    faults.point("snapshot.exported")
    sink = ParquetSink.for_spec(spec, spark_provider)
    writer = sink.open_window(spec.window, _topics(spec))
    context = EventContext.of_window(spec.topic_prefix, spec.connection.database, spec.window)
    rows: dict[str, int] = {}
    try:
        for name, table in tables.items():
            topic = Topic.for_table(spec.topic_prefix, table.ref.schema, table.ref.name)
            rows[topic.name] = write_partitions(
                spark,
                writer,
                topic,
                plans[name],
                functools.partial(read_partition, info, point, table, context=context, settings=spec.events),
                file_name=_part_file,
                schema=TableEncoder(table, table.columns, spec.events).layout.schema,
                arrow_writes=sink.arrow_writes,
            )
            log.info("snapshot of %s: %d rows", table.ref, rows[topic.name])
            faults.point("snapshot.table_written")
        if spec.gap is not None:
            writer.write_batches(Topic.gaps(spec.topic_prefix), [spec.gap.to_batch(spec.window.window_id)])
    finally:
        writer.close()
    # The stream continues after the snapshot's LSN: windows are [from, to) on commit LSNs.
    return writer.commit(
        spec.window.with_end(position.next()),
        stats={
            **({"gap": spec.gap.to_dict()} if spec.gap is not None else {}),
            "rows": rows,
            "seconds": round(time.monotonic() - started, 3),
            "snapshot_isolation_mode": spec.snapshot_isolation_mode,
            "source_state": _source_state(spec, described),
            "job_pid": os.getpid(),
            **recorded_run(spec),
        },
    )


def _part_file(part: KeyRange) -> str:
    return f"part-{part.index:06d}.parquet"
