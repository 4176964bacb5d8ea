"""The Airflow side of backfills, cleared runs and retries: the run a task stands for.

The rule and the records live in the engine (``cdc/runs.py``); this reads the task's context.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_provider_cdc.cdc.runs import RunInterval, is_replay, landed_for
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry


def run_interval(context: Any) -> RunInterval | None:
    """The task's run and data interval (None outside a DAG run, e.g. a bare execute). A manual
    run without a logical date has no data interval: it stands only for itself."""
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
        start_ms=int(start.timestamp() * 1000) if has_interval else None,
        end_ms=int(end.timestamp() * 1000) if has_interval else None,
    )


def replays(
    interval: RunInterval | None,
    runs: dict[str, Any] | None,
    kind: str,
    committed: Callable[[], list[CommitEntry]],
) -> bool:
    """``is_replay``, plus, for a manual run that is not the last one recorded, a look at the
    commit log: a manual run cleared long after its window landed still only reports it."""
    if is_replay(interval, runs, kind):
        return True
    if interval is None or interval.by_interval:
        return False
    return bool(landed_for(committed(), interval, kind))
