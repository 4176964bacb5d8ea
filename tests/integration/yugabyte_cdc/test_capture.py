"""The CDC-service capture end to end on the stand-in: the shared operators under ``dag.test()``.

Setup's preflight (bad streams and schedules refused, nothing written), stream windows from the
tablets' latest ops (``snapshot_mode='never'``), the checkpoints stored on the server only after
the offset, and the current state equal to the source's tables.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_provider_cdc.captures.yugabyte_cdc_service import YugabyteCdcServiceCapture
from airflow_provider_cdc.operators.setup import CdcSetupOperator
from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator
from airflow_provider_cdc.operators.window import CdcWindowOperator
from tests.support import airflow as af
from tests.support.oracle import assert_same_state, events_of, replay, source_rows
from tests.support.yugabyte_cdc import YugabyteCdcStandIn, airflow_connection, standin_for

pytestmark = [pytest.mark.airflow, pytest.mark.pg]

PREFIX = "ybs"


@pytest.fixture(scope="module")
def yb(request, clusters) -> Iterator[YugabyteCdcStandIn]:
    yield from standin_for(request, clusters["pg15"], rpc_heartbeat_interval=0.3)


@pytest.fixture
def conn_id(yb, airflow_db, monkeypatch) -> str:
    conn_id = f"ybc_{yb.database}"
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        airflow_connection(yb),
    )
    return conn_id


def make_capture(conn_id: str, stream: str, sink, tables, **overrides) -> YugabyteCdcServiceCapture:
    from airflow_provider_cdc.offsets.variable import VariableOffsetStore

    overrides.setdefault("offset_store", VariableOffsetStore(key_prefix=f"cdc_offset_{conn_id}_{stream[:6]}__"))
    return YugabyteCdcServiceCapture(
        yugabytedb_conn_id=conn_id,
        stream_id=stream,
        topic_prefix=PREFIX,
        sink_path=str(sink),
        tables=list(tables),
        **{"spark_master": "local[2]", "idle_timeout_seconds": 30.0, **overrides},
    )


def capture_dag(dag_id: str, capture, errors: dict, *, schedule: str = "@hourly", snapshot: bool = True):
    from airflow.sdk import DAG

    with DAG(
        dag_id,
        schedule=schedule,
        start_date=af.START,
        catchup=False,
        max_active_runs=1,
        default_args={"on_failure_callback": af.failure_recorder(errors)},
    ) as dag:
        setup = CdcSetupOperator(task_id="setup", capture=capture)
        window = CdcWindowOperator(task_id="window", capture=capture)
        if snapshot:
            setup >> CdcSnapshotOperator(task_id="snapshot", capture=capture) >> window
        else:
            setup >> window
    af.register(dag)
    return dag


def stored_offset(capture):
    """The offset the run stored (read from the metadata DB: the test is not a task)."""
    from airflow.models.variable import Variable

    text = Variable.get(capture.store().key(capture.topic_prefix), default_var=None)
    return None if text is None else capture.OFFSET_TYPE.from_json(text)


def test_stream_windows_from_the_latest_ops_reproduce_the_table(yb, conn_id, tmp_path):
    with yb.connect() as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance numeric(12,2))")
        conn.execute("INSERT INTO accounts SELECT g, 'o' || g, g * 1.5 FROM generate_series(1, 30) g")
    yb.wait_caught_up()
    stream = yb.create_stream("FULL_ROW_NEW_IMAGE", "EXPLICIT", tables=["accounts"])
    capture = make_capture(conn_id, stream, tmp_path, ["public.accounts"], snapshot_mode="never")
    errors: dict = {}
    dag = capture_dag(f"ybc_never_{yb.database}", capture, errors, snapshot=False)

    first = af.run(dag, 0, errors=errors)
    assert first.state == "success", errors
    assert first.xcom["setup"]["stream"]["checkpoint_type"] == "EXPLICIT"
    offset = stored_offset(capture)
    assert offset.stream_id == stream and len(offset.tablets) == 3
    for tablet_id, state in offset.tablets.items():  # stored on the server after the offset
        checkpoint = state.position.checkpoint
        assert yb.state(stream, tablet_id)["checkpoint"][:2] == [checkpoint.term, checkpoint.index]

    with yb.connect() as conn:
        conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id <= 10")
        conn.execute("DELETE FROM accounts WHERE id > 25")
        with conn.transaction():
            conn.execute("INSERT INTO accounts VALUES (100, 'new', 0), (101, 'new', 1), (102, 'new', 2)")
            conn.execute("UPDATE accounts SET owner = 'moved' WHERE id = 11")
    yb.wait_caught_up()
    second = af.run(dag, 1, errors=errors)
    assert second.state == "success", errors
    window = second.xcom["window"]
    assert window["events"] == {f"{PREFIX}.public.accounts": {"u": 11, "d": 5, "c": 3}}
    assert window["from_lsn"] == first.xcom["window"]["to_lsn"]
    after = stored_offset(capture)
    assert after.lsn is not None and str(after.lsn) == window["to_lsn"]
    assert after.tablets != offset.tablets
    for tablet_id, state in after.tablets.items():
        checkpoint = state.position.checkpoint
        assert yb.state(stream, tablet_id)["checkpoint"][:2] == [checkpoint.term, checkpoint.index]

    # every key the windows touched is as in the table (full new images: the events carry whole rows)
    events = events_of(tmp_path, PREFIX, "accounts")
    touched = {(e["after"] or e["before"])["id"] for e in events}
    with yb.connect() as conn:
        expected = {k: v for k, v in source_rows(conn, "public.accounts", ["id"]).items() if k[0] in touched}
    assert_same_state(replay(events, ["id"]), expected)


def test_setup_refuses_bad_streams_and_schedules_and_writes_nothing(yb, conn_id, tmp_path):
    from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError

    with yb.connect() as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, v text)")
    yb.wait_caught_up()
    good = yb.create_stream("CHANGE", "EXPLICIT", tables=["items"])
    cases = {
        "unknown": ("0" * 32, ["public.items"], {}, "know no CDC stream"),
        "foreign": (yb.create_stream(database="postgres"), ["public.items"], {}, "belongs to another database"),
        "implicit": (yb.create_stream("CHANGE", "IMPLICIT", tables=["items"]), ["public.items"], {}, "IMPLICIT"),
        "missing_table": (good, ["public.items", "public.notes"], {}, '"public"."notes" are not in CDC stream'),
        "retention": (good, ["public.items"], {"schedule": "@daily"}, "expires changes not read for 8.00 h"),
    }
    for name, (stream, tables, dag_kwargs, message) in cases.items():
        sink = tmp_path / name
        capture = make_capture(conn_id, stream, sink, tables, snapshot_mode="never")
        errors: dict = {}
        dag = capture_dag(f"ybc_bad_{name}_{yb.database}", capture, errors, snapshot=False, **dag_kwargs)
        result = af.run(dag, 0, errors=errors)
        assert result.tasks["setup"] == "failed", name
        assert message in str(errors["setup"]), (name, errors["setup"])
        assert result.tasks["window"] != "success"
        assert stored_offset(capture) is None, name
        assert not sink.exists() or not any(sink.rglob("*.parquet")), name
    with pytest.raises(CdcConfigurationError, match="stream_id must be a DB stream id"):
        make_capture(conn_id, "not-a-stream", tmp_path, ["public.items"])


def set_last_read(capture, ms_ago: int) -> None:
    """Move the offset's record of the last read into the past (as if runs had stopped)."""
    import time

    from airflow.models.variable import Variable

    offset = stored_offset(capture)
    state = dict(offset.extra["source_state"])
    state["last_read_ms"] = int(time.time() * 1000) - ms_ago
    from dataclasses import replace

    moved = replace(offset, extra={**offset.extra, "source_state": state})
    Variable.set(capture.store().key(capture.topic_prefix), moved.to_json())


