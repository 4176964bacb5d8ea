"""A SQL Server capture: its settings, its setup (preflight only), and one run's session.

``SqlServerCapture`` is what DAG authors write (validated at DAG parse, no I/O, no Spark);
:class:`SqlServerRun` is how the shared operators talk to SQL Server during a run: the capture
lock (``sp_getapplock``), the capture job's newest LSN (``sys.fn_cdc_get_max_lsn()``) as the
window's end, the retention edge of each capture instance, and the job spec.

Unlike PostgreSQL, SQL Server has nothing to acknowledge: the capture job writes change rows
whether anyone reads them or not, and only the cleanup job's retention protects the changes a
capture has not read yet (docs/sqlserver.md). Setup creates nothing either: enabling CDC on the
database and tables is the DBA's step, and setup checks it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_provider_cdc.captures.base import Capture
from airflow_provider_cdc.captures.source_run import SourceRun, common_spec_fields
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.readiness import Readiness
from airflow_provider_cdc.cdc.basics.tables import SQLSERVER_NAMES, TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.planning import plan as core
from airflow_provider_cdc.cdc.planning.gaps import CaptureGap
from airflow_provider_cdc.cdc.planning.offset import CaptureOffset, OffsetIdentity
from airflow_provider_cdc.cdc.planning.plan import SnapshotDecision, StreamPlan
from airflow_provider_cdc.cdc.sources.sqlserver.connection import check_driver_name
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn
from airflow_provider_cdc.cdc.sources.sqlserver.offset import SqlServerOffset
from airflow_provider_cdc.cdc.sources.sqlserver.spec import SqlServerJobSpec, validate_sqlserver_modes
from airflow_provider_cdc.utils.times import utc_time

if TYPE_CHECKING:
    from airflow_provider_cdc.hooks.sqlserver_cdc import SqlServerCdcHook

log = logging.getLogger(__name__)


@dataclass
class SqlServerCapture(Capture):
    """Configuration of one SQL Server capture. See docs/sqlserver.md for every field."""

    OFFSET_TYPE: ClassVar[type[CaptureOffset]] = SqlServerOffset
    NAMES = SQLSERVER_NAMES
    SOURCE_NAME = "SQL Server"
    DEFAULT_WATERMARKS: ClassVar[str] = "insert_insert"
    LINEAGE_SCHEME: ClassVar[str] = "mssql"

    sqlserver_conn_id: str
    # The ODBC driver's name (default "ODBC Driver 18 for SQL Server"; the connection's "driver" extra only
    # where [cdc] sqlserver_allow_driver_in_extra allows it: docs/sqlserver.md).
    odbc_driver: str | None = None
    # Debezium's data.query.mode: "direct" (its default too, DBZ-9394) reads the change table in
    # __$command_id order, the order Microsoft documents; "function" reads
    # cdc.fn_cdc_get_all_changes_<instance> (no __$command_id) and re-reads from the change table a
    # transaction whose __$seqval order is ambiguous (commit_order.seqval_order_is_ambiguous).
    data_query_mode: str = "direct"
    # Debezium's snapshot.isolation.mode (the ones that need no table locks): docs/sqlserver.md.
    snapshot_isolation_mode: str = "snapshot"
    # The zone of the server's clock: cdc.lsn_time_mapping keeps local times (source.ts_ms).
    server_time_zone: str = "UTC"
    # Incremental snapshots need the signal table (CDC-enabled): their watermarks are rows in it.
    incremental_watermarks: str = field(default="insert_insert", kw_only=True)
    # How long a window's job waits for the capture job to capture its chunks' watermark rows.
    incremental_watermark_wait_seconds: float = 120.0
    # Tables that join after the snapshot: "incremental" (needs signal_table) or "fail".
    new_table_snapshot: str = field(default="fail", kw_only=True)

    def validate_source(self) -> None:
        if not isinstance(self.sqlserver_conn_id, str) or not self.sqlserver_conn_id.strip():
            raise CdcConfigurationError(
                f"sqlserver_conn_id is required, got {self.sqlserver_conn_id!r}: give the id of the Airflow connection "
                "(type mssql) to the SQL Server database to capture"
            )
        if self.odbc_driver is not None:
            try:
                check_driver_name(self.odbc_driver)
            except CdcConfigurationError:
                raise CdcConfigurationError(
                    f"odbc_driver {self.odbc_driver!r} is not an ODBC driver name: give the name the driver is "
                    "registered under (odbcinst.ini), e.g. 'ODBC Driver 18 for SQL Server', without braces and never "
                    "a path to a library, or None for the default"
                ) from None
        validate_sqlserver_modes(self.data_query_mode, self.snapshot_isolation_mode, self.incremental_watermarks)
        wait = self.incremental_watermark_wait_seconds
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 1 <= wait <= 3600:
            raise CdcConfigurationError(
                f"incremental_watermark_wait_seconds must be a number of seconds from 1 to 3600, got {wait!r}"
            )
        from airflow_provider_cdc.cdc.sources.sqlserver.server_clock import zone_of

        if not isinstance(self.server_time_zone, str):
            raise CdcConfigurationError(
                f"server_time_zone must be an IANA time zone name (e.g. 'UTC', 'Europe/Berlin'), got "
                f"{self.server_time_zone!r}"
            )
        zone_of(self.server_time_zone)
        if self.offset_store == "state_table":
            raise CdcConfigurationError(
                "offset_store='state_table' keeps offsets in a PostgreSQL table; a SQL Server capture uses "
                "'variable' (an Airflow Variable) or an OffsetStore instance"
            )
        if self.new_table_snapshot == "incremental" and self.signal_table is None:
            raise CdcConfigurationError(
                "new_table_snapshot='incremental' needs signal_table on SQL Server: the incremental snapshot's "
                "watermarks are rows written into it (a CDC-enabled table with columns id, type, data); set "
                "signal_table, or new_table_snapshot='fail'"
            )

    def incremental_unavailable(self) -> str | None:
        if self.signal_table is None:
            return (
                "incremental snapshots on SQL Server need signal_table: their watermarks are rows written into it "
                "(a CDC-enabled table with columns id, type, data, as Debezium's signal.data.collection)"
            )
        return None

    @property
    def conn_id(self) -> str:
        return self.sqlserver_conn_id

    def position(self, text: str) -> SqlServerLsn:
        return SqlServerLsn(text)

    def hook(self) -> SqlServerCdcHook:
        from airflow_provider_cdc.hooks.sqlserver_cdc import SqlServerCdcHook

        return SqlServerCdcHook(self.sqlserver_conn_id, driver=self.odbc_driver)

    def readiness(self, sensor: Any, context: Any) -> Readiness:
        """Has the capture job processed every commit up to the sensor's ``wait_until``?"""
        from airflow_provider_cdc.cdc.sources.sqlserver.pending import capture_job_readiness

        with self.hook().session() as conn:
            return capture_job_readiness(conn, utc_time(sensor.wait_until, sensor.task_id), self.server_time_zone)

    def readiness_trigger(self, sensor: Any, context: Any) -> Any:
        from airflow_provider_cdc.triggers.sqlserver_cdc import SqlServerCdcChangesTrigger

        until = utc_time(sensor.wait_until, sensor.task_id)
        return SqlServerCdcChangesTrigger(
            self.sqlserver_conn_id,
            None if until is None else until.isoformat(),
            float(sensor.poke_interval),
            driver=self.odbc_driver,
            server_time_zone=self.server_time_zone,
        )

    def connection_errors(self) -> tuple[type[BaseException], ...]:
        import pyodbc

        return (pyodbc.OperationalError, pyodbc.InterfaceError)

    def resolve_tables(self, conn: Any) -> tuple[TableRef, ...]:
        from airflow_provider_cdc.cdc.sources.sqlserver import admin

        return admin.resolve_tables(conn, self.table_refs, self.table_include_list, self.table_exclude_list)

    def identity(self, database_guid: str, database: str) -> OffsetIdentity:
        return OffsetIdentity(self.topic_prefix, database_guid, database, None)

    # -- setup -----------------------------------------------------------------------------------

    def setup(self, log: logging.Logger) -> dict[str, Any]:
        """Preflight: every problem in one error, each with its fix. SQL Server's CDC objects are
        the DBA's (``sys.sp_cdc_enable_db`` / ``sp_cdc_enable_table``): nothing is created."""
        from airflow.sdk.exceptions import AirflowNotFoundException

        from airflow_provider_cdc.cdc.sources.sqlserver import admin, health, server_clock

        problems = self.setup_problems()
        hook = self.hook()
        conn = None
        with problems.check():  # a connection without a database, a refused login: nothing else can be checked
            try:
                conn = hook.get_conn()
            except CdcConfigurationError as exc:
                if repr(self.sqlserver_conn_id) in str(exc):
                    raise
                raise type(exc)(f"Airflow connection {self.sqlserver_conn_id!r} cannot be used: {exc}") from None
            except AirflowNotFoundException as exc:  # a typo in sqlserver_conn_id: retrying cannot help
                raise CdcConfigurationError(
                    f"{exc}: create the Airflow connection {self.sqlserver_conn_id!r} (type mssql: host, port, "
                    "schema = the database, login, password), or fix sqlserver_conn_id"
                ) from None
        if conn is None:
            problems.raise_if_any()
        if conn is None:  # raise_if_any above reports why it could not connect
            raise RuntimeError("setup's preflight found no problem but has no connection")
        try:
            server = admin.server_info(conn)
            problems.add(
                admin.check_server(server, needs_snapshot_isolation=self.snapshot_isolation_mode == "snapshot"),
                heading="the database cannot be captured",
            )
            tables: tuple[TableRef, ...] = ()
            with problems.check():
                tables = self.resolve_tables(conn)
            found, table_problems = admin.describe_tables(conn, tables, cdc_enabled=server.cdc_enabled)
            problems.add(table_problems, heading="captured tables are not ready")
            self.check_column_rules(problems, found.values(), _encoder)
            problems.add(
                admin.check_table_access(conn, tables) + admin.check_change_access(conn, list(found.values())),
                heading="missing permissions",
            )
            problems.add(admin.check_command_ids(conn, list(found.values())), heading="captured tables are not ready")
            problems.add(admin.check_agent(conn), heading="the capture job is not running")
            # Not a problem: a capture never needs the retention (it detects purges by min LSN); only the
            # health operator reads it, so the grant is named here without failing setup.
            retention_warning = health.retention_access_warning(conn)
            if retention_warning is not None:
                log.warning("capture %s: %s", self.topic_prefix, retention_warning)
            with problems.check():  # commit times are the server's local time: read them in its zone
                server_clock.check_server_zone(conn, self.server_time_zone)
            signal = self.signal_table_ref
            if signal is not None:
                described, signal_problems = admin.describe_tables(conn, [signal], cdc_enabled=server.cdc_enabled)
                if signal in described:
                    signal_problems = admin.check_signal_table(conn, described[signal], self.incremental_watermarks)
                problems.add(signal_problems, heading="the signal table cannot be used")
            # Without the database's GUID there is no identity to compare (check_server reports it).
            guid = server.database_guid
            stored = self.check_stored_offset(problems, None if guid is None else self.identity(guid, server.database))
            instances_matter = server.cdc_enabled and self.snapshot_mode in ("initial", "never")
            if stored is not None and stored.lsn is not None and instances_matter:
                with problems.check():
                    _check_instances_kept(conn, stored, tables, self.store().describe(self.topic_prefix))
        finally:
            conn.close()
        problems.raise_if_any()
        log.info(
            "capture %s ready: database %s, %d table(s) with capture instances %s",
            self.topic_prefix,
            server.database,
            len(found),
            ", ".join(i.name for t in found.values() for i in t.instances),
        )
        return {
            **self.describe(),
            "database": server.database,
            "server_version": server.version,
            "capture_instances": {ref.data_collection: [i.name for i in t.instances] for ref, t in found.items()},
            "key_columns": {ref.data_collection: list(t.key_columns) for ref, t in found.items()},
            "retention_readable": retention_warning is None,
        }

    # -- runs ------------------------------------------------------------------------------------

    @contextmanager
    def open_run(self, log: logging.Logger) -> Iterator[SqlServerRun]:
        from airflow_provider_cdc.cdc.sources.sqlserver import admin, server_clock

        hook = self.hook()
        with hook.capture_lock(self.topic_prefix) as conn:
            server = admin.server_info(conn)
            # Every run: a zone that matched at setup can stop matching (the server moved, a DST rule).
            server_clock.check_server_zone(conn, self.server_time_zone)
            run = SqlServerRun(self, hook, conn, self.identity(server.require_guid(), server.database))
            run.tables = self.resolve_tables(conn)
            yield run


