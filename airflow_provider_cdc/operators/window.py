"""The window operator (one stream window per run), the signals it applies first, and the
incremental snapshot state they and newly captured tables change."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from airflow_provider_cdc.captures.base import Capture
from airflow_provider_cdc.cdc.basics import faults
from airflow_provider_cdc.cdc.basics.errors import (
    CdcConfigurationError,
    CdcStateError,
    InvalidLsnError,
    SnapshotRequiredError,
)
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
from airflow_provider_cdc.cdc.planning.plan import offset_after_commit
from airflow_provider_cdc.cdc.planning.runs import RunDecision
from airflow_provider_cdc.operators.landing import CdcLandingOperator, RunState, window_summary
from airflow_provider_cdc.utils.runs import run_interval
from airflow_provider_cdc.utils.times import now_ms, utc_time
from airflow_provider_cdc.version_compat import AirflowSkipException, Context


class CdcWindowOperator(CdcLandingOperator):
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
        until = utc_time(self.upto_time, self.task_id)
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
            plan = source.plan_stream(state.offset, requested, now_ms(), until=until)  # validated before writing
            check_covers_staged_chunks(plan.window, state.offset)
            # Signals and new tables are checked here too, before anything is written.
            incremental, known_tables, applied = incremental_update(state.offset, signals, new_tables, state.tables)
            if incremental is not None and incremental.active and capture.incremental_unavailable():
                raise CdcConfigurationError(f"{capture.incremental_unavailable()}; nothing was written")
            retrying = state.offset is not None and plan.window == state.offset.pending
            if capture.heartbeat_action_query and not retrying:
                source.heartbeat(capture.heartbeat_action_query)
                if requested is None and until is None:
                    plan = source.plan_stream(state.offset, None, now_ms())  # an end after the heartbeat
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
            summary = window_summary(entry, capture, confirmed_lsn=confirmed, lag=source.lag())
        self.log.info(
            "window %s committed: %d changes in %d transactions; now %s bytes behind",
            entry.window_id,
            summary["changes"],
            summary["transactions"],
            summary["bytes_behind"],
        )
        return summary

    def _replay(self, state: RunState, decision: RunDecision, signals: Sequence[Signal]) -> dict[str, Any]:
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

    def _tables_without_snapshot(self, state: RunState) -> list[TableRef]:
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


def incremental_update(
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


def check_covers_staged_chunks(window: Window, offset: CaptureOffset | None) -> None:
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


__all__ = ["CdcWindowOperator", "airflow_signals", "check_covers_staged_chunks", "incremental_update"]
