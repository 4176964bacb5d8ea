"""Slot and WAL health: WAL loss reproduced with a small ``max_slot_wal_keep_size``, the health
check that alerts before it, the gap record of a ``when_needed`` re-snapshot, retained WAL under
unrelated load (heartbeats), and the guarded teardown. Real PostgreSQL, Spark and Airflow."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
import time

import psycopg
import pytest

from airflow_provider_cdc.cdc.sinks.reader import committed_windows, read_topic_arrow
from airflow_provider_cdc.operators.slot_maintenance import PostgresCdcSlotHealthOperator, PostgresCdcTeardownOperator
from airflow_provider_cdc.testing import shop
from airflow_provider_cdc.testing.postgres_cluster import PostgresCluster, available_flavours, scratch_dir
from airflow_provider_cdc.triggers.postgres_cdc import PostgresCdcSlotHealthTrigger
from tests.integration.test_operators import _shop, assert_reproduces_source, capture_dag, make_capture
from tests.support import airflow as af
from tests.support.databases import CaptureDatabase

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

KEEP_MB = 32  # two WAL segments: losing the slot takes three pg_switch_wal() calls


@pytest.fixture(scope="module")
def small_wal_cluster():
    """PostgreSQL 15 that invalidates slots retaining more than 32 MB of WAL."""
    cluster = PostgresCluster(available_flavours()["pg15"], scratch_dir("cdc-test-smallwal-")).start(
        {
            "max_slot_wal_keep_size": f"{KEEP_MB}MB",
            "wal_keep_size": "0",
            "max_wal_size": "1GB",  # no checkpoint unless the test asks for one
            "checkpoint_timeout": "1d",
        }
    )
    yield cluster
    cluster.stop()


@pytest.fixture
def small_wal_db(request, small_wal_cluster, airflow_db, spark, monkeypatch):
    database = CaptureDatabase.create(small_wal_cluster, f"t_{request.node.name[:40].lower()}")
    try:
        yield _shop(database, monkeypatch)
    finally:
        database.drop()


def _burn_wal(db, segments: int) -> None:
    """Write WAL past ``segments`` segment switches (other tables, like a busy neighbour)."""
    with db.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS ballast (v text)")
        for _ in range(segments):
            conn.execute("INSERT INTO ballast SELECT repeat('x', 100) FROM generate_series(1, 100)")
            conn.execute("SELECT pg_switch_wal()")


def _fill_wal(db, nbytes: int) -> None:
    """Write at least ``nbytes`` of WAL without switching segments."""
    with db.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS ballast (v text)")
        start = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        while conn.execute("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn", (start,)).fetchone()[0] < nbytes:
            conn.execute("INSERT INTO ballast SELECT repeat('x', 200) FROM generate_series(1, 5000)")


def health_dag(dag_id: str, capture, errors: dict, **kwargs):
    from airflow.sdk import DAG

    with DAG(
        dag_id,
        schedule="@hourly",
        start_date=af.START,
        catchup=False,
        default_args={"on_failure_callback": af.failure_recorder(errors)},
    ) as dag:
        PostgresCdcSlotHealthOperator(task_id="health", capture=capture, poll_interval=0.5, **kwargs)
    af.register(dag)
    return dag


def test_wal_loss_is_alerted_before_and_recovered_with_a_recorded_gap(small_wal_db, tmp_path):
    db, conn_id = small_wal_db
    errors: dict = {}
    capture = make_capture(db, conn_id, tmp_path, snapshot_mode="when_needed")
    dag = capture_dag(f"gap_{db.name}", capture, errors)
    check = health_dag(f"health_{db.name}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    healthy = af.run(check, 0, errors=errors)
    assert healthy.state == "success", errors
    metrics = healthy.xcom["health"]["metrics"]
    assert metrics["max_slot_wal_keep_size"] == KEEP_MB * 1024 * 1024 and metrics["wal_status"] == "reserved"
    before = {e.window.seq for e in committed_windows(str(tmp_path), "shop")}
    offset_lsn = committed_windows(str(tmp_path), "shop")[-1].window.to_lsn

    with db.connect() as conn:
        shop.mutate(conn, round_no=1)  # changes the slot is about to lose
    _burn_wal(db, 3)
    # Past the keep size but not yet removed: the check fails while the capture could still run.
    alert = af.run(check, 1, errors=errors)
    assert alert.tasks["health"] == "failed"
    assert "wal_status 'unreserved'" in alert.error("health") and "Run the capture now" in alert.error("health")

    db.execute("CHECKPOINT")  # the server removes the WAL and invalidates the slot
    assert db.slot_status().wal_status == "lost"
    lost = af.run(check, 2, errors=errors)
    assert "wal_status 'lost'" in lost.error("health")

    # The initial-mode view of the same capture refuses to continue and writes nothing.
    strict = capture_dag(f"strict_{db.name}", make_capture(db, conn_id, tmp_path, snapshot_mode="initial"), errors)
    refused = af.run(strict, 3, errors=errors)
    assert refused.tasks["window"] == "failed" and "wal_status 'lost'" in refused.error("window")
    assert {e.window.seq for e in committed_windows(str(tmp_path), "shop")} == before

    # when_needed: re-snapshot, with the gap recorded next to the rows that restart history.
    result = af.run(dag, 4, errors=errors)
    assert result.tasks == {"setup": "success", "snapshot": "success", "window": "success"}, errors
    gap = result.xcom["snapshot"]["gap"]
    assert gap["reason"] == "wal_lost" and gap["last_lsn"] == str(offset_lsn) and gap["wal_status"] == "lost"
    rows = read_topic_arrow(str(tmp_path), "shop", "shop.capture_gap").to_pylist()
    assert len(rows) == 1 and rows[0]["reason"] == "wal_lost"
    assert rows[0]["window_id"] == result.xcom["snapshot"]["window_id"]
    assert rows[0]["last_window_id"] == f"{max(before):010d}"
    assert_reproduces_source(db, tmp_path)
    assert db.slot_status().wal_status == "reserved"
    assert af.run(check, 5, errors=errors).state == "success", errors

    with db.connect() as conn:
        shop.mutate(conn, round_no=2)
    result = af.run(dag, 5, errors=errors)
    assert result.tasks["snapshot"] == "skipped" and result.xcom["window"]["gap"] is None
    assert_reproduces_source(db, tmp_path)
    assert len(read_topic_arrow(str(tmp_path), "shop", "shop.capture_gap")) == 1  # one gap, recorded once


def test_health_thresholds_and_the_deferred_watch(small_wal_db, tmp_path):
    db, conn_id = small_wal_db
    db.setup_capture(list(shop.TABLES))
    errors: dict = {}
    capture = make_capture(db, conn_id, tmp_path)
    # Deferred: the watch runs in a trigger (dag.test runs it in-process) and reports at its end.
    started = time.monotonic()
    deferred = health_dag(f"defer_{db.name}", capture, errors, deferrable=True, watch_seconds=2)
    watched = af.run(deferred, 0, errors=errors)
    assert watched.state == "success", errors
    assert watched.xcom["health"]["healthy"] and time.monotonic() - started >= 2
    _fill_wal(db, 12 * 1024 * 1024)  # over a quarter of the keep size retained
    fraction = af.run(health_dag(f"frac_{db.name}", capture, errors, max_retained_fraction=0.25), 0, errors=errors)
    assert "of max_slot_wal_keep_size" in fraction.error("health") and "Run the capture more often" in fraction.error(
        "health"
    )
    lag = af.run(health_dag(f"lag_{db.name}", capture, errors, max_lag_bytes=1024), 0, errors=errors)
    assert "bytes behind the server (limit 1024)" in lag.error("health")
    missing = dataclasses.replace(capture, slot_name="no_such_slot")
    gone = af.run(health_dag(f"gone_{db.name}", missing, errors), 0, errors=errors)
    assert "'no_such_slot' does not exist" in gone.error("health")

    async def first_event(trigger):
        async for event in trigger.run():
            return event.payload

    thresholds = {"max_retained_fraction": 0.8, "max_retained_bytes": None, "max_lag_bytes": None}
    trigger = PostgresCdcSlotHealthTrigger(conn_id, db.slot, thresholds, poll_interval=0.2, watch_seconds=1.0)
    path, kwargs = trigger.serialize()
    assert path.endswith("PostgresCdcSlotHealthTrigger") and db.cluster.password not in str(kwargs)
    started = time.monotonic()
    event = asyncio.run(asyncio.wait_for(first_event(PostgresCdcSlotHealthTrigger(**kwargs)), 30))
    assert event["status"] == "healthy" and time.monotonic() - started >= 1.0  # watched, then reported

    def burn_soon():
        time.sleep(1.0)
        _fill_wal(db, 16 * 1024 * 1024)  # with the 12 MB above: past 80% of the keep size

    burner = threading.Thread(target=burn_soon)
    burner.start()
    watch = PostgresCdcSlotHealthTrigger(conn_id, db.slot, thresholds, poll_interval=0.2, watch_seconds=60)
    event = asyncio.run(asyncio.wait_for(first_event(watch), 60))
    burner.join()
    # Past 80% (or, on a slow machine, already past the keep size): an alert either way.
    assert event["status"] == "unhealthy" and "max_slot_wal_keep_size (33554432)" in event["message"]
    assert time.monotonic() - started < 30  # fired when crossed, not at the end of the watch


def test_idle_captured_tables_on_a_busy_server_keep_retained_wal_bounded(shop_db_busy, tmp_path):
    db, conn_id = shop_db_busy
    errors: dict = {}
    capture = make_capture(
        db, conn_id, tmp_path, heartbeat_action_query="SELECT pg_logical_emit_message(true, 'heartbeat', 'tick')"
    )
    dag = capture_dag(f"busy_{db.name}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    samples: list[tuple[float, int]] = []  # (time, WAL insert position) while the neighbours write
    stop = threading.Event()

    def neighbours():
        other = f"{db.name}_other"[:63]
        with psycopg.connect(db.cluster.dsn("postgres"), autocommit=True) as admin_conn:
            admin_conn.execute(f'CREATE DATABASE "{other}"')
        try:
            with db.connect() as here, psycopg.connect(db.cluster.dsn(other), autocommit=True) as there:
                here.execute("CREATE TABLE busy (v text)")  # not captured
                there.execute("CREATE TABLE busy (v text)")
                while not stop.is_set():
                    for conn in (here, there):
                        conn.execute("INSERT INTO busy SELECT repeat('y', 200) FROM generate_series(1, 300)")
                    lsn = here.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0]
                    samples.append((time.monotonic(), int(lsn)))
                    time.sleep(0.05)
        finally:
            with psycopg.connect(db.cluster.dsn("postgres"), autocommit=True) as admin_conn:
                admin_conn.execute(f'DROP DATABASE IF EXISTS "{other}" WITH (FORCE)')

    writer = threading.Thread(target=neighbours)
    writer.start()
    try:
        retained, restart = [], []
        for hour in range(1, 6):
            # Over 30 s from the first run to the last (a run takes ~1.5 s): at least two of the
            # running-xacts records a busy server logs every 15 s, at which restart_lsn moves.
            time.sleep(7)
            result = af.run(dag, hour, errors=errors)
            assert result.state == "success", errors
            status = db.slot_status()
            # Acknowledged to the target even though no captured table changed.
            assert str(status.confirmed_flush_lsn) == result.xcom["window"]["to_lsn"]
            assert result.xcom["window"]["changes"] == 0
            retained.append(status.retained_bytes)
            restart.append(int(status.restart_lsn))
    finally:
        stop.set()
        writer.join()
    generated = samples[-1][1] - samples[0][1]
    # restart_lsn follows the acknowledgements (PostgreSQL moves it at its running-xacts records,
    # logged every 15 s on a busy server), so what the slot pins stays near 15-25 s of WAL
    # instead of growing with every run.
    assert restart[-1] > restart[0]
    recent = next(lsn for t, lsn in samples if t >= samples[-1][0] - 60)
    assert retained[-1] <= samples[-1][1] - recent + 1024 * 1024, (retained, generated)
    assert any(after < before for before, after in itertools.pairwise(retained)), (retained, generated)
    # The heartbeat lands in every window, as a message event.
    messages = read_topic_arrow(str(tmp_path), "shop", "shop.message").to_pylist()
    assert sorted(m["window_id"] for m in messages if m["message"]["prefix"] == "heartbeat") == [
        f"{seq:010d}" for seq in range(2, 8)
    ]


@pytest.fixture
def shop_db_busy(db15, airflow_db, spark, monkeypatch):
    return _shop(db15, monkeypatch)


def test_teardown_is_guarded_and_drops_only_when_confirmed(small_wal_db, tmp_path):
    from airflow.sdk import DAG

    from airflow_provider_cdc.cdc.sources.postgres import admin

    db, conn_id = small_wal_db
    errors: dict = {}
    capture = make_capture(db, conn_id, tmp_path, offset_store="state_table")
    assert af.run(capture_dag(f"td_setup_{db.name}", capture, errors), 0, errors=errors).state == "success"
    sink_files = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    def teardown(name: str, **kwargs):
        with DAG(
            name,
            schedule=None,
            start_date=af.START,
            params={"confirm": ""},
            default_args={"on_failure_callback": af.failure_recorder(errors)},
        ) as dag:
            PostgresCdcTeardownOperator(task_id="teardown", capture=capture, **kwargs)
        af.register(dag)
        return dag

    wrong = af.run(teardown(f"td_wrong_{db.name}", confirm="{{ params.confirm }}"), 0, errors=errors)
    assert "confirm='' does not match its topic_prefix" in wrong.error("teardown")
    assert "Set confirm='shop'" in wrong.error("teardown")
    assert db.slot_status() is not None
    with db.connect() as holder:  # a run in progress holds the capture's lock
        admin.try_capture_lock(holder, "shop")
        busy = af.run(teardown(f"td_busy_{db.name}", confirm="shop"), 0, errors=errors)
        assert f"already running in pid {holder.info.backend_pid}" in busy.error("teardown")
    assert db.slot_status() is not None

    done = af.run(teardown(f"td_ok_{db.name}", confirm="shop"), 0, errors=errors)
    assert done.state == "success", errors
    assert done.xcom["teardown"] == {
        "topic_prefix": "shop",
        "slot_dropped": True,
        "publication_dropped": True,
        "offset_deleted": False,
        "released_wal_bytes": done.xcom["teardown"]["released_wal_bytes"],
    }
    assert db.slot_status() is None
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone()[0] == 0
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == sink_files  # sink untouched
    assert capture.store().load("shop") is not None
    again = af.run(teardown(f"td_again_{db.name}", confirm="shop", delete_offset=True), 0, errors=errors)
    assert again.xcom["teardown"]["slot_dropped"] is False and again.xcom["teardown"]["offset_deleted"] is True
    assert capture.store().load("shop") is None


def test_heartbeat_runs_only_for_a_valid_window_and_a_failing_one_is_clear(shop_db_busy, tmp_path):
    db, conn_id = shop_db_busy
    db.execute("CREATE TABLE beats (n int PRIMARY KEY, at timestamptz)")
    db.execute("INSERT INTO beats VALUES (1, now())")
    errors: dict = {}
    beat = "UPDATE public.beats SET at = clock_timestamp() WHERE n = 1"  # capture sessions search pg_catalog only
    capture = make_capture(db, conn_id, tmp_path, tables=[*shop.TABLES, "public.beats"], heartbeat_action_query=beat)
    dag = capture_dag(f"hb_{db.name}", capture, errors, upto_lsn="{{ params.upto_lsn }}")
    dag.params["upto_lsn"] = ""
    af.register(dag)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    # The heartbeat of this run is in this run's window.
    assert af.run(dag, 1, errors=errors).xcom["window"]["events"] == {"shop.public.beats": {"u": 1}}

    def last_beat():
        with db.connect() as conn:
            return conn.execute("SELECT at FROM beats").fetchone()[0]

    before, windows = last_beat(), len(committed_windows(str(tmp_path), "shop"))
    dag.params["upto_lsn"] = "0/1"  # behind the offset: refused before the heartbeat writes
    af.register(dag)
    assert "behind the committed offset" in af.run(dag, 2, errors=errors).error("window")
    assert last_beat() == before and len(committed_windows(str(tmp_path), "shop")) == windows

    broken = dataclasses.replace(capture, heartbeat_action_query="UPDATE no_such_table SET x = 1")
    dag = capture_dag(f"hb_broken_{db.name}", broken, errors)
    message = af.run(dag, 3, errors=errors).error("window")
    assert "heartbeat_action_query failed" in message and "no_such_table" in message
    assert len(committed_windows(str(tmp_path), "shop")) == windows
