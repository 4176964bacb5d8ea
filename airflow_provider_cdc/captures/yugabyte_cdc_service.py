"""A YugabyteDB capture through the CDC service (the "gRPC" connector's protocol): per-tablet streams.

``YugabyteCdcServiceCapture`` is what DAG authors write; :class:`YugabyteCdcServiceRun` is one
run's session. Where the logical-replication capture (:mod:`.yugabyte`) reads one slot, this one
reads every tablet of a DB stream (created by ``yb-admin create_change_data_stream``) over YB's
RPC (docs/yugabytedb.md, "The CDC service"):

- the window ends at the cluster's hybrid time read at run start; its job reads every tablet up to
  it and merges the tablets into whole transactions (:mod:`cdc.sources.yugabyte_cdc.jobs`);
- the tablets' checkpoints travel with each window's commit entry into the offset, and are stored
  on the server (``SetCDCCheckpoint``, explicit checkpointing) only after the sink commit and the
  offset save (:meth:`YugabyteCdcServiceRun.acknowledge`);
- the snapshot reads the stream's own consistent snapshot through the service;
- YSQL holds the capture lock and the catalog (tables, keys, patterns) and gives the clock.

A stream expires when it is not read for ``cdc_intent_retention_ms``; an expired or deleted stream
is replaced by a new one (its id in ``stream_id``), from which ``snapshot_mode='when_needed'``
re-snapshots, recording the gap (the lost-WAL policy).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_provider_cdc.captures.postgres import PostgresCapture
from airflow_provider_cdc.captures.source_run import SourceRun, common_spec_fields
from airflow_provider_cdc.captures.yugabyte import (
    DEFAULT_INTENT_RETENTION_MS,
    check_intent_retention,
    check_ysql_conn_id,
    trigger_wait,
)
from airflow_provider_cdc.cdc.basics.errors import (
    CdcConfigurationError,
    CdcStateError,
    SnapshotRequiredError,
    WalLostError,
)
from airflow_provider_cdc.cdc.basics.readiness import Readiness
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.planning import plan as core
from airflow_provider_cdc.cdc.planning.gaps import CaptureGap
from airflow_provider_cdc.cdc.planning.offset import CaptureOffset, OffsetIdentity
from airflow_provider_cdc.cdc.planning.plan import SnapshotDecision, StreamPlan, uncorroborated_position
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn, ht_from_datetime
from airflow_provider_cdc.offsets.base import peek_offset
from airflow_provider_cdc.utils.times import now_ms, utc_time

if TYPE_CHECKING:
    from airflow_provider_cdc.cdc.sources.yugabyte_cdc.admin import DatabaseIds, StreamStatus
    from airflow_provider_cdc.cdc.sources.yugabyte_cdc.client import YbCdcClient
    from airflow_provider_cdc.cdc.sources.yugabyte_cdc.offset import YbCdcOffset
    from airflow_provider_cdc.cdc.sources.yugabyte_cdc.spec import YbCdcJobSpec
    from airflow_provider_cdc.hooks.yugabyte_cdc import YugabyteCdcServiceHook

log = logging.getLogger(__name__)

_STREAM_ID = re.compile(r"^[0-9a-f]{32}$")


class _OffsetType:
    """``OFFSET_TYPE``, imported on first use: the offset's module needs protobuf (the
    ``yugabytedb-grpc`` extra), and a DAG file that only declares the capture must parse without it."""

    def __get__(self, obj: object, owner: type | None = None) -> type[CaptureOffset]:
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc.offset import YbCdcOffset

        return YbCdcOffset


@dataclass
class YugabyteCdcServiceCapture(PostgresCapture):
    """Configuration of one capture through YugabyteDB's CDC service. See docs/yugabytedb.md."""

    OFFSET_TYPE = _OffsetType()  # type: ignore[assignment]  (no annotation: dataclass must not read it)
    LANDS_MESSAGES: ClassVar[bool] = False
    SOURCE_NAME = "YugabyteDB (CDC service)"
    DEFAULT_WATERMARKS: ClassVar[str] = "insert_insert"

    postgres_conn_id: str = ""
    # The Airflow connection (type yugabytedb_cdc) of a YSQL endpoint; its extra names the masters.
    yugabytedb_conn_id: str = ""
    # The DB stream id (32 hex digits; `yb-admin create_change_data_stream ysql.<db> EXPLICIT <type>`).
    stream_id: str = ""
    # host:port,... of the masters (default: the connection's master_addresses extra, else host:7100).
    master_addresses: str | None = None
    # Where the capture lock lives when the server has no advisory locks (before v2025.1).
    lock_table: str = "public.airflow_cdc_locks"
    # YugabyteDB's cdc_intent_retention_ms: a stream not read for this long expires.
    intent_retention_ms: int = DEFAULT_INTENT_RETENTION_MS
    # Tables that join after the snapshot: incremental snapshots are not available on this path.
    new_table_snapshot: str = field(default="fail", kw_only=True)
    incremental_watermarks: str = "insert_insert"

    def validate_source(self) -> None:
        check_ysql_conn_id(self, " (the YSQL endpoint; its extra names the masters)")
        if not isinstance(self.stream_id, str) or not _STREAM_ID.match(self.stream_id):
            raise CdcConfigurationError(
                f"stream_id must be a DB stream id (32 lower-case hex digits, as `yb-admin list_change_data_streams` "
                f"prints it), got {self.stream_id!r}"
            )
        if self.master_addresses is not None:
            from airflow_provider_cdc.cdc.sources.yugabyte_cdc.addresses import parse_addresses

            parse_addresses(self.master_addresses)
        for name in ("slot_name", "publication_name"):
            if getattr(self, name) is not None:
                raise CdcConfigurationError(
                    f"{name} is for logical replication (YugabyteCapture); a CDC-service capture reads stream_id"
                )
        if self.message_prefix_include_list or self.message_prefix_exclude_list:
            raise CdcConfigurationError("message_prefix_*: YugabyteDB's CDC service never streams logical messages")
        if self.signal_table is not None or self.new_table_snapshot == "incremental":
            raise CdcConfigurationError(
                f"{self.incremental_unavailable()}; leave signal_table unset and new_table_snapshot='fail'"
            )
        try:
            TableRef.parse(self.lock_table, self.NAMES)
        except CdcConfigurationError as exc:
            raise CdcConfigurationError(f"lock_table {self.lock_table!r} is invalid: {exc}") from None
        check_intent_retention(self.intent_retention_ms)
        super().validate_source()

    @property
    def lock_table_ref(self) -> TableRef:
        return TableRef.parse(self.lock_table, self.NAMES)

    def position(self, text: str) -> YbLsn:
        return YbLsn(text)

    def hook(self) -> YugabyteCdcServiceHook:
        from airflow_provider_cdc.hooks.yugabyte_cdc import YugabyteCdcServiceHook

        return YugabyteCdcServiceHook(self.postgres_conn_id, master_addresses=self.master_addresses)

    def retention_ms(self) -> int | None:
        return self.intent_retention_ms

    def incremental_unavailable(self) -> str | None:
        return (
            "incremental snapshots are not available through YugabyteDB's CDC service (it streams no signal "
            "table watermarks a window could order chunks by); run a full snapshot with a new stream instead"
        )

    def identity(self, namespace_id: str, database: str) -> OffsetIdentity:
        return OffsetIdentity(self.topic_prefix, namespace_id, database, None)

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        for name in ("slot", "publication"):
            described.pop(name, None)
        return {"topic_prefix": described.pop("topic_prefix"), "stream_id": self.stream_id, **described}

    # -- readiness -------------------------------------------------------------------------------

    def readiness(self, sensor: Any, context: Any) -> Readiness:
        """The stream can deliver (it exists, this database's, not expired) and the cluster's clock
        has passed the sensor's ``wait_until`` (the CDC service cannot count pending changes
        without reading them, so nothing is counted)."""
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc import admin

        if getattr(sensor, "require_captured_change", False):
            raise CdcConfigurationError(
                "require_captured_change is not available through the CDC service: pending changes cannot be "
                "counted without reading the tablets"
            )
        until = utc_time(sensor.wait_until, sensor.task_id)
        hook = self.hook()
        with hook.session() as conn:
            ids = admin.database_ids(conn, self.table_refs)
            now_ht = admin.current_hybrid_time(conn)
        with hook.cdc_client(self.stream_id) as client:
            status = admin.stream_status(client)
        problems = admin.stream_problems(status, ids, self.stream_id)
        if problems:
            return Readiness("failed", "; ".join(problems))
        offset = peek_offset(self.store(), self.topic_prefix, self.OFFSET_TYPE)
        lost = stream_unavailable(offset, self.stream_id, self.intent_retention_ms, now_ms())  # type: ignore[arg-type]
        if lost is not None:
            return Readiness("failed", lost[1])
        if until is not None and now_ht < ht_from_datetime(until):
            return Readiness("waiting", f"the cluster's clock has not reached {until.isoformat()} yet")
        return Readiness("ready", f"stream {self.stream_id} can deliver", detail=status.to_dict() if status else {})

    def readiness_trigger(self, sensor: Any, context: Any) -> Any:
        """Waits for the cluster's clock (the poke already checked the stream against the tables)."""
        from airflow_provider_cdc.triggers.yugabyte_cdc_service import YugabyteCdcServiceChangesTrigger

        return YugabyteCdcServiceChangesTrigger(
            self.postgres_conn_id, self.stream_id, *trigger_wait(self, sensor), master_addresses=self.master_addresses
        )

    # -- setup -----------------------------------------------------------------------------------

    def setup(self, log: logging.Logger) -> dict[str, Any]:
        """Preflight only: the stream is the DBA's (``yb-admin create_change_data_stream``), so
        nothing is created on the cluster; every problem is raised in one error, each with its fix."""
        from airflow_provider_cdc.cdc.sources.postgres import admin as pg_admin
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc import admin
        from airflow_provider_cdc.offsets.base import load_offset

        problems = self.setup_problems()
        hook = self.hook()
        tables: tuple[TableRef, ...] = ()
        described: dict = {}
        ids = None
        with hook.session() as conn:
            with problems.check():
                tables = self.resolve_tables(conn)
            described, catalog_problems = pg_admin.find_tables(conn, list(tables))
            for error, message in catalog_problems:
                problems.add([message], error)
            keyless = [str(r) for r, t in described.items() if not t.has_primary_key]
            if keyless:
                problems.add(
                    [
                        f"table(s) {', '.join(keyless)} have no primary key: YugabyteDB's CDC service streams only "
                        "tables with one (add a primary key, or capture them with YugabyteCapture)"
                    ],
                    heading="captured tables are not ready",
                )
            from airflow_provider_cdc.cdc.sources.yugabyte_cdc.carried_types import uncarried_problems

            problems.add(uncarried_problems(described.values()), heading="captured tables are not ready")
            ids = admin.database_ids(conn, list(described))
        from airflow_provider_cdc.cdc.sources.postgres.events import TableEncoder

        self.check_column_rules(problems, described.values(), TableEncoder)
        status = None
        with problems.check(), hook.cdc_client(self.stream_id) as client:
            status = admin.stream_status(client)
            problems.add(admin.stream_problems(status, ids, self.stream_id), heading="the CDC stream cannot be used")
        self.check_stored_offset(problems, self.identity(ids.namespace_id, ids.database))
        problems.raise_if_any()
        load_offset(self.store(), self.topic_prefix, self.OFFSET_TYPE)  # a state-table store creates its table
        if status is None:  # raise_if_any above reports why it could not be read
            raise RuntimeError("setup's preflight found no problem but read no CDC stream status")
        log.info(
            "capture %s ready: stream %s (%s, %s checkpoints), %d table(s)",
            self.topic_prefix,
            self.stream_id,
            status.record_type,
            status.checkpoint_type,
            len(described),
        )
        return {
            **self.describe(),
            "stream": status.to_dict(),
            "master_addresses": hook.master_addresses,
            "key_columns": {ref.data_collection: list(t.key_columns) for ref, t in described.items()},
        }

    # -- runs ------------------------------------------------------------------------------------

    @contextmanager
    def open_run(self, log: logging.Logger) -> Iterator[YugabyteCdcServiceRun]:
        from airflow_provider_cdc.cdc.sources.yugabyte import admin as yb_admin
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc import admin

        hook = self.hook()
        with yb_admin.locked_session(hook, self.topic_prefix, self.lock_table_ref) as conn:
            tables = self.resolve_tables(conn)
            ids = admin.database_ids(conn, tables)
            with hook.cdc_client(self.stream_id) as client:
                run = YugabyteCdcServiceRun(self, hook, conn, client, ids)
                run.tables = tables
                yield run


