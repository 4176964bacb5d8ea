"""Backfills, cleared runs and retries: which run a task stands for, and what landed for it.

A capture only moves forward: the slot is never rewound and never re-read. Every committed
window records the scheduler run that planned it (``run`` in the commit entry: DAG, run id, run
type and data interval), and the offset remembers, per DAG, the last run that landed a window of
each kind and the newest *interval* run. A task that stands for something already landed is a
*replay*: it changes nothing at the source or in the lake and returns what landed; downstream
tasks rebuild their outputs "as of" that interval from the lake.

Two kinds of run:
- a run with a data interval (scheduled, backfill, and manual runs given a logical date) stands
  for that interval: it is a replay when its interval is older than the newest landed one, or
  when its interval already landed a window of its kind. (A manual run at 01:30 gets the last
  complete interval, [00:00, 01:00), which the 01:00 run landed: it reports that window.)
- a manual or asset-triggered run without a data interval means "capture now": it is a replay
  only when the very same run already landed a window of its kind (a retry, or a later clear).

Intervals compare within one DAG only: another DAG's schedule is unrelated. Kept free of Airflow
so the engine (which records the runs) imports it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry


def _by_interval(run: dict[str, Any] | None) -> bool:
    return bool(run) and run.get("start_ms") is not None and run.get("end_ms") is not None  # type: ignore[union-attr]


@dataclass(frozen=True)
class RunInterval:
    run_id: str
    run_type: str
    start_ms: int | None
    end_ms: int | None
    dag_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "run_type": self.run_type,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
        }

    @property
    def by_interval(self) -> bool:
        return self.start_ms is not None and self.end_ms is not None

    def same_dag(self, recorded: dict[str, Any] | None) -> bool:
        return bool(recorded) and recorded.get("dag_id", "") == self.dag_id  # type: ignore[union-attr]

    def same_run(self, recorded: dict[str, Any] | None) -> bool:
        return self.same_dag(recorded) and recorded.get("run_id") == self.run_id  # type: ignore[union-attr]

    def same_interval(self, recorded: dict[str, Any] | None) -> bool:
        return (
            self.by_interval
            and _by_interval(recorded)
            and self.same_dag(recorded)
            and (recorded.get("start_ms"), recorded.get("end_ms")) == (self.start_ms, self.end_ms)  # type: ignore[union-attr]
        )

    def stands_for(self, recorded: dict[str, Any] | None) -> bool:
        """Did the run ``recorded`` land a window on this run's behalf (the same interval, or the same run)?"""
        return self.same_interval(recorded) or (not self.by_interval and self.same_run(recorded))

    def describe(self) -> str:
        if self.start_ms is None or self.end_ms is None:
            return f"run {self.run_id!r} of DAG {self.dag_id!r}"
        start, end = (
            datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat() for ms in (self.start_ms, self.end_ms)
        )
        return f"[{start}, {end}) of run {self.run_id!r}"


def _dag_records(runs: dict[str, Any] | None, dag_id: str) -> dict[str, dict[str, Any]]:
    """``{"last": {kind: run}, "newest": {kind: run}}`` of one DAG, from the offset's ``runs``."""
    records = normalised_runs(runs).get(dag_id) or {}
    return {"last": dict(records.get("last") or {}), "newest": dict(records.get("newest") or {})}


def normalised_runs(runs: dict[str, Any] | None) -> dict[str, Any]:
    """The offset's ``runs`` keyed by DAG. Offsets written before runs were kept per DAG hold
    ``{kind: run}``: each run is filed under its own DAG."""
    runs = runs or {}
    if not any(isinstance(v, dict) and "run_id" in v for v in runs.values()):
        return runs
    out: dict[str, Any] = {}
    for kind, run in runs.items():
        records = out.setdefault(run.get("dag_id", ""), {"last": {}, "newest": {}})
        records["last"][kind] = run
        if _by_interval(run):
            records["newest"][kind] = run
    return out


def record_run(runs: dict[str, Any] | None, run: dict[str, Any], kind: str) -> dict[str, Any]:
    """The offset's ``runs`` after ``run`` landed a window of ``kind``."""
    out = dict(normalised_runs(runs))
    dag_id = run.get("dag_id", "")
    records = _dag_records(out, dag_id)
    records["last"][kind] = run
    if _by_interval(run):
        records["newest"][kind] = run
    out[dag_id] = records
    return out


def is_replay(interval: RunInterval | None, runs: dict[str, Any] | None, kind: str) -> bool:
    """Does this run stand for a window of ``kind`` that already landed, or for a past interval?
    (``runs``: the offset's record; see the module docstring for the rule.)"""
    if interval is None:
        return False
    records = _dag_records(runs, interval.dag_id)
    if interval.same_run(records["last"].get(kind)):
        return True  # a retry, or a clear, of the run that landed the last window of this kind
    if not interval.by_interval:
        return False
    newest = [int(r["end_ms"]) for r in records["newest"].values()]
    return bool(newest) and (interval.end_ms < max(newest) or interval.same_interval(records["newest"].get(kind)))  # type: ignore[operator]


def landed_for(entries: list[CommitEntry], interval: RunInterval, kind: str | None = None) -> list[CommitEntry]:
    """Committed windows (of ``kind``, or any) landed on behalf of this run."""
    return [e for e in entries if interval.stands_for(e.stats.get("run")) and (kind is None or e.window.kind == kind)]


def _interval_runs(entries: list[CommitEntry], interval: RunInterval) -> list[CommitEntry]:
    return [e for e in entries if interval.same_dag(e.stats.get("run")) and _by_interval(e.stats["run"])]


def landed_by(entries: list[CommitEntry], interval: RunInterval) -> CommitEntry | None:
    """The last window landed by an interval run of this DAG whose interval ended by ``interval``'s end."""
    if interval.end_ms is None:
        return None
    before = [e for e in _interval_runs(entries, interval) if int(e.stats["run"]["end_ms"]) <= interval.end_ms]
    return before[-1] if before else None


def newest_run(entries: list[CommitEntry], interval: RunInterval) -> dict[str, Any] | None:
    """The newest interval run of ``interval``'s DAG that landed a window."""
    runs = [e.stats["run"] for e in _interval_runs(entries, interval)]
    return max(runs, key=lambda r: int(r["end_ms"])) if runs else None
