"""The operators of every capture, whatever its source: setup → snapshot → window batch, and
the current-state fold.

Each is thin: it decides (with the engine's pure planning functions), runs the job from one
spec, and records progress in the fixed order *sink commit → offset → acknowledgement* (where
the source has one: PostgreSQL's slot). What differs per source is behind the capture object
(:mod:`airflow_provider_cdc.captures`): its setup and its run session. Engine errors marked
terminal (bad configuration, lost slot, inconsistent offsets) fail the task without retries;
transient ones (a dropped connection) are left to Airflow's retries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, ClassVar

from airflow_provider_cdc.captures.base import Capture, SourceRun
from airflow_provider_cdc.cdc.basics import faults
from airflow_provider_cdc.cdc.basics.errors import (
    CdcConfigurationError,
    CdcError,
    CdcStateError,
    InvalidLsnError,
    SnapshotRequiredError,
)
from airflow_provider_cdc.cdc.basics.naming import Topic, gap_topic, is_staged_topic, message_topic, side_topics
from airflow_provider_cdc.cdc.basics.positions import Position
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.planning.incremental import (
    MAX_RUN_CONF_SIGNALS,
    IncrementalState,
    Signal,
    SignalError,
    TableProgress,
    apply_signal,
    check_run_conf_signal,
    remember_applied,
)
from airflow_provider_cdc.cdc.planning.offset import CaptureOffset
from airflow_provider_cdc.cdc.planning.plan import (
    checkpoint,
    decide_snapshot,
    offset_after_commit,
    plan_snapshot_window,
    reconcile,
)
from airflow_provider_cdc.cdc.planning.runs import RunDecision, RunInterval, decide, state_target
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry, CommitLog
from airflow_provider_cdc.cdc.sinks.path_checks import check_writable
from airflow_provider_cdc.cdc.sinks.storage import storage_for
from airflow_provider_cdc.offsets.base import load_offset, save_offset
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
def fail_fast_on_terminal_errors(capture: Capture | None = None) -> Iterator[None]:
    """Terminal engine errors fail the task without retries; a source session that died mid-run
    becomes a (retryable) CdcTransientError that says so; others propagate unchanged.

    The replacement carries the original's message and traceback (where the engine raised it)
    and is not chained to it, so the task log shows one traceback, not a "direct cause" pair.
    """
    from airflow_provider_cdc.cdc.basics.errors import CdcTransientError

    lost = capture.connection_errors() if capture is not None else _postgres_connection_errors()
    source = capture.SOURCE_NAME if capture is not None else "PostgreSQL"
    try:
        yield
    except CdcError as exc:
        if exc.terminal:
            raise AirflowFailException(f"{type(exc).__name__}: {exc}").with_traceback(exc.__traceback__) from None
        raise
    except lost as exc:  # a session of the run died: server restart, network, kill
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise CdcTransientError(
            f"lost the connection to {source} during the run ({type(exc).__name__}: {detail}); "
            "nothing past the stored offset was acknowledged, a retry continues from there"
        ).with_traceback(exc.__traceback__) from None


def _spark_runner() -> Any:
    """:mod:`airflow_provider_cdc.spark_runner`, imported when a task runs, not at DAG parse."""
    from airflow_provider_cdc import spark_runner

    return spark_runner


def _interrupt_behind(exc: BaseException) -> BaseException | None:
    """The timeout (or other interrupt: not an Exception) that ``exc`` is or that it hides.

    Airflow's timeout is raised in the main thread, usually inside the py4j call waiting for the
    running Spark job; PySpark's cleanup then makes another call on that connection, which can
    fail with a Py4JError that has the timeout as context (spark_runner.cancel_before_timeout
    drops the interrupted call first; this is the fallback)."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return None
        if not isinstance(seen, Exception):
            return seen
        seen = seen.__context__
    return None


def _postgres_connection_errors() -> tuple[type[BaseException], ...]:
    import psycopg

    return (psycopg.OperationalError,)


