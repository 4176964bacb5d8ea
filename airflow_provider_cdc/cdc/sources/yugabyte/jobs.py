"""Running one YugabyteDB window: the PostgreSQL source's jobs with YugabyteDB's differences.

A stream window is PostgreSQL's stream job (:func:`..postgres.jobs.run_stream`) with the YugabyteDB
collector (hybrid-time bounds, retransmitted transactions skipped, ``'u'`` columns) and no end
marker message (YugabyteDB never streams logical messages: the capture's fence row, committed
when the window was planned, ends the read). A snapshot reads every table in hash ranges at the
slot's consistent hybrid time. Neither stores offsets nor acknowledges the slot.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

from airflow_provider_cdc.cdc.basics import faults
from airflow_provider_cdc.cdc.basics.errors import CdcError, CdcStateError, OffsetMismatchError, SnapshotRequiredError
from airflow_provider_cdc.cdc.reading.window_job import SparkProvider, run_window
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry
from airflow_provider_cdc.cdc.sinks.parquet import ParquetSink
from airflow_provider_cdc.cdc.sources.postgres import admin as pg_admin
from airflow_provider_cdc.cdc.sources.postgres.connection import connect
from airflow_provider_cdc.cdc.sources.postgres.events import EventContext, TableEncoder
from airflow_provider_cdc.cdc.sources.postgres.jobs import (
    StreamFlavour,
    commit_snapshot,
    run_stream,
    topics_of,
    write_snapshot_tables,
)
from airflow_provider_cdc.cdc.sources.postgres.snapshot import SnapshotPoint
from airflow_provider_cdc.cdc.sources.yugabyte import admin
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn, ht_to_unix_us
from airflow_provider_cdc.cdc.sources.yugabyte.snapshot import hash_range_file, plan_hash_ranges, read_hash_range
from airflow_provider_cdc.cdc.sources.yugabyte.spec import YugabyteJobSpec
from airflow_provider_cdc.cdc.sources.yugabyte.stream import YbWindowCollector

log = logging.getLogger(__name__)


def run_job(spec: YugabyteJobSpec, spark_provider: SparkProvider | None = None) -> CommitEntry:
    """Run the window of ``spec`` and return its commit-log entry."""
    return run_window(spec, spark_provider, snapshot=_run_snapshot, stream=_run_stream)


def _start_error(slot: str, error: Exception) -> Exception:
    return admin.stream_error(slot, str(error))


STREAM = StreamFlavour(
    check_source=lambda conn, spec: _check_stream_source(conn, spec),
    collector=YbWindowCollector,
    start_options=(),
    incremental=False,
    start_error=_start_error,
)


def _run_stream(spec: YugabyteJobSpec, spark_provider: SparkProvider) -> CommitEntry:
    # YugabyteDB reports expiry, a missing publication and the like after CopyBothResponse: the
    # stream's ErrorResponse is classified as a refused START would be.
    with admin.classified_stream_errors(spec.slot_name):
        return run_stream(spec, spark_provider, STREAM)


def _check_stream_source(conn: Any, spec: YugabyteJobSpec) -> dict:
    """Tables, publication and slot are as the window needs them (nothing is written: the fence row
    was committed when the window was planned)."""
    window = spec.window
    tables = pg_admin.describe_tables(conn, list(spec.tables))
    for table in tables.values():  # fail on bad filters or masks before reading anything
        TableEncoder(table, table.columns, spec.events)
    pg_admin.verify_publication(conn, spec.publication_name, list(spec.tables))
    status = admin.require_slot(conn, spec.slot_name, spec.connection.dbname, spec.lsn_type)
    if window.from_lsn is None:
        raise CdcStateError(f"stream window {window.describe()} has no start position: its job spec is broken")
    if status.confirmed_flush_lsn is not None and status.confirmed_flush_lsn >= window.from_lsn:
        raise OffsetMismatchError(
            f"slot {spec.slot_name!r} is confirmed up to {status.confirmed_flush_lsn}, at or past the start "
            f"of {window.describe()}: the window's changes are no longer in the slot"
        )
    return tables


def check_snapshot_duration(created_ms: int, now_ms: int, timeout_ms: int) -> None:
    """Refuse to land a snapshot that ended after ``cdcsdk_tablet_not_of_interest_timeout_secs``: the
    slot is first read by the window after it, and YugabyteDB releases the history of the tables a
    slot did not poll within that time of its creation (docs/yugabytedb.md, "Publications and the
    slot"). The slot is not read earlier on purpose: a slot's first poll may move its restart time
    and history retention past the snapshot's read time (``UpdateRestartTimeIfRequired``)."""
    if now_ms - created_ms <= timeout_ms:
        return
    raise SnapshotRequiredError(
        f"the snapshot took {(now_ms - created_ms) / 3_600_000:.1f} h, longer than YugabyteDB's "
        f"cdcsdk_tablet_not_of_interest_timeout_secs ({timeout_ms // 1000} s) after the slot's creation: the "
        "slot's tables are no longer of interest to it and their changes since the snapshot are not kept. "
        "Nothing was committed. Raise cdcsdk_tablet_not_of_interest_timeout_secs on the tablet servers above "
        "the snapshot's duration (and the capture's tablet_not_of_interest_timeout_seconds with it), or "
        "snapshot fewer tables per capture, then run the snapshot again"
    )


def _run_snapshot(spec: YugabyteJobSpec, spark_provider: SparkProvider) -> CommitEntry:
    info = spec.connection
    started = time.monotonic()
    if spec.snapshot_ht is None:
        raise CdcError("a YugabyteDB snapshot job needs the slot's consistent hybrid time (snapshot_ht)")
    ht = int(spec.snapshot_ht)
    point = SnapshotPoint(str(ht), ht, None, ht_to_unix_us(ht) // 1000)
    spark = spark_provider()
    with connect(info) as conn:
        tables = pg_admin.describe_tables(conn, list(spec.tables))
        admin.wait_for_read_time(conn, ht)  # the consistent time may be ahead of this node's clock
        admin.enter_read_time(conn, ht, spec.read_time_procedure)  # fails early if the read time is refused
        plans = {
            ref: plan_hash_ranges(
                conn,
                table,
                max_partitions=spec.options.snapshot_max_partitions,
                parallelism=spark.sparkContext.defaultParallelism,
            )
            for ref, table in tables.items()
        }
        conn.execute("COMMIT")
    encoders = {ref: TableEncoder(table, table.columns, spec.events) for ref, table in tables.items()}
    sink = ParquetSink.for_spec(spec, spark_provider)
    writer = sink.open_window(spec.window, topics_of(spec, tables))
    context = EventContext.of_window(spec.topic_prefix, info.dbname, spec.window)
    log.info(
        "snapshot at hybrid time %d; reading %d table(s) in %d partition(s)",
        ht,
        len(tables),
        sum(len(p) for p in plans.values()),
    )
    faults.point("snapshot.exported")
    rows = write_snapshot_tables(
        spark,
        writer,
        sink,
        spec,
        {ref: encoders[ref].layout.schema for ref in tables},
        plans,
        lambda ref: functools.partial(
            read_hash_range, info, point, spec.read_time_procedure, tables[ref], context, spec.events
        ),
        file_name=hash_range_file,
    )
    # The stream continues with the commits after the consistent point.
    end = YbLsn(spec.snapshot_end if spec.snapshot_end is not None else ht + 1)
    created_ms = ht_to_unix_us(ht) // 1000  # the slot's consistent time: when it was created
    check_snapshot_duration(created_ms, int(time.time() * 1000), spec.not_of_interest_timeout_ms)
    # YugabyteDB starts a consistent-snapshot slot's expiry timer at its creation (its first read
    # comes with the first window).
    state = {"last_read_ms": created_ms, "first_poll_due_ms": created_ms + spec.not_of_interest_timeout_ms}
    return commit_snapshot(
        writer, spec, end, started=started, rows=rows, stats={"snapshot_ht": ht, "source_state": state}
    )