@dataclass(frozen=True)
class SqlServerStatus:
    """Where the capture job and the cleanup job stand: the newest commit captured, and for each
    captured table its capture instances with the oldest change each still holds (None: gone)."""

    max_lsn: SqlServerLsn | None
    instances: dict[TableRef, dict[str, SqlServerLsn | None]]


def changes_lost(
    status: SqlServerStatus, tables: Sequence[TableRef], offset: CaptureOffset | None
) -> tuple[str, str] | None:
    """``(gap reason, why)`` when some captured table's changes after the offset can no longer be
    read: no capture instance left, or none whose oldest change reaches back to the offset (the
    cleanup job purged them, or the instance that held them was disabled before a newer one took
    over). Dropping the old instance after a schema change, once the new one covers the offset,
    loses nothing."""
    if offset is None or offset.lsn is None:
        return None
    starts = _known_starts(offset)
    for ref in tables:
        held = {name: oldest for name, oldest in status.instances.get(ref, {}).items() if oldest is not None}
        if any(starts.get(name) == str(oldest) for name, oldest in held.items()):
            continue  # an instance the capture knew is where it started: nothing purged since
        if not held:
            return (
                "instance_missing",
                f"table {ref.quoted(SQLSERVER_NAMES)} has no capture instance any more (CDC was disabled on it): its "
                f"changes after {offset.lsn} are gone",
            )
        reach = min(held.values())
        if reach > offset.lsn:
            return (
                "changes_purged",
                f"the oldest change any capture instance of {ref.quoted(SQLSERVER_NAMES)} still holds is {reach} "
                f"({', '.join(sorted(held))}), past the stored offset {offset.lsn}: the cleanup job purged the changes "
                "in between, or the instance that held them was disabled before a newer one took over",
            )
    return None