class CdcCaptureOperator(BaseOperator):
    """Base of the operators that act on one capture (any source).

    Dynamic task mapping: give the capture (and what the outlets derive from) in ``.partial()``
    and map the other arguments. The outlets are derived there, as for an unmapped task; mapping
    the capture itself is refused: its outlets could not be known when the DAG is parsed, and its
    settings would be stored in the serialized DAG or in XCom.
    """

    ui_color = "#d4ecff"
    #: Arguments that must be given in ``.partial()``, never mapped.
    unmappable: ClassVar[tuple[str, ...]] = ("capture",)

    @classmethod
    def partial(cls, **kwargs: Any) -> Any:  # type: ignore[override]
        """``BaseOperator.partial``, with the outlets an unmapped task would have; refuses to map
        what they derive from (see the class docstring)."""
        if not isinstance(kwargs.get("capture"), Capture):
            raise _unmappable_error(cls, ["capture"])
        outlets = cls._partial_outlets(kwargs)
        if outlets is not None:
            kwargs.setdefault("outlets", outlets)
        return _CapturePartial(super().partial(**kwargs), cls, kwargs)

    @classmethod
    def _partial_outlets(cls, kwargs: dict[str, Any]) -> list[Any] | None:
        return None

    def get_openlineage_facets_on_start(self) -> Any:
        """OpenLineage START event: no datasets (the COMPLETE event reports what the run did)."""
        from airflow_provider_cdc.operators.lineage import start_lineage

        return start_lineage(self)

    def on_kill(self) -> None:
        """Stop what this task started when Airflow kills it ("mark failed", its supervisor's
        SIGTERM; an ``execution_timeout`` stops it as it unwinds the run): a job submitted with
        ``spark_conn_id`` by killing every process ``spark-submit`` started (in client mode the
        Python driver, which holds the replication session), then as ``SparkSubmitOperator.on_kill``
        does (the hook kills ``spark-submit`` and, on a cluster, the driver); the in-process
        session's Spark jobs, cancelled from another thread (the main thread is usually inside a
        py4j call, which must not be re-entered), and that call dropped. A run still executing
        then ends where it is: nothing is saved or acknowledged after a kill, the capture lock and
        the source session are released as the run unwinds (by the server, if the process is
        killed outright), and the next run continues from the last committed window (a window the
        sink committed is rolled forward, once).
        """
        self._killed = True
        if not getattr(self, "_executing", False):
            return
        try:
            self._stop_jobs()
            if self.capture.spark_conn_id is None:
                _spark_runner().drop_interrupted_call()
        finally:  # a SIGTERM during the run: end it here, whatever stopping the jobs did
            raise self._terminated()

    def _terminated(self) -> BaseException:
        from airflow.sdk.exceptions import AirflowTaskTerminated

        return AirflowTaskTerminated(
            f"task {self.task_id!r} was killed during its run: nothing past the last committed window "
            "was saved or acknowledged; the next run continues from there"
        )

    def _stop_jobs(self) -> None:
        """Stop the Spark work of this run, if any (best effort: never raises)."""
        job, self._spark_job = getattr(self, "_spark_job", None), None
        try:
            if job is not None:
                self.log.warning("stopping the submitted Spark job")
                _spark_runner().kill_submitted(job)
            elif self.capture.spark_conn_id is None:
                self.log.warning("cancelling the in-process Spark jobs")
                _spark_runner().cancel_embedded()
        except Exception as exc:
            self.log.warning("could not stop the run's Spark job: %s", exc)

    @contextmanager
    def _running(self) -> Iterator[None]:
        """Mark the run in progress, for :meth:`on_kill`."""
        self._killed, self._executing, self._spark_job = False, True, None
        try:
            if self.capture.spark_conn_id is None:
                with _spark_runner().cancel_before_timeout(lambda: self._executing):
                    yield
            else:
                yield
        except BaseException as exc:
            if self._killed:  # on_kill stopped the jobs; PySpark's cleanup may have hidden its exception
                from airflow.sdk.exceptions import AirflowTaskTerminated

                if not isinstance(exc, AirflowTaskTerminated):
                    raise self._terminated() from exc
                raise
            # An execution_timeout (or another interrupt) unwinds execute before Airflow calls
            # on_kill, which then finds no run: stop what may still run (a submitted job is
            # stopped by spark_runner.submit itself). After an error of the job itself there is
            # nothing left to stop.
            interrupt = _interrupt_behind(exc)
            if interrupt is None:
                raise
            self._stop_jobs()
            if interrupt is not exc:  # PySpark's cleanup hid it: report the timeout
                raise interrupt.with_traceback(interrupt.__traceback__) from None
            raise
        finally:
            self._executing, self._spark_job = False, None

    def _track_job(self, hook: Any) -> None:
        """Remember the submitted job's hook (for :meth:`on_kill`) before it starts."""
        self._spark_job = hook

    def _check_not_killed(self, action: str) -> None:
        if getattr(self, "_killed", False):
            from airflow.sdk.exceptions import AirflowTaskTerminated

            raise AirflowTaskTerminated(f"task {self.task_id!r} was killed: not {action}")

    def __init__(self, *, capture: Capture, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(capture, Capture):
            raise CdcConfigurationError(
                f"capture must be a capture object (e.g. PostgresCapture), got {type(capture).__name__}"
            )
        self.capture = capture

    def hook(self) -> Any:
        return self.capture.hook()  # type: ignore[attr-defined]

    @contextmanager
    def _object_store(self) -> Iterator[None]:
        """The capture's object-store access (``object_store_conn_id``, read now) active for the
        block: every store client the task builds takes it (commit log, readers, lake tables, jobs
        run in the task's process); a submitted job gets it through its spec and environment. Kept
        for the lineage the task reports after ``execute``."""
        from airflow_provider_cdc.cdc.sinks import object_store

        self._store_access = self.capture.object_store_access()
        with object_store.using(self._store_access):
            yield

    @contextmanager
    def _after_run(self) -> Iterator[None]:
        """The access of the run that just ended, for the lineage read after ``execute``."""
        from airflow_provider_cdc.cdc.sinks import object_store

        with object_store.using(getattr(self, "_store_access", None)):
            yield


_CaptureOperator = CdcCaptureOperator  # the name source-specific maintenance operators extend


def _unmappable_error(operator: type, names: Sequence[str]) -> CdcConfigurationError:
    listed = ", ".join(repr(n) for n in names)
    return CdcConfigurationError(
        f"{operator.__name__}: {listed} cannot be mapped: give it in .partial(), and map the other arguments "
        "with .expand(). The task's outlets (the datasets it lands) are derived from it when the DAG is "
        "parsed, and a capture's settings (which may hold credentials, e.g. in spark_conf) must not be "
        "stored in the serialized DAG or in XCom. For several captures, write one task per capture."
    )


class _CapturePartial:
    """What ``.partial()`` of a capture operator returns: Airflow's ``OperatorPartial``, whose
    ``expand`` / ``expand_kwargs`` first refuse mapping the operator's ``unmappable`` arguments."""

    def __init__(self, partial: Any, operator: type[CdcCaptureOperator], given: dict[str, Any]) -> None:
        self._partial = partial
        self._operator = operator
        self._given = set(given)

    def expand(self, **mapped_kwargs: Any) -> Any:
        self._refuse([n for n in self._operator.unmappable if n in mapped_kwargs])
        return self._partial.expand(**mapped_kwargs)

    def expand_kwargs(self, kwargs: Any, *, strict: bool = True) -> Any:
        if isinstance(kwargs, (list, tuple)) and all(isinstance(k, dict) for k in kwargs):
            self._refuse([n for n in self._operator.unmappable if any(n in k for k in kwargs)])
        else:  # an XCom: any key could come from it at run time
            self._refuse([n for n in self._operator.unmappable if n not in self._given])
        return self._partial.expand_kwargs(kwargs, strict=strict)

    def _refuse(self, names: list[str]) -> None:
        if names:
            self._partial._expand_called = True  # no "was never mapped" warning on top of the error
            raise _unmappable_error(self._operator, names)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._partial, name)

    def __repr__(self) -> str:
        return repr(self._partial)


