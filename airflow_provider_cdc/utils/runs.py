"""The Airflow side of backfills, cleared runs and retries: the run a task stands for.

The rule and the records live in the engine (``cdc/planning/runs.py``); this reads the task's context.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow_provider_cdc.cdc.planning.runs import RunInterval

#: The run's end as a template, for templated times (the window's ``upto_time``): its data
#: interval's end, or, in a run without one (a manual or asset-triggered run, ``dags test``
#: without a logical date), its ``run_after``, when it was triggered. ``"{{ data_interval_end }}"``
#: alone fails to render in those runs; ``default(..., true)`` also covers a key with no value.
#: :func:`run_end` is the same rule in Python (the sensor's ``wait_until`` default).
RUN_END = "{{ data_interval_end | default(dag_run.run_after, true) }}"


def _ms(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


def run_interval(context: Any) -> RunInterval | None:
    """The task's DAG run: id, type, data interval, ``run_after`` and clear count (None outside a
    DAG run, e.g. a bare ``execute``)."""
    dag_run = context.get("dag_run") if hasattr(context, "get") else None
    if dag_run is None:
        return None
    start, end = (context.get(k) for k in ("data_interval_start", "data_interval_end"))
    has_interval = start is not None and end is not None
    run_type = getattr(dag_run, "run_type", "")
    return RunInterval(
        dag_id=str(getattr(dag_run, "dag_id", "")),
        run_id=str(dag_run.run_id),
        run_type=str(getattr(run_type, "value", run_type)),
        start_ms=_ms(start) if has_interval else None,
        end_ms=_ms(end) if has_interval else None,
        run_after_ms=_ms(getattr(dag_run, "run_after", None)),
        clear_number=int(getattr(dag_run, "clear_number", 0) or 0),
    )


def run_end(context: Any) -> datetime | None:
    """The run's data interval end, or its ``run_after`` when it has no data interval (None
    outside a run): :data:`RUN_END` at run time."""
    end = context.get("data_interval_end")
    if end is not None:
        return end
    return getattr(context.get("dag_run"), "run_after", None)
