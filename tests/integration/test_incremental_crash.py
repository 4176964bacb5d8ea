"""An incremental snapshot of busy tables, with capture runs killed at every step boundary and
at random moments: nothing lost, nothing duplicated, and the state equals the source."""

from __future__ import annotations

import json
import random

import pytest

from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from airflow_provider_cdc.cdc.state.apply import apply_windows
from airflow_provider_cdc.cdc.state.jobs import read_state
from tests.integration.test_crash_safety import KEYS, Workload
from tests.integration.test_crash_safety import crash_db as crash_db  # the fixture
from tests.support import crash as harness
from tests.support.crash import CrashCapture
from tests.support.oracle import assert_same_state, source_rows, spark_rows

pytestmark = [pytest.mark.spark, pytest.mark.slow]


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
    harness.incremental_crashes(capture, workload, random.Random(11), kills=3, kill_span=(0.0, 2.0), writer_rounds=2)
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