class CdcSetupOperator(CdcCaptureOperator):
    """Preflight checks, then idempotent creation of what the capture needs on the source
    (PostgreSQL: the publication and the slot).

    Fails with one error listing every problem found, each with its fix (server settings and
    privileges, tables that do not exist or cannot emit complete update/delete events, missing
    grants, the source's own objects, the sink path, column masks, the stored offset), before
    anything is created.
    """

    def execute(self, context: Context) -> dict[str, Any]:
        with self._running(), fail_fast_on_terminal_errors(self.capture), self._object_store():
            check_schedule_within_retention(self.capture, self.dag if self.has_dag() else None)
            return self.capture.setup(self.log)


def schedule_gap_ms(dag: Any, runs: int = 8) -> int | None:
    """The longest gap between consecutive scheduled runs of ``dag`` (over ``runs`` runs from a
    fixed date), or None for a DAG without a periodic schedule.

    Reads the schedule through the Task SDK's public timetable classes (their cron expression or
    delta), the form a DAG file holds. A custom timetable cannot say how far apart its runs are:
    the check is then skipped, and the log says so.
    """
    from airflow import sdk

    timetable = getattr(dag, "timetable", None)
    start = datetime(2025, 1, 6, tzinfo=timezone.utc)
    if isinstance(timetable, sdk.MultipleCronTriggerTimetable):
        times = sorted({t for tt in timetable.timetables for t in _cron_times(tt, start, runs)})[:runs]
    elif isinstance(timetable, (sdk.CronDataIntervalTimetable, sdk.CronTriggerTimetable)):
        times = _cron_times(timetable, start, runs)
    elif isinstance(timetable, (sdk.DeltaDataIntervalTimetable, sdk.DeltaTriggerTimetable)):
        times = [start]
        for _ in range(runs - 1):
            times.append(times[-1] + timetable.delta)
    else:
        if timetable is not None and getattr(timetable, "periodic", False):
            log.warning(
                "DAG %r has a custom timetable (%s): the check that its runs are closer together than "
                "the source keeps unread changes is skipped",
                getattr(dag, "dag_id", "?"),
                type(timetable).__name__,
            )
        return None
    from itertools import pairwise

    gaps = [int((b - a).total_seconds() * 1000) for a, b in pairwise(times)]
    return max(gaps) if gaps else None


def _cron_times(timetable: Any, start: datetime, runs: int) -> list[datetime]:
    """The first ``runs`` fire times of a cron timetable after ``start``, in its time zone."""
    import pendulum
    from croniter import croniter  # the Task SDK's own cron library

    zone = timetable.timezone if not isinstance(timetable.timezone, str) else pendulum.timezone(timetable.timezone)
    it = croniter(timetable.expression, start.astimezone(zone))
    return [it.get_next(datetime) for _ in range(runs)]