def test_expiry_is_reported_before_and_refused_after(yb, conn_id, tmp_path):
    from airflow.sdk import DAG

    from airflow_provider_cdc.operators.yugabyte_health import YugabyteCdcStreamHealthOperator

    with yb.connect() as conn:
        conn.execute("CREATE TABLE ledger (id int PRIMARY KEY, v text)")
    yb.wait_caught_up()
    stream = yb.create_stream("CHANGE", "EXPLICIT", tables=["ledger"])
    capture = make_capture(conn_id, stream, tmp_path, ["public.ledger"], snapshot_mode="never")
    errors: dict = {}
    dag = capture_dag(f"ybc_expiry_{yb.database}", capture, errors, snapshot=False)
    with DAG(f"ybc_health_{yb.database}", schedule=None, start_date=af.START, catchup=False) as health:
        YugabyteCdcStreamHealthOperator(
            task_id="health",
            capture=capture,
            on_failure_callback=af.failure_recorder(errors),
        )
    af.register(health)

    assert af.run(dag, 0, errors=errors).state == "success", errors
    ok = af.run(health, 0, errors=errors)
    assert ok.state == "success", errors
    report = ok.xcom["health"]
    assert report["healthy"] and report["stream"]["checkpoint_type"] == "EXPLICIT"
    assert 7.9 * 3_600_000 < report["ms_to_expiry"] <= 8 * 3_600_000

    set_last_read(capture, 5 * 3_600_000)  # past half the retention: a warning before it is too late
    assert af.run(health, 1, errors=errors).state == "failed"
    assert "of the intent retention: it expires in 3.00 h" in str(errors["health"])

    # the cluster expired the stream: the health check and the next window say so, nothing is read
    yb.age(stream, 9 * 3_600_000)
    set_last_read(capture, 9 * 3_600_000)
    before = stored_offset(capture)
    assert af.run(health, 2, errors=errors).state == "failed"
    assert "YugabyteDB has expired it" in str(errors["health"])
    errors.clear()
    result = af.run(dag, 1, errors=errors)
    assert result.tasks["window"] == "failed"
    assert "expired" in str(errors["window"]) and "snapshot_mode='when_needed'" in str(errors["window"])
    assert stored_offset(capture) == before


