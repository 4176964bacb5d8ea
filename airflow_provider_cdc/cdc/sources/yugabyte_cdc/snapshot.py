"""The initial snapshot of a CDC-service capture: every tablet paged through ``GetChanges`` at the
stream's snapshot time, one Spark task per tablet.

YB's snapshot protocol (``cdc_service.cc``, the connector's ``YugabyteDBSnapshotChangeEventSource``;
docs/yugabytedb-cdc-service-research.md §7), per tablet:

1. **Bootstrap**: ``GetChanges`` from ``{term -1, index -1, key "", write_id -1, snapshot_time 0}``.
   The answer's checkpoint carries the op id the snapshot stands at and, with ``write_id -1``, the
   snapshot's hybrid time ``T``. It is made here, on the driver, for every tablet of the captured
   tables: ``T`` must be one time for all of them (a stream's consistent snapshot), else the
   tablets would be read at different points and nothing is written (:class:`CdcStateError`).
2. **Pages**: ``GetChanges`` from ``{op id, key, write_id -1, snapshot_time T}``, starting with the
   empty key (the tablet's first row), each next request from the previous answer's checkpoint
   (the key moves through the tablet). Pages hold ``READ`` records, read at ``T``.
3. **End**: an answer whose checkpoint has an empty key, ``write_id 0`` and ``snapshot_time 0``
   (``isSnapshotCompleteMarker``), at the snapshot's op id: the tablet streams from there.

Tablets are independent, so each is a Spark task (:func:`read_tablet`) with its own
:class:`~.client.YbCdcClient` (leader discovery and retries are the client's). A task starts at
the tablet's first key whatever the bootstrap answered, so a retried task reads the tablet again
from the start into the same file (its name is the tablet's), and a bootstrap that already carried
rows loses none.

**Which table is which.** The masters list a stream's tables by id only; the schema (name,
columns, key) comes in the ``DDL`` record a ``GetChanges`` with ``need_schema_info`` puts first.
The capture passes the captured tables' ids (``YbCdcJobSpec.table_ids``, from the YSQL catalog),
so only their tablets are bootstrapped: a bootstrap makes the server keep a tablet's changes for
the stream, and a table the capture never reads would keep them until the stream expires. The
driver asks one tablet of each captured table for its ``DDL`` record (the bootstrap, else the
first page). Without ids (a spec from before they were passed) it asks one tablet of every stream
table, to find the captured ones by name. Either way a captured table the stream lacks fails
before anything is written (:class:`CdcConfigurationError`).
The table version is built from that record exactly as the stream collector builds it (no
catalog: :func:`~.records.relation_columns`, :func:`~.records.ddl_key_columns`), so snapshot and
stream events of a table share one layout.

**Rows to events.** A ``READ`` record carries the row as an ``INSERT`` does (every column in
``new_tuple``): :func:`~.records.row_image` makes the pgoutput Insert message yboutput would send,
and the PostgreSQL decoder (:func:`~..postgres.columnar.decode_rows`) and
:class:`~..postgres.events.TableEncoder` give the typed values, as for the stream. The ``op = r``
envelope is PostgreSQL's snapshot one (:class:`~..postgres.events.SnapshotBatches`: no before
image, no transaction, ``source.snapshot = "true"``) with the collector's YugabyteDB ``source``
block (:func:`~.collector.yb_source_batch`): ``lsn`` the record's op id text, ``commit_time`` and
``record_time`` the snapshot time, ``tablet_id`` the tablet, ``txId`` null.

**Where the stream continues.** The window ends at ``YbLsn(T + 1)``; each tablet's stream starts
at the snapshot's op id (``write_id 0``, ``snapshot_time 0``) with safe time ``T`` (every commit at
or before ``T`` is in the snapshot), returned as the commit's ``source_state``. Once every
tablet is read, each is marked done on the server (``snapshot_done_key``, as the connector does:
YugabyteDB's ``UpdateSnapshotDone`` moves the row's safe time to the snapshot's). Beyond that
and what a bootstrap records itself (the snapshot's op id as the tablet's checkpoint) nothing is stored here: no
``SetCDCCheckpoint`` but the ``initial_checkpoint`` one that starts a never-started tablet; the
operator sets the checkpoints after the offset is saved. The
explicit checkpoint sent with every page is the bootstrap's (nothing of the snapshot is committed
yet), so the server keeps everything after the snapshot's op id.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from airflow_provider_cdc.cdc.basics import faults
from airflow_provider_cdc.cdc.basics.errors import (
    CdcConfigurationError,
    DecodingError,
)
from airflow_provider_cdc.cdc.basics.tables import POSTGRES_NAMES, TableRef
from airflow_provider_cdc.cdc.reading.window_job import SparkProvider
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry
from airflow_provider_cdc.cdc.sinks.parquet import ParquetSink
from airflow_provider_cdc.cdc.sources.postgres.events import EventContext, EventSettings, TableEncoder
from airflow_provider_cdc.cdc.sources.postgres.jobs import commit_snapshot, topics_of, write_snapshot_tables
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import (
    Checkpoint,
    TabletCheckpoints,
    TabletPosition,
    TabletState,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.client import YbCdcClient
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.offset import source_state
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.pages import Fetch, Page
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.position import YbLsn
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import methods
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol.client import TlsOptions
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.snapshot_pages import (
    BOOTSTRAP,
    check_bootstrap,
    common_snapshot_time,
    first_page,
    snapshot_pages,
    streaming_start,
)
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.snapshot_rows import SnapshotRows, SnapshotTable, event_schema
from airflow_provider_cdc.cdc.sources.yugabyte_cdc.spec import YbCdcJobSpec

log = logging.getLogger(__name__)

Op = pb.RowMessage

#: Rows per Arrow batch a task builds (the Parquet writer groups them into row groups).
ROWS_PER_BATCH = 8192


# -- the tasks --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TabletTask:
    """One tablet of one table: a Spark task. ``bootstrap`` is its bootstrap answer's checkpoint."""

    tablet_id: str
    bootstrap: Checkpoint

    @property
    def file_name(self) -> str:
        return f"part-{self.tablet_id}.parquet"


