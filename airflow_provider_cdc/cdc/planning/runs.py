"""Which Airflow run a task stands for, and whether it captures or reports what already landed.

A capture only moves forward: the slot is never rewound and never re-read. Every committed
window records the scheduler run that planned it (``run`` in the commit entry: DAG, run id, run
type, data interval, ``run_after``), and the offset remembers, per DAG, the last run that landed
a window of each kind and the latest ``run_after`` of any landed run.

The rule, for a task of a window kind (``snapshot``, ``stream``, ``query``):

=====================================  ======================================================
run                                    the task
=====================================  ======================================================
backfill (run type ``backfill``)       reports the windows landed for its interval (by any run
                                       of the DAG with the same data interval); never captures
the same run already landed a window   reports it: a retry, or a clear of a run that landed
of this kind (same DAG and run id)     (also a ``dag.test()`` re-run of the same date)
anything else: scheduled, catchup,     captures: manual with or without a data interval,
manual, asset- or operator-triggered,  asset-triggered, a cleared or retried run that never
a clear of a run that never landed     landed, whatever its interval
=====================================  ======================================================

A run's *interval* never makes it a replay by itself: a scheduled run whose interval is older
than a manual run's is still the scheduler's next run, and its changes must not wait an hour.
Finding "the same run" is one look at the offset's record for the common case (a retry of the
run that landed last); a run that is not newer (by ``run_after``) than every landed run of its
DAG may be a clear of an older one, and only then is the commit log read.

Kept free of Airflow so the engine (which records the runs) imports it too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry

BACKFILL = "backfill"


def _by_interval(run: dict[str, Any] | None) -> bool:
    return bool(run) and run.get("start_ms") is not None and run.get("end_ms") is not None  # type: ignore[union-attr]


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat()


@dataclass(frozen=True)
class RunInterval:
    """One Airflow DAG run, as the capture records it."""

    run_id: str
    run_type: str
    start_ms: int | None
    end_ms: int | None
    dag_id: str = ""
    run_after_ms: int | None = None  # when the run could start (creation order of runs)
    clear_number: int = 0  # how often the run was cleared (Airflow 3)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "run_type": self.run_type,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
            **({"run_after_ms": self.run_after_ms} if self.run_after_ms is not None else {}),
        }

    @property
    def by_interval(self) -> bool:
        return self.start_ms is not None and self.end_ms is not None

    @property
    def is_backfill(self) -> bool:
        return self.run_type == BACKFILL

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

    def describe(self) -> str:
        """``run 'scheduled__…' of DAG 'd' (scheduled, data interval [a, b))``: the type always named."""
        details = [self.run_type or "unknown run type"]
        if self.start_ms is not None and self.end_ms is not None:
            if self.start_ms == self.end_ms:  # cron schedules' default timetable: a point in time
                details.append(f"data interval at {_iso(self.start_ms)}")
            else:
                details.append(f"data interval [{_iso(self.start_ms)}, {_iso(self.end_ms)})")
        else:
            details.append("no data interval")
        if self.clear_number:
            details.append(f"cleared {self.clear_number}x")
        return f"run {self.run_id!r} of DAG {self.dag_id!r} ({', '.join(details)})"


@dataclass(frozen=True)
class RunDecision:
    """Does a task capture, or report what landed? ``reason`` names the run type and why."""

    replay: bool
    reason: str
    landed: tuple[CommitEntry, ...] = field(default=())


def _dag_records(runs: dict[str, Any] | None, dag_id: str) -> dict[str, Any]:
    """``{"last": {kind: run}, "run_after_ms": int | None}`` of one DAG: the last run that landed
    a window of each kind, and the latest ``run_after`` of any run that landed one."""
    records = normalised_runs(runs).get(dag_id) or {}
    return {"last": dict(records.get("last") or {}), "run_after_ms": records.get("run_after_ms")}


def normalised_runs(runs: dict[str, Any] | None) -> dict[str, Any]:
    """The offset's ``runs`` keyed by DAG. Offsets written before runs were kept per DAG hold
    ``{kind: run}``: each run is filed under its own DAG."""
    runs = runs or {}
    if not any(isinstance(v, dict) and "run_id" in v for v in runs.values()):
        return runs
    out: dict[str, Any] = {}
    for kind, run in runs.items():
        out.setdefault(run.get("dag_id", ""), {"last": {}})["last"][kind] = run
    return out


def record_run(runs: dict[str, Any] | None, run: dict[str, Any], kind: str) -> dict[str, Any]:
    """The offset's ``runs`` after ``run`` landed a window of ``kind``."""
    out = dict(normalised_runs(runs))
    dag_id = run.get("dag_id", "")
    records = _dag_records(out, dag_id)
    records["last"][kind] = run
    after = run.get("run_after_ms")
    if after is not None:
        records["run_after_ms"] = max(int(after), int(records["run_after_ms"] or after))
    if records["run_after_ms"] is None:
        del records["run_after_ms"]
    out[dag_id] = records
    return out


