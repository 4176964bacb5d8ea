"""Which runs capture and which report what landed (backfills, retries, clears), and the state a
current-state task builds for each. The same rule runs under real Airflow in
tests/dags/test_run_types.py; here every branch, including the commit-log reads it avoids."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.planning.runs import (
    RunInterval,
    decide,
    landed_by,
    landed_by_run,
    normalised_runs,
    record_run,
    state_target,
)
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry

HOUR = 3_600_000


def scheduled(hour: int, dag_id: str = "d", **kw) -> RunInterval:
    """A run of a cron schedule (Airflow 3's default CronTriggerTimetable: a zero-length interval)."""
    return RunInterval(f"scheduled__{hour}", "scheduled", hour * HOUR, hour * HOUR, dag_id, hour * HOUR, **kw)


def manual(run_id: str, after_hour: float, interval: bool = True, dag_id: str = "d") -> RunInterval:
    at = int(after_hour * HOUR)
    return RunInterval(run_id, "manual", at if interval else None, at if interval else None, dag_id, at)


def backfill(hour: int, dag_id: str = "d") -> RunInterval:
    return RunInterval(f"backfill__{hour}", "backfill", hour * HOUR, hour * HOUR, dag_id, hour * HOUR + 99 * HOUR)


def entry(seq: int, run: RunInterval | None, kind: str = "stream") -> CommitEntry:
    window = Window(seq, kind, seq * 10, seq * 10 + 10, 0)  # type: ignore[arg-type]
    stats = {} if run is None else {"run": run.to_dict()}
    return CommitEntry("p", window, "a", (), 0, None, None, None, 0, stats)


class Log:
    """Landed windows and the offset's record of them; counts how often the log is read."""

    def __init__(self, *landed: tuple[RunInterval, str]):
        self.entries = [entry(i + 1, run, kind) for i, (run, kind) in enumerate(landed)]
        self.record: dict = {}
        for run, kind in landed:
            self.record = record_run(self.record, run.to_dict(), kind)
        self.reads = 0

    def committed(self) -> list[CommitEntry]:
        self.reads += 1
        return self.entries

    def decide(self, run: RunInterval | None, kind: str = "stream"):
        return decide(run, self.record, kind, self.committed)


def test_the_scheduled_run_after_a_manual_run_captures():
    # The field report: `airflow dags test` at 10:30, then the scheduler's 10:00 run.
    log = Log((scheduled(8), "snapshot"), (manual("manual__1030", 10.5), "stream"))
    decision = log.decide(scheduled(10))
    assert not decision.replay
    assert "scheduled" in decision.reason and "captures" in decision.reason
    assert log.reads == 1  # older than the manual run: the log says this run never landed


def test_a_new_run_captures_without_reading_the_log():
    log = Log((scheduled(8), "snapshot"), (scheduled(8), "stream"), (scheduled(9), "stream"))
    for run in (scheduled(10), manual("manual__x", 10.5), manual("manual__y", 11, interval=False)):
        assert not log.decide(run).replay
    asset = RunInterval("asset_triggered__x", "asset_triggered", None, None, "d", 12 * HOUR)
    assert not log.decide(asset).replay
    assert log.reads == 0


def test_retries_and_clears_of_a_landed_run_report_it():
    log = Log((scheduled(8), "snapshot"), (scheduled(8), "stream"), (scheduled(9), "stream"), (scheduled(10), "stream"))
    retry = log.decide(scheduled(10))
    assert retry.replay and [e.window.seq for e in retry.landed] == [4]
    assert "already landed stream window(s) 0000000004" in retry.reason
    cleared = log.decide(scheduled(8, clear_number=1))  # a clear of an older run: found in the log
    assert cleared.replay and [e.window.seq for e in cleared.landed] == [2]
    assert "cleared 1x" in cleared.reason
    assert log.decide(scheduled(8), "snapshot").replay  # the snapshot task of that run too


def test_a_cleared_or_retried_run_that_never_landed_captures():
    log = Log((scheduled(8), "snapshot"), (scheduled(10), "stream"))
    assert not log.decide(scheduled(9, clear_number=1)).replay  # failed at 09:00, cleared later
    assert not log.decide(scheduled(10), "snapshot").replay  # its snapshot task never landed one


@pytest.mark.parametrize("hour", [8, 9, 20])
def test_a_backfill_never_captures(hour):
    log = Log((scheduled(8), "snapshot"), (scheduled(8), "stream"), (scheduled(9), "stream"))
    decision = log.decide(backfill(hour))
    assert decision.replay and "is a backfill" in decision.reason
    expected = {8: [2], 9: [3], 20: []}[hour]
    assert [e.window.seq for e in decision.landed] == expected
    if not expected:
        assert "no window landed for its interval" in decision.reason
    assert [e.window.seq for e in log.decide(backfill(hour), "snapshot").landed] == ([1] if hour == 8 else [])


def test_runs_are_matched_within_their_dag():
    log = Log((scheduled(8), "stream"), (scheduled(9, dag_id="maintenance"), "stream"))
    assert log.decide(scheduled(8)).replay
    assert not log.decide(scheduled(8, dag_id="maintenance")).replay
    assert not log.decide(backfill(8, dag_id="other")).landed
    assert not log.decide(None).replay


def test_offsets_from_before_per_dag_records_are_read_per_dag():
    legacy = {"snapshot": scheduled(5).to_dict(), "stream": scheduled(4, dag_id="other").to_dict()}
    assert normalised_runs(legacy) == {
        "d": {"last": {"snapshot": scheduled(5).to_dict()}},
        "other": {"last": {"stream": scheduled(4, dag_id="other").to_dict()}},
    }
    updated = record_run(legacy, scheduled(6).to_dict(), "stream")
    assert updated["d"] == {
        "last": {"snapshot": scheduled(5).to_dict(), "stream": scheduled(6).to_dict()},
        "run_after_ms": 6 * HOUR,
    }
    assert updated["other"] == normalised_runs(legacy)["other"]
    assert legacy["snapshot"] == scheduled(5).to_dict()  # not modified in place
    # A record without run_after (older offsets): the log is read to tell a clear from a new run.
    log = Log()
    log.entries = [entry(1, scheduled(5), "snapshot")]
    assert decide(scheduled(5), legacy, "snapshot", log.committed).replay
    assert not decide(scheduled(6), legacy, "snapshot", log.committed).replay and log.reads == 2


def test_the_state_a_current_state_task_builds():
    entries = [
        entry(1, scheduled(0), "snapshot"),
        entry(2, scheduled(0)),
        entry(3, scheduled(1)),
        entry(4, manual("manual__x", 1.5)),
        entry(5, scheduled(3)),
    ]
    assert state_target(entries, scheduled(3)).as_of is None  # the run that just captured
    assert state_target(entries, scheduled(4)).as_of is None  # a run that captured nothing new
    assert state_target(entries, scheduled(1)).as_of.window.seq == 3  # a cleared past run
    assert state_target(entries, manual("manual__x", 1.5)).as_of.window.seq == 4
    past = state_target(entries, backfill(2))
    assert past.as_of.window.seq == 4 and "backfill" in past.reason  # the last one landed by 02:00
    assert state_target(entries, backfill(1)).as_of.window.seq == 3
    assert state_target(entries, backfill(-1)).skip
    assert state_target(entries, None).as_of is None
    assert landed_by(entries, manual("manual__y", 9, interval=False)) is None
    assert [e.window.seq for e in landed_by_run(entries, scheduled(0))] == [1, 2]
    assert [e.window.seq for e in landed_by_run(entries, scheduled(0), "snapshot")] == [1]