class SqlServerRun(SourceRun):
    """One run's session with SQL Server, on the connection holding the capture lock."""

    capture: SqlServerCapture
    hook: SqlServerCdcHook

    def __init__(self, capture: SqlServerCapture, hook: SqlServerCdcHook, conn: Any, identity: OffsetIdentity):
        super().__init__(capture, hook, conn, identity)
        self._status: SqlServerStatus | None = None

    def status(self) -> SqlServerStatus:
        from airflow_provider_cdc.cdc.sources.sqlserver import admin

        instances = admin.capture_instances(self.conn)
        return SqlServerStatus(
            admin.max_lsn(self.conn),
            {ref: {i.name: admin.min_lsn(self.conn, i.name) for i in instances.get(ref, ())} for ref in self.tables},
        )

    def unavailable(self, offset: CaptureOffset | None, status: SqlServerStatus) -> tuple[str, str] | None:
        """Changes after the offset that the cleanup job purged, or whose instance was disabled."""
        return changes_lost(status, _snapshotted(offset, self.tables), offset)

    def prepare_snapshot(self, decision: SnapshotDecision, status: SqlServerStatus) -> None:
        """Nothing to create: the snapshot is positioned by the capture job's newest LSN."""

    def gap(
        self, decision: SnapshotDecision, offset: CaptureOffset | None, status: SqlServerStatus, now_ms: int
    ) -> CaptureGap:
        return CaptureGap.of(decision, offset, now_ms)

    def plan_stream(
        self, offset: CaptureOffset | None, requested: Any, now_ms: int, *, until: datetime | None = None
    ) -> StreamPlan:
        from airflow_provider_cdc.cdc.sources.sqlserver import admin
        from airflow_provider_cdc.cdc.sources.sqlserver.change_queries import ChangesPurgedError

        newest = admin.max_lsn(self.conn)
        current = SqlServerLsn(0) if newest is None else newest.next()  # windows end before their `to`
        notes: list[str] = []
        start = core.stream_start(
            self.capture.snapshot_mode,
            offset,
            self.identity,
            offset_type=SqlServerOffset,
            start=current,
            start_name="after the capture job's newest LSN",
        ).note_into(notes)
        lost = self.unavailable(start, self.status())
        if lost is not None:
            raise ChangesPurgedError(
                f"capture {self.capture.topic_prefix!r} cannot continue from {start.lsn}: {lost[1]}. Re-snapshot "
                "(snapshot_mode='when_needed' records the gap and re-snapshots), and raise the cleanup job's "
                "retention (sys.sp_cdc_change_job @job_type = N'cleanup', @retention = <minutes>)"
            )
        if until is not None:
            target = self._end_before(until, start.lsn)
        else:
            target = SqlServerLsn(requested) if requested is not None else current
        window, planned = core.plan_window(
            start, target=target, current=current, now_ms=now_ms, notes=notes, current_name="capture job's position"
        )
        self._newest = newest
        return StreamPlan(window, planned, None, tuple(notes))

    def _end_before(self, until: datetime, start: Any) -> SqlServerLsn:
        """The window end that takes exactly the commits before ``until``: after the last commit whose
        ``tran_end_time`` is before it (``sys.fn_cdc_map_time_to_lsn('largest less than', ...)``, in the
        server's local time), never before the window's start."""
        from airflow_provider_cdc.cdc.sources.sqlserver import admin, server_clock

        zone = server_clock.zone_of(self.capture.server_time_zone)
        local = server_clock.local_time(until, zone)
        hour = server_clock.repeated_hour(local, zone)
        # In a repeated hour (clocks going back) a local time names two instants: compare instants,
        # from the commits of that hour in commit order, and take the last commit before the hour.
        last = admin.map_time_to_lsn(self.conn, "largest less than", local if hour is None else hour[0])
        in_hour = server_clock.last_commit_before(self.conn, zone, until)
        if in_hour is not None:
            last = max(SqlServerLsn(in_hour), last) if last is not None else SqlServerLsn(in_hour)
        end = SqlServerLsn(0) if last is None else last.next()
        return max(end, SqlServerLsn(start))

    def heartbeat(self, query: str) -> None:
        cursor = self.conn.cursor()
        try:
            cursor.execute(query)
        finally:
            cursor.close()

    def acknowledge(self, position: Any, saved: CaptureOffset | None = None) -> None:
        """SQL Server has no reader position to move: the change rows stay until the cleanup job."""
        return None

    def check_restored(self, offset: CaptureOffset) -> None:
        """SQL Server keeps no reader position to compare a restored offset with: the change tables
        are read from the offset's LSN (docs/reliability.md, what the sink's writers are trusted with)."""

    def finish_landed(self, offset: CaptureOffset | None) -> None:
        """Nothing to bring up to date on the server."""

    def window_detail(self, window: Window, status: Any) -> str:
        newest = getattr(self, "_newest", None)
        return f"; the capture job is at {newest}" if newest is not None else "; the capture job has no changes yet"

    def lag(self) -> int | None:
        return None  # SQL Server has no byte measure of unread changes; the health check reports retention

    def job_spec(
        self,
        window: Window,
        offset: CaptureOffset | None,
        *,
        run: dict[str, Any] | None,
        checkpoint: dict[str, Any] | None,
        gap: CaptureGap | None = None,
    ) -> SqlServerJobSpec:
        capture = self.capture
        return SqlServerJobSpec(
            **common_spec_fields(self, window, offset, run=run, checkpoint=checkpoint, gap=gap),
            connection=self.hook.connection_info,
            incremental_watermark_wait_seconds=float(capture.incremental_watermark_wait_seconds),
            data_query_mode=capture.data_query_mode,
            snapshot_isolation_mode=capture.snapshot_isolation_mode,
            server_time_zone=capture.server_time_zone,
            known_instances=tuple(_known_instances(offset)) if window.kind == "stream" else (),
            known_starts=_known_starts(offset) if window.kind == "stream" else {},
        )