def _may_have_landed_before(run: RunInterval, records: dict[str, Any]) -> bool:
    """Could this run have landed a window that the offset's record no longer names? Only a run
    that is not newer than every landed run of its DAG (a clear or re-run of an older one)."""
    newest_after = records.get("run_after_ms")
    if run.run_after_ms is None or newest_after is None:
        return bool(records["last"])  # no creation order known: look whenever the DAG landed anything
    return run.run_after_ms <= int(newest_after)


def decide(
    run: RunInterval | None,
    runs: dict[str, Any] | None,
    kind: str,
    committed: Callable[[], list[CommitEntry]],
) -> RunDecision:
    """Capture or report (see the module docstring). ``runs``: the offset's record; ``committed``
    reads the commit log's committed windows, called only when the record cannot answer."""
    if run is None:
        return RunDecision(False, "not part of a DAG run: captures")
    if run.is_backfill:
        landed = tuple(
            e for e in committed() if run.same_interval(e.stats.get("run")) and (kind == "any" or e.window.kind == kind)
        )
        if landed:
            reason = f"{run.describe()} is a backfill: reports window(s) {_ids(landed)} landed for its interval"
        else:
            reason = f"{run.describe()} is a backfill and no window landed for its interval"
        return RunDecision(True, reason + "; a backfill never re-reads the source for a past interval", landed)
    records = _dag_records(runs, run.dag_id)
    recorded = run.same_run(records["last"].get(kind))
    if recorded or _may_have_landed_before(run, records):
        landed = landed_by_run(committed(), run, kind)
        if landed:
            return RunDecision(
                True,
                f"{run.describe()} already landed {kind} window(s) {_ids(landed)} "
                "(a retry, or a clear of a run that landed): reports them",
                landed,
            )
    # Says what happens next: for a snapshot, whether one is due is decided (and logged) after this.
    then = "checks whether a snapshot is due" if kind == "snapshot" else "captures"
    return RunDecision(False, f"{run.describe()}: no {kind} window of this run landed before: {then}")


def _ids(entries: tuple[CommitEntry, ...] | list[CommitEntry]) -> str:
    return ", ".join(e.window_id for e in entries)


def landed_by_run(entries: list[CommitEntry], run: RunInterval, kind: str = "any") -> tuple[CommitEntry, ...]:
    """Committed windows (of ``kind``, or ``"any"``) landed by this very run."""
    return tuple(e for e in entries if run.same_run(e.stats.get("run")) and kind in ("any", e.window.kind))


def _interval_runs(entries: list[CommitEntry], run: RunInterval) -> list[CommitEntry]:
    return [e for e in entries if run.same_dag(e.stats.get("run")) and _by_interval(e.stats["run"])]


def landed_by(entries: list[CommitEntry], run: RunInterval) -> CommitEntry | None:
    """The last window landed by an interval run of this DAG whose interval ended by ``run``'s end
    (a backfill's current state is rebuilt as of it)."""
    if run.end_ms is None:
        return None
    before = [e for e in _interval_runs(entries, run) if int(e.stats["run"]["end_ms"]) <= run.end_ms]
    return before[-1] if before else None


@dataclass(frozen=True)
class StateTarget:
    """What a current-state task builds: the current state (``as_of`` None), the state as of a
    landed window, or nothing (``skip``); ``reason`` names the run type and why."""

    as_of: CommitEntry | None
    reason: str
    skip: bool = False


def state_target(entries: list[CommitEntry], run: RunInterval | None) -> StateTarget:
    """A backfill: as of the last window landed by the end of its interval (skip if none did). A
    re-run of a run whose windows landed, when later windows landed since (a cleared past run):
    as of its own last window. Every other run, the one that just captured included: current."""
    if run is None:
        return StateTarget(None, "not part of a DAG run: the current state")
    if run.is_backfill:
        entry = landed_by(entries, run)
        if entry is None:
            return StateTarget(None, f"{run.describe()} is a backfill and no window landed by its end", skip=True)
        return StateTarget(entry, f"{run.describe()} is a backfill: state as of window {entry.window_id}")
    own = landed_by_run(entries, run)
    if own and entries and entries[-1].window.seq > own[-1].window.seq:
        return StateTarget(own[-1], f"{run.describe()} re-runs a past run: state as of its window {own[-1].window_id}")
    return StateTarget(None, f"{run.describe()}: the current state")
