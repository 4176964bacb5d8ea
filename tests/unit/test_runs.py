"""Which runs are replays (backfills, cleared past runs) and what landed for them."""

from __future__ import annotations

from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry
from airflow_provider_cdc.cdc.window import Window
from airflow_provider_cdc.operators.runs import RunInterval, is_replay, landed_by, landed_for, newest_run

HOUR = 3_600_000


def interval(hour: int, run_id: str | None = None, dag_id: str = "d") -> RunInterval:
    return RunInterval(run_id or f"scheduled__{hour}", "scheduled", hour * HOUR, (hour + 1) * HOUR, dag_id)


def entry(seq: int, hour: int | None) -> CommitEntry:
    window = Window(seq, "stream", seq * 10, seq * 10 + 10, 0)
    stats = {} if hour is None else {"run": interval(hour).to_dict()}
    return CommitEntry("p", window, "a", (), 0, None, None, None, 0, stats)


def test_a_run_not_newer_than_the_newest_landed_one_is_a_replay():
    runs = {"snapshot": interval(5).to_dict(), "stream": interval(4).to_dict()}
    assert is_replay(interval(3), runs, "stream")
    assert is_replay(interval(4), runs, "stream")  # older than the newest snapshot
    assert is_replay(interval(5, "manual__again"), runs, "snapshot")  # the same interval, run again
    assert not is_replay(interval(5), runs, "stream")  # the window of the run that snapshotted
    assert not is_replay(interval(6), runs, "stream")
    assert not is_replay(None, runs, "stream") and not is_replay(interval(1), None, "stream")
    assert not is_replay(interval(1, dag_id="other"), runs, "stream")  # another DAG's schedule


def test_what_landed_for_and_by_an_interval():
    entries = [entry(1, None), entry(2, 0), entry(3, 1), entry(4, 1), entry(5, 3)]
    assert [e.window.seq for e in landed_for(entries, interval(1))] == [3, 4]
    assert landed_for(entries, interval(2)) == []
    assert landed_by(entries, interval(2)).window.seq == 4
    assert landed_by(entries, interval(-1)) is None
    assert newest_run(entries, interval(0)) == interval(3).to_dict()
    assert newest_run(entries, interval(0, dag_id="other")) is None