def check_schedule_within_retention(capture: Capture, dag: Any) -> None:
    """Refuse a schedule whose runs are further apart than the source keeps unread changes (the
    stream or slot would expire between two runs that both succeed)."""
    retention = capture.retention_ms()
    gap = None if retention is None else schedule_gap_ms(dag)
    if retention is None or gap is None or gap < retention:
        return
    raise CdcConfigurationError(
        f"DAG {dag.dag_id!r} runs as much as {gap / 3_600_000:.2f} h apart, but {capture.SOURCE_NAME} expires "
        f"changes not read for {retention / 3_600_000:.2f} h (intent_retention_ms={retention}, the server's "
        "cdc_intent_retention_ms): every run would find the stream expired. Schedule the DAG more often than "
        "the retention (hourly is typical), or raise cdc_intent_retention_ms on the cluster and "
        "intent_retention_ms on the capture"
    )


class _WindowOperator(CdcCaptureOperator):
    """Shared run logic of the snapshot and window operators (subclasses define ``_run``).

    Their outlets are the landed datasets (:mod:`airflow_provider_cdc.operators.assets`); each
    successful run puts what it landed in each on the asset events' ``extra``.
    """

    def __init__(self, *, capture: Capture, **kwargs: Any) -> None:
        from airflow_provider_cdc.operators.assets import window_outlets

        if isinstance(capture, Capture):
            kwargs.setdefault("outlets", window_outlets(capture))
        super().__init__(capture=capture, **kwargs)
        self._run_tables: tuple[TableRef, ...] = ()
        # What this task object's run did, for its lineage: False until it runs; then the summary
        # of the window it committed, or None (skipped, or only reported what landed before).
        self._ran = False
        self._committed: dict[str, Any] | None = None

    @classmethod
    def _partial_outlets(cls, kwargs: dict[str, Any]) -> list[Any] | None:
        from airflow_provider_cdc.operators.assets import window_outlets

        return window_outlets(kwargs["capture"])

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_cdc.operators.assets import emit_window_events

        self._ran, self._committed = True, None
        with self._running(), fail_fast_on_terminal_errors(self.capture), self._object_store():
            summary = self._run(context)  # type: ignore[attr-defined]
        if not summary.get("replayed"):
            self._committed = summary
        emit_window_events(context, self.capture, summary, self._run_tables)
        return summary

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (when its provider is installed): the source tables this run read in, the
        datasets it landed rows in out; nothing for a skipped run, a window that landed nothing
        or a run that only reported what landed before."""
        from airflow_provider_cdc.operators.lineage import window_lineage

        with self._after_run():
            return window_lineage(self, task_instance)

    @contextmanager
    def _state(self) -> Iterator[_RunState]:
        capture = self.capture
        check_writable(capture.sink_path)  # before the source is touched (an object store: a probe)
        with capture.open_run(self.log) as source:
            store = capture.store()
            commit_log = CommitLog(storage_for(capture.sink_path), capture.topic_prefix)
            stored = load_offset(store, capture.topic_prefix, capture.OFFSET_TYPE)
            latest = commit_log.latest()
            from airflow_provider_cdc.cdc.sinks.reader import check_landed_tables  # pyarrow: not at DAG parse

            check_landed_tables(
                latest,
                capture.sink_path,
                capture.topic_prefix,
                capture.catalog_properties(),
                sink_format=capture.sink_format,  # never the format a log entry names
            )
            reconciled = reconcile(
                stored,
                latest,
                source.identity,
                offset_type=capture.OFFSET_TYPE,
                source=store.describe(capture.topic_prefix),
                committed=commit_log.committed,
            )
            for note in reconciled.notes:
                self.log.warning("%s", note)
            if not reconciled.corroborated and reconciled.offset is not None:
                source.check_restored(reconciled.offset)  # the source must already be where the log says
            self._run_tables = source.tables
            yield _RunState(capture, source, store, commit_log, stored, reconciled.offset, self._check_not_killed)

    def _decide(self, state: _RunState, context: Context, kind: str) -> RunDecision:
        """Capture, or report what landed (a backfill, or a re-run of a run that landed)."""
        decision = decide(run_interval(context), _landed_runs(state.offset), kind, state.commit_log.committed)
        self.log.info("%s", decision.reason)
        return decision

    def _report_landed(self, state: _RunState, decision: RunDecision, nothing_landed: str) -> dict[str, Any]:
        """A replay: finish what a crashed run left, then return the summary of the windows the
        decision found; skipped (saying why) when none landed. Never reads the source's changes."""
        self._finish_landed(state, acknowledge=self.capture.streams)
        landed = decision.landed
        if not landed:
            raise AirflowSkipException(f"{decision.reason}: {nothing_landed}")
        summary = _summary(landed[-1], self.capture, confirmed_lsn=None, lag=None)
        summary.update(replayed=True, windows=[e.window_id for e in landed])
        self.log.info(
            "window(s) %s reported from the sink: nothing read from the source or the slot",
            ", ".join(summary["windows"]),
        )
        return summary

    def _finish_landed(self, state: _RunState, *, acknowledge: bool = True) -> None:
        """Before reporting what landed: finish what a crashed run left (store the rolled-forward
        offset, acknowledge up to it); a source that moved past the offset still fails."""
        if state.offset is not None and state.offset != state.stored:
            state.save(state.offset)
        if acknowledge:
            self._check_not_killed("acknowledging the source")
            state.source.finish_landed(state.offset)

    def _spec(
        self, state: _RunState, window: Window, offset: CaptureOffset | None, interval: RunInterval | None = None
    ) -> Any:
        return state.source.job_spec(
            window,
            offset,
            run=None if interval is None else interval.to_dict(),
            checkpoint=None if state.offset is None else checkpoint(state.offset),
        )

    def _run_job(self, spec: Any) -> CommitEntry:
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
                on_start=self._track_job,
            )
        except AirflowException as exc:
            if "Error code is: 2." in str(exc):  # the job's exit code for terminal engine errors
                raise AirflowFailException(f"the capture job failed permanently: {exc}") from exc
            raise
        finally:
            self._spark_job = None  # ended (or stopped): a later kill has nothing of it to stop


