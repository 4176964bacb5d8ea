"""A PostgreSQL capture: its settings, its setup, and one run's session (the slot's side).

``PostgresCapture`` is what DAG authors write (validated at DAG parse, no I/O, no Spark);
:class:`PostgresRun` is how the shared operators talk to PostgreSQL during a run: the advisory
capture lock, the slot (status, creation for a snapshot, acknowledgement), the window's end
(``pg_current_wal_insert_lsn()``) and the job spec.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_provider_cdc._lazy import lazy_module
from airflow_provider_cdc.captures.base import Capture
from airflow_provider_cdc.captures.source_run import SourceRun, common_spec_fields
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, PublicationError
from airflow_provider_cdc.cdc.basics.readiness import Readiness
from airflow_provider_cdc.cdc.basics.tables import POSTGRES_NAMES, TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.events.settings import EventSettings
from airflow_provider_cdc.cdc.events.value_modes import DEFAULT_PLACEHOLDER, ValueModes
from airflow_provider_cdc.cdc.planning.gaps import CaptureGap
from airflow_provider_cdc.cdc.planning.offset import CaptureOffset
from airflow_provider_cdc.cdc.planning.plan import SnapshotDecision, StreamPlan, uncorroborated_position
from airflow_provider_cdc.cdc.planning.spec import DEFAULT_DECODING_WORK_MEM_BYTES
from airflow_provider_cdc.cdc.sources.postgres import PUBLICATION_MODES
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.offset import OffsetIdentity, PostgresOffset
from airflow_provider_cdc.offsets.base import OffsetStore

if TYPE_CHECKING:
    from airflow_provider_cdc.cdc.sources.postgres import admin, planning
    from airflow_provider_cdc.cdc.sources.postgres.spec import PostgresJobSpec
    from airflow_provider_cdc.hooks.postgres_cdc import PostgresCdcHook, PreflightReport
else:  # the engine (pyarrow, numpy, psycopg) loads when a task uses it, not when a DAG file is parsed
    admin = lazy_module("airflow_provider_cdc.cdc.sources.postgres.admin")
    planning = lazy_module("airflow_provider_cdc.cdc.sources.postgres.planning")

_SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")


@dataclass
class PostgresCapture(Capture):
    """Configuration of one PostgreSQL capture. See docs/operators.md for every field."""

    OFFSET_TYPE: ClassVar[type[CaptureOffset]] = PostgresOffset
    LANDS_MESSAGES: ClassVar[bool] = True
    NAMES = POSTGRES_NAMES
    SOURCE_NAME = "PostgreSQL"

    postgres_conn_id: str
    slot_name: str | None = None
    publication_name: str | None = None
    publication_autocreate_mode: str = "filtered"
    idle_timeout_seconds: float = 300.0
    # How a stream window is read: "auto" (the SQL functions up to a size, else streaming), "sql", "stream".
    window_reader: str = "auto"
    # The least logical_decoding_work_mem of the sessions that decode a window (None: the server's as it is).
    decoding_work_mem_bytes: int | None = DEFAULT_DECODING_WORK_MEM_BYTES
    # How long a run waits for a slot still held by a reader (a just-killed run's walsender).
    slot_release_timeout_seconds: float = 30.0
    hstore_handling_mode: str = "json"
    interval_handling_mode: str = "numeric"
    unavailable_value_placeholder: str = DEFAULT_PLACEHOLDER
    message_prefix_include_list: Sequence[str] = ()
    message_prefix_exclude_list: Sequence[str] = ()

    def validate_source(self) -> None:
        if self.publication_autocreate_mode not in PUBLICATION_MODES:
            raise CdcConfigurationError(
                f"publication_autocreate_mode {self.publication_autocreate_mode!r} is not one of "
                f"{', '.join(PUBLICATION_MODES)}"
            )
        if not _SLOT_NAME.match(self.resolved_slot_name):
            raise CdcConfigurationError(
                f"slot_name {self.resolved_slot_name!r} is invalid: PostgreSQL slot names use only "
                "lower-case letters, digits and '_', at most 63 characters"
            )
        if not self.postgres_conn_id:
            raise CdcConfigurationError("postgres_conn_id is required")

    @property
    def conn_id(self) -> str:
        return self.postgres_conn_id

    def position(self, text: str) -> Lsn:
        return Lsn(text)

    def hook(self) -> PostgresCdcHook:
        from airflow_provider_cdc.hooks.postgres_cdc import PostgresCdcHook

        return PostgresCdcHook(self.postgres_conn_id)

    def resolve_tables(self, conn) -> tuple[TableRef, ...]:
        """The tables this capture reads now (explicit list or patterns against the catalog)."""
        return admin.resolve_tables(conn, self.table_refs, self.table_include_list, self.table_exclude_list)

    def readiness(self, sensor: Any, context: Any) -> Readiness:
        """Pending WAL on the slot (and, if asked, a captured change decoded from it)."""
        from airflow_provider_cdc.cdc.sources.postgres.pending import slot_readiness

        hook = self.hook()
        slot = self.resolved_slot_name
        status = hook.slot_status(slot)
        readiness = slot_readiness(status, slot, int(sensor.min_pending_bytes))
        if readiness.state != "ready":
            return readiness
        if sensor.require_captured_change:
            if status is not None and status.active:
                return Readiness("waiting", f"slot {slot!r} is being read by pid {status.active_pid}; waiting")
            if not hook.count_pending_changes(slot, self.resolved_publication_name):
                return Readiness("waiting", f"{readiness.message}, but no captured change among them")
        return replace(readiness, detail=status.to_dict() if status else {})

    def readiness_trigger(self, sensor: Any, context: Any) -> Any:
        from airflow_provider_cdc.triggers.postgres_cdc import PostgresCdcChangesTrigger

        return PostgresCdcChangesTrigger(
            self.postgres_conn_id,
            self.resolved_slot_name,
            int(sensor.min_pending_bytes),
            float(sensor.poke_interval),
            # The trigger decodes pending WAL too, or it would fire on WAL the poke would not accept.
            publication_name=self.resolved_publication_name if sensor.require_captured_change else None,
        )

    def connection_errors(self) -> tuple[type[BaseException], ...]:
        import psycopg

        return (psycopg.OperationalError,)

    @property
    def resolved_slot_name(self) -> str:
        return self.slot_name or f"cdc_{self.topic_prefix.lower()}"[:63]

    @property
    def resolved_publication_name(self) -> str:
        return self.publication_name or f"cdc_{self.topic_prefix.lower()}"

    def identity(self, system_identifier: str, database: str) -> OffsetIdentity:
        return OffsetIdentity(self.topic_prefix, system_identifier, database, self.resolved_slot_name)

    def store(self) -> OffsetStore:
        if self.offset_store == "state_table":
            from airflow_provider_cdc.offsets.state_table import PostgresStateTableOffsetStore

            return PostgresStateTableOffsetStore(self.postgres_conn_id, self.offset_table, self.offset_table_owner)
        return super().store()

    def value_modes(self) -> ValueModes:
        return replace(
            super().value_modes(),
            hstore=self.hstore_handling_mode,
            interval=self.interval_handling_mode,
            unavailable_value_placeholder=self.unavailable_value_placeholder,
        )

    def event_settings(self) -> EventSettings:
        return replace(
            super().event_settings(),
            message_prefix_include=tuple(self.message_prefix_include_list),
            message_prefix_exclude=tuple(self.message_prefix_exclude_list),
        )

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        return {
            "topic_prefix": described.pop("topic_prefix"),
            "slot": self.resolved_slot_name,
            "publication": self.resolved_publication_name,
            **described,
        }

    # -- setup -----------------------------------------------------------------------------------

    def setup(self, log: logging.Logger) -> dict[str, Any]:
        """Preflight checks, then idempotent creation of the publication and the slot."""
        from airflow_provider_cdc.offsets.base import load_offset

        hook = self.hook()
        streams = self.streams
        report, published = self._setup_preflight(hook, streams)
        load_offset(self.store(), self.topic_prefix, self.OFFSET_TYPE)  # a state-table store creates its table
        publication = hook.ensure_publication(
            self.resolved_publication_name, published, self.publication_autocreate_mode
        )
        slot_created = hook.ensure_slot(self.resolved_slot_name)[1] if streams else False
        keep_size = hook.max_slot_wal_keep_size() if slot_created else None
        server, tables = report.server, report.tables
        log.info(
            "capture %s ready: publication %r %s, slot %r %s, %d table(s)",
            self.topic_prefix,
            self.resolved_publication_name,
            publication,
            self.resolved_slot_name,
            "created" if slot_created else "present" if streams else "not needed",
            len(tables),
        )
        if keep_size is not None and keep_size < 0:  # said once per capture: when its slot is created
            log.warning(
                "max_slot_wal_keep_size is -1 (unlimited) on this server: if runs stop, slot %r keeps all WAL "
                "written since its last window until the disk fills. Set max_retained_bytes on the slot health "
                "check, or a keep size on the server (see docs/reliability.md#slot-and-wal-health)",
                self.resolved_slot_name,
            )
        return {
            **self.describe(),
            "publication_action": publication,
            "slot_created": slot_created,
            "server_version": server.version_num,
            "key_columns": {ref.data_collection: list(t.key_columns) for ref, t in tables.items()},
        }

    def _setup_preflight(self, hook: PostgresCdcHook, streams: bool) -> tuple[PreflightReport, list[TableRef]]:
        """Setup's checks, run before anything is created: every problem found is raised in one
        error, each with its fix. Returns the report and the tables to publish."""
        problems = self.setup_problems()
        tables: tuple[TableRef, ...] = ()
        with hook.session() as conn, problems.check():
            tables = self.resolve_tables(conn)
        report = hook.preflight(tables, slot_name=self.resolved_slot_name if streams else None, problems=problems)
        from airflow_provider_cdc.cdc.sources.postgres.events import TableEncoder

        self.check_column_rules(problems, report.tables.values(), TableEncoder)
        published = list(tables)
        signal = self.signal_table_ref
        if signal is not None:
            with hook.session() as conn, problems.check():
                described_signal = admin.describe_tables(conn, [signal])[signal]
                problems.add(
                    admin.check_signal_table(conn, described_signal, self.incremental_watermarks),
                    heading="the signal table cannot be used",
                )
            if signal not in published:
                published.append(signal)  # signals are read from the stream, like Debezium
        self.check_stored_offset(problems, self.identity(report.server.system_identifier, report.server.database))
        existing = [r for r in published if r in report.tables or r == signal]
        if existing:  # no table found: that problem is reported already, the publication's would be noise
            problems.add(
                hook.publication_problems(self.resolved_publication_name, existing, self.publication_autocreate_mode),
                PublicationError,
            )
        problems.raise_if_any()
        return report, published

    # -- runs ------------------------------------------------------------------------------------

    @contextmanager
    def open_run(self, log: logging.Logger) -> Iterator[PostgresRun]:
        hook = self.hook()
        with hook.capture_lock(self.topic_prefix) as conn:
            server = admin.server_info(conn)
            run = PostgresRun(self, hook, conn, self.identity(server.system_identifier, server.database))
            # A run killed moments ago may still have a walsender on the slot: let it go away.
            admin.wait_for_slot_release(conn, self.resolved_slot_name, timeout=self.slot_release_timeout_seconds)
            run.tables = self.resolve_tables(conn)
            yield run


class PostgresRun(SourceRun):
    """One run's session with PostgreSQL, on the connection holding the capture lock."""

    capture: PostgresCapture
    hook: PostgresCdcHook

    @property
    def slot_name(self) -> str:
        return self.capture.resolved_slot_name

    def status(self) -> admin.SlotStatus | None:
        return admin.slot_status(self.conn, self.slot_name)

    def unavailable(self, offset: CaptureOffset | None, status: admin.SlotStatus | None) -> tuple[str, str] | None:
        return planning.slot_unavailable(offset, status)  # type: ignore[arg-type]

    def prepare_snapshot(self, decision: SnapshotDecision, status: admin.SlotStatus | None) -> None:
        """The slot the stream continues from after the snapshot: recreated when its WAL was lost
        (``when_needed``), created when missing (``when_needed``), else required and verified."""
        capture = self.capture
        if not capture.streams:
            return
        database = self.identity.database
        slot = status
        if slot is not None and slot.wal_lost and capture.snapshot_mode == "when_needed":
            logging.getLogger(__name__).warning("dropping slot %r: its WAL was lost", slot.slot_name)
            admin.drop_slot(self.conn, slot.slot_name)
            slot = None
        if slot is None and capture.snapshot_mode != "when_needed":
            admin.require_slot(self.conn, self.slot_name, database)
        if slot is None:
            admin.ensure_slot(self.conn, self.slot_name, database)
            logging.getLogger(__name__).warning("created replication slot %r", self.slot_name)
        else:
            admin.verify_slot(slot, database)

    def gap(
        self, decision: SnapshotDecision, offset: CaptureOffset | None, status: admin.SlotStatus | None, now_ms: int
    ) -> CaptureGap:
        return CaptureGap.of(
            decision,
            offset,
            now_ms,
            slot_confirmed_lsn=None if status is None else status.confirmed_flush_lsn,
            wal_status=None if status is None else status.wal_status,
        )

    def plan_stream(
        self, offset: CaptureOffset | None, requested: Any, now_ms: int, *, until: datetime | None = None
    ) -> StreamPlan:
        if until is not None:
            raise CdcConfigurationError(
                "upto_time: PostgreSQL keeps no map from commit times to WAL positions; bound a window with "
                "upto_lsn instead (or leave both unset for the current position)"
            )
        slot = admin.require_slot(self.conn, self.slot_name, self.identity.database)
        current = admin.current_lsn(self.conn)
        self._slot_before = slot
        return planning.plan_stream_window(
            mode=self.capture.snapshot_mode,
            offset=offset,  # type: ignore[arg-type]
            slot=slot,
            identity=self.identity,
            target=requested if requested is not None else current,
            current_lsn=current,
            now_ms=now_ms,
        )

    def heartbeat(self, query: str) -> None:
        admin.run_heartbeat(self.conn, query)

    def acknowledge(self, position: Any, saved: CaptureOffset | None = None) -> Lsn:
        return admin.advance_slot(self.conn, self.slot_name, Lsn(position))

    def check_restored(self, offset: CaptureOffset) -> None:
        slot = self.status()
        confirmed = None if slot is None else slot.confirmed_flush_lsn
        if offset.lsn is not None and confirmed is not None and confirmed < offset.lsn:
            raise uncorroborated_position(
                f"replication slot {self.slot_name!r}",
                confirmed,
                offset,
                f"advance the slot as an administrator (SELECT pg_replication_slot_advance({self.slot_name!r}, "
                f"'{offset.lsn}')) and run again",
            )

    def finish_landed(self, offset: CaptureOffset | None) -> None:
        slot = self.status()
        if slot is not None and offset is not None:
            planning.check_slot_not_ahead(slot, offset)  # type: ignore[arg-type]  # a broken capture is never fine
        committed = offset.lsn if offset is not None else None
        confirmed = slot.confirmed_flush_lsn if slot is not None else None
        if committed is not None and confirmed is not None and confirmed < committed:
            self.acknowledge(committed)  # a crashed run stopped after storing its offset

    def window_detail(self, window: Window, status: Any) -> str:
        slot = getattr(self, "_slot_before", None)
        wal = (window.to_lsn or 0) - (window.from_lsn or 0)
        return f", {wal} bytes of WAL; slot lag before the run: {None if slot is None else slot.pending_bytes} bytes"

    def lag(self) -> int | None:
        after = self.status()
        return None if after is None else after.pending_bytes

    def job_spec(
        self,
        window: Window,
        offset: CaptureOffset | None,
        *,
        run: dict[str, Any] | None,
        checkpoint: dict[str, Any] | None,
        gap: CaptureGap | None = None,
    ) -> PostgresJobSpec:
        from airflow_provider_cdc.cdc.sources.postgres.spec import PostgresJobSpec

        return PostgresJobSpec(**spec_fields(self, window, offset, run=run, checkpoint=checkpoint, gap=gap))


def spec_fields(
    source: Any,
    window: Window,
    offset: CaptureOffset | None,
    *,
    run: dict[str, Any] | None,
    checkpoint: dict[str, Any] | None,
    gap: CaptureGap | None,
) -> dict[str, Any]:
    """The job spec fields of a run on a PostgreSQL-protocol source (``source``: its run, with
    ``capture``, ``hook`` and ``tables``); YugabyteDB's spec adds its own."""
    capture = source.capture
    return {
        **common_spec_fields(source, window, offset, run=run, checkpoint=checkpoint, gap=gap),
        # With the sslmode this task settled on: the job's partitions connect alike, no probing.
        "connection": source.hook.resolved_connection_info(),
        "slot_name": capture.resolved_slot_name,
        "publication_name": capture.resolved_publication_name,
        "previous_commit_lsn": offset.lsn_commit if offset else None,
    }


__all__ = ["PostgresCapture", "PostgresRun"]
