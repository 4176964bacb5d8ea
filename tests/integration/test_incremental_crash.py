"""An incremental snapshot of busy tables, with capture runs killed at every step boundary and
at random moments: nothing lost, nothing duplicated, and the state equals the source."""

from __future__ import annotations

import json
import random

import pytest

from airflow_provider_cdc.cdc.naming import Topic
from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from airflow_provider_cdc.cdc.state import apply_windows, read_state
from tests.integration.test_crash_safety import KEYS, Workload, _fault
from tests.integration.test_crash_safety import crash_db as crash_db  # the fixture
from tests.support.crash import CrashCapture
from tests.support.oracle import assert_same_state, source_rows, spark_rows

pytestmark = [pytest.mark.spark, pytest.mark.slow]

INCREMENTAL_FAULTS = [
    ("incremental.chunk_staged", 1),
    ("incremental.chunk_staged", 2),
    ("window.read_done", 1),
    ("sink.committed", 1),
    ("operator.offset_saved", 1),
    ("operator.pending_saved", 1),
]


def test_incremental_snapshot_survives_crashes_under_load(crash_db, spark, tmp_path):
    db, conn_id = crash_db
    with db.connect() as conn:
        conn.execute("CREATE TABLE dbz_signal (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data text)")
    overrides = {
        "signal_table": "public.dbz_signal",
        "incremental_chunk_size": 40,
        "incremental_chunks_per_run": 2,
    }
    capture = CrashCapture(db, conn_id, "inc", tmp_path / "lake", KEYS, chunk=10, overrides=overrides)
    capture.run("setup")
    capture.run("snapshot")
    workload = Workload(db)
    signal = {"data-collections": ["public\\.(customers|orders|order_items)"]}
    with db.connect() as conn:
        conn.execute("INSERT INTO dbz_signal VALUES ('resnap-1', 'execute-snapshot', %s)", (json.dumps(signal),))
    rng = random.Random(11)
    cycles = [{"fault": _fault(p, n)} for p, n in INCREMENTAL_FAULTS]
    cycles += [{"kill_after": rng.uniform(0.0, 2.0)} for _ in range(3)]
    rng.shuffle(cycles)
    for cycle in cycles:
        writer = workload.in_background(2)
        if "fault" in cycle:
            result = capture.child("batch", fault=cycle["fault"])
        else:
            result = capture.child("batch", kill_after=cycle["kill_after"])
        assert result.returncode in (-9, 0), result.describe()
        writer.join()
        capture.catch_up()
        capture.verify(transactions=workload.transactions)
    for _ in range(40):  # finish the snapshot
        offset = capture.stored_offset()
        if offset.incremental is not None and offset.incremental.idle:
            break
        capture.run("batch")
    offset = capture.stored_offset()
    assert offset.incremental.idle, offset.incremental.summary()
    assert {t.status for t in offset.incremental.history} == {"done"}
    capture.verify(transactions=workload.transactions)
    for table, keys in KEYS.items():
        events = read_topic_arrow(str(capture.sink), "inc", f"inc.{table}").to_pylist()
        incremental = [e for e in events if e["op"] == "r" and e["source"]["snapshot"] == "incremental"]
        assert incremental, f"{table}: no incremental snapshot rows"
        # The current-state table (Spark's fold) equals the source too.
        schema, name = table.split(".")
        topic = Topic.for_table("inc", schema, name)
        apply_windows(
            spark, sink_path=str(capture.sink), topic_prefix="inc", topic=topic, state_path=str(tmp_path / "state")
        )
        state = read_state(spark, state_path=str(tmp_path / "state"), topic_prefix="inc", topic=topic)
        with db.connect() as conn:
            assert_same_state(spark_rows(state, keys), source_rows(conn, table, keys))