class _RunState:
    """Offsets, commit log and source session of one run, written in the invariant order."""

    def __init__(
        self,
        capture: Capture,
        source: SourceRun,
        store: Any,
        commit_log: CommitLog,
        stored: CaptureOffset | None,
        offset: CaptureOffset | None,
        check_not_killed: Any = None,
    ):
        self.capture = capture
        self._check_not_killed = check_not_killed or (lambda action: None)
        self.source = source
        self.identity = source.identity
        self.tables: tuple[TableRef, ...] = source.tables
        self.store = store
        self.commit_log = commit_log
        self.stored = stored
        self.offset = offset

    def save(self, offset: CaptureOffset) -> CaptureOffset:
        self._check_not_killed("saving the offset")  # a killed run saves and acknowledges nothing
        self.stored = save_offset(self.store, offset, previous=self.stored)
        self.offset = self.stored
        return self.stored

    def acknowledge(self, position: Position) -> Position | None:
        self._check_not_killed("acknowledging the source")
        return self.source.acknowledge(position, saved=self.stored)


class CdcSnapshotOperator(_WindowOperator):
    """Initial (or repeated) consistent snapshot, per ``snapshot_mode``; skipped when not due.

    Rows are read in parallel Spark partitions pinned to one consistent point of the source
    (PostgreSQL: a snapshot exported by a temporary slot, after which the capture's slot is
    acknowledged at the snapshot's consistent point, where the next stream window starts).
    """

    def _run(self, context: Context) -> dict[str, Any]:
        capture = self.capture
        interval = run_interval(context)
        with self._state() as state:
            decision = self._decide(state, context, "snapshot")
            if decision.replay:
                return self._replay(state, decision)
            source = state.source
            status = source.status()
            decision = decide_snapshot(capture.snapshot_mode, state.offset, source.unavailable(state.offset, status))
            if not decision.run:
                if state.offset is not None and state.offset != state.stored:
                    state.save(state.offset)  # record a roll-forward found while deciding
                self.log.info("no snapshot needed, skipping: %s", decision.reason)
                raise AirflowSkipException(f"no snapshot needed: {decision.reason}")
            self.log.info("snapshot due: %s", decision.reason)
            gap = None if decision.gap_reason is None else source.gap(decision, state.offset, status, _now_ms())
            if gap is not None:
                self.log.warning(
                    "capture %s lost changes after %s (%s): re-snapshotting; the gap is recorded in %s",
                    capture.topic_prefix,
                    gap.last_lsn,
                    gap.reason,
                    gap_topic(capture.topic_prefix),
                )
            source.prepare_snapshot(decision, status)
            window, pending = plan_snapshot_window(
                state.offset, state.identity, offset_type=capture.OFFSET_TYPE, now_ms=_now_ms()
            )
            # Remember which tables the snapshot covers (a table that joins later has none). Stored
            # with the pending window, so a run that stops after the sink commit keeps it too.
            pending = replace(pending, extra={**pending.extra, "tables": [r.to_json() for r in state.tables]})
            state.save(pending)
            faults.point("operator.pending_saved")
            entry = self._run_job(replace(self._spec(state, window, state.offset, interval), gap=gap))
            state.save(offset_after_commit(state.offset, entry, state.identity, offset_type=capture.OFFSET_TYPE))
            faults.point("operator.offset_saved")
            confirmed = None
            if capture.streams:
                if entry.window.to_lsn is None:
                    raise CdcStateError(f"committed {entry.window.describe()} has no end position to acknowledge")
                confirmed = state.acknowledge(entry.window.to_lsn)
                faults.point("operator.acknowledged")
            summary = _summary(entry, capture, confirmed_lsn=confirmed, lag=None)
        self.log.info("snapshot committed: %s", summary)
        return summary

    def _replay(self, state: _RunState, decision: RunDecision) -> dict[str, Any]:
        """A backfill, or a re-run of a run whose snapshot landed: nothing is read."""
        return self._report_landed(
            state, decision, "nothing to report (an incremental snapshot repairs a table, see docs/incremental.md)"
        )


