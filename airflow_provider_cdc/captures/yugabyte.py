"""A YugabyteDB capture (logical replication, ``yboutput``): the PostgreSQL capture with YugabyteDB's
differences.

``YugabyteCapture`` is what DAG authors write; :class:`YugabyteRun` is one run's session. What
differs from PostgreSQL (docs/yugabytedb.md): a window ends at a hybrid time read at run start
and a fence row committed after it; the slot is acknowledged on a replication connection after
the offset is saved; a snapshot re-creates the slot (``USE_SNAPSHOT``) and reads at its consistent
hybrid time; the slot expires when it is not read for ``intent_retention_ms``; there are no
logical messages and no truncates.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_provider_cdc._lazy import lazy_module
from airflow_provider_cdc.captures.postgres import PostgresCapture, spec_fields
from airflow_provider_cdc.captures.source_run import SourceRun
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcStateError, PublicationError
from airflow_provider_cdc.cdc.basics.readiness import Readiness
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.planning.gaps import CaptureGap
from airflow_provider_cdc.cdc.planning.offset import CaptureOffset, OffsetIdentity
from airflow_provider_cdc.cdc.planning.plan import SnapshotDecision, StreamPlan, uncorroborated_position
from airflow_provider_cdc.cdc.sources.yugabyte import LSN_TYPES
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn, ht_from_datetime
from airflow_provider_cdc.cdc.sources.yugabyte.offset import YugabyteOffset
from airflow_provider_cdc.offsets.base import peek_offset
from airflow_provider_cdc.utils.times import now_ms, utc_time

if TYPE_CHECKING:
    from airflow_provider_cdc.cdc.sources.postgres import admin as pg_admin
    from airflow_provider_cdc.cdc.sources.yugabyte import admin, planning, publications
    from airflow_provider_cdc.cdc.sources.yugabyte.spec import YugabyteJobSpec
    from airflow_provider_cdc.hooks.yugabyte_cdc import YugabyteCdcHook
else:  # the engine (pyarrow, numpy, psycopg) loads when a task uses it, not when a DAG file is parsed
    pg_admin = lazy_module("airflow_provider_cdc.cdc.sources.postgres.admin")
    admin = lazy_module("airflow_provider_cdc.cdc.sources.yugabyte.admin")
    planning = lazy_module("airflow_provider_cdc.cdc.sources.yugabyte.planning")
    publications = lazy_module("airflow_provider_cdc.cdc.sources.yugabyte.publications")

log = logging.getLogger(__name__)

# Schema-qualified: capture sessions run with search_path = pg_catalog, pg_temp, so an unqualified
# name would resolve nowhere else (and a name another role could place earlier is never looked up).
_PROCEDURE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$]*$")
#: YugabyteDB's default cdc_intent_retention_ms (8 h since v2024.2.1; 4 h before).
DEFAULT_INTENT_RETENTION_MS = 8 * 3600 * 1000


def check_ysql_conn_id(capture: PostgresCapture, hint: str = "") -> None:
    """A YugabyteDB capture's YSQL connection: ``yugabytedb_conn_id``, or the same id as
    ``postgres_conn_id`` (the PostgreSQL capture's name for it), which then holds it."""
    ysql = capture.yugabytedb_conn_id  # type: ignore[attr-defined]
    if ysql and capture.postgres_conn_id and ysql != capture.postgres_conn_id:
        raise CdcConfigurationError("give yugabytedb_conn_id or postgres_conn_id, not both")
    capture.postgres_conn_id = capture.postgres_conn_id or ysql
    if not capture.postgres_conn_id:
        raise CdcConfigurationError(f"yugabytedb_conn_id is required{hint}")


def check_intent_retention(value: Any) -> None:
    """``intent_retention_ms``: YugabyteDB's cdc_intent_retention_ms, a whole number of milliseconds."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 60_000:
        raise CdcConfigurationError(
            f"intent_retention_ms must be YugabyteDB's cdc_intent_retention_ms in milliseconds (at least "
            f"60000), got {value!r}"
        )


def trigger_wait(capture: Any, sensor: Any) -> tuple[str | None, float, int | None]:
    """What a YugabyteDB trigger waits with: the sensor's ``wait_until`` (ISO, UTC), its poke
    interval, and when the slot or stream expires (from the stored offset's last read)."""
    until = utc_time(sensor.wait_until, sensor.task_id)
    offset = peek_offset(capture.store(), capture.topic_prefix, capture.OFFSET_TYPE)
    expires = planning.expiry_ms(offset, capture.intent_retention_ms)
    return None if until is None else until.isoformat(), float(sensor.poke_interval), expires


@dataclass
class YugabyteCapture(PostgresCapture):
    """Configuration of one YugabyteDB capture. See docs/yugabytedb.md for every field."""

    OFFSET_TYPE: ClassVar[type[CaptureOffset]] = YugabyteOffset
    LANDS_MESSAGES: ClassVar[bool] = False  # YugabyteDB does not deliver logical messages
    SOURCE_NAME = "YugabyteDB"
    DEFAULT_WATERMARKS: ClassVar[str] = "insert_insert"

    postgres_conn_id: str = ""
    # The Airflow connection (type postgres) of a YSQL endpoint; the same as postgres_conn_id.
    yugabytedb_conn_id: str = ""
    # The slot's LSN type: HYBRID_TIME (a commit's position is its commit hybrid time).
    lsn_type: str = "HYBRID_TIME"
    # Published, never captured: one fence row per window ends the window's read.
    heartbeat_table: str = "public.airflow_cdc_heartbeat"
    # Where the capture lock lives when the server has no advisory locks (before v2025.1).
    lock_table: str = "public.airflow_cdc_locks"
    # YugabyteDB's cdc_intent_retention_ms: a slot not read for this long expires.
    intent_retention_ms: int = DEFAULT_INTENT_RETENTION_MS
    # YugabyteDB's cdcsdk_tablet_not_of_interest_timeout_secs: a table a slot has not polled this long
    # after its creation loses its history, so a snapshot (which precedes the first poll) must end sooner.
    tablet_not_of_interest_timeout_seconds: int = 14_400
    # A SECURITY DEFINER procedure that sets yb_read_time, for a role that may not set it itself.
    read_time_procedure: str | None = None
    # How long to wait for YugabyteDB to consider the slot inactive before dropping it.
    slot_drop_timeout_seconds: float = 360.0
    # How long the acknowledgement may stream before it confirms what it has seen.
    acknowledge_timeout_seconds: float = 120.0
    incremental_watermarks: str = "insert_insert"
    # PostgreSQL's logical_decoding_work_mem: YugabyteDB sizes its reorder buffer by its own settings
    # (yb_reorderbuffer_max_changes_in_memory), so the capture does not set it there.
    decoding_work_mem_bytes: int | None = None

    def validate_source(self) -> None:
        check_ysql_conn_id(self)
        if self.decoding_work_mem_bytes is not None:
            raise CdcConfigurationError(
                "decoding_work_mem_bytes raises PostgreSQL's logical_decoding_work_mem, which this capture does "
                "not set on YugabyteDB (its reorder buffer has its own settings, such as "
                "yb_reorderbuffer_max_changes_in_memory): leave it unset"
            )
        if self.lsn_type not in LSN_TYPES:
            raise CdcConfigurationError(f"lsn_type {self.lsn_type!r} is not one of {', '.join(LSN_TYPES)}")
        if self.message_prefix_include_list or self.message_prefix_exclude_list:
            raise CdcConfigurationError(
                "message_prefix_include_list / message_prefix_exclude_list: YugabyteDB never streams logical "
                "messages (pg_logical_emit_message writes only the local PostgreSQL WAL)"
            )
        for name in ("heartbeat_table", "lock_table"):
            try:
                TableRef.parse(getattr(self, name), self.NAMES)
            except CdcConfigurationError as exc:
                raise CdcConfigurationError(f"{name} {getattr(self, name)!r} is invalid: {exc}") from None
        check_intent_retention(self.intent_retention_ms)
        timeout = self.tablet_not_of_interest_timeout_seconds
        if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 60:
            raise CdcConfigurationError(
                "tablet_not_of_interest_timeout_seconds must be YugabyteDB's "
                f"cdcsdk_tablet_not_of_interest_timeout_secs (at least 60), got {timeout!r}"
            )
        if self.read_time_procedure is not None and not _PROCEDURE.match(self.read_time_procedure):
            raise CdcConfigurationError(
                f"read_time_procedure {self.read_time_procedure!r} must be a schema-qualified procedure name "
                "(e.g. 'cdc.set_yb_read_time'): capture sessions look names up in pg_catalog only"
            )
        super().validate_source()

    @property
    def heartbeat_table_ref(self) -> TableRef:
        return TableRef.parse(self.heartbeat_table, self.NAMES)

    @property
    def lock_table_ref(self) -> TableRef:
        return TableRef.parse(self.lock_table, self.NAMES)

    def position(self, text: str) -> YbLsn:
        return YbLsn(text)

    def hook(self) -> YugabyteCdcHook:
        from airflow_provider_cdc.hooks.yugabyte_cdc import YugabyteCdcHook

        return YugabyteCdcHook(self.postgres_conn_id)

    def retention_ms(self) -> int | None:
        return self.intent_retention_ms

    def incremental_unavailable(self) -> str | None:
        return (
            "incremental snapshots are not available on YugabyteDB yet (its transaction ids are per-slot "
            "counters, so in-flight transactions cannot be told from a chunk read); run a full snapshot "
            "(snapshot_mode='always' once) or set new_table_snapshot='fail'"
        )

    def readiness(self, sensor: Any, context: Any) -> Readiness:
        """The server's hybrid time has passed the sensor's ``wait_until`` and the slot can deliver
        (YugabyteDB cannot peek at a slot, so pending changes are not counted)."""
        from airflow_provider_cdc.cdc.sources.yugabyte.pending import slot_readiness

        if getattr(sensor, "require_captured_change", False):
            raise CdcConfigurationError(
                "require_captured_change is not available on YugabyteDB: pending changes cannot be peeked "
                "without consuming the slot"
            )
        status = self.hook().yb_slot_status(self.resolved_slot_name)
        offset = peek_offset(self.store(), self.topic_prefix, self.OFFSET_TYPE)
        return slot_readiness(
            status,
            self.resolved_slot_name,
            wait_until=utc_time(sensor.wait_until, sensor.task_id),
            expires_ms=planning.expiry_ms(offset, self.intent_retention_ms),
            now_ms=now_ms(),
        )

    def readiness_trigger(self, sensor: Any, context: Any) -> Any:
        from airflow_provider_cdc.triggers.yugabyte_cdc import YugabyteCdcChangesTrigger

        return YugabyteCdcChangesTrigger(self.postgres_conn_id, self.resolved_slot_name, *trigger_wait(self, sensor))

    def identity(self, system_identifier: str, database: str) -> OffsetIdentity:
        return OffsetIdentity(self.topic_prefix, system_identifier, database, self.resolved_slot_name)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "lsn_type": self.lsn_type, "heartbeat_table": self.heartbeat_table}

    # -- setup -----------------------------------------------------------------------------------

    def setup(self, log: logging.Logger) -> dict[str, Any]:
        """Preflight, then idempotent creation of the heartbeat table and the publication (the slot
        is created by the snapshot, which needs it fresh; with snapshot_mode='never', here)."""
        from airflow_provider_cdc.offsets.base import load_offset

        hook = self.hook()
        server, tables, published = self._yb_preflight(hook)
        load_offset(self.store(), self.topic_prefix, self.OFFSET_TYPE)  # a state-table store creates its table
        with hook.session() as conn:
            slot = admin.slot_status(conn, self.resolved_slot_name)
            # What would join the publication while the slot exists, the slot cannot stream
            # (publications.py): refused before anything is changed, so a retried setup refuses too.
            # The snapshot adds it (prepare_snapshot) right before it creates a new slot.
            late = [] if slot is None else self._unpublished(conn, published)
            if late and self.snapshot_mode != "always":  # 'always' replaces the slot in this run's snapshot
                raise publications.late_tables_error(
                    self.resolved_slot_name, self.resolved_publication_name, late, never=self.snapshot_mode == "never"
                )
            admin.ensure_heartbeat_table(conn, self.heartbeat_table_ref)
        publication = hook.ensure_publication(
            self.resolved_publication_name, published, self.publication_autocreate_mode
        )
        slot_created = False
        if self.snapshot_mode == "never" and slot is None:
            # Everything is published before the slot exists.
            admin.create_slot(hook.connection_info, self.resolved_slot_name, self.lsn_type)
            slot_created = True
        log.info(
            "capture %s ready: publication %r %s, heartbeat table %s, %d table(s)",
            self.topic_prefix,
            self.resolved_publication_name,
            publication,
            self.heartbeat_table_ref,
            len(tables),
        )
        return {
            **self.describe(),
            "publication_action": publication,
            "slot_created": slot_created,
            "server_version": server.version_num,
            "key_columns": {ref.data_collection: list(t.key_columns) for ref, t in tables.items()},
        }

    def _unpublished(self, conn: Any, refs: list[TableRef]) -> list[TableRef]:
        """The tables of ``refs`` not in the capture's publication now (a heartbeat table not created yet
        counts: under FOR ALL TABLES it joins when created)."""
        existing = pg_admin.publication_tables(conn, self.resolved_publication_name)
        heartbeat = self.heartbeat_table_ref
        missing = [] if existing is None or existing[0] else [r for r in refs if r not in existing[1]]
        if heartbeat not in missing and not admin.table_exists(conn, heartbeat):
            missing.append(heartbeat)
        return missing if existing is not None else list(refs)

    def _yb_preflight(self, hook: YugabyteCdcHook) -> tuple[pg_admin.ServerInfo, dict, list[TableRef]]:
        problems = self.setup_problems()
        described: dict = {}
        server = None
        with hook.session() as conn:
            with problems.check():
                server = admin.server_info(conn, hook.connection_info)
                problems.add(admin.check_server(server), heading="the server cannot do logical capture")
            tables: tuple[TableRef, ...] = ()
            with problems.check():
                tables = self.resolve_tables(conn)
            described, catalog_problems = pg_admin.find_tables(conn, list(tables))
            for error, message in catalog_problems:
                problems.add([message], error)
            problems.add(admin.check_tables(conn, list(described.values())), heading="captured tables are not ready")
            slot = admin.slot_status(conn, self.resolved_slot_name)
            if slot is not None and server is not None:
                problems.add(admin.slot_problems(slot, server.database, self.lsn_type))
        from airflow_provider_cdc.cdc.sources.postgres.events import TableEncoder

        self.check_column_rules(problems, described.values(), TableEncoder)
        published = [*tables, self.heartbeat_table_ref]
        self.check_stored_offset(
            problems, None if server is None else self.identity(server.system_identifier, server.database)
        )
        existing = [r for r in tables if r in described]
        if existing:
            problems.add(
                hook.publication_problems(self.resolved_publication_name, existing, self.publication_autocreate_mode),
                PublicationError,
            )
        problems.raise_if_any()
        if server is None:  # raise_if_any above reports why it could not be read
            raise RuntimeError("setup's preflight found no problem but read no server information")
        return server, described, published

    # -- runs ------------------------------------------------------------------------------------

    @contextmanager
    def open_run(self, log: logging.Logger) -> Iterator[YugabyteRun]:
        hook = self.hook()
        with admin.locked_session(hook, self.topic_prefix, self.lock_table_ref) as conn:
            server = admin.server_info(conn, hook.connection_info)
            run = YugabyteRun(self, hook, conn, self.identity(server.system_identifier, server.database))
            run.tables = self.resolve_tables(conn)
            yield run


class YugabyteRun(SourceRun):
    """One run's session with YugabyteDB, on the connection holding the capture lock."""

    capture: YugabyteCapture
    hook: YugabyteCdcHook

    def __init__(self, capture: YugabyteCapture, hook: YugabyteCdcHook, conn: Any, identity: OffsetIdentity):
        super().__init__(capture, hook, conn, identity)
        self._snapshot_ht: int | None = None
        self._snapshot_end: int | None = None
        self._slot_before: admin.YbSlotStatus | None = None

    @property
    def slot_name(self) -> str:
        return self.capture.resolved_slot_name

    def status(self) -> admin.YbSlotStatus | None:
        return admin.slot_status(self.conn, self.slot_name)

    def unavailable(self, offset: CaptureOffset | None, status: admin.YbSlotStatus | None) -> tuple[str, str] | None:
        return planning.slot_unavailable(offset, status, retention_ms=self.capture.intent_retention_ms, now_ms=now_ms())

    def prepare_snapshot(self, decision: SnapshotDecision, status: admin.YbSlotStatus | None) -> None:
        """A fresh slot for every snapshot: YugabyteDB keeps the history a read at the slot's
        consistent point needs only for a slot created with USE_SNAPSHOT, and the snapshot covers
        every change the old slot still held."""
        capture = self.capture
        publication = capture.resolved_publication_name
        # The new slot streams what is published when it is created (publications.py): a table that
        # joined the capture since setup, or a new heartbeat table, is published first.
        admin.ensure_heartbeat_table(self.conn, capture.heartbeat_table_ref)
        self.hook.ensure_publication(publication, self._needed(), capture.publication_autocreate_mode)
        existing = pg_admin.publication_tables(self.conn, publication)
        published = None if existing is None else (set(self._needed()) if existing[0] else existing[1])
        problems = publications.check_before_slot(published, self._needed(), publication)
        if problems:  # before the old slot is dropped
            raise PublicationError(problems[0])
        if status is not None:
            log.warning("dropping slot %r to snapshot at a new one's consistent point", self.slot_name)
            admin.drop_slot(self.conn, self.slot_name, timeout=capture.slot_drop_timeout_seconds)
        _, self._snapshot_ht, point = admin.create_slot(self.hook.connection_info, self.slot_name, capture.lsn_type)
        # Not read before the snapshot is read: YugabyteDB's first poll of a slot may move its restart
        # time, and with it the history retention, past the snapshot's read time
        # (cdcsdk_virtual_wal.cc UpdateRestartTimeIfRequired: last_restart_lsn_read_time_ starts unset).
        # The first window must come within cdcsdk_tablet_not_of_interest_timeout_secs instead
        # (the snapshot records when: planning.not_of_interest_why).
        # Where the stream continues: after the consistent hybrid time, or after a SEQUENCE slot's
        # consistent point (the slot reports it as confirmed; its first commit comes later).
        self._snapshot_end = (point if capture.lsn_type == "SEQUENCE" else self._snapshot_ht) + 1
        log.warning("created replication slot %r at hybrid time %d", self.slot_name, self._snapshot_ht)

    def gap(
        self, decision: SnapshotDecision, offset: CaptureOffset | None, status: admin.YbSlotStatus | None, now_ms: int
    ) -> CaptureGap:
        confirmed = None if status is None else status.confirmed_flush_lsn
        return CaptureGap.of(decision, offset, now_ms, slot_confirmed_lsn=confirmed)

    def plan_stream(
        self, offset: CaptureOffset | None, requested: Any, now_ms: int, *, until: datetime | None = None
    ) -> StreamPlan:
        capture = self.capture
        slot = admin.require_slot(self.conn, self.slot_name, self.identity.database, capture.lsn_type)
        self._slot_before = slot
        late = publications.late_tables(publications.slot_record(offset), slot.stream_id, self._needed())
        if late:
            raise publications.late_tables_error(
                self.slot_name, capture.resolved_publication_name, late, never=capture.snapshot_mode == "never"
            )
        if capture.lsn_type == "SEQUENCE":
            return self._with_slot_record(self._plan_sequence_window(offset, slot, requested, now_ms, until), slot)
        current = int(slot.current_ht)
        if until is not None:
            # The commits before ``until``: hybrid times below its own.
            end = ht_from_datetime(until if until.tzinfo else until.replace(tzinfo=timezone.utc)) - 1
            if end > current:
                raise CdcConfigurationError(f"upto_time {until.isoformat()} is in the future of the server's clock")
        elif requested is not None:
            end = int(requested) - 1  # upto_lsn is the window's exclusive end, like every source
        else:
            end = current
        plan = planning.plan_stream_window(
            mode=capture.snapshot_mode,
            offset=offset,  # type: ignore[arg-type]
            slot=slot,
            identity=self.identity,
            end=end,
            current=current,
            now_ms=now_ms,
            retention_ms=capture.intent_retention_ms,
            clamp=until is not None,
        )
        # A commit after the end, so the window's reader stops (YugabyteDB's walsender never says
        # it has caught up). A retry's window ended earlier: this row is after its end too.
        admin.write_fence(self.conn, capture.heartbeat_table_ref, capture.topic_prefix, plan.window.window_id)
        return self._with_slot_record(plan, slot)

    def _needed(self) -> list[TableRef]:
        return publications.needed(self.tables, self.capture.heartbeat_table_ref)

    def _with_slot_record(self, plan: StreamPlan, slot: admin.YbSlotStatus) -> StreamPlan:
        """The plan's offset remembers what was published when this capture first read the slot, so a
        table added to the publication later is refused (publications.py)."""
        record = publications.slot_record(plan.offset)
        if record is not None and record.get("stream_id") == slot.stream_id:
            return plan
        existing = pg_admin.publication_tables(self.conn, self.capture.resolved_publication_name)
        needed = self._needed()
        published = [] if existing is None else [r for r in needed if existing[0] or r in existing[1]]
        record = publications.record_for(slot.stream_id, published)
        offset = replace(plan.offset, extra={**plan.offset.extra, publications.SLOT_KEY: record})
        return replace(plan, offset=offset)

    def _plan_sequence_window(
        self, offset: CaptureOffset | None, slot: admin.YbSlotStatus, requested: Any, now_ms: int, until: Any
    ) -> StreamPlan:
        """A SEQUENCE slot's LSNs are counters: the window ends before the transaction that wrote its
        fence row, found by streaming to it (a retry reuses the pending window and reads nothing)."""
        capture = self.capture
        if until is not None:
            raise CdcConfigurationError(
                "upto_time needs HYBRID_TIME slots (a SEQUENCE slot's positions are not times); use upto_lsn "
                "or lsn_type='HYBRID_TIME'"
            )
        plan = planning.plan_stream_window(
            mode=capture.snapshot_mode,
            offset=offset,  # type: ignore[arg-type]
            slot=slot,
            identity=self.identity,
            end=admin.MAX_POSITION - 1,
            current=admin.MAX_POSITION - 1,
            now_ms=now_ms,
            retention_ms=capture.intent_retention_ms,
        )
        if offset is not None and plan.window == offset.pending:
            return plan  # a retry: the same window, found when it was first planned
        window = plan.window
        if window.from_lsn is None:
            raise CdcStateError(f"planned {window.describe()} has no start position")
        if requested is not None:
            end = max(int(requested), int(window.from_lsn))
        else:
            admin.write_fence(self.conn, capture.heartbeat_table_ref, capture.topic_prefix, window.window_id)
            end = admin.find_fence(
                self.hook.connection_info,
                self.slot_name,
                capture.resolved_publication_name,
                int(window.from_lsn),
                capture.heartbeat_table_ref,
                window.window_id,
                timeout=capture.acknowledge_timeout_seconds,
            )
        window = replace(window, to_lsn=YbLsn(end))
        return replace(plan, window=window, offset=plan.offset.with_pending(window))

    def heartbeat(self, query: str) -> None:
        pg_admin.run_heartbeat(self.conn, query)

    def acknowledge(self, position: Any, saved: CaptureOffset | None = None) -> YbLsn | None:
        flush = planning.acknowledged(int(position))
        slot = self.status()
        if slot is None:
            return None
        if slot.confirmed_flush_lsn is not None and slot.confirmed_flush_lsn >= flush:
            return slot.confirmed_flush_lsn
        hybrid = self.capture.lsn_type == "HYBRID_TIME"
        if hybrid and slot.restart_commit_ht is not None and slot.restart_commit_ht >= flush:
            # Nothing committed at or before ``flush`` is unacknowledged (a snapshot's window ends
            # at the new slot's consistent point): streaming would only wait for the timeout.
            return slot.confirmed_flush_lsn
        admin.acknowledge(
            self.hook.connection_info,
            self.slot_name,
            self.capture.resolved_publication_name,
            flush,
            timeout=self.capture.acknowledge_timeout_seconds,
        )
        after = self.status()
        return None if after is None else after.confirmed_flush_lsn

    def check_restored(self, offset: CaptureOffset) -> None:
        slot = self.status()
        if offset.lsn is None or slot is None:
            return
        confirmed = slot.confirmed_flush_lsn
        flush = planning.acknowledged(int(offset.lsn))
        caught_up = (confirmed is not None and confirmed >= flush) or (
            self.capture.lsn_type == "HYBRID_TIME"
            and slot.restart_commit_ht is not None
            and slot.restart_commit_ht >= flush
        )
        if not caught_up:
            raise uncorroborated_position(
                f"replication slot {self.slot_name!r}",
                confirmed,
                offset,
                "acknowledge it up to there over the replication protocol, or set the offset to the slot's position",
            )

    def finish_landed(self, offset: CaptureOffset | None) -> None:
        slot = self.status()
        if slot is not None and offset is not None:
            planning.check_slot_not_ahead(slot, offset)
        if offset is not None and offset.lsn is not None and slot is not None:
            confirmed = slot.confirmed_flush_lsn
            if confirmed is None or confirmed < planning.acknowledged(offset.lsn):
                self.acknowledge(offset.lsn)

    def window_detail(self, window: Window, status: Any) -> str:
        slot = self._slot_before
        lag = None if slot is None else slot.ack_lag_ms
        # yb_restart_commit_ht: the last acknowledged commit, or a later point YugabyteDB moved it to
        # while nothing streamed was unacknowledged (cdcsdk_update_restart_time_when_nothing_to_stream)
        return f"; slot's restart time {lag} ms before the run"

    def lag(self) -> int | None:
        """Not known in bytes (YugabyteDB has no WAL positions to subtract); the window's log line
        and the health check give the acknowledgement lag in time."""
        return None

    def job_spec(
        self,
        window: Window,
        offset: CaptureOffset | None,
        *,
        run: dict[str, Any] | None,
        checkpoint: dict[str, Any] | None,
        gap: CaptureGap | None = None,
    ) -> YugabyteJobSpec:
        capture = self.capture
        snapshot_ht = self._snapshot_ht
        if window.kind == "snapshot" and snapshot_ht is None:
            slot = self.status()
            snapshot_ht = None if slot is None else slot.restart_commit_ht
        fields = spec_fields(self, window, offset, run=run, checkpoint=checkpoint, gap=gap)
        from airflow_provider_cdc.cdc.sources.yugabyte.spec import YugabyteJobSpec

        return YugabyteJobSpec(
            **{**fields, "incremental": None},
            snapshot_ht=snapshot_ht if window.kind == "snapshot" else None,
            snapshot_end=self._snapshot_end if window.kind == "snapshot" else None,
            read_time_procedure=capture.read_time_procedure,
            lsn_type=capture.lsn_type,
            not_of_interest_timeout_ms=capture.tablet_not_of_interest_timeout_seconds * 1000,
        )


__all__ = ["YugabyteCapture", "YugabyteRun"]
