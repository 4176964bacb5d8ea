"""The snapshot operator: the initial (or a repeated) consistent snapshot, when it is due."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from airflow_provider_cdc.cdc.basics import faults
from airflow_provider_cdc.cdc.basics.errors import CdcStateError
from airflow_provider_cdc.cdc.basics.naming import gap_topic
from airflow_provider_cdc.cdc.planning.plan import decide_snapshot, offset_after_commit, plan_snapshot_window
from airflow_provider_cdc.cdc.planning.runs import RunDecision
from airflow_provider_cdc.operators.landing import CdcLandingOperator, RunState, window_summary
from airflow_provider_cdc.utils.runs import run_interval
from airflow_provider_cdc.utils.times import now_ms
from airflow_provider_cdc.version_compat import AirflowSkipException, Context


class CdcSnapshotOperator(CdcLandingOperator):
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
            gap = None if decision.gap_reason is None else source.gap(decision, state.offset, status, now_ms())
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
                state.offset, state.identity, offset_type=capture.OFFSET_TYPE, now_ms=now_ms()
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
            summary = window_summary(entry, capture, confirmed_lsn=confirmed, lag=None)
        self.log.info("snapshot committed: %s", summary)
        return summary

    def _replay(self, state: RunState, decision: RunDecision) -> dict[str, Any]:
        """A backfill, or a re-run of a run whose snapshot landed: nothing is read."""
        return self._report_landed(
            state, decision, "nothing to report (an incremental snapshot repairs a table, see docs/incremental.md)"
        )


__all__ = ["CdcSnapshotOperator"]
