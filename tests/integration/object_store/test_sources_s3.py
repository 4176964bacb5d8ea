"""The two YugabyteDB sources land on S3 (the suite's SeaweedFS) like PostgreSQL's: their windows
under ``dag.test()`` with the sink under ``s3_prefix`` and the store's access from an ``aws``
connection (``object_store_conn_id``), read back from the store with the product's reader and Polars."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.cdc.sinks import object_store
from airflow_provider_cdc.cdc.sinks.reader import committed_paths, read_topic_arrow
from tests.support import airflow as af
from tests.support.oracle import assert_same_state, replay, source_rows
from tests.support.s3_server import ADMIN, BUCKET, REGION

pytestmark = [pytest.mark.airflow, pytest.mark.pg]


@pytest.fixture
def aws_conn(s3_aws_connection) -> str:
    """The store as an Airflow ``aws`` connection; only it gives access (not s3_prefix's)."""
    return s3_aws_connection


def _polars_ops(s3_server, sink: str, prefix: str, topic: str) -> list[str]:
    import polars as pl

    options = {
        "aws_endpoint_url": s3_server.endpoint_url,
        "aws_region": REGION,
        "aws_access_key_id": ADMIN[0],
        "aws_secret_access_key": ADMIN[1],
        "aws_allow_http": "true",
        "aws_virtual_hosted_style_request": "false",
    }
    paths = committed_paths(sink, prefix, topic)
    assert paths and all(p.startswith("s3://") for p in paths), paths
    frame = pl.concat(
        [pl.read_parquet(f"{p}/*.parquet", storage_options=options) for p in paths], how="diagonal_relaxed"
    )
    return sorted(frame["op"].to_list())


def _data_keys(s3_server, sink: str) -> list[str]:
    _, root = object_store.split_bucket(sink)
    return [k for k in s3_server.keys(BUCKET, root + "/") if "/_cdc_log/" not in k]


@pytest.fixture
def yugabyte_conn(request, pg15, airflow_db, monkeypatch):
    """A YugabyteDB (logical replication) stand-in and its Airflow connection id."""
    from tests.support.yugabyte.fixtures import airflow_connection, standin_for

    for standin in standin_for(request, pg15, active_window_ms=1000):
        conn_id = f"yb_{standin.database}"
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", airflow_connection(standin))
        yield standin, conn_id


def test_yugabyte_logical_replication_lands_on_s3(yugabyte_conn, s3_server, s3_prefix, aws_conn):
    """A stream window from the slot's start (no snapshot: Spark's tasks on S3 are
    test_parquet_sink's), on S3."""
    from tests.integration.yugabyte.test_capture import capture_dag, make_capture

    standin, conn_id = yugabyte_conn
    with standin.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 8) g")
    capture = make_capture(
        conn_id, s3_prefix, standin.database, tables=["public.t"], snapshot_mode="never", object_store_conn_id=aws_conn
    )
    errors: dict = {}
    dag = capture_dag(f"yb_s3_{standin.database}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors  # setup creates the slot
    with standin.connect() as conn:
        conn.execute("UPDATE t SET v = 'changed' WHERE id <= 3")
        with conn.transaction():
            conn.execute("DELETE FROM t WHERE id > 6")
            conn.execute("INSERT INTO t VALUES (100, 'new')")
    second = af.run(dag, 1, errors=errors)
    assert second.state == "success", errors
    topic = "shop.public.t"
    assert second.xcom["window"]["events"] == {topic: {"u": 3, "d": 2, "c": 1}}

    with object_store.using(capture.object_store_access()):
        events = read_topic_arrow(s3_prefix, "shop", topic).to_pylist()
        assert sorted(e["op"] for e in events) == ["c", "d", "d", "u", "u", "u"]
        _assert_touched_rows_equal_source(events, standin, "public.t")
        assert _polars_ops(s3_server, s3_prefix, "shop", topic) == sorted(e["op"] for e in events)
        transactions = read_topic_arrow(s3_prefix, "shop", "shop.transaction")
        assert transactions is not None and transactions.num_rows == 2 * 2  # BEGIN + END of each
    data = _data_keys(s3_server, s3_prefix)
    assert data and all(k.endswith(".parquet") for k in data), data


def _assert_touched_rows_equal_source(events: list[dict], source, table: str) -> None:
    """The events replayed equal the source's rows for every key they touch (the windows start
    after the rows were inserted; updates here change every non-key column: whole rows)."""
    touched = {(e["after"] or e["before"])["id"] for e in events}
    with source.connect() as conn:
        expected = {k: v for k, v in source_rows(conn, table, ["id"]).items() if k[0] in touched}
    assert_same_state(replay(events, ["id"]), expected)


@pytest.fixture
def yb_cdc_conn(request, pg15, airflow_db, monkeypatch):
    """A YugabyteDB CDC-service stand-in and its Airflow connection id."""
    from tests.support.yugabyte_cdc import airflow_connection, standin_for

    for yb in standin_for(request, pg15, rpc_heartbeat_interval=0.3):
        conn_id = f"ybc_{yb.database}"
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", airflow_connection(yb))
        yield yb, conn_id


def test_yugabyte_cdc_service_lands_on_s3(yb_cdc_conn, s3_server, s3_prefix, aws_conn):
    """Stream windows from the tablets' latest ops (no Spark), on S3."""
    from tests.integration.yugabyte_cdc.test_capture import PREFIX, capture_dag, make_capture

    yb, conn_id = yb_cdc_conn
    with yb.connect() as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance numeric(12,2))")
        conn.execute("INSERT INTO accounts SELECT g, 'o' || g, g * 1.5 FROM generate_series(1, 10) g")
    yb.wait_caught_up()
    stream = yb.create_stream("FULL_ROW_NEW_IMAGE", "EXPLICIT", tables=["accounts"])
    capture = make_capture(
        conn_id, stream, s3_prefix, ["public.accounts"], snapshot_mode="never", object_store_conn_id=aws_conn
    )
    errors: dict = {}
    dag = capture_dag(f"ybc_s3_{yb.database}", capture, errors, snapshot=False)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    with yb.connect() as conn:
        conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id <= 3")
        conn.execute("DELETE FROM accounts WHERE id > 8")
        with conn.transaction():
            conn.execute("INSERT INTO accounts VALUES (100, 'new', 0), (101, 'new', 1)")
    yb.wait_caught_up()
    second = af.run(dag, 1, errors=errors)
    assert second.state == "success", errors
    topic = f"{PREFIX}.public.accounts"
    assert second.xcom["window"]["events"] == {topic: {"u": 3, "d": 2, "c": 2}}

    with object_store.using(capture.object_store_access()):
        events = read_topic_arrow(s3_prefix, PREFIX, topic).to_pylist()
        assert sorted(e["op"] for e in events) == ["c", "c", "d", "d", "u", "u", "u"]
        _assert_touched_rows_equal_source(events, yb, "public.accounts")  # full new images: whole rows
        assert _polars_ops(s3_server, s3_prefix, PREFIX, topic) == sorted(e["op"] for e in events)
    data = _data_keys(s3_server, s3_prefix)
    assert data and all(k.endswith(".parquet") for k in data), data


def test_no_store_access_is_left_active_after_the_sources():
    """Last in the file: the tests above leave no access active for the tests after them."""
    assert object_store.current() is None
