"""The Parquet current state on S3 (the suite's SeaweedFS): a capture landed on the store folded
into a state path on the store, equal to the same fold on local paths, incrementally and as of
an earlier window; Polars reads the state from the store."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.jobs import run_window_job
from airflow_provider_cdc.cdc.planning.spec import SparkOptions, StateJobSpec
from airflow_provider_cdc.cdc.sinks import object_store
from airflow_provider_cdc.cdc.sources.postgres import admin
from airflow_provider_cdc.cdc.state.apply import apply_windows
from airflow_provider_cdc.cdc.state.jobs import read_state, run_state_job
from airflow_provider_cdc.cdc.state.versions import STATE_LOG_DIR
from tests.support.databases import snapshot_window, stream_window
from tests.support.oracle import assert_same_state, source_rows, spark_rows
from tests.support.s3_server import BUCKET, REGION

pytestmark = pytest.mark.spark

TOPIC = Topic.for_table("t", "public", "t")
CHANGES = [
    # window 2: updates, deletes, an insert and a key change
    "UPDATE t SET v = 'changed', amount = amount * 2 WHERE id <= 5;"
    "DELETE FROM t WHERE id > 25; INSERT INTO t VALUES (100, 'new', 1.5, now(), '2024-02-29');"
    "UPDATE t SET id = 50 WHERE id = 6",
    # window 3: more of the same over the state of window 2
    "UPDATE t SET v = NULL WHERE id IN (1, 100); DELETE FROM t WHERE id = 2;"
    "INSERT INTO t VALUES (7000, 'x', 0, NULL, NULL)",
]


def _state_spec(sink: str, state: str, access, as_of_seq: int | None = None, engine: str = "spark") -> StateJobSpec:
    return StateJobSpec(
        topic_prefix="t",
        sink_path=sink,
        state_path=state,
        topics=((TOPIC.name, TOPIC.directory),),
        as_of_seq=as_of_seq,
        spark=SparkOptions(master="local[2]"),
        object_store=access,
        state_engine=engine,
    )


def _rows(spark, state: str, window_seq: int | None = None) -> dict:
    return spark_rows(read_state(spark, state_path=state, topic_prefix="t", topic=TOPIC, window_seq=window_seq), ["id"])


def test_parquet_state_on_s3_equals_the_local_fold(db15, spark, s3_server, s3_prefix, tmp_path):
    db = db15
    db.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text, amount numeric(10,2), at timestamptz, d date);"
        "INSERT INTO t SELECT g, 'v' || g, g / 4.0, '2024-01-01 00:00+00'::timestamptz + g * interval '1 hour',"
        " '2024-01-01'::date + g FROM generate_series(1, 30) g"
    )
    db.setup_capture(["public.t"])
    access = s3_server.access()
    sink, state, local = f"{s3_prefix}/lake", f"{s3_prefix}/state", tmp_path / "local"
    source: dict[int, dict] = {}

    def capture(window) -> None:
        entry = run_window_job(db.spec(["public.t"], window, sink, object_store=access))
        with db.connect() as conn:
            admin.advance_slot(conn, db.slot, entry.window.to_lsn)
            source[window.seq] = source_rows(conn, "public.t", ["id"])

    capture(snapshot_window(1))
    at = db.current_lsn()
    for seq, statements in enumerate(CHANGES, start=2):
        db.execute(statements)
        end = db.current_lsn()
        capture(stream_window(seq, at, end))
        at = end
        # The operator's engine path, on the store (window 3 applies to window 2's version): Spark,
        # then Arrow over Spark's version (reading and writing the store without a JVM).
        (result,) = run_state_job(_state_spec(sink, state, access, engine="spark" if seq == 2 else "arrow"))
        assert result["action"] == "applied" and result["rows"] == len(source[seq])
        assert_same_state(_rows(spark, state), source[seq])

    # The same fold on local paths, of a copy of the landed sink, gives the same rows.
    import pyarrow.fs as pafs

    filesystem, path = object_store.filesystem(sink)
    pafs.copy_files(
        path, str(local / "lake"), source_filesystem=filesystem, destination_filesystem=pafs.LocalFileSystem()
    )
    folded = apply_windows(
        spark, sink_path=str(local / "lake"), topic_prefix="t", topic=TOPIC, state_path=str(local / "state")
    )
    assert folded.version.window_id == result["window_id"] and folded.version.rows == result["rows"]
    assert _rows(spark, state) == _rows(spark, str(local / "state"))

    # as_of a window the job never stopped at: rebuilt on the store, the current version untouched;
    # as_of one it stopped at: that version, read back from the store.
    (rebuilt,) = run_state_job(_state_spec(sink, state, access, as_of_seq=1, engine="arrow"))
    assert rebuilt["action"] == "rebuilt" and rebuilt["engine"] == "arrow"
    apply_windows(
        spark,
        sink_path=str(local / "lake"),
        topic_prefix="t",
        topic=TOPIC,
        state_path=str(local / "state"),
        as_of_seq=1,
    )
    assert _rows(spark, state, 1) == _rows(spark, str(local / "state"), 1)
    assert_same_state(_rows(spark, state, 1), source[1])
    assert_same_state(_rows(spark, state, 2), source[2])
    assert_same_state(_rows(spark, state), source[3])

    # Everything is on the store: the state log's entries and the versions' Parquet files.
    _, root = object_store.split_bucket(state)
    keys = s3_server.keys(BUCKET, root + "/")
    assert [k.rsplit("/", 1)[1] for k in keys if f"/{STATE_LOG_DIR}/" in k] == [f"{n:020d}.json" for n in (1, 2, 3)]
    current = next(k for k in keys if k.endswith(".parquet") and f"version={result['window_id']}-" in k)
    assert result["path"] in current

    # A third-party reader from the store: Polars, with its own S3 client.
    import polars as pl

    options = {
        "aws_endpoint_url": s3_server.endpoint_url,
        "aws_region": REGION,
        "aws_access_key_id": access.access_key_id,
        "aws_secret_access_key": access.secret_access_key,
        "aws_allow_http": "true",
        "aws_virtual_hosted_style_request": "false",
    }
    directory = current.rsplit("/", 1)[0]
    frame = pl.read_parquet(f"s3://{BUCKET}/{directory}/*.parquet", storage_options=options)
    assert_same_state({(r["id"],): r for r in frame.to_dicts()}, source[3])
