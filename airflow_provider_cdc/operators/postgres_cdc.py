"""Operators of a PostgreSQL capture: setup → snapshot → window batch.

Each is thin: it decides (with the engine's pure planning functions), runs the job from one
spec, and records progress in the fixed order *sink commit → offset → slot acknowledgement*.
Engine errors marked terminal (bad configuration, lost slot, inconsistent offsets) fail the
task without retries; transient ones (a dropped connection) are left to Airflow's retries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from airflow_provider_cdc.capture import PostgresCapture
from airflow_provider_cdc.cdc import faults
from airflow_provider_cdc.cdc.errors import (
    CdcConfigurationError,
    CdcError,
    InvalidLsnError,
    PublicationError,
    SnapshotRequiredError,
)
from airflow_provider_cdc.cdc.gaps import CaptureGap
from airflow_provider_cdc.cdc.naming import Topic, gap_topic, side_topics
from airflow_provider_cdc.cdc.problems import Problems
from airflow_provider_cdc.cdc.runs import RunDecision, RunInterval, decide, state_target
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry, CommitLog
from airflow_provider_cdc.cdc.sinks.storage import check_writable, storage_for
from airflow_provider_cdc.cdc.sources.postgres import admin, planning
from airflow_provider_cdc.cdc.sources.postgres.chunks import is_staged_topic
from airflow_provider_cdc.cdc.sources.postgres.events import TableEncoder
from airflow_provider_cdc.cdc.sources.postgres.incremental import (
    IncrementalState,
    Signal,
    SignalError,
    TableProgress,
    apply_signal,
    remember_applied,
)
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.offset import OffsetIdentity, PostgresOffset
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
from airflow_provider_cdc.cdc.spec import PostgresJobSpec
from airflow_provider_cdc.cdc.window import Window, window_id_for
from airflow_provider_cdc.hooks.postgres_cdc import PostgresCdcHook, PreflightReport
from airflow_provider_cdc.offsets.base import load_offset, peek_offset, save_offset
from airflow_provider_cdc.operators.runs import run_interval
from airflow_provider_cdc.version_compat import (
    AirflowException,
    AirflowFailException,
    AirflowSkipException,
    BaseOperator,
    Context,
)

log = logging.getLogger(__name__)


@contextmanager
def fail_fast_on_terminal_errors() -> Iterator[None]:
    """Terminal engine errors fail the task without retries; a PostgreSQL session that died mid-run
    becomes a (retryable) CdcTransientError that says so; others propagate unchanged.

    The replacement carries the original's message and traceback (where the engine raised it)
    and is not chained to it, so the task log shows one traceback, not a "direct cause" pair.
    """
    import psycopg

    from airflow_provider_cdc.cdc.errors import CdcTransientError

    try:
        yield
    except CdcError as exc:
        if exc.terminal:
            raise AirflowFailException(f"{type(exc).__name__}: {exc}").with_traceback(exc.__traceback__) from None
        raise
    except psycopg.OperationalError as exc:  # a session of the run died: server restart, network, kill
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise CdcTransientError(
            f"lost the connection to PostgreSQL during the run ({type(exc).__name__}: {detail}); "
            "nothing past the stored offset was acknowledged, a retry continues from there"
        ).with_traceback(exc.__traceback__) from None


class _CaptureOperator(BaseOperator):
    ui_color = "#d4ecff"

    def __init__(self, *, capture: PostgresCapture, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(capture, PostgresCapture):
            raise CdcConfigurationError(f"capture must be a PostgresCapture, got {type(capture).__name__}")
        self.capture = capture

    def hook(self) -> PostgresCdcHook:
        return PostgresCdcHook(self.capture.postgres_conn_id)


class PostgresCdcSetupOperator(_CaptureOperator):
    """Preflight checks, then idempotent creation of the publication and the slot.

    Fails with one error listing every problem found, each with its fix (wal_level, the
    REPLICATION privilege, tables that do not exist or cannot emit complete update/delete
    events, missing grants, a slot of the wrong plugin or database, the publication, the sink
    path, column masks, the stored offset), before anything is created.
    """

    def execute(self, context: Context) -> dict[str, Any]:
        capture = self.capture
        hook = self.hook()
        streams = planning.streams(capture.snapshot_mode)
        with fail_fast_on_terminal_errors():
            report, published = _setup_preflight(capture, hook, streams)
            load_offset(capture.store(), capture.topic_prefix)  # a state-table store creates its table
            publication = hook.ensure_publication(
                capture.resolved_publication_name, published, capture.publication_autocreate_mode
            )
            slot_created = hook.ensure_slot(capture.resolved_slot_name)[1] if streams else False
            keep_size = hook.max_slot_wal_keep_size() if slot_created else None
        server, tables = report.server, report.tables
        self.log.info(
            "capture %s ready: publication %r %s, slot %r %s, %d table(s)",
            capture.topic_prefix,
            capture.resolved_publication_name,
            publication,
            capture.resolved_slot_name,
            "created" if slot_created else "present" if streams else "not needed",
            len(tables),
        )
        if keep_size is not None and keep_size < 0:  # said once per capture: when its slot is created
            self.log.warning(
                "max_slot_wal_keep_size is -1 (unlimited) on this server: if runs stop, slot %r keeps all WAL "
                "written since its last window until the disk fills. Set max_retained_bytes on the slot health "
                "check, or a keep size on the server (see docs/reliability.md#slot-and-wal-health)",
                capture.resolved_slot_name,
            )
        return {
            **capture.describe(),
            "publication_action": publication,
            "slot_created": slot_created,
            "server_version": server.version_num,
            "key_columns": {ref.data_collection: list(t.key_columns) for ref, t in tables.items()},
        }


def _setup_preflight(
    capture: PostgresCapture, hook: PostgresCdcHook, streams: bool
) -> tuple[PreflightReport, list[TableRef]]:
    """Setup's checks, run before anything is created: every problem found is raised in one
    error, each with its fix. Returns the report and the tables to publish."""
    problems = Problems("setup")
    with problems.check():
        check_writable(capture.sink_path)
    tables: tuple[TableRef, ...] = ()
    with hook.session() as conn, problems.check():
        tables = capture.resolve_tables(conn)
    report = hook.preflight(tables, slot_name=capture.resolved_slot_name if streams else None, problems=problems)
    for described in report.tables.values():  # column filters and masks that cannot apply
        with problems.check():
            TableEncoder(described, described.columns, capture.event_settings())
    published = list(tables)
    signal = capture.signal_table_ref
    if signal is not None:
        with hook.session() as conn, problems.check():
            described_signal = admin.describe_tables(conn, [signal])[signal]
            problems.add(
                admin.check_signal_table(conn, described_signal, capture.incremental_watermarks),
                heading="the signal table cannot be used",
            )
        if signal not in published:
            published.append(signal)  # signals are read from the stream, like Debezium
    store = capture.store()
    with problems.check():
        stored = peek_offset(store, capture.topic_prefix)  # malformed, or another capture's
        if stored is not None:
            stored.check_identity(
                capture.identity(report.server.system_identifier, report.server.database),
                source=store.describe(capture.topic_prefix),
            )
    existing = [r for r in published if r in report.tables or r == signal]
    if existing:  # no table found: that problem is reported already, the publication's would be noise
        problems.add(
            hook.publication_problems(capture.resolved_publication_name, existing, capture.publication_autocreate_mode),
            PublicationError,
        )
    problems.raise_if_any()
    return report, published


class _WindowOperator(_CaptureOperator):
    """Shared run logic of the snapshot and window operators (subclasses define ``_run``)."""

    def execute(self, context: Context) -> dict[str, Any]:
        with fail_fast_on_terminal_errors():
            return self._run(context)  # type: ignore[attr-defined]

    @contextmanager
    def _state(self) -> Iterator[_RunState]:
        capture = self.capture
        hook = self.hook()
        with hook.capture_lock(capture.topic_prefix) as conn:
            server = admin.server_info(conn)
            identity = capture.identity(server.system_identifier, server.database)
            store = capture.store()
            check_writable(capture.sink_path)
            commit_log = CommitLog(storage_for(capture.sink_path), capture.topic_prefix)
            stored = load_offset(store, capture.topic_prefix)
            # A run killed moments ago may still have a walsender on the slot: let it go away.
            admin.wait_for_slot_release(conn, capture.resolved_slot_name, timeout=capture.slot_release_timeout_seconds)
            reconciled = planning.reconcile(
                stored,
                commit_log.latest(),
                identity,
                source=store.describe(capture.topic_prefix),
                committed=commit_log.committed,
            )
            for note in reconciled.notes:
                self.log.warning("%s", note)
            state = _RunState(self, hook, conn, identity, store, commit_log, stored, reconciled.offset)
            state.tables = capture.resolve_tables(conn)
            yield state

    def _decide(self, state: _RunState, context: Context, kind: str) -> RunDecision:
        """Capture, or report what landed (a backfill, or a re-run of a run that landed)."""
        decision = decide(run_interval(context), _landed_runs(state.offset), kind, state.commit_log.committed)
        self.log.info("%s", decision.reason)
        return decision

    def _report_landed(self, state: _RunState, decision: RunDecision, nothing_landed: str) -> dict[str, Any]:
        """A replay: finish what a crashed run left, then return the summary of the windows the
        decision found; skipped (saying why) when none landed. Never reads the source or the slot."""
        self._finish_landed(state, acknowledge=planning.streams(self.capture.snapshot_mode))
        landed = decision.landed
        if not landed:
            raise AirflowSkipException(f"{decision.reason}: {nothing_landed}")
        summary = _summary(landed[-1], self.capture, confirmed_lsn=None, slot=None)
        summary.update(replayed=True, windows=[e.window_id for e in landed])
        self.log.info(
            "window(s) %s reported from the sink: nothing read from the source or the slot",
            ", ".join(summary["windows"]),
        )
        return summary

    def _finish_landed(self, state: _RunState, *, acknowledge: bool = True) -> None:
        """Before reporting what landed: finish what a crashed run left (store the rolled-forward
        offset, acknowledge the slot up to it); a slot ahead of the offset still fails."""
        if state.offset is not None and state.offset != state.stored:
            state.save(state.offset)
        if not acknowledge:
            return
        slot = admin.slot_status(state.conn, self.capture.resolved_slot_name)
        if slot is not None and state.offset is not None:
            planning.check_slot_not_ahead(slot, state.offset)  # a broken capture is never reported as fine
        committed = state.offset.lsn if state.offset is not None else None
        confirmed = slot.confirmed_flush_lsn if slot is not None else None
        if committed is not None and confirmed is not None and confirmed < committed:
            state.acknowledge(committed)  # a crashed run stopped after storing its offset

    def _spec(
        self, state: _RunState, window: Window, offset: PostgresOffset | None, interval: RunInterval | None = None
    ) -> PostgresJobSpec:
        capture = self.capture
        return PostgresJobSpec(
            topic_prefix=capture.topic_prefix,
            connection=state.hook.connection_info,
            slot_name=capture.resolved_slot_name,
            publication_name=capture.resolved_publication_name,
            tables=state.tables,
            window=window,
            sink_path=capture.sink_path,
            previous_commit_lsn=offset.lsn_commit if offset else None,
            options=capture.capture_options(),
            spark=capture.spark_options(),
            events=capture.event_settings(),
            incremental=offset.incremental if offset is not None and window.kind == "stream" else None,
            signal_table=capture.signal_table_ref,
            incremental_watermarks=capture.incremental_watermarks,
            run=None if interval is None else interval.to_dict(),
            checkpoint=None if state.offset is None else planning.checkpoint(state.offset),
        )

    def _run_job(self, spec: PostgresJobSpec) -> CommitEntry:
        from airflow_provider_cdc import spark_runner

        capture = self.capture
        if capture.spark_conn_id is None:
            return spark_runner.run_embedded(spec)
        try:
            return spark_runner.run_submitted(
                spec,
                spark_conn_id=capture.spark_conn_id,
                conf=dict(capture.spark_conf),
                application=capture.spark_application,
            )
        except AirflowException as exc:
            if "Error code is: 2." in str(exc):  # the job's exit code for terminal engine errors
                raise AirflowFailException(f"the capture job failed permanently: {exc}") from exc
            raise


class _RunState:
    """Offsets, commit log and slot of one run, written in the invariant order."""

    def __init__(
        self,
        operator: _WindowOperator,
        hook: PostgresCdcHook,
        conn: Any,
        identity: OffsetIdentity,
        store: Any,
        commit_log: CommitLog,
        stored: PostgresOffset | None,
        offset: PostgresOffset | None,
    ):
        self.operator = operator
        self.hook = hook
        self.conn = conn
        self.identity = identity
        self.store = store
        self.commit_log = commit_log
        self.stored = stored
        self.offset = offset
        self.tables: tuple[TableRef, ...] = ()

    def save(self, offset: PostgresOffset) -> PostgresOffset:
        self.stored = save_offset(self.store, offset, previous=self.stored)
        self.offset = self.stored
        return self.stored

    def acknowledge(self, lsn: Lsn) -> Lsn:
        return admin.advance_slot(self.conn, self.operator.capture.resolved_slot_name, lsn)


class PostgresCdcSnapshotOperator(_WindowOperator):
    """Initial (or repeated) consistent snapshot, per ``snapshot_mode``; skipped when not due.

    Rows are read in parallel Spark partitions pinned to a snapshot exported by a temporary
    slot; the capture's slot is then acknowledged at the snapshot's consistent point, where the
    next stream window starts.
    """

    def _run(self, context: Context) -> dict[str, Any]:
        capture = self.capture
        interval = run_interval(context)
        with self._state() as state:
            decision = self._decide(state, context, "snapshot")
            if decision.replay:
                return self._replay(state, decision)
            slot = admin.slot_status(state.conn, capture.resolved_slot_name)
            decision = planning.decide_snapshot(capture.snapshot_mode, state.offset, slot)
            if not decision.run:
                if state.offset is not None and state.offset != state.stored:
                    state.save(state.offset)  # record a roll-forward found while deciding
                raise AirflowSkipException(decision.reason)
            self.log.info("snapshot due: %s", decision.reason)
            gap = _gap(decision, state.offset, slot)
            if gap is not None:
                self.log.warning(
                    "capture %s lost changes after %s (%s): re-snapshotting; the gap is recorded in %s",
                    capture.topic_prefix,
                    gap.last_lsn,
                    gap.reason,
                    gap_topic(capture.topic_prefix),
                )
            if planning.streams(capture.snapshot_mode):
                if slot is not None and slot.wal_lost and capture.snapshot_mode == "when_needed":
                    self.log.warning("dropping slot %r: its WAL was lost", slot.slot_name)
                    admin.drop_slot(state.conn, slot.slot_name)
                    slot = None
                if slot is None and capture.snapshot_mode != "when_needed":
                    admin.require_slot(state.conn, capture.resolved_slot_name, state.identity.database)
                if slot is None:
                    admin.ensure_slot(state.conn, capture.resolved_slot_name, state.identity.database)
                    self.log.warning("created replication slot %r", capture.resolved_slot_name)
                else:
                    admin.verify_slot(slot, state.identity.database)
            window, pending = planning.plan_snapshot_window(state.offset, state.identity, now_ms=_now_ms())
            # Remember which tables the snapshot covers (a table that joins later has none). Stored
            # with the pending window, so a run that stops after the sink commit keeps it too.
            pending = replace(pending, extra={**pending.extra, "tables": [r.to_json() for r in state.tables]})
            state.save(pending)
            faults.point("operator.pending_saved")
            entry = self._run_job(replace(self._spec(state, window, state.offset, interval), gap=gap))
            state.save(planning.offset_after_commit(state.offset, entry, state.identity))
            faults.point("operator.offset_saved")
            confirmed = None
            if planning.streams(capture.snapshot_mode):
                assert entry.window.to_lsn is not None
                confirmed = state.acknowledge(entry.window.to_lsn)
                faults.point("operator.acknowledged")
            summary = _summary(entry, capture, confirmed_lsn=confirmed, slot=None)
        self.log.info("snapshot committed: %s", summary)
        return summary

    def _replay(self, state: _RunState, decision: RunDecision) -> dict[str, Any]:
        """A backfill, or a re-run of a run whose snapshot landed: nothing is read."""
        return self._report_landed(
            state, decision, "nothing to report (an incremental snapshot repairs a table, see docs/incremental.md)"
        )


class PostgresCdcBatchOperator(_WindowOperator):
    """One stream window: changes committed in ``[offset, upto_lsn)``, written, then acknowledged.

    :param capture: the capture's configuration
    The window also carries the capture's incremental snapshot (docs/incremental.md): it emits
    the chunks the previous window read, applies signals, and reads the next chunks.

    :param capture: the capture's configuration
    :param upto_lsn: end of the window (exclusive, on commit LSNs); default: the server's current
        WAL insert position at run start. Templated.
    :param signals: Debezium signals to apply before the window, e.g.
        ``[{"type": "execute-snapshot", "data": {"data-collections": ["public.orders"]}}]``
        (a list of objects, or its JSON). Signals in the DAG run's conf under ``cdc_signals`` are
        applied too. Each is applied once, also when the task is retried. Templated.
    """

    template_fields: Sequence[str] = ("upto_lsn", "signals")

    def __init__(
        self,
        *,
        capture: PostgresCapture,
        upto_lsn: str | None = None,
        signals: Sequence[dict[str, Any]] | str | None = None,
        **kwargs: Any,
    ) -> None:
        # Runs after a snapshot task that is skipped once the snapshot exists.
        kwargs.setdefault("trigger_rule", "none_failed")
        super().__init__(capture=capture, **kwargs)
        self.upto_lsn = upto_lsn
        self.signals = signals

    def _run(self, context: Context) -> dict[str, Any]:
        capture = self.capture
        if not planning.streams(capture.snapshot_mode):
            raise AirflowSkipException("snapshot_mode='initial_only': this capture does not stream")
        try:
            requested = Lsn(self.upto_lsn) if self.upto_lsn not in (None, "") else None
        except InvalidLsnError as exc:
            raise InvalidLsnError(f"upto_lsn of task {self.task_id!r} is invalid: {exc}") from None
        signals = airflow_signals(self.signals, context, self.task_id)
        interval = run_interval(context)
        with self._state() as state:
            decision = self._decide(state, context, "stream")
            if decision.replay:
                return self._replay(state, decision, signals)
            new_tables = self._tables_without_snapshot(state)
            slot = admin.require_slot(state.conn, capture.resolved_slot_name, state.identity.database)

            def plan_window() -> planning.StreamPlan:
                current = admin.current_lsn(state.conn)
                return planning.plan_stream_window(
                    mode=capture.snapshot_mode,
                    offset=state.offset,
                    slot=slot,
                    identity=state.identity,
                    target=requested if requested is not None else current,
                    current_lsn=current,
                    now_ms=_now_ms(),
                )

            plan = plan_window()  # validates everything before the heartbeat writes to the source
            _check_covers_staged_chunks(plan.window, state.offset)
            # Signals and new tables are checked here too, before anything is written.
            incremental, known_tables, applied = _incremental_update(state.offset, signals, new_tables, state.tables)
            retrying = state.offset is not None and plan.window == state.offset.pending
            if capture.heartbeat_action_query and not retrying:
                admin.run_heartbeat(state.conn, capture.heartbeat_action_query)
                if requested is None:
                    plan = plan_window()  # a target after the heartbeat, so it lands in this window
            for note in plan.notes:
                self.log.warning("%s", note)
            offset = plan.offset
            if incremental is not None:
                offset = replace(offset, incremental=incremental, extra={**offset.extra, **known_tables})
            for note in applied:
                self.log.info("%s", note)
            if plan.acknowledge_first is not None:
                state.acknowledge(plan.acknowledge_first)
            state.save(offset)
            faults.point("operator.pending_saved")
            self.log.info(
                "window %s: [%s, %s), %d bytes of WAL; slot lag before the run: %s bytes",
                plan.window.window_id,
                plan.window.from_lsn,
                plan.window.to_lsn,
                (plan.window.to_lsn or 0) - (plan.window.from_lsn or 0),
                slot.pending_bytes,
            )
            entry = self._run_job(self._spec(state, plan.window, offset, interval))
            state.save(planning.offset_after_commit(state.offset, entry, state.identity))
            faults.point("operator.offset_saved")
            assert entry.window.to_lsn is not None
            confirmed = state.acknowledge(entry.window.to_lsn)
            faults.point("operator.acknowledged")
            after = admin.slot_status(state.conn, capture.resolved_slot_name)
            summary = _summary(entry, capture, confirmed_lsn=confirmed, slot=after)
        self.log.info(
            "window %s committed: %d changes in %d transactions; now %s bytes behind",
            entry.window_id,
            summary["changes"],
            summary["transactions"],
            summary["bytes_behind"],
        )
        return summary

    def _replay(self, state: _RunState, decision: RunDecision, signals: Sequence[Signal]) -> dict[str, Any]:
        """A backfill, or a re-run of a run whose window landed: finish what a crashed run left
        (roll the offset forward, acknowledge), then report what landed. Never reads the slot."""
        if signals:
            self.log.warning("signals are not applied by a replayed run: %s", [s.describe() for s in signals])
        if self.upto_lsn not in (None, ""):
            self.log.warning("upto_lsn %s is ignored: a replayed run reads nothing", self.upto_lsn)
        return self._report_landed(
            state,
            decision,
            "a capture only moves forward and never re-reads the slot for a past interval (its changes are in "
            "the windows of the runs around it; an incremental snapshot repairs a table, see docs/incremental.md)",
        )

    def _tables_without_snapshot(self, state: _RunState) -> list[TableRef]:
        """Tables that joined the capture after its snapshot: snapshotted incrementally (the
        default), or refused with ``new_table_snapshot='fail'``."""
        snapshotted = state.offset.extra.get("tables") if state.offset is not None else None
        if snapshotted is None or self.capture.snapshot_mode == "never":
            return []
        known = {TableRef(*t) for t in snapshotted}
        new = [r for r in state.tables if r not in known]
        if new and self.capture.new_table_snapshot == "fail":
            raise SnapshotRequiredError(
                f"table(s) {', '.join(map(str, new))} joined capture {self.capture.topic_prefix!r} after its "
                "snapshot: their existing rows were never captured. Run the snapshot once more "
                "(snapshot_mode='always' for one run) before streaming them, remove them from the capture, "
                "or set new_table_snapshot='incremental'."
            )
        return new


class PostgresCdcCurrentStateOperator(_CaptureOperator):
    """Maintain current-state tables of captured tables from the committed change windows.

    Each run folds the windows committed since the last run into the state (deletes remove rows,
    key changes move them, truncates clear the table, unchanged TOAST values are kept); running
    it again without new windows changes nothing. With ``as_of_window`` it rebuilds the state at
    that committed window instead (for backfills), leaving the current version where it is.

    :param capture: the capture
    :param state_path: base directory (or Hadoop URI) of the state tables
    :param tables: subset of the capture's tables (default: all)
    :param as_of_window: a committed window id (e.g. ``"0000000042"``); templated
    """

    template_fields: Sequence[str] = ("state_path", "as_of_window")

    def __init__(
        self,
        *,
        capture: PostgresCapture,
        state_path: str,
        tables: Sequence[str] | None = None,
        as_of_window: str | int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(capture=capture, **kwargs)
        self.state_path = state_path
        self.tables = None if tables is None else tuple(TableRef.coerce(t) for t in tables)
        unknown = [str(r) for r in self.tables or () if capture.table_refs and r not in capture.table_refs]
        if unknown:
            raise CdcConfigurationError(f"tables {unknown} are not captured by {capture.topic_prefix!r}")
        self.as_of_window = as_of_window

    def execute(self, context: Context) -> list[dict[str, Any]]:
        from airflow_provider_cdc import spark_runner
        from airflow_provider_cdc.cdc.spec import StateJobSpec

        capture = self.capture
        as_of = None if self.as_of_window in (None, "") else int(str(self.as_of_window))
        if as_of is None:
            as_of = self._as_of_for_past_run(context)
        tables = self.tables
        if tables is None:
            if capture.table_refs:
                tables = capture.table_refs
            else:
                with fail_fast_on_terminal_errors(), self.hook().session() as conn:
                    tables = capture.resolve_tables(conn)
        spec = StateJobSpec(
            topic_prefix=capture.topic_prefix,
            sink_path=capture.sink_path,
            state_path=self.state_path,
            topics=tuple(
                (topic.name, topic.directory)
                for topic in (Topic.for_table(capture.topic_prefix, r.schema, r.name) for r in tables)
            ),
            as_of_seq=as_of,
            spark=capture.spark_options(),
        )
        with fail_fast_on_terminal_errors():
            if capture.spark_conn_id is None:
                from airflow_provider_cdc.cdc.state import run_state_job

                results = run_state_job(spec)
            else:
                results = spark_runner.submit(
                    spec.to_json(),
                    name=f"cdc-state-{capture.topic_prefix}",
                    secrets={},
                    spark_conn_id=capture.spark_conn_id,
                    conf=dict(capture.spark_conf),
                    application=capture.spark_application,
                )
        for result in results:
            self.log.info(
                "%s: %s (window %s, %d rows)", result["topic"], result["action"], result["window_id"], result["rows"]
            )
        return results

    def _as_of_for_past_run(self, context: Context) -> int | None:
        """A backfill, or a re-run of a past run: the window its state is rebuilt "as of" (the
        current version stays); None for every other run (the current state)."""
        from airflow_provider_cdc.cdc.sinks.reader import committed_windows

        interval = run_interval(context)
        if interval is None:
            return None
        target = state_target(committed_windows(self.capture.sink_path, self.capture.topic_prefix), interval)
        if target.skip:
            raise AirflowSkipException(target.reason)
        self.log.info("%s", target.reason)
        return None if target.as_of is None else target.as_of.window.seq


def airflow_signals(value: Any, context: Context, task_id: str) -> list[Signal]:
    """Signals given to the operator (``signals``) and in the DAG run's conf (``cdc_signals``).

    Each gets a stable id (its own ``id``, or one made of the run, the task and its position), so
    a retried task does not apply it twice."""
    import json

    dag_run = context.get("dag_run")
    conf = (getattr(dag_run, "conf", None) or {}) if dag_run is not None else {}
    run = f"{getattr(dag_run, 'dag_id', '?')}:{getattr(dag_run, 'run_id', '?')}"
    out: list[Signal] = []
    for origin, key, raw in (
        ("operator argument 'signals'", "arg", value),
        ("DAG run conf 'cdc_signals'", "conf", conf.get("cdc_signals") if isinstance(conf, dict) else None),
    ):
        if raw in (None, "", [], ()):
            continue
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError as exc:
                raise SignalError(f"{origin} is not valid JSON: {exc}") from None
        items = [raw] if isinstance(raw, dict) else raw
        if not isinstance(items, (list, tuple)) or not all(isinstance(i, dict) for i in items):
            raise SignalError(f"{origin} must be a signal object or a list of them, got {type(raw).__name__}")
        for i, item in enumerate(items):
            unknown = sorted(set(item) - {"id", "type", "data"})
            if unknown:
                raise SignalError(f"{origin}: signal {i} has unknown keys {unknown} (use id, type, data)")
            signal_id = item.get("id") or f"airflow:{run}:{task_id}:{key}:{i}"
            out.append(Signal.parse(signal_id, item.get("type"), item.get("data"), origin=f"Airflow {origin}"))
    return out


def _incremental_update(
    offset: PostgresOffset | None,
    signals: Sequence[Signal],
    new_tables: Sequence[TableRef],
    captured: Sequence[TableRef],
) -> tuple[IncrementalState | None, dict[str, Any], list[str]]:
    """The incremental snapshot state after Airflow-side signals and newly captured tables;
    raises :class:`SignalError` for a signal that cannot apply. (None: nothing to change.)"""
    if not signals and not new_tables:
        return None, {}, []
    state = (offset.incremental if offset is not None else None) or IncrementalState()
    notes: list[str] = []
    for ref in new_tables:
        if state.progress(ref) is None:
            state = replace(state, tables=(*state.tables, TableProgress(ref, f"new-table:{ref.data_collection}")))
            notes.append(f"{ref} joined the capture after its snapshot: snapshotting its rows incrementally")
    for signal in signals:
        if signal.id in state.applied_signals:
            notes.append(f"{signal.describe()}: already applied (a retry)")
            continue
        state, note = apply_signal(state, signal, captured)
        state = remember_applied(state, signal.id)
        notes.append(note)
    known: dict[str, Any] = {}
    if new_tables and offset is not None:
        listed = [list(t) for t in offset.extra.get("tables", [])]
        known = {"tables": listed + [r.to_json() for r in new_tables if r.to_json() not in listed]}
    return state, known, notes


def _summary(
    entry: CommitEntry, capture: PostgresCapture, *, confirmed_lsn: Lsn | None, slot: admin.SlotStatus | None
) -> dict[str, Any]:
    side = side_topics(capture.topic_prefix)
    events = {
        d.topic: dict(d.ops)
        for d in entry.datasets
        if d.topic not in side and not is_staged_topic(capture.topic_prefix, d.topic)
    }
    return {
        "window_id": entry.window_id,
        "kind": entry.window.kind,
        "from_lsn": None if entry.window.from_lsn is None else str(entry.window.from_lsn),
        "to_lsn": None if entry.window.to_lsn is None else str(entry.window.to_lsn),
        "events": events,
        "changes": sum(sum(ops.values()) for ops in events.values()),
        "transactions": entry.transactions,
        "slot_confirmed_lsn": None if confirmed_lsn is None else str(confirmed_lsn),
        "bytes_behind": None if slot is None else slot.pending_bytes,
        "sink_path": capture.sink_path,
        "job_pid": entry.stats.get("job_pid"),
        "gap": entry.stats.get("gap"),
        **_incremental_summary(entry),
    }


def _check_covers_staged_chunks(window: Window, offset: PostgresOffset | None) -> None:
    """A window emits the incremental chunks the previous one staged, which needs the stream up
    to their high watermarks (written after the previous window's end): an explicit ``upto_lsn``
    before them would emit rows the stream has not yet been checked against."""
    staged = offset.incremental.staged if offset is not None and offset.incremental is not None else ()
    if not staged or window.to_lsn is None:
        return
    high = Lsn(max(c.high_lsn for c in staged))
    if window.to_lsn < high:
        raise CdcConfigurationError(
            f"upto_lsn {window.to_lsn} is before {high}, the high watermark of the incremental snapshot chunks "
            "the previous window read: give a later upto_lsn, or leave it unset (the current position)"
        )


def _landed_runs(offset: PostgresOffset | None) -> dict[str, Any] | None:
    return offset.extra.get("runs") if offset is not None else None


def _incremental_summary(entry: CommitEntry) -> dict[str, Any]:
    if "incremental" not in entry.stats:
        return {}
    state = IncrementalState.from_dict(entry.stats["incremental"])
    if state.idle and not state.history and not entry.stats.get("incremental_run", {}).get("notes"):
        return {}
    return {"incremental_snapshot": {**state.summary(), **entry.stats.get("incremental_run", {})}}


def _gap(
    decision: planning.SnapshotDecision, offset: PostgresOffset | None, slot: admin.SlotStatus | None
) -> CaptureGap | None:
    if decision.gap_reason is None:
        return None
    return CaptureGap(
        reason=decision.gap_reason,
        detail=decision.reason,
        last_window_id=None if offset is None or not offset.window_seq else window_id_for(offset.window_seq),
        last_lsn=None if offset is None or offset.lsn is None else str(offset.lsn),
        slot_confirmed_lsn=None if slot is None or slot.confirmed_flush_lsn is None else str(slot.confirmed_flush_lsn),
        wal_status=None if slot is None else slot.wal_status,
        detected_ts_ms=_now_ms(),
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


__all__ = [
    "PostgresCdcBatchOperator",
    "PostgresCdcCurrentStateOperator",
    "PostgresCdcSetupOperator",
    "PostgresCdcSnapshotOperator",
    "fail_fast_on_terminal_errors",
]