@dataclass(frozen=True)
class SnapshotSource:
    """How a task reaches the stream and makes events: plain, picklable fields (no client)."""

    master_addresses: str
    stream_id: str
    tls: TlsOptions | None
    snapshot_ht: int
    context: EventContext
    settings: EventSettings
    get_changes_max_bytes: int = methods.GET_CHANGES_MAX_BYTES

    def client(self) -> YbCdcClient:
        return YbCdcClient.of(self)


def read_tablet(source: SnapshotSource, table: SnapshotTable, task: TabletTask) -> Iterator[pa.RecordBatch]:
    """``op = r`` event batches of one table's rows on one tablet, paged at the snapshot time
    (in Spark's Python workers)."""
    rows = SnapshotRows(table, task.tablet_id, source.snapshot_ht, source.context, source.settings)
    with source.client() as client:
        for page in snapshot_pages(_fetcher(client, task), task.tablet_id, task.bootstrap):
            for record in page.records:
                rows.add(record)
                if len(rows) >= ROWS_PER_BATCH:
                    yield rows.flush()
    if len(rows):
        yield rows.flush()


def _fetcher(client: YbCdcClient, task: TabletTask) -> Fetch:
    """The tablet's ``GetChanges``: the schema asked with the first page (so a changed table
    version shows), the bootstrap's checkpoint sent as the explicit (committed) one."""
    first = [True]

    def fetch(position: TabletPosition) -> pb.GetChangesResponsePB:
        response = client.get_changes(task.tablet_id, position, explicit=task.bootstrap, need_schema_info=first[0])
        first[0] = False
        return response

    return fetch


def _task_file(task: TabletTask) -> str:
    return task.file_name


# -- the driver -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SnapshotPlan:
    """What the driver found: the captured tables, their tablets' bootstraps, the snapshot time."""

    snapshot_ht: int
    tables: dict[TableRef, SnapshotTable]
    tasks: dict[TableRef, list[TabletTask]]
    tablets: TabletCheckpoints  # where each captured tablet's stream continues