def _encoder(table: Any, columns: Any, settings: Any) -> Any:
    """The event encoder, its errors naming the table as SQL Server writes it."""
    from airflow_provider_cdc.cdc.sources.sqlserver.events import TableEncoder

    try:
        return TableEncoder(table, columns, settings)
    except CdcConfigurationError as exc:
        raise type(exc)(str(exc).replace(str(table.ref), table.ref.quoted(SQLSERVER_NAMES))) from None


def _check_instances_kept(conn: Any, stored: CaptureOffset, tables: Sequence[TableRef], where: str) -> None:
    """Setup: no capture instance the offset names is gone while a table has no instance holding its
    changes since the offset (a successor that took over before it is a schema change, not a hole)."""
    from airflow_provider_cdc.cdc.sources.sqlserver import admin

    current = admin.capture_instances(conn)
    names = {i.name for listed in current.values() for i in listed}
    gone = [name for name in _known_instances(stored) if name not in names]
    uncovered = [
        ref
        for ref in tables
        if not any(i.start_lsn is not None and i.start_lsn <= stored.lsn for i in current.get(ref, ()))
    ]
    if gone and uncovered:
        raise CdcConfigurationError(
            f"{where}: capture instance(s) {', '.join(map(repr, gone))} that this capture reads "
            "were disabled (sys.sp_cdc_disable_table) after it started: the changes made since "
            "were not recorded and cannot be read. Enable CDC on the table again, then "
            "re-snapshot: run with snapshot_mode='when_needed' (it records the gap and snapshots "
            "again)"
        )


def _snapshotted(offset: CaptureOffset | None, tables: Sequence[TableRef]) -> list[TableRef]:
    """The captured tables whose history the capture holds (those its snapshot covered)."""
    if offset is None:
        return []
    covered = offset.extra.get("tables")
    return list(tables) if covered is None else [r for r in tables if r.to_json() in covered]


def _known_starts(offset: CaptureOffset | None) -> dict[str, str]:
    """Each known instance's start_lsn when a window first saw it."""
    if offset is None:
        return {}
    return dict((offset.extra.get("source_state") or {}).get("starts") or {})


def _known_instances(offset: CaptureOffset | None) -> list[str]:
    if offset is None:
        return []
    return list((offset.extra.get("source_state") or {}).get("instances") or ())


__all__ = ["SqlServerCapture", "SqlServerRun"]