class CdcBatchOperator(_WindowOperator):
    """One stream window: changes committed in ``[offset, upto_lsn)``, written, then acknowledged.

    The window also carries the capture's incremental snapshot (docs/incremental.md): it emits
    the chunks the previous window read, applies signals, and reads the next chunks.

    :param capture: the capture's configuration
    :param upto_lsn: end of the window (exclusive, on commit positions, in the source's text form);
        default: the source's current position at run start. Templated.
    :param upto_time: end the window after the last commit before this time (an ISO-8601 timestamp,
        e.g. ``"{{ data_interval_end }}"``), so a run's window holds exactly its interval's commits;
        for sources that map commit times to positions (SQL Server). Templated.
    :param signals: Debezium signals to apply before the window, e.g.
        ``[{"type": "execute-snapshot", "data": {"data-collections": ["public.orders"]}}]``
        (a list of objects, or its JSON). Signals in the DAG run's conf under ``cdc_signals`` are
        applied too. Each is applied once, also when the task is retried. Templated.
    """

    template_fields: Sequence[str] = ("upto_lsn", "upto_time", "signals")

    def __init__(
        self,
        *,
        capture: Capture,
        upto_lsn: str | None = None,
        upto_time: str | datetime | None = None,
        signals: Sequence[dict[str, Any]] | str | None = None,
        **kwargs: Any,
    ) -> None:
        # Runs after a snapshot task that is skipped once the snapshot exists.
        kwargs.setdefault("trigger_rule", "none_failed")
        super().__init__(capture=capture, **kwargs)
        if upto_lsn not in (None, "") and upto_time not in (None, ""):
            raise CdcConfigurationError("give upto_lsn or upto_time, not both")
        self.upto_lsn = upto_lsn
        self.upto_time = upto_time
        self.signals = signals

    def _run(self, context: Context) -> dict[str, Any]:
        capture = self.capture
        if not capture.streams:
            raise AirflowSkipException("snapshot_mode='initial_only': this capture does not stream")
        try:
            requested = capture.position(str(self.upto_lsn)) if self.upto_lsn not in (None, "") else None
        except InvalidLsnError as exc:
            raise InvalidLsnError(f"upto_lsn of task {self.task_id!r} is invalid: {exc}") from None
        until = _utc_time(self.upto_time, self.task_id)
        signals = airflow_signals(
            self.signals, context, self.task_id, run_conf_types=capture.run_conf_signals, capture=capture.topic_prefix
        )
        interval = run_interval(context)
        with self._state() as state:
            decision = self._decide(state, context, "stream")
            if decision.replay:
                return self._replay(state, decision, signals)
            source = state.source
            new_tables = self._tables_without_snapshot(state)
            plan = source.plan_stream(state.offset, requested, _now_ms(), until=until)  # validated before writing
            _check_covers_staged_chunks(plan.window, state.offset)
            # Signals and new tables are checked here too, before anything is written.
            incremental, known_tables, applied = _incremental_update(state.offset, signals, new_tables, state.tables)
            if incremental is not None and incremental.active and capture.incremental_unavailable():
                raise CdcConfigurationError(f"{capture.incremental_unavailable()}; nothing was written")
            retrying = state.offset is not None and plan.window == state.offset.pending
            if capture.heartbeat_action_query and not retrying:
                source.heartbeat(capture.heartbeat_action_query)
                if requested is None and until is None:
                    plan = source.plan_stream(state.offset, None, _now_ms())  # an end after the heartbeat
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
                "window %s: [%s, %s)%s",
                plan.window.window_id,
                plan.window.from_lsn,
                plan.window.to_lsn,
                source.window_detail(plan.window, None),
            )
            entry = self._run_job(self._spec(state, plan.window, offset, interval))
            state.save(offset_after_commit(state.offset, entry, state.identity, offset_type=capture.OFFSET_TYPE))
            faults.point("operator.offset_saved")
            if entry.window.to_lsn is None:
                raise CdcStateError(f"committed {entry.window.describe()} has no end position to acknowledge")
            confirmed = state.acknowledge(entry.window.to_lsn)
            faults.point("operator.acknowledged")
            summary = _summary(entry, capture, confirmed_lsn=confirmed, lag=source.lag())
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
        (roll the offset forward, acknowledge), then report what landed. Never reads changes."""
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


class CdcCurrentStateOperator(CdcCaptureOperator):
    """Maintain current-state tables of captured tables from the committed change windows.

    Each run folds the windows committed since the last run into the state (deletes remove rows,
    key changes move them, truncates clear the table, unchanged TOAST values are kept); running
    it again without new windows changes nothing. With ``as_of_window`` it rebuilds the state at
    that committed window instead (for backfills), leaving the current version where it is.

    :param capture: the capture
    :param state_path: base directory (or Hadoop URI) of the state tables; not templated (it names
        the outlets, which Airflow needs at parse)
    :param tables: subset of the capture's tables (default: all)
    :param as_of_window: a committed window id (e.g. ``"0000000042"``); templated
    :param state_engine: ``"auto"`` (default: Arrow in the task's process when the refresh is
        small, see docs/operators.md; Spark above), ``"arrow"`` (never a JVM: the fold in the
        worker's memory) or ``"spark"`` (as before: embedded, or ``spark-submit`` with
        ``spark_conn_id``)
    """

    template_fields: Sequence[str] = ("as_of_window",)
    unmappable: ClassVar[tuple[str, ...]] = ("capture", "state_path", "tables")  # the outlets derive from them

    @classmethod
    def _partial_outlets(cls, kwargs: dict[str, Any]) -> list[Any] | None:
        from airflow_provider_cdc.operators.assets import state_outlets

        if "state_path" not in kwargs:
            raise _unmappable_error(cls, ["state_path"])
        capture, tables = kwargs["capture"], kwargs.get("tables")
        chosen = None if tables is None else tuple(TableRef.coerce(t, capture.NAMES) for t in tables)
        return state_outlets(capture, kwargs["state_path"], chosen)

    def __init__(
        self,
        *,
        capture: Capture,
        state_path: str,
        tables: Sequence[str] | None = None,
        as_of_window: str | int | None = None,
        state_engine: str = "auto",
        **kwargs: Any,
    ) -> None:
        from airflow_provider_cdc.cdc.sinks.path_checks import check_path_setting
        from airflow_provider_cdc.operators.assets import state_outlets

        if state_engine not in ("auto", "arrow", "spark"):  # checked at parse; no pyarrow import here
            raise CdcConfigurationError(f"state_engine must be 'auto', 'arrow' or 'spark', not {state_engine!r}")
        # Fixed at parse, like sink_path: it names the outlets (no Jinja, relative path or '%').
        state_path = check_path_setting(state_path, "state_path")
        if isinstance(capture, Capture):
            from airflow_provider_cdc.cdc.sinks.formats import check_iceberg_catalog

            has_catalog = bool(capture.table_catalog) or capture.table_catalog_conn_id is not None
            check_iceberg_catalog(capture.sink_format, state_path, "state_path", has_catalog)
        chosen = None if tables is None else tuple(TableRef.coerce(t, capture.NAMES) for t in tables)
        if isinstance(capture, Capture):
            kwargs.setdefault("outlets", state_outlets(capture, state_path, chosen))
        super().__init__(capture=capture, **kwargs)
        self.state_path = state_path
        self.tables = chosen
        unknown = [str(r) for r in self.tables or () if capture.table_refs and r not in capture.table_refs]
        if unknown:
            raise CdcConfigurationError(f"tables {unknown} are not captured by {capture.topic_prefix!r}")
        self.as_of_window = as_of_window
        self.state_engine = state_engine
        self._ran = False  # see _WindowOperator: what this task object's run did, for its lineage
        self._state_results: list[dict[str, Any]] = []

    def execute(self, context: Context) -> list[dict[str, Any]]:
        self._ran, self._state_results = True, []  # for the lineage: nothing folded until the job returns
        with fail_fast_on_terminal_errors(self.capture), self._object_store():
            return self._fold(context)

    def _fold(self, context: Context) -> list[dict[str, Any]]:
        from airflow_provider_cdc import spark_runner
        from airflow_provider_cdc.cdc.planning.spec import StateJobSpec
        from airflow_provider_cdc.cdc.sinks.object_store import is_object_store

        capture = self.capture
        if is_object_store(self.state_path):  # before the job: a store it cannot write fails here, clearly
            check_writable(self.state_path, "state_path")
        as_of = None if self.as_of_window in (None, "") else int(str(self.as_of_window))
        if as_of is None:
            as_of = self._as_of_for_past_run(context)
        tables = self.tables
        if tables is None:
            with fail_fast_on_terminal_errors(capture):
                tables = capture.resolve_tables_now()
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
            sink_format=capture.sink_format,
            table_catalog=(options := capture.run_options()).table_catalog,
            table_catalog_secret_property=options.table_catalog_secret_property,
            table_catalog_secret=options.table_catalog_secret,
            object_store=options.object_store,
            state_engine=self.state_engine,
        )
        # Decided here, before anything starts a JVM: an Arrow-sized refresh runs in this process
        # (with spark_conn_id too: no spark-submit), a larger one in Spark as before.
        from dataclasses import replace

        from airflow_provider_cdc.cdc.state.arrow import ARROW, choose_engine

        engine, size = choose_engine(spec)
        self.log.info("current-state engine: %s%s", engine, "" if size is None else f" ({size})")
        spec = replace(spec, state_engine=engine)
        with self._running():
            if capture.spark_conn_id is None or engine == ARROW:
                from airflow_provider_cdc.cdc.state.jobs import run_state_job

                results = run_state_job(spec)
            else:
                try:
                    results = spark_runner.submit(
                        spec.to_json(),
                        name=f"cdc-state-{capture.topic_prefix}",
                        secrets=spark_runner.state_secrets(spec),
                        spark_conn_id=capture.spark_conn_id,
                        conf=dict(capture.spark_conf),
                        application=capture.spark_application,
                        on_start=self._track_job,
                    )
                finally:
                    self._spark_job = None  # ended (or stopped): a later kill has nothing of it to stop
        for result in results:
            self.log.info(
                "%s: %s (window %s, %d rows)", result["topic"], result["action"], result["window_id"], result["rows"]
            )
        if engine == ARROW:
            import sys

            self.log.info("folded on Arrow in the task's process (pyspark imported: %s)", "pyspark" in sys.modules)
        from airflow_provider_cdc.operators.assets import emit_state_events

        via_alias = self.tables is None and not capture.tables_known_at_parse
        emit_state_events(context, capture, self.state_path, results, tables, via_alias=via_alias)
        self._state_tables = tuple(tables)
        self._state_results = results
        return results

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (when its provider is installed): the topics this run folded in, the
        current-state tables it changed out; nothing for a skipped run or an unchanged state."""
        from airflow_provider_cdc.operators.lineage import state_lineage

        tables = getattr(self, "_state_tables", None) or self.tables or self.capture.table_refs
        with self._after_run():
            return state_lineage(self, tables, task_instance)

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