def bootstrap(client: YbCdcClient, tablet_id: str) -> Page:
    """The tablet's bootstrap ``GetChanges`` (asking for the schema too): its answer's checkpoint
    is the snapshot's op id and time. A tablet the server never started (``GetCheckpoint``
    -1.-1: a stream created without a consistent snapshot, or a tablet added later) is started
    first with ``SetCDCCheckpoint(0.0, initial_checkpoint)`` as the connector's ``makeStreamActive``
    does: until then YB answers every ``GetChanges`` with "Stream ID ... is expired"."""
    if client.get_checkpoint(tablet_id).never_set:
        client.start_tablet(tablet_id)
    request = TabletPosition(BOOTSTRAP)
    page = Page.of(request, client.get_changes(tablet_id, request, need_schema_info=True, starting=True))
    check_bootstrap(tablet_id, page.checkpoint)
    return page


def table_schema(client: YbCdcClient, tablet_id: str, table_id: str, boot: Page) -> pb.RowMessage:
    """The DDL record of ``table_id``: from the bootstrap's answer when it carried one, else
    from the tablet's first snapshot page (asked with ``need_schema_info``; its rows are read
    again by the tablet's task)."""
    found = _ddl_of(boot.records, table_id)
    if found is not None:
        return found
    request = TabletPosition(first_page(boot.checkpoint))
    response = client.get_changes(tablet_id, request, explicit=boot.checkpoint, need_schema_info=True)
    found = _ddl_of(response.cdc_sdk_proto_records, table_id)
    if found is None:
        raise DecodingError(
            f"tablet {tablet_id}: no schema record of table {table_id} in a snapshot page asked with need_schema_info"
        )
    return found


def _ddl_of(records: Sequence[pb.CDCSDKProtoRecordPB], table_id: str) -> pb.RowMessage | None:
    for record in records:
        row = record.row_message
        if row.op == Op.DDL and row.table_id == table_id and row.schema.column_info:
            return row
    return None


def plan_snapshot(
    client: YbCdcClient,
    captured: Sequence[TableRef],
    settings: EventSettings | None = None,
    known_ids: Mapping[TableRef, str] | None = None,
) -> SnapshotPlan:
    """Find the captured tables among the stream's, bootstrap each of their tablets and check
    they share one snapshot time. Fails before anything is read when a captured table is not in
    the stream (:class:`CdcConfigurationError`) or the times differ (:class:`CdcStateError`).
    With ``known_ids`` (every captured table's id) no other stream table's tablet is touched: a
    bootstrap makes the server keep that tablet's changes for the stream until it expires."""
    _, table_ids = client.stream_tables()
    if known_ids and all(ref in known_ids for ref in captured):
        absent = [ref for ref in captured if known_ids[ref] not in table_ids]
        if absent:
            raise _not_in_stream(client, absent, "")
        table_ids = [known_ids[ref] for ref in captured]
    tablets = client.tablets(table_ids)
    by_table: dict[str, list[str]] = {table_id: [] for table_id in table_ids}
    for tablet_id, tables in tablets.items():
        for table_id in tables:
            by_table.setdefault(table_id, []).append(tablet_id)
    boots: dict[str, Page] = {}
    found: dict[TableRef, SnapshotTable] = {}
    for table_id in table_ids:
        mine = by_table.get(table_id) or []
        if not mine:
            log.warning("stream %s: table %s has no tablets; it is not snapshotted", client.stream_id, table_id)
            continue
        probe = mine[0]
        if probe not in boots:
            boots[probe] = bootstrap(client, probe)
        table = SnapshotTable.of(table_schema(client, probe, table_id, boots[probe]))
        found[table.ref] = table
    missing = [ref for ref in captured if ref not in found]
    if missing:
        known = ", ".join(sorted(ref.quoted(POSTGRES_NAMES) for ref in found)) or "none"
        raise _not_in_stream(client, missing, f" (its tables: {known})")
    tables = {ref: found[ref] for ref in captured}
    for table in tables.values():
        if settings is not None:
            TableEncoder(table.table, table.table.columns, settings)  # bad filters or masks fail before reading
        for tablet_id in by_table[table.table_id]:
            if tablet_id not in boots:
                boots[tablet_id] = bootstrap(client, tablet_id)
    wanted = {tablet_id for table in tables.values() for tablet_id in by_table[table.table_id]}
    checkpoints = {tablet_id: page.checkpoint for tablet_id, page in boots.items()}
    snapshot_ht = common_snapshot_time(checkpoints)
    tasks = {
        ref: [TabletTask(tablet_id, checkpoints[tablet_id]) for tablet_id in sorted(by_table[table.table_id])]
        for ref, table in tables.items()
    }
    starts = TabletCheckpoints(
        {
            tablet_id: TabletState(streaming_start(checkpoints[tablet_id]), table_ids=tuple(tablets[tablet_id]))
            for tablet_id in sorted(wanted)
        }
    )
    return SnapshotPlan(snapshot_ht, tables, tasks, starts)


