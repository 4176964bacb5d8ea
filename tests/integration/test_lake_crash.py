"""Crash safety with Iceberg and Delta sinks: runs killed (SIGKILL) between their table commits.

A window's table commits (one per landed dataset, the transaction table last) come before its
commit-log entry, so a kill can leave tables that hold a window the log does not. The next run
must replace those commits (a snapshot retried after changes reads other rows), never add to
them. Besides the harness's checks (nothing lost, nothing duplicated, the state equals the
source), ``verify`` reads every table whole with its own library and finds exactly the windows
the log committed, each with the events the log counted.

The suite runs a CI-sized sample; every fault point for both formats:

    CDC_LAKE_CRASH_FULL=1 ./scripts/test.sh tests/integration/test_lake_crash.py
"""

from __future__ import annotations

import json
import os
import random

import pytest

from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.state.jobs import read_state
from airflow_provider_cdc.operators.current_state import CdcCurrentStateOperator
from airflow_provider_cdc.operators.table_maintenance import CdcTableMaintenanceOperator
from tests.support import crash as harness
from tests.support.crash import CrashCapture, prepare_shop
from tests.support.crash_sources import PostgresCrashSource
from tests.support.oracle import assert_same_state, spark_rows

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KEYS = {"public.customers": ["id"], "public.orders": ["id"], "public.order_items": ["order_id", "line_no"]}
FULL = bool(os.environ.get("CDC_LAKE_CRASH_FULL"))

# The snapshot commits customers, order_items, orders, then the transaction table (none: a
# snapshot has no transactions), then the log: kills after the 1st and 3rd table commit.
SNAPSHOT_FAULTS = [("sink.table_committed", 1), ("sink.table_committed", 3)] + (
    [("snapshot.table_written", 2), ("sink.committed", 1), ("operator.offset_saved", 1)] if FULL else []
)
STREAM_FAULTS = [("sink.table_committed", 1), ("sink.table_committed", 4), ("sink.committed", 1)] + (
    [("window.chunk_written", 2), ("window.read_done", 1), ("sink.table_committed", 2), ("operator.offset_saved", 1)]
    if FULL
    else []
)


@pytest.fixture
def crash_db(db15, spark, monkeypatch):
    return db15, prepare_shop(db15, monkeypatch, "lake", customers=30, orders_per_customer=3)


class Workload(harness.Workload):
    def __init__(self, db):
        super().__init__(PostgresCrashSource(db, conn_id=""))


@pytest.mark.parametrize("sink_format", ["iceberg", "delta"])
@pytest.mark.parametrize("point,nth", SNAPSHOT_FAULTS, ids=[f"{p}:{n}" for p, n in SNAPSHOT_FAULTS])
def test_a_snapshot_killed_between_table_commits_is_replaced_by_the_next_run(
    crash_db, tmp_path, sink_format, point, nth
):
    db, conn_id = crash_db
    capture = CrashCapture(db, conn_id, "lake", tmp_path / "lake", KEYS, overrides={"sink_format": sink_format})
    outcome = harness.snapshot_crash(capture, Workload(db), {"point": point, "nth": nth})
    assert outcome["killed"]


@pytest.mark.parametrize("sink_format", ["iceberg", "delta"])
def test_stream_windows_killed_between_table_commits_lose_and_duplicate_nothing(crash_db, tmp_path, sink_format):
    db, conn_id = crash_db
    capture = CrashCapture(
        db, conn_id, "lake", tmp_path / "lake", KEYS, chunk=10, overrides={"sink_format": sink_format}
    )
    capture.run("setup")
    capture.run("snapshot")
    workload = Workload(db)
    cycles = [{"fault": harness.fault(p, n)} for p, n in STREAM_FAULTS] + [{"random": True}]
    outcomes = harness.stream_crashes(capture, workload, cycles, random.Random(20261124)).outcomes
    assert outcomes["killed"] >= len(STREAM_FAULTS)

    # Maintenance (compaction, then expiry of all history) under the capture lock changes no
    # committed event, and the capture goes on committing windows after it.
    before = {t: harness._rows(str(capture.sink), "lake", f"lake.{t}") for t in KEYS}
    summary = CdcTableMaintenanceOperator(task_id="maintain", capture=capture.capture(), retain_hours=0).execute({})
    assert set(summary["tables"]) >= {f"lake.{t}" for t in KEYS}
    after = {t: harness._rows(str(capture.sink), "lake", f"lake.{t}") for t in KEYS}
    assert {t: _canonical(rows) for t, rows in after.items()} == {t: _canonical(rows) for t, rows in before.items()}
    workload.mutate()
    capture.catch_up()
    capture.verify()

    # The current state by MERGE equals the source; as of an earlier window it is time travel.
    state_path = str(tmp_path / "state")
    first = _state(capture, state_path, state_engine="spark")  # then Arrow (auto, small) merges into it
    held = {r["topic"]: r["window_id"] for r in first}
    for table, keys in KEYS.items():
        assert_same_state(spark_rows(_read(capture, state_path, table), keys), capture.source.source_rows(table, keys))
    earlier = {t: sorted(map(str, _read(capture, state_path, t).collect())) for t in KEYS}
    workload.mutate()
    capture.catch_up()
    second = _state(capture, state_path)
    assert {r["action"] for r in second} == {"applied"} and all(r["merge"]["action"] for r in second)
    assert {r["engine"] for r in first} == {"spark"} and {r["engine"] for r in second} == {"arrow"}
    for table, keys in KEYS.items():
        assert_same_state(spark_rows(_read(capture, state_path, table), keys), capture.source.source_rows(table, keys))
    window = int(held[f"lake.{next(iter(KEYS))}"])
    past = _state(capture, state_path, as_of_window=window)
    assert {r["action"] for r in past} == {"time_travel"}
    for table in KEYS:
        assert sorted(map(str, _read(capture, state_path, table, window).collect())) == earlier[table]


def _state(capture, state_path: str, **kwargs) -> list[dict]:
    operator = CdcCurrentStateOperator(task_id="state", capture=capture.capture(), state_path=state_path, **kwargs)
    return operator.execute({})


def _read(capture, state_path: str, table: str, window: int | None = None):
    from pyspark.sql import SparkSession

    schema, name = table.split(".")
    return read_state(
        SparkSession.getActiveSession(),
        state_path=state_path,
        topic_prefix="lake",
        topic=Topic.for_table("lake", schema, name),
        window_seq=window,
        sink_format=capture.overrides["sink_format"],
    )


def _canonical(rows: list[dict]) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)
