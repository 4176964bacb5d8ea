"""The setup operator: preflight checks, then what the capture needs on the source; and the check
that the DAG's schedule runs more often than the source keeps unread changes."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from airflow_provider_cdc.captures.base import Capture
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.operators.base import CdcCaptureOperator, fail_fast_on_terminal_errors
from airflow_provider_cdc.version_compat import Context

log = logging.getLogger(__name__)


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


__all__ = ["CdcSetupOperator", "check_schedule_within_retention", "schedule_gap_ms"]