def stream_unavailable(
    offset: YbCdcOffset | None, stream_id: str, retention_ms: int, now_ms: int
) -> tuple[str, str] | None:
    """``(gap reason, why)`` when the stored checkpoints cannot continue on ``stream_id``: they
    belong to another stream (a replaced one), or the stream was not read for the retention."""
    if offset is None:
        return None
    if offset.stream_id is not None and offset.stream_id != stream_id:
        return (
            "stream_replaced",
            f"the stored tablet checkpoints belong to stream {offset.stream_id}, not {stream_id}: a new stream "
            "starts from its own snapshot, and the changes between the two streams are not in either",
        )
    from airflow_provider_cdc.cdc.sources.yugabyte.planning import expired_why

    expired = expired_why(f"stream {stream_id}", offset, retention_ms, now_ms)
    return None if expired is None else ("stream_expired", expired)


class YugabyteCdcServiceRun(SourceRun):
    """One run's session: the YSQL connection holding the capture lock, and the stream's client."""

    capture: YugabyteCdcServiceCapture
    hook: YugabyteCdcServiceHook

    def __init__(
        self,
        capture: YugabyteCdcServiceCapture,
        hook: YugabyteCdcServiceHook,
        conn: Any,
        client: YbCdcClient,
        ids: DatabaseIds,
    ):
        super().__init__(capture, hook, conn, capture.identity(ids.namespace_id, ids.database))
        self.client = client
        self.ids = ids
        self._status: StreamStatus | None = None
        self._status_read = False

    @property
    def stream_id(self) -> str:
        return self.capture.stream_id

    def status(self) -> StreamStatus | None:
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc import admin

        if not self._status_read:
            self._status, self._status_read = admin.stream_status(self.client), True
        return self._status

    def _require_stream(self) -> StreamStatus:
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc import admin

        status = self.status()
        problems = admin.stream_problems(status, self.ids, self.stream_id)
        if problems:
            raise CdcConfigurationError(f"capture {self.capture.topic_prefix!r}: " + "; ".join(problems))
        if status is None:
            raise CdcConfigurationError(
                f"capture {self.capture.topic_prefix!r}: CDC stream {self.stream_id!r} not found"
            )
        return status

    def unavailable(self, offset: CaptureOffset | None, status: StreamStatus | None) -> tuple[str, str] | None:
        if status is None:
            return "stream_missing", f"the masters know no CDC stream {self.stream_id}"
        return stream_unavailable(offset, self.stream_id, self.capture.intent_retention_ms, now_ms())  # type: ignore[arg-type]

    def prepare_snapshot(self, decision: SnapshotDecision, status: StreamStatus | None) -> None:
        """The stream must serve this capture; and a stream gives its consistent snapshot once: a
        capture that completed one on it needs a new stream to snapshot again."""
        self._require_stream()
        offset = peek_offset(self.capture.store(), self.capture.topic_prefix, self.capture.OFFSET_TYPE)
        if offset is not None and offset.snapshot_completed and offset.stream_id == self.stream_id:  # type: ignore[attr-defined]
            raise CdcConfigurationError(
                f"capture {self.capture.topic_prefix!r} already snapshotted stream {self.stream_id} "
                f"({decision.reason}): a CDC stream delivers its consistent snapshot once. Create a new stream "
                f"(`yb-admin create_change_data_stream ysql.{self.ids.database} EXPLICIT <record type>`), set "
                "stream_id to it and run the snapshot again; nothing was written"
            )

    def gap(
        self, decision: SnapshotDecision, offset: CaptureOffset | None, status: StreamStatus | None, now_ms: int
    ) -> CaptureGap:
        return CaptureGap.of(decision, offset, now_ms)

    def plan_stream(
        self, offset: CaptureOffset | None, requested: Any, now_ms: int, *, until: datetime | None = None
    ) -> StreamPlan:
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc import admin

        capture = self.capture
        self._require_stream()
        lost = stream_unavailable(offset, self.stream_id, capture.intent_retention_ms, now_ms)  # type: ignore[arg-type]
        if lost is not None:
            error = WalLostError if lost[0] == "stream_expired" else SnapshotRequiredError
            raise error(
                f"capture {capture.topic_prefix!r} cannot continue: {lost[1]}. Re-snapshot from a new stream: set "
                "stream_id to a new stream and run with snapshot_mode='when_needed' (it records the gap)"
            )
        current = admin.current_hybrid_time(self.conn)
        notes: list[str] = []
        start = core.stream_start(
            capture.snapshot_mode,
            offset,
            self.identity,
            offset_type=capture.OFFSET_TYPE,
            start=YbLsn(1),
            start_name="the tablets' latest ops (checkpointed now)",
        ).note_into(notes)
        if not start.tablets:  # type: ignore[attr-defined]
            # snapshot_mode='never', first window: every tablet starts at its latest op. Stored with
            # the pending window, so a retry starts where this attempt did.
            tablets = admin.bootstrap_tablets(self.client, admin.stream_tablets(self.client, self._table_ids()))
            start = start.with_tablets(tablets, self.stream_id)  # type: ignore[attr-defined]
        if start.lsn is None:
            raise CdcStateError(f"capture {self.capture.topic_prefix!r}: the stream window has no start position")
        if until is not None:
            end = ht_from_datetime(until if until.tzinfo else until.replace(tzinfo=timezone.utc)) - 1
            if end > current:
                raise CdcConfigurationError(f"upto_time {until.isoformat()} is in the future of the cluster's clock")
            target = max(end + 1, int(start.lsn))  # an interval before the offset: an empty window
        elif requested is not None:
            target = int(requested)
        else:
            target = current + 1
        window, planned = core.plan_window(
            start,
            target=YbLsn(target),
            current=YbLsn(current + 1),
            now_ms=now_ms,
            notes=notes,
            current_name="the cluster's hybrid time",
        )
        return StreamPlan(window, planned, None, tuple(notes))

    def _table_ids(self) -> list[str]:
        return [self.ids.tables[ref] for ref in self.tables if ref in self.ids.tables]

    def heartbeat(self, query: str) -> None:
        from airflow_provider_cdc.cdc.sources.postgres import admin as pg_admin

        pg_admin.run_heartbeat(self.conn, query)

    def acknowledge(self, position: Any, saved: CaptureOffset | None = None) -> YbLsn | None:
        """Store the saved offset's tablet checkpoints on the server (``SetCDCCheckpoint``): called
        after the sink commit and the offset save, so the server never releases what the sink lacks.
        Without a saved offset ending at ``position`` there is nothing safe to store."""
        if saved is None or saved.pending is not None or saved.lsn is None or int(saved.lsn) != int(position):
            return None
        return self._store_checkpoints(saved)  # type: ignore[arg-type]

    def _store_checkpoints(self, offset: YbCdcOffset) -> YbLsn | None:
        if offset.stream_id != self.stream_id or not offset.tablets:
            return None
        self.client.set_checkpoints(offset.tablets)
        log.info(
            "stream %s: %d tablet checkpoint(s) stored on the server", self.stream_id, len(offset.tablets.polled())
        )
        return YbLsn(int(offset.lsn)) if offset.lsn is not None else None

    def check_restored(self, offset: CaptureOffset) -> None:
        """The server's stored checkpoints must not lag the restored offset's: a window reads from the
        offset's checkpoints, so a restored offset ahead of them would skip what lies between."""
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc.admin import server_checkpoints

        tablets = getattr(offset, "tablets", None)
        if not tablets or getattr(offset, "stream_id", None) != self.stream_id:
            return
        polled = tablets.polled()
        stored = server_checkpoints(self.client, list(polled))
        for tablet_id, position in polled.items():
            ours, theirs = position.checkpoint, stored.get(tablet_id)
            if theirs is None or (theirs.term, theirs.index) < (ours.term, ours.index):
                raise uncorroborated_position(
                    f"the server's checkpoint of tablet {tablet_id} (stream {self.stream_id})",
                    theirs,
                    offset,
                    "store its checkpoints with SetCDCCheckpoint (yb-admin) and run again",
                )

    def finish_landed(self, offset: CaptureOffset | None) -> None:
        """A run that stopped after saving the offset: store its checkpoints (idempotent)."""
        if offset is not None and offset.pending is None:
            self._store_checkpoints(offset)  # type: ignore[arg-type]

    def window_detail(self, window: Window, status: Any) -> str:
        return f"; stream {self.stream_id}"

    def lag(self) -> int | None:
        return None  # no byte measure: the health check reports the time to expiry

    def job_spec(
        self,
        window: Window,
        offset: CaptureOffset | None,
        *,
        run: dict[str, Any] | None,
        checkpoint: dict[str, Any] | None,
        gap: CaptureGap | None = None,
    ) -> YbCdcJobSpec:
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc.checkpoints import TabletCheckpoints
        from airflow_provider_cdc.cdc.sources.yugabyte_cdc.spec import YbCdcJobSpec

        status = self.status()
        stream = window.kind == "stream" and offset is not None
        return YbCdcJobSpec(
            **common_spec_fields(self, window, offset, run=run, checkpoint=checkpoint, gap=gap, incremental=False),
            master_addresses=self.hook.master_addresses,
            stream_id=self.stream_id,
            database=self.ids.database,
            tablets=offset.tablets if stream else TabletCheckpoints(),  # type: ignore[union-attr]
            previous_commit_ht=offset.last_commit_ht if stream else None,  # type: ignore[union-attr]
            record_type=None if status is None else status.record_type,
            table_ids=tuple((ref, self.ids.tables[ref]) for ref in self.tables if ref in self.ids.tables),
            tls=self.hook.rpc_tls,
            get_changes_max_bytes=self.hook.rpc_get_changes_max_bytes,
        )


__all__ = ["YugabyteCdcServiceCapture", "YugabyteCdcServiceRun", "stream_unavailable"]
