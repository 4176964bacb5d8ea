"""A Hadoop-URI sink (file://): Spark's writers and Hadoop FS inside the job, Arrow FS outside."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.cdc.sinks.commit_log import CommitLog
from airflow_provider_cdc.cdc.sinks.reader import read_topic_spark
from airflow_provider_cdc.cdc.sinks.storage import ArrowFsStorage, HadoopStorage, storage_for
from airflow_provider_cdc.cdc.sources.postgres import admin
from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job
from tests.support.databases import snapshot_window, stream_window
from tests.support.oracle import assert_same_state, replay, source_rows

pytestmark = pytest.mark.spark


def test_snapshot_and_window_on_a_uri_sink(db15, spark, tmp_path):
    db = db15
    uri = f"file://{tmp_path}/lake"
    db.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 50) g"
    )
    db.setup_capture(["public.t"])
    assert isinstance(storage_for(uri, lambda: spark), HadoopStorage)
    snapshot = run_job(db.spec(["public.t"], snapshot_window(1), uri))
    with db.connect() as conn:
        admin.advance_slot(conn, db.slot, snapshot.window.to_lsn)
        conn.execute("UPDATE t SET v = 'changed' WHERE id <= 10; DELETE FROM t WHERE id > 45")
    window = run_job(db.spec(["public.t"], stream_window(2, snapshot.window.to_lsn, db.current_lsn()), uri))
    assert window.dataset("t.public.t").ops == {"u": 10, "d": 5}
    events = [row.asDict(recursive=True) for row in read_topic_spark(spark, uri, "t", "t.public.t").collect()]
    with db.connect() as conn:
        assert_same_state(replay(events, ["id"]), source_rows(conn, "public.t", ["id"]))
    # The operator side reads the same commit log without Spark.
    outside = CommitLog(storage_for(uri), "t")
    assert isinstance(outside.storage, ArrowFsStorage)
    assert [e.window.seq for e in outside.committed()] == [1, 2]
    assert outside.latest().attempt == window.attempt
