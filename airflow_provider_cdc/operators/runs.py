"""Backfills and cleared runs: which data interval a task runs for, and what landed for it.

A capture only moves forward: the slot is never rewound and never re-read. Every committed
window records the scheduler run that planned it (``run`` in the commit entry: run id, run type
and data interval), and the offset remembers the newest one. A task whose data interval is not
newer than that one (a backfill, or a past run cleared and run again) is a *replay*: it changes
nothing at the source or in the lake and returns what landed for its interval; downstream tasks
rebuild their outputs "as of" that interval from the lake.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry


@dataclass(frozen=True)
class RunInterval:
    run_id: str
    run_type: str
    start_ms: int
    end_ms: int
    dag_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "run_type": self.run_type,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
        }

    def same_dag(self, recorded: dict[str, Any] | None) -> bool:
        """Intervals compare only within one DAG: another DAG's schedule is unrelated."""
        return bool(recorded) and recorded.get("dag_id", "") == self.dag_id

    def same_interval(self, recorded: dict[str, Any] | None) -> bool:
        return self.same_dag(recorded) and (recorded.get("start_ms"), recorded.get("end_ms")) == (  # type: ignore[union-attr]
            self.start_ms,
            self.end_ms,
        )

    def describe(self) -> str:
        import pendulum

        start, end = (pendulum.from_timestamp(ms / 1000).to_iso8601_string() for ms in (self.start_ms, self.end_ms))
        return f"[{start}, {end}) of run {self.run_id!r}"


def run_interval(context: Any) -> RunInterval | None:
    """The task's run and data interval (None outside a scheduled context, e.g. a bare execute)."""
    dag_run = context.get("dag_run") if hasattr(context, "get") else None
    start, end = (context.get(k) for k in ("data_interval_start", "data_interval_end")) if dag_run else (None, None)
    if dag_run is None or start is None or end is None:
        return None
    run_type = getattr(dag_run, "run_type", "")
    return RunInterval(
        dag_id=str(getattr(dag_run, "dag_id", "")),
        run_id=str(dag_run.run_id),
        run_type=str(getattr(run_type, "value", run_type)),
        start_ms=int(start.timestamp() * 1000),
        end_ms=int(end.timestamp() * 1000),
    )


def is_replay(interval: RunInterval | None, runs: dict[str, dict[str, Any]] | None, kind: str) -> bool:
    """Is ``interval`` a past one? ``runs``: the run that landed the newest window of each kind
    (``snapshot``, ``stream``, ``query``). Past: older than the newest of any kind, or the very
    interval that already landed a window of this ``kind`` (the snapshot and the window of one
    run land one window each)."""
    runs = {k: r for k, r in (runs or {}).items() if interval is not None and interval.same_dag(r)}
    if interval is None or not runs:
        return False
    newest = max(int(r["end_ms"]) for r in runs.values())
    return interval.end_ms < newest or interval.same_interval(runs.get(kind))


def landed_for(entries: list[CommitEntry], interval: RunInterval) -> list[CommitEntry]:
    """Committed windows planned by a run of this data interval."""
    return [e for e in entries if interval.same_interval(e.stats.get("run"))]


def landed_by(entries: list[CommitEntry], interval: RunInterval) -> CommitEntry | None:
    """The last committed window planned by a run of this DAG whose interval ended by ``interval``'s end."""
    before = [
        e for e in entries if interval.same_dag(e.stats.get("run")) and int(e.stats["run"]["end_ms"]) <= interval.end_ms
    ]
    return before[-1] if before else None


def newest_run(entries: list[CommitEntry], interval: RunInterval) -> dict[str, Any] | None:
    """The newest run of ``interval``'s DAG that landed a window."""
    runs = [e.stats["run"] for e in entries if interval.same_dag(e.stats.get("run"))]
    return max(runs, key=lambda r: int(r["end_ms"])) if runs else None