def mark_snapshots_done(spec: YbCdcJobSpec, plan: SnapshotPlan) -> None:
    """Every read tablet's snapshot marked done on the server (``snapshot_done_key``, the
    connector's ``markSnapshotDoneOnServer``; YugabyteDB's ``UpdateSnapshotDone`` moves the row's
    safe time to the snapshot's). Before the commit: a run that fails after it snapshots again, and the bootstrap
    marks the row "in snapshot" again; the checkpoint and the changes kept are not touched."""
    with YbCdcClient.of(spec) as client:
        for tablet_id, state in plan.tablets.items():
            start = state.position.checkpoint
            client.mark_snapshot_done(tablet_id, Checkpoint(start.term, start.index, snapshot_time=plan.snapshot_ht))


def _not_in_stream(client: YbCdcClient, missing: Sequence[TableRef], tables: str) -> CdcConfigurationError:
    names = ", ".join(ref.quoted(POSTGRES_NAMES) for ref in missing)
    return CdcConfigurationError(
        f"table(s) {names} are not in CDC stream {client.stream_id}{tables}; a stream captures the tables "
        "it was created with: remove them from the capture or use a stream that has them"
    )


def run_snapshot(spec: YbCdcJobSpec, spark_provider: SparkProvider) -> CommitEntry:
    """Snapshot the captured tables through the CDC service into the sink and commit the window
    (ending at the snapshot time + 1), with each tablet's streaming start as ``source_state``."""
    started = time.monotonic()
    with YbCdcClient.of(spec) as client:
        plan = plan_snapshot(client, spec.tables, spec.events, dict(spec.table_ids))
    ht = plan.snapshot_ht
    faults.point("snapshot.exported")
    log.info(
        "snapshot of stream %s at hybrid time %d: %d table(s) in %d tablet(s)",
        spec.stream_id,
        ht,
        len(plan.tables),
        sum(len(tasks) for tasks in plan.tasks.values()),
    )
    context = EventContext.of_window(spec.topic_prefix, spec.database, spec.window)
    source = SnapshotSource(
        spec.master_addresses, spec.stream_id, spec.tls, ht, context, spec.events, spec.get_changes_max_bytes
    )
    schemas = {
        ref: event_schema(TableEncoder(table.table, table.table.columns, spec.events))
        for ref, table in plan.tables.items()
    }
    sink = ParquetSink.for_spec(spec, spark_provider)
    writer = sink.open_window(spec.window, topics_of(spec, plan.tables))

    def reader_for(ref: TableRef) -> Callable[[TabletTask], Iterator[pa.RecordBatch]]:
        return functools.partial(read_tablet, source, plan.tables[ref])  # pickled to the workers

    rows = write_snapshot_tables(
        spark_provider(), writer, sink, spec, schemas, plan.tasks, reader_for, file_name=_task_file
    )
    mark_snapshots_done(spec, plan)
    # Reading pages restarts the stream's expiry timer of every tablet read.
    state = source_state(plan.tablets, stream_id=spec.stream_id, last_read_ms=int(time.time() * 1000))
    return commit_snapshot(
        writer, spec, YbLsn(ht + 1), started=started, rows=rows, stats={"snapshot_ht": ht, "source_state": state}
    )


__all__ = ["SnapshotPlan", "SnapshotSource", "TabletTask", "plan_snapshot", "read_tablet", "run_snapshot"]
