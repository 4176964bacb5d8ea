"""Which runs are replays (backfills, cleared past runs, retries) and what landed for them."""

from __future__ import annotations

from airflow_provider_cdc.cdc.runs import (
    RunInterval,
    is_replay,
    landed_by,
    landed_for,
    newest_run,
    normalised_runs,
    record_run,
)
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry
from airflow_provider_cdc.cdc.window import Window

HOUR = 3_600_000


def interval(hour: int, run_id: str | None = None, dag_id: str = "d") -> RunInterval:
    return RunInterval(run_id or f"scheduled__{hour}", "scheduled", hour * HOUR, (hour + 1) * HOUR, dag_id)


def manual(run_id: str, dag_id: str = "d") -> RunInterval:
    return RunInterval(run_id, "manual", None, None, dag_id)


def entry(seq: int, run: RunInterval | None, kind: str = "stream") -> CommitEntry:
    window = Window(seq, kind, seq * 10, seq * 10 + 10, 0)
    stats = {} if run is None else {"run": run.to_dict()}
    return CommitEntry("p", window, "a", (), 0, None, None, None, 0, stats)


def landed(*runs: tuple[RunInterval, str]) -> dict:
    """The offset's record after these runs landed windows, in order."""
    record: dict = {}
    for run, kind in runs:
        record = record_run(record, run.to_dict(), kind)
    return record


def test_a_run_not_newer_than_the_newest_landed_one_is_a_replay():
    runs = landed((interval(4), "stream"), (interval(5), "snapshot"))
    assert is_replay(interval(3), runs, "stream")
    assert is_replay(interval(4), runs, "stream")  # older than the newest snapshot
    assert is_replay(interval(5, "manual__again"), runs, "snapshot")  # the same interval, run again
    assert not is_replay(interval(5), runs, "stream")  # the window of the run that snapshotted
    assert not is_replay(interval(6), runs, "stream")
    assert not is_replay(None, runs, "stream") and not is_replay(interval(1), None, "stream")
    assert not is_replay(interval(1, dag_id="other"), runs, "stream")  # another DAG's schedule


def test_another_dag_landing_a_window_does_not_erase_this_dags_record():
    runs = landed((interval(5), "stream"), (interval(0, dag_id="maintenance"), "stream"))
    assert is_replay(interval(5), runs, "stream")  # a retry of the 05:00 run
    assert is_replay(interval(3), runs, "stream")  # a cleared 03:00 run
    assert not is_replay(interval(6), runs, "stream")
    assert is_replay(interval(0, dag_id="maintenance"), runs, "stream")
    assert not is_replay(interval(1, dag_id="maintenance"), runs, "stream")


def test_a_run_without_a_data_interval_is_a_replay_only_of_itself():
    runs = landed((interval(5), "stream"), (manual("manual__a"), "stream"))
    assert is_replay(manual("manual__a"), runs, "stream")  # retried after its window landed
    assert not is_replay(manual("manual__b"), runs, "stream")  # a new manual run captures now
    assert not is_replay(manual("manual__a"), runs, "snapshot")
    # A manual run does not hide the newest interval from the scheduled runs.
    assert is_replay(interval(4), runs, "stream") and not is_replay(interval(6), runs, "stream")
    entries = [entry(1, interval(5)), entry(2, manual("manual__a")), entry(3, manual("manual__b"))]
    assert [e.window.seq for e in landed_for(entries, manual("manual__a"))] == [2]
    assert landed_for(entries, manual("manual__a"), "snapshot") == []
    assert landed_by(entries, manual("manual__a")) is None
    assert newest_run(entries, interval(0)) == interval(5).to_dict()


def test_offsets_from_before_per_dag_records_are_read_per_dag():
    legacy = {"snapshot": interval(5).to_dict(), "stream": interval(4, dag_id="other").to_dict()}
    assert normalised_runs(legacy) == {
        "d": {"last": {"snapshot": interval(5).to_dict()}, "newest": {"snapshot": interval(5).to_dict()}},
        "other": {
            "last": {"stream": interval(4, dag_id="other").to_dict()},
            "newest": {"stream": interval(4, dag_id="other").to_dict()},
        },
    }
    assert is_replay(interval(4), legacy, "stream") and not is_replay(interval(5), legacy, "stream")
    updated = record_run(legacy, interval(6).to_dict(), "stream")
    assert updated["d"]["newest"] == {"snapshot": interval(5).to_dict(), "stream": interval(6).to_dict()}
    assert updated["other"] == normalised_runs(legacy)["other"]
    assert legacy["snapshot"] == interval(5).to_dict()  # not modified in place


def test_what_landed_for_and_by_an_interval():
    entries = [
        entry(1, None),
        entry(2, interval(0)),
        entry(3, interval(1)),
        entry(4, interval(1)),
        entry(5, interval(3)),
    ]
    assert [e.window.seq for e in landed_for(entries, interval(1))] == [3, 4]
    assert [e.window.seq for e in landed_for(entries, interval(1, "manual__x"))] == [3, 4]  # by interval
    assert landed_for(entries, interval(2)) == []
    assert landed_by(entries, interval(2)).window.seq == 4
    assert landed_by(entries, interval(-1)) is None
    assert newest_run(entries, interval(0)) == interval(3).to_dict()
    assert newest_run(entries, interval(0, dag_id="other")) is None