def test_an_expired_stream_is_replaced_and_re_snapshotted_with_the_gap_recorded(yb, conn_id, tmp_path, spark):
    with yb.connect() as conn:
        conn.execute("CREATE TABLE stock (id int PRIMARY KEY, qty int)")
        conn.execute("INSERT INTO stock SELECT g, g FROM generate_series(1, 12) g")
    yb.wait_caught_up()
    first_stream = yb.create_stream("ALL", "EXPLICIT", tables=["stock"])
    capture = make_capture(conn_id, first_stream, tmp_path, ["public.stock"], snapshot_mode="when_needed")
    errors: dict = {}
    dag = capture_dag(f"ybc_replace_{yb.database}", capture, errors)
    first = af.run(dag, 0, errors=errors)
    assert first.state == "success", errors
    assert first.xcom["snapshot"]["events"] == {f"{PREFIX}.public.stock": {"r": 12}}

    # the same stream cannot give its snapshot again
    again = make_capture(conn_id, first_stream, tmp_path, ["public.stock"], snapshot_mode="always")
    errors.clear()
    refused = af.run(capture_dag(f"ybc_again_{yb.database}", again, errors), 1, errors=errors)
    assert refused.tasks["snapshot"] == "failed"
    assert "delivers its consistent snapshot once" in str(errors["snapshot"])

    # runs stopped; the stream expired; changes made meanwhile are lost with it
    with yb.connect() as conn:
        conn.execute("UPDATE stock SET qty = qty + 100 WHERE id <= 3")
    yb.wait_caught_up()
    yb.age(first_stream, 9 * 3_600_000)
    set_last_read(capture, 9 * 3_600_000)
    errors.clear()
    stopped = af.run(dag, 2, errors=errors)  # when_needed: a re-snapshot is due, and needs a new stream
    assert stopped.tasks["snapshot"] == "failed" and stopped.tasks["window"] == "upstream_failed"
    assert "YugabyteDB has expired it" in str(errors["snapshot"]) and "Create a new stream" in str(errors["snapshot"])

    # a new stream: when_needed re-snapshots from it and records the gap; windows continue from it
    second_stream = yb.create_stream("ALL", "EXPLICIT", tables=["stock"])
    replaced = make_capture(conn_id, second_stream, tmp_path, ["public.stock"], snapshot_mode="when_needed")
    replaced.offset_store = capture.offset_store
    with yb.connect() as conn:
        conn.execute("DELETE FROM stock WHERE id = 12")
    yb.wait_caught_up()
    errors.clear()
    resumed = af.run(capture_dag(f"ybc_replaced_{yb.database}", replaced, errors), 3, errors=errors)
    assert resumed.state == "success", errors
    assert resumed.xcom["snapshot"]["events"] == {f"{PREFIX}.public.stock": {"r": 12}}
    gaps = events_of(tmp_path, PREFIX, "capture_gap")
    assert [g["reason"] for g in gaps] == ["stream_replaced"]
    assert stored_offset(replaced).stream_id == second_stream
    with yb.connect() as conn:
        assert_same_state(
            replay(events_of(tmp_path, PREFIX, "public.stock"), ["id"]), source_rows(conn, "public.stock", ["id"])
        )


