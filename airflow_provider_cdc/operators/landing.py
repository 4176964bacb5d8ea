"""The shared run of the operators that land a window in the sink: the snapshot and the stream
window.

A run opens the source's session (holding the capture lock), reconciles the stored offset with the
sink's commit log, decides between capturing and reporting what landed (a backfill, a re-run),
runs the job from one spec, and records progress in the fixed order *sink commit → offset →
acknowledgement* (where the source has one: PostgreSQL's slot). What differs per source is behind
the capture object (:mod:`airflow_provider_cdc.captures`): its run session.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow_provider_cdc.captures.base import Capture
from airflow_provider_cdc.captures.source_run import SourceRun
from airflow_provider_cdc.cdc.basics.naming import is_staged_topic, message_topic, side_topics
from airflow_provider_cdc.cdc.basics.positions import Position
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.planning.incremental import IncrementalState
from airflow_provider_cdc.cdc.planning.offset import CaptureOffset
from airflow_provider_cdc.cdc.planning.plan import checkpoint, reconcile
from airflow_provider_cdc.cdc.planning.runs import RunDecision, RunInterval, decide
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry, CommitLog
from airflow_provider_cdc.cdc.sinks.path_checks import check_writable
from airflow_provider_cdc.cdc.sinks.storage import storage_for
from airflow_provider_cdc.offsets.base import load_offset, save_offset
from airflow_provider_cdc.operators.base import CdcCaptureOperator, fail_fast_on_terminal_errors
from airflow_provider_cdc.utils.runs import run_interval
from airflow_provider_cdc.version_compat import (
    AirflowException,
    AirflowFailException,
    AirflowSkipException,
    Context,
)


class CdcLandingOperator(CdcCaptureOperator):
    """Base of the snapshot and window operators: their shared run (subclasses define ``_run``).

    Their outlets are the landed datasets (:mod:`airflow_provider_cdc.utils.assets`); each
    successful run puts what it landed in each on the asset events' ``extra``.
    """

    def __init__(self, *, capture: Capture, **kwargs: Any) -> None:
        from airflow_provider_cdc.utils.assets import window_outlets

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
        from airflow_provider_cdc.utils.assets import window_outlets

        return window_outlets(kwargs["capture"])

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_cdc.utils.assets import emit_window_events

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
        from airflow_provider_cdc.utils.lineage import window_lineage

        with self._after_run():
            return window_lineage(self, task_instance)

    @contextmanager
    def _state(self) -> Iterator[RunState]:
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
            yield RunState(capture, source, store, commit_log, stored, reconciled.offset, self._check_not_killed)

    def _decide(self, state: RunState, context: Context, kind: str) -> RunDecision:
        """Capture, or report what landed (a backfill, or a re-run of a run that landed)."""
        decision = decide(run_interval(context), _landed_runs(state.offset), kind, state.commit_log.committed)
        self.log.info("%s", decision.reason)
        return decision

    def _report_landed(self, state: RunState, decision: RunDecision, nothing_landed: str) -> dict[str, Any]:
        """A replay: finish what a crashed run left, then return the summary of the windows the
        decision found; skipped (saying why) when none landed. Never reads the source's changes."""
        self._finish_landed(state, acknowledge=self.capture.streams)
        landed = decision.landed
        if not landed:
            raise AirflowSkipException(f"{decision.reason}: {nothing_landed}")
        summary = window_summary(landed[-1], self.capture, confirmed_lsn=None, lag=None)
        summary.update(replayed=True, windows=[e.window_id for e in landed])
        self.log.info(
            "window(s) %s reported from the sink: nothing read from the source or the slot",
            ", ".join(summary["windows"]),
        )
        return summary

    def _finish_landed(self, state: RunState, *, acknowledge: bool = True) -> None:
        """Before reporting what landed: finish what a crashed run left (store the rolled-forward
        offset, acknowledge up to it); a source that moved past the offset still fails."""
        if state.offset is not None and state.offset != state.stored:
            state.save(state.offset)
        if acknowledge:
            self._check_not_killed("acknowledging the source")
            state.source.finish_landed(state.offset)

    def _spec(
        self, state: RunState, window: Window, offset: CaptureOffset | None, interval: RunInterval | None = None
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


class RunState:
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


def window_summary(
    entry: CommitEntry, capture: Capture, *, confirmed_lsn: Position | None, lag: int | None
) -> dict[str, Any]:
    """The task's XCom (and its asset events' source): what the committed window landed."""
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


def _landed_runs(offset: CaptureOffset | None) -> dict[str, Any] | None:
    return offset.extra.get("runs") if offset is not None else None


def _incremental_summary(entry: CommitEntry) -> dict[str, Any]:
    if "incremental" not in entry.stats:
        return {}
    state = IncrementalState.from_dict(entry.stats["incremental"])
    if state.idle and not state.history and not entry.stats.get("incremental_run", {}).get("notes"):
        return {}
    return {"incremental_snapshot": {**state.summary(), **entry.stats.get("incremental_run", {})}}


__all__ = ["CdcLandingOperator", "RunState", "window_summary"]
