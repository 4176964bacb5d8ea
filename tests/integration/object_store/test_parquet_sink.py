"""The Parquet sink and its commit log on S3 (the suite's SeaweedFS): Arrow writes the windows on
the driver and the snapshot's files in Spark tasks, the log is published with a conditional PUT,
and the product's readers, Polars and DuckDB read the landed files back from the store."""

from __future__ import annotations

import json
import re

import pytest

from airflow_provider_cdc.cdc.jobs import run_window_job
from airflow_provider_cdc.cdc.sinks import object_store
from airflow_provider_cdc.cdc.sinks.commit_log import CommitLog
from airflow_provider_cdc.cdc.sinks.reader import committed_paths, read_topic_arrow
from airflow_provider_cdc.cdc.sinks.storage import ObjectStoreStorage, storage_for
from airflow_provider_cdc.cdc.sources.postgres import admin
from tests.support.databases import snapshot_window, stream_window
from tests.support.oracle import assert_same_state, replay, source_rows
from tests.support.s3_server import BUCKET, REGION
from tests.support.sqlserver import StatementRecorder, workload
from tests.support.sqlserver.fixtures import DRIVER_IN_EXTRA_ALLOWED, airflow_connection, standin_for

pytestmark = pytest.mark.spark

TOPIC = "t.public.t"


def _key(uri: str) -> str:
    return object_store.split_bucket(uri)[1]


def _polars_options(s3_server) -> dict[str, str]:
    access = s3_server.access()
    return {
        "aws_endpoint_url": s3_server.endpoint_url,
        "aws_region": REGION,
        "aws_access_key_id": access.access_key_id,
        "aws_secret_access_key": access.secret_access_key,
        "aws_allow_http": "true",
        "aws_virtual_hosted_style_request": "false",
    }


def test_capture_lands_on_s3(db15, spark, s3_server, s3_prefix):
    db = db15
    db.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 60) g"
    )
    db.setup_capture(["public.t"])
    access = s3_server.access()
    storage = storage_for(s3_prefix, lambda: spark)
    assert isinstance(storage, ObjectStoreStorage)  # inside jobs too: Spark never touches the store

    # Snapshot: each Spark task writes its own file with Arrow, with the access the driver captured.
    snapshot = run_window_job(db.spec(["public.t"], snapshot_window(1), s3_prefix, object_store=access))
    assert snapshot.dataset(TOPIC).ops == {"r": 60}
    with db.connect() as conn:
        admin.advance_slot(conn, db.slot, snapshot.window.to_lsn)
        with conn.transaction():
            conn.execute("UPDATE t SET v = 'changed' WHERE id <= 10")
            conn.execute("DELETE FROM t WHERE id > 55")
        conn.execute("INSERT INTO t VALUES (100, 'new')")
    window = stream_window(2, snapshot.window.to_lsn, db.current_lsn())
    first = run_window_job(db.spec(["public.t"], window, s3_prefix, object_store=access))
    assert first.dataset(TOPIC).ops == {"u": 10, "d": 5, "c": 1}
    assert first.transactions == 2

    # A re-run of the window supersedes the first attempt: its objects go, nothing is duplicated.
    rerun = run_window_job(db.spec(["public.t"], window, s3_prefix, object_store=access))
    assert rerun.attempt != first.attempt and rerun.dataset(TOPIC).ops == first.dataset(TOPIC).ops
    _, root = object_store.split_bucket(s3_prefix)
    keys = s3_server.keys(BUCKET, root + "/")
    assert not [k for k in keys if f"attempt={first.attempt}" in k]
    log = CommitLog(storage, "t")
    entries = log.entries()
    assert [e.window.seq for e in entries] == [1, 2, 2]
    assert [k for k in keys if "/_cdc_log/" in k] == [f"{root}/{log.directory}/{n:020d}.json" for n in (1, 2, 3)]
    # Every data object belongs to an attempt the log names as its window's effective one.
    named = {f"window={e.window_id}/attempt={e.attempt}/" for e in log.committed()}
    data = [k for k in keys if "/_cdc_log/" not in k]
    assert data and all(k.endswith(".parquet") for k in data), data
    assert all(any(n in k for n in named) for k in data), data

    # The product's reader (s3:// and s3a:// name the same place) equals the source.
    events = read_topic_arrow(s3_prefix, "t", TOPIC).to_pylist()
    assert events == read_topic_arrow("s3a" + s3_prefix[2:], "t", TOPIC).to_pylist()
    assert len(events) == 60 + 16
    with db.connect() as conn:
        assert_same_state(replay(events, ["id"]), source_rows(conn, "public.t", ["id"]))
    transactions = read_topic_arrow(s3_prefix, "t", "t.transaction")
    assert transactions is not None and transactions.num_rows == 4  # BEGIN + END of each, once

    # Third-party readers, from the store: Polars with its own S3 client, DuckDB over Arrow's.
    import duckdb
    import polars as pl
    import pyarrow.dataset as ds

    paths = committed_paths(s3_prefix, "t", TOPIC)
    frame = pl.concat(
        [pl.read_parquet(f"{p}/*.parquet", storage_options=_polars_options(s3_server)) for p in paths],
        how="diagonal_relaxed",
    )
    assert sorted(frame["op"].to_list()) == sorted(e["op"] for e in events)
    filesystem, _ = object_store.filesystem(s3_prefix)
    duck = duckdb.connect()
    duck.register("stream", ds.dataset(_bucket_path(paths[-1]), filesystem=filesystem, format="parquet"))
    assert duck.sql("SELECT op, count(*) FROM stream GROUP BY op ORDER BY op").fetchall() == [
        ("c", 1),
        ("d", 5),
        ("u", 10),
    ]

    # Lineage reads the landed schema from the store.
    from airflow_provider_cdc.utils.lineage import _parquet_schema

    schema = _parquet_schema(storage.uri(rerun.dataset(TOPIC).path))
    assert schema is not None and "op" in schema.names and "after" in schema.names