def test_ddl_records_evolve_the_schema_between_and_inside_windows(yb, conn_id, tmp_path):
    with yb.connect() as conn:
        conn.execute("CREATE TABLE people (id int PRIMARY KEY, name text)")
    yb.wait_caught_up()
    stream = yb.create_stream("ALL", "EXPLICIT", tables=["people"])
    capture = make_capture(conn_id, stream, tmp_path, ["public.people"], snapshot_mode="never")
    errors: dict = {}
    dag = capture_dag(f"ybc_ddl_{yb.database}", capture, errors, snapshot=False)
    assert af.run(dag, 0, errors=errors).state == "success", errors

    # inside one window: rows before the change, the change, rows after it
    with yb.connect() as conn:
        conn.execute("INSERT INTO people VALUES (1, 'ann'), (2, 'bob'), (3, 'cy')")
        conn.execute("ALTER TABLE people ADD COLUMN email text")
        conn.execute("INSERT INTO people VALUES (4, 'dee', 'dee@example.com')")
        conn.execute("UPDATE people SET email = 'ann@example.com' WHERE id = 1")
    yb.wait_caught_up()
    assert af.run(dag, 1, errors=errors).state == "success", errors
    # between windows: another column, then changes that use it
    with yb.connect() as conn:
        conn.execute("ALTER TABLE people ADD COLUMN age int")
        conn.execute("UPDATE people SET age = 40, name = 'bobby' WHERE id = 2")
        conn.execute("DELETE FROM people WHERE id = 3")
    yb.wait_caught_up()
    assert af.run(dag, 2, errors=errors).state == "success", errors

    events = events_of(tmp_path, PREFIX, "public.people")
    by_key = {}
    for event in events:
        by_key.setdefault((event["after"] or event["before"])["id"], []).append(event)
    first_insert = by_key[1][0]["after"]
    assert first_insert.get("email") is None and first_insert["name"] == "ann"
    assert by_key[4][0]["after"]["email"] == "dee@example.com"
    assert by_key[1][-1]["after"]["email"] == "ann@example.com"
    assert by_key[2][-1]["after"]["age"] == 40 and by_key[2][-1]["before"]["name"] == "bob"
    assert by_key[3][-1]["op"] == "d"
    with yb.connect() as conn:
        assert_same_state(replay(events, ["id"]), source_rows(conn, "public.people", ["id"]))