def airflow_signals(
    value: Any, context: Context, task_id: str, *, run_conf_types: Sequence[str] = (), capture: str = ""
) -> list[Signal]:
    """Signals given to the operator (``signals``) and in the DAG run's conf (``cdc_signals``).

    The operator's come from the DAG author. The conf's come from whoever triggers the run: only
    the capture's ``run_conf_signals`` types, never filters or surrogate keys, tables by exact name
    (:func:`check_run_conf_signal`). Each gets a stable id (its own ``id``, or one made of the run,
    the task and its position), so a retried task does not apply it twice."""
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
        if key == "conf" and len(items) > MAX_RUN_CONF_SIGNALS:
            raise SignalError(f"{origin} holds {len(items)} signals; at most {MAX_RUN_CONF_SIGNALS} are taken")
        for i, item in enumerate(items):
            unknown = sorted(set(item) - {"id", "type", "data"})
            if unknown:
                raise SignalError(f"{origin}: signal {i} has unknown keys {unknown} (use id, type, data)")
            signal_id = item.get("id") or f"airflow:{run}:{task_id}:{key}:{i}"
            if key == "conf":  # kept apart from the operator's ids: a conf cannot mark them applied
                signal_id = f"conf:{signal_id}" if item.get("id") else signal_id
            signal = Signal.parse(signal_id, item.get("type"), item.get("data"), origin=f"Airflow {origin}")
            out.append(check_run_conf_signal(signal, run_conf_types, capture) if key == "conf" else signal)
    return out