def _bucket_path(uri: str) -> str:
    bucket, key = object_store.split_bucket(uri)
    return f"{bucket}/{key}"


def test_commit_log_publish_is_create_only(s3_server, s3_prefix):
    storage = storage_for(s3_prefix)
    assert isinstance(storage, ObjectStoreStorage)
    rel = "_cdc_log/t/00000000000000000001.json"
    storage.publish_text(rel, json.dumps({"first": True}))
    with pytest.raises(FileExistsError):
        storage.publish_text(rel, json.dumps({"second": True}))
    assert json.loads(storage.read_text(rel)) == {"first": True}
    body = s3_server.client().get_object(Bucket=BUCKET, Key=f"{_key(s3_prefix)}/{rel}")["Body"].read()
    assert json.loads(body) == {"first": True}
    # No temporary objects beside the entry, and nothing else was written.
    assert s3_server.keys(BUCKET, _key(s3_prefix) + "/") == [f"{_key(s3_prefix)}/{rel}"]
    assert storage.list_names("_cdc_log/t") == ["00000000000000000001.json"]
    assert re.fullmatch(r"s3://lake/.+/_cdc_log/t/0+1\.json", storage.dataset_uri(rel))


@pytest.fixture
def sqlserver_conn(request, pg15, airflow_db, spark, monkeypatch):
    """A SQL Server stand-in and its Airflow connection id (as tests/integration/sqlserver's)."""
    recorder = StatementRecorder()
    for standin in standin_for(request, pg15, recorder):
        conn_id = f"mssql_{standin.database}"
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", airflow_connection(standin))
        monkeypatch.setenv(*DRIVER_IN_EXTRA_ALLOWED)
        yield standin, conn_id
    assert recorder.invalid() == []


def test_sqlserver_snapshot_lands_on_s3(sqlserver_conn, s3_server, s3_prefix):
    """Every source shares the writer and the snapshot tasks: one SQL Server (stand-in) window."""
    from airflow_provider_cdc.cdc.basics.tables import TableRef
    from airflow_provider_cdc.cdc.planning.spec import CaptureOptions, SparkOptions
    from airflow_provider_cdc.cdc.sources.sqlserver.spec import SqlServerJobSpec
    from airflow_provider_cdc.hooks.sqlserver_cdc import SqlServerCdcHook

    standin, conn_id = sqlserver_conn
    workload.create(standin)
    standin.wait_until_captured()
    spec = SqlServerJobSpec(
        topic_prefix="shop",
        connection=SqlServerCdcHook(conn_id).connection_info,
        tables=tuple(TableRef.parse(t) for t in workload.TABLES),
        window=snapshot_window(1),
        sink_path=s3_prefix,
        options=CaptureOptions(object_store=s3_server.access()),
        spark=SparkOptions(master="local[2]"),
    )
    entry = run_window_job(spec)
    assert {d.topic: d.ops for d in entry.datasets} == {"shop.dbo.customers": {"r": 10}, "shop.dbo.orders": {"r": 20}}
    for table, keys in workload.KEYS.items():
        events = read_topic_arrow(s3_prefix, "shop", f"shop.{table}").to_pylist()
        assert_same_state(replay(events, keys), workload.source_rows(standin, table))
    data = [k for k in s3_server.keys(BUCKET, _key(s3_prefix) + "/") if "/_cdc_log/" not in k]
    assert data and all(f"attempt={entry.attempt}/" in k and k.endswith(".parquet") for k in data), data


def test_task_file_on_s3_is_whole_or_absent(s3_server, s3_prefix):
    """A snapshot task's file: a failed write leaves no object; a retry replaces the file whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_cdc.cdc.sinks.parquet import write_parquet_file

    uri = f"{s3_prefix}/t.public.t/window=0000000001/attempt=0123456789abcdef/part-00000.parquet"

    def failing():
        yield pa.record_batch({"id": list(range(10))})
        raise RuntimeError("the source went away")

    with pytest.raises(RuntimeError, match="went away"):
        write_parquet_file(uri, failing(), row_group_rows=4)
    assert s3_server.keys(BUCKET, _key(s3_prefix) + "/") == []
    for rows in (10, 3):  # the task, then its retry
        assert write_parquet_file(uri, iter([pa.record_batch({"id": list(range(rows))})]), row_group_rows=4) == rows
    assert s3_server.keys(BUCKET, _key(s3_prefix) + "/") == [_key(uri)]
    filesystem, path = object_store.filesystem(uri)
    assert pq.read_table(path, filesystem=filesystem).column("id").to_pylist() == [0, 1, 2]