def _incremental_update(
    offset: CaptureOffset | None,
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
    entry: CommitEntry, capture: Capture, *, confirmed_lsn: Position | None, lag: int | None
) -> dict[str, Any]:
    side = side_topics(capture.topic_prefix)
    messages = sum(d.events for d in entry.datasets if d.topic == message_topic(capture.topic_prefix))
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
        "messages": messages,
        "slot_confirmed_lsn": None if confirmed_lsn is None else str(confirmed_lsn),
        "bytes_behind": lag,
        "sink_path": capture.sink_path,
        "job_pid": entry.stats.get("job_pid"),
        "gap": entry.stats.get("gap"),
        **_incremental_summary(entry),
    }


def _check_covers_staged_chunks(window: Window, offset: CaptureOffset | None) -> None:
    """A window emits the incremental chunks the previous one staged, which needs the stream up
    to their high watermarks (written after the previous window's end): an explicit ``upto_lsn``
    before them would emit rows the stream has not yet been checked against."""
    staged = offset.incremental.staged if offset is not None and offset.incremental is not None else ()
    if not staged or window.to_lsn is None:
        return
    high = type(window.to_lsn)(max(c.high_lsn for c in staged))
    if window.to_lsn < high:
        raise CdcConfigurationError(
            f"upto_lsn {window.to_lsn} is before {high}, the high watermark of the incremental snapshot chunks "
            "the previous window read: give a later upto_lsn, or leave it unset (the current position)"
        )


def _landed_runs(offset: CaptureOffset | None) -> dict[str, Any] | None:
    return offset.extra.get("runs") if offset is not None else None


def _incremental_summary(entry: CommitEntry) -> dict[str, Any]:
    if "incremental" not in entry.stats:
        return {}
    state = IncrementalState.from_dict(entry.stats["incremental"])
    if state.idle and not state.history and not entry.stats.get("incremental_run", {}).get("notes"):
        return {}
    return {"incremental_snapshot": {**state.summary(), **entry.stats.get("incremental_run", {})}}


def _utc_time(value: Any, task_id: str) -> datetime | None:
    """``upto_time`` as an aware UTC datetime (a naive one is taken as UTC, like Airflow's times)."""
    if value in (None, ""):
        return None
    if isinstance(value, datetime):
        parsed = value
    else:
        try:
            parsed = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
        except ValueError:
            raise CdcConfigurationError(
                f"upto_time of task {task_id!r} is not an ISO-8601 timestamp: {value!r} "
                "(e.g. '2026-01-01T10:00:00+00:00' or '{{ data_interval_end }}')"
            ) from None
    return (parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


def _now_ms() -> int:
    return int(time.time() * 1000)


__all__ = [
    "CdcBatchOperator",
    "CdcCaptureOperator",
    "CdcCurrentStateOperator",
    "CdcSetupOperator",
    "CdcSnapshotOperator",
    "airflow_signals",
    "fail_fast_on_terminal_errors",
]
