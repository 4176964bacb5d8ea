"""The operators, sensor and trigger under real Airflow (dag.test), real PostgreSQL, real Spark."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os

import pytest

from airflow_provider_cdc.capture import PostgresCapture
from airflow_provider_cdc.cdc.sinks.reader import committed_windows
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.operators.current_state import CdcCurrentStateOperator
from airflow_provider_cdc.operators.setup import CdcSetupOperator
from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator
from airflow_provider_cdc.operators.window import CdcWindowOperator
from airflow_provider_cdc.sensors.cdc import CdcChangesSensor
from airflow_provider_cdc.testing import shop
from airflow_provider_cdc.triggers.postgres_cdc import PostgresCdcChangesTrigger
from tests.support import airflow as af
from tests.support.oracle import assert_same_state, events_of, replay, source_rows

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

KEYS = {"public.customers": ["id"], "public.orders": ["id"], "public.order_items": ["order_id", "line_no"]}


def _shop(db, monkeypatch):
    with db.connect() as conn:
        shop.create_schema(conn)
        shop.seed(conn, customers=12, orders_per_customer=2)
    conn_id = f"src_{db.name}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", db.cluster.airflow_uri(db.name))
    return db, conn_id


@pytest.fixture
def shop_db(db15, airflow_db, spark, monkeypatch):
    """The shop database on PostgreSQL 15."""
    return _shop(db15, monkeypatch)


@pytest.fixture
def shop_db_any(db, airflow_db, spark, monkeypatch):
    """The shop database on PostgreSQL 15 and on 18."""
    return _shop(db, monkeypatch)


def make_capture(db, conn_id, sink, **overrides) -> PostgresCapture:
    from airflow_provider_cdc.offsets.variable import VariableOffsetStore

    # One Variable per test: the metadata DB lives for the whole session.
    overrides.setdefault("offset_store", VariableOffsetStore(key_prefix=f"cdc_offset_{db.name}__"))
    overrides.setdefault("tables", list(shop.TABLES))
    return PostgresCapture(
        postgres_conn_id=conn_id,
        topic_prefix="shop",
        sink_path=str(sink),
        slot_name=db.slot,
        publication_name=db.publication,
        **{"spark_master": "local[2]", **overrides},
    )


def capture_dag(dag_id: str, capture: PostgresCapture, errors: dict, **window_kwargs):
    from airflow.sdk import DAG

    with DAG(
        dag_id,
        schedule="@hourly",
        start_date=af.START,
        catchup=False,
        max_active_runs=1,
        default_args={"on_failure_callback": af.failure_recorder(errors)},
    ) as dag:
        (
            CdcSetupOperator(task_id="setup", capture=capture)
            >> CdcSnapshotOperator(task_id="snapshot", capture=capture)
            >> CdcWindowOperator(task_id="window", capture=capture, **window_kwargs)
        )
    af.register(dag)
    return dag


def assert_reproduces_source(db, sink) -> None:
    with db.connect() as conn:
        for table, keys in KEYS.items():
            assert_same_state(replay(events_of(sink, "shop", table), keys), source_rows(conn, table, keys))


def test_hourly_runs_capture_everything_and_acknowledge_each_target(shop_db_any, tmp_path):
    db, conn_id = shop_db_any
    errors: dict = {}
    dag = capture_dag(f"flow_{db.name}", make_capture(db, conn_id, tmp_path), errors)

    first = af.run(dag, 0, errors=errors)
    assert first.state == "success", errors
    assert first.tasks == {"setup": "success", "snapshot": "success", "window": "success"}
    snapshot, window = first.xcom["snapshot"], first.xcom["window"]
    assert snapshot["kind"] == "snapshot" and snapshot["events"]["shop.public.customers"] == {"r": 12}
    assert window["from_lsn"] == snapshot["to_lsn"]
    assert Lsn(db.slot_status().confirmed_flush_lsn) == Lsn(window["to_lsn"])

    with db.connect() as conn:
        made = shop.mutate(conn, round_no=1)
    second = af.run(dag, 1, errors=errors)
    assert second.tasks == {"setup": "success", "snapshot": "skipped", "window": "success"}, errors
    summary = second.xcom["window"]
    assert summary["transactions"] == made.transactions
    assert summary["from_lsn"] == window["to_lsn"]
    assert db.slot_status().confirmed_flush_lsn == Lsn(summary["to_lsn"])
    assert set(summary) >= {"window_id", "events", "changes", "bytes_behind", "slot_confirmed_lsn", "sink_path"}

    # Nothing captured, but WAL moves on (an uncaptured table): the slot still advances.
    db.execute("CREATE TABLE noise (id int); INSERT INTO noise SELECT generate_series(1, 1000)")
    third = af.run(dag, 2, errors=errors)
    idle = third.xcom["window"]
    assert idle["changes"] == 0 and idle["transactions"] == 0
    assert Lsn(idle["to_lsn"]) > Lsn(summary["to_lsn"])
    assert db.slot_status().confirmed_flush_lsn == Lsn(idle["to_lsn"])

    assert [e.window.kind for e in committed_windows(str(tmp_path), "shop")] == ["snapshot"] + ["stream"] * 3
    assert_reproduces_source(db, tmp_path)
    password = db.cluster.password
    assert password not in json.dumps([first.xcom, second.xcom, third.xcom])


def test_state_table_offset_store(shop_db, tmp_path):
    db, conn_id = shop_db
    errors: dict = {}
    capture = make_capture(db, conn_id, tmp_path, offset_store="state_table", offset_table="cdc_state.offsets")
    db.execute("CREATE SCHEMA cdc_state")
    dag = capture_dag(f"state_{db.name}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    with db.connect() as conn:
        shop.mutate(conn, round_no=1)
    assert af.run(dag, 1, errors=errors).state == "success", errors
    with db.connect() as conn:
        ((revision, document),) = conn.execute("SELECT revision, document FROM cdc_state.offsets").fetchall()
    # snapshot: pending + committed; two windows: pending + committed each
    assert revision == 6
    assert document["window_seq"] == 3 and document["snapshot_completed"] and document["pending"] is None
    assert document["lsn"] == int(db.slot_status().confirmed_flush_lsn)
    assert_reproduces_source(db, tmp_path)


def test_setup_refuses_a_table_without_key_and_creates_nothing(shop_db, tmp_path):
    db, conn_id = shop_db
    db.execute("CREATE TABLE keyless (v text)")
    errors: dict = {}
    capture = make_capture(db, conn_id, tmp_path, tables=[*shop.TABLES, "public.keyless", "public.custmers"])
    result = af.run(capture_dag(f"keyless_{db.name}", capture, errors), 0, errors=errors)
    assert result.tasks["setup"] == "failed" and result.tasks["window"] == "upstream_failed"
    assert 'did you mean "public"."customers"' in result.error("setup")
    capture = make_capture(db, conn_id, tmp_path, tables=[*shop.TABLES, "public.keyless"])
    result = af.run(capture_dag(f"keyless2_{db.name}", capture, errors), 0, errors=errors)
    message = result.error("setup")
    assert "no primary key" in message and "REPLICA IDENTITY FULL" in message
    assert db.slot_status() is None
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone()[0] == 0
    db.execute("ALTER TABLE keyless REPLICA IDENTITY FULL")
    result = af.run(capture_dag(f"keyless3_{db.name}", capture, errors), 0, errors=errors)
    assert result.state == "success", errors


def test_second_concurrent_run_fails_fast(shop_db, tmp_path):
    from airflow_provider_cdc.cdc.sources.postgres import admin

    db, conn_id = shop_db
    errors: dict = {}
    dag = capture_dag(f"lock_{db.name}", make_capture(db, conn_id, tmp_path), errors)
    assert af.run(dag, 0, errors=errors).state == "success"
    with db.connect() as holder:
        admin.try_capture_lock(holder, "shop")
        pid = holder.info.backend_pid
        result = af.run(dag, 1, errors=errors)
    # Every task that reads the offsets takes the capture lock: the snapshot task fails first.
    assert result.tasks["snapshot"] == "failed" and result.tasks["window"] == "upstream_failed"
    assert f"capture 'shop' is already running in pid {pid}" in result.error("snapshot")


def test_upto_lsn_is_templated_and_bounds_the_window(shop_db, tmp_path):
    db, conn_id = shop_db
    errors: dict = {}
    dag = capture_dag(f"upto_{db.name}", make_capture(db, conn_id, tmp_path), errors, upto_lsn="{{ params.upto_lsn }}")
    dag.params["upto_lsn"] = ""
    assert af.run(dag, 0, errors=errors).state == "success", errors
    db.execute("UPDATE customers SET vip = true WHERE id = 1")
    bound = db.current_lsn()
    db.execute("UPDATE customers SET vip = true WHERE id = 2")
    dag.params["upto_lsn"] = str(bound)
    af.register(dag)
    result = af.run(dag, 1, errors=errors)
    assert result.xcom["window"]["to_lsn"] == str(bound) and result.xcom["window"]["changes"] == 1
    dag.params["upto_lsn"] = "0/1"  # behind the offset
    af.register(dag)
    result = af.run(dag, 2, errors=errors)
    assert "behind the committed offset" in result.error("window")


def test_sensor_waits_in_reschedule_mode_and_fails_without_slot(shop_db, tmp_path):
    from airflow.sdk import DAG

    db, conn_id = shop_db
    errors: dict = {}
    capture = make_capture(db, conn_id, tmp_path)
    dag = capture_dag(f"sense_{db.name}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success"
    db.execute("UPDATE customers SET vip = NOT vip")
    with DAG(
        f"sensor_{db.name}",
        schedule=None,
        start_date=af.START,
        default_args={"on_failure_callback": af.failure_recorder(errors)},
    ) as sensor_dag:
        CdcChangesSensor(
            task_id="wait",
            capture=capture,
            mode="reschedule",
            poke_interval=1,
            timeout=60,
            require_captured_change=True,
        )
    af.register(sensor_dag)
    result = af.run(sensor_dag, 0, errors=errors)
    assert result.tasks == {"wait": "success"}, errors
    assert result.xcom["wait"]["pending_bytes"] > 0
    db.execute(f"SELECT pg_drop_replication_slot('{db.slot}')")
    result = af.run(sensor_dag, 1, errors=errors)
    assert result.tasks == {"wait": "failed"}
    assert "does not exist" in result.error("wait")


def test_trigger_reports_pending_wal_and_missing_slots(shop_db, tmp_path):
    db, conn_id = shop_db
    db.setup_capture(list(shop.TABLES))

    async def first_event(trigger):
        async for event in trigger.run():
            return event.payload

    trigger = PostgresCdcChangesTrigger(conn_id, db.slot, min_pending_bytes=1, poll_interval=0.2)
    path, kwargs = trigger.serialize()
    assert path == "airflow_provider_cdc.triggers.postgres_cdc.PostgresCdcChangesTrigger"
    assert db.cluster.password not in json.dumps(kwargs)
    db.execute("UPDATE customers SET vip = NOT vip")
    event = asyncio.run(asyncio.wait_for(first_event(PostgresCdcChangesTrigger(**kwargs)), 30))
    assert event["status"] == "success" and event["pending_bytes"] > 0
    missing = PostgresCdcChangesTrigger(conn_id, "no_such_slot", poll_interval=0.2)
    event = asyncio.run(asyncio.wait_for(first_event(missing), 30))
    assert event["status"] == "error" and "does not exist" in event["message"]


def test_window_runs_through_spark_submit(shop_db, spark, tmp_path, monkeypatch):
    db, conn_id = shop_db
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    errors: dict = {}
    embedded = make_capture(db, conn_id, tmp_path)
    dag = capture_dag(f"submit_a_{db.name}", embedded, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    with db.connect() as conn:
        made = shop.mutate(conn, round_no=1)
    for submitted in (False, True):  # killed windows land nothing and leave nothing running
        _kill_during_a_window(db, conn_id, tmp_path, monkeypatch, spark, submitted=submitted)
    _kill_during_a_window(db, conn_id, tmp_path, monkeypatch, spark, submitted=False, timeout=True)
    _kill_the_task_group(db, conn_id, tmp_path, monkeypatch)
    submitted = make_capture(db, conn_id, tmp_path, spark_conn_id="spark_local")
    dag = capture_dag(f"submit_b_{db.name}", submitted, errors)
    result = af.run(dag, 1, errors=errors)
    assert result.tasks["window"] == "success", errors
    assert result.xcom["window"]["transactions"] == made.transactions
    assert result.xcom["window"]["job_pid"] != os.getpid()  # ran in the spark-submit driver
    assert db.slot_status().confirmed_flush_lsn == Lsn(result.xcom["window"]["to_lsn"])
    assert_reproduces_source(db, tmp_path)
    # The current-state job goes through spark-submit too.
    from airflow.sdk import DAG

    with DAG(
        f"submit_state_{db.name}",
        schedule=None,
        start_date=af.START,
        default_args={"on_failure_callback": af.failure_recorder(errors)},
    ) as state_dag:
        # Mapped (issue 30, item 6): a mapped task runs as an unmapped one does.
        CdcCurrentStateOperator.partial(
            task_id="state", capture=submitted, state_path=str(tmp_path / "state"), state_engine="spark"
        ).expand(as_of_window=[""])
    af.register(state_dag)
    state = af.run(state_dag, 0, errors=errors)
    assert state.tasks == {"state": "success"}, errors
    assert {r["topic"]: r["action"] for r in state.xcom["state"]} == {
        f"shop.{table}": "applied" for table in shop.TABLES
    }
    from airflow_provider_cdc.cdc.basics.naming import Topic
    from airflow_provider_cdc.cdc.state.jobs import read_state
    from tests.support.oracle import spark_rows

    with db.connect() as conn:
        for table, keys in KEYS.items():
            schema, name = table.split(".")
            frame = read_state(
                spark,
                state_path=str(tmp_path / "state"),
                topic_prefix="shop",
                topic=Topic.for_table("shop", schema, name),
            )
            assert_same_state(spark_rows(frame, keys), source_rows(conn, table, keys))
    _small_refresh_without_a_jvm(db, conn_id, tmp_path, spark)


def _small_refresh_without_a_jvm(db, conn_id, tmp_path, spark) -> None:
    """state_engine="auto" with spark_conn_id: a small refresh runs in the task's process on Arrow
    (no spark-submit, pyspark never imported) and builds the state Spark built."""
    import subprocess
    import sys

    from airflow_provider_cdc.cdc.basics.naming import Topic
    from airflow_provider_cdc.cdc.state.jobs import read_state

    script = f"""
import json, sys
from airflow_provider_cdc.capture import PostgresCapture
from airflow_provider_cdc.operators.current_state import CdcCurrentStateOperator
capture = PostgresCapture(postgres_conn_id={conn_id!r}, topic_prefix="shop", sink_path={str(tmp_path)!r},
    slot_name={db.slot!r}, publication_name={db.publication!r}, tables={list(shop.TABLES)!r},
    spark_conn_id="spark_local")
state = CdcCurrentStateOperator(task_id="state", capture=capture, state_path={str(tmp_path / "arrow")!r})
engines = sorted({{r["engine"] for r in state.execute({{}})}})
print("RESULT " + json.dumps({{"engines": engines, "pyspark": "pyspark" in sys.modules}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ, timeout=120)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, done.stdout[-2000:] + done.stderr[-4000:]
    assert json.loads(line[len("RESULT ") :]) == {"engines": ["arrow"], "pyspark": False}
    for table in KEYS:
        topic = Topic.for_table("shop", *table.split("."))
        by_spark = read_state(spark, state_path=str(tmp_path / "state"), topic_prefix="shop", topic=topic)
        by_arrow = read_state(spark, state_path=str(tmp_path / "arrow"), topic_prefix="shop", topic=topic)
        assert sorted(map(str, by_arrow.select(*by_spark.columns).collect())) == sorted(map(str, by_spark.collect()))


def _kill_during_a_window(db, conn_id, sink, monkeypatch, spark, *, submitted: bool, timeout: bool = False) -> None:
    """Airflow kills the window task (its supervisor's SIGTERM, or its execution_timeout) while
    its job holds the slot, in the task's process or submitted: the task fails, no Spark job,
    spark-submit or driver is left, the slot is not active, the capture lock is free and nothing
    was acknowledged (the caller's next run then lands exactly the changes). In the task's
    process, the kill comes while the main thread waits in a py4j call (a running Spark action),
    as it does in a real window."""
    import signal
    import threading
    import time
    from datetime import timedelta

    from airflow_provider_cdc.cdc.basics import faults
    from tests.conftest import ROOT

    pidfile = sink / f"stalled-{submitted}-{timeout}.pid"
    monkeypatch.setenv("CDC_TEST_STALL_PIDFILE", str(pidfile))
    original = faults.point
    # The replication protocol holds the slot for the whole read (the SQL reader only while the
    # server decodes; its kill: tests/integration/postgres/test_sql_window.py).
    reader = {"window_reader": "stream"}
    if submitted:  # the job stalls in the spark-submit driver
        app = str(ROOT / "tests" / "support" / "stalled_cdc_job.py")
        stalled = make_capture(db, conn_id, sink, spark_conn_id="spark_local", spark_application=app, **reader)
    else:  # the job stalls here, reading the slot, in a Spark action

        def stall(name: str) -> None:
            if name == "window.streaming":
                pidfile.write_text(str(os.getpid()))
                spark.sparkContext.parallelize([0], 1).foreach(lambda _: time.sleep(600))
            original(name)

        monkeypatch.setattr(faults, "point", stall)
        stalled = make_capture(db, conn_id, sink, **reader)
    errors: dict = {}
    window = {"execution_timeout": timedelta(seconds=10)} if timeout else {}
    dag = capture_dag(f"killed_{submitted}_{timeout}_{db.name}", stalled, errors, **window)
    before = db.slot_status().confirmed_flush_lsn
    seen: dict = {}

    def kill_when_streaming() -> None:
        deadline = time.monotonic() + 120
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        while not submitted and not spark.sparkContext.statusTracker().getActiveJobsIds():
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)  # the stalling action runs: the main thread is inside py4j
        seen["driver"] = int(pidfile.read_text()) if pidfile.exists() else None
        seen["active"] = db.slot_status().active
        if not timeout:
            os.kill(os.getpid(), signal.SIGTERM)  # what the supervisor sends the task process

    watcher = threading.Thread(target=kill_when_streaming, daemon=True)
    watcher.start()
    started = time.monotonic()
    result = af.run(dag, 1, errors=errors)
    watcher.join()
    monkeypatch.setattr(faults, "point", original)
    assert seen["driver"] is not None and seen["active"], "the job never held the slot"
    assert result.tasks["window"] == "failed", errors
    assert ("AirflowTaskTimeout" if timeout else "was killed") in result.error("window")
    assert time.monotonic() - started < 120
    if submitted:
        assert not _running(seen["driver"]), "the driver outlived its task"
    else:
        for _ in range(50):  # the cancelled task's Python worker is stopped
            if not spark.sparkContext.statusTracker().getActiveJobsIds():
                break
            time.sleep(0.1)
        assert not spark.sparkContext.statusTracker().getActiveJobsIds(), "the Spark job outlived its task"
    _assert_released(db, before)


def _kill_the_task_group(db, conn_id, sink, monkeypatch) -> None:
    """The end of the supervisor's kill (Airflow 3 runs each task in its own process group, and
    SIGKILLs the group when SIGTERM did not end it within 5 s, e.g. while on_kill waits for a YARN
    kill; or the OOM killer): spark-submit and its driver die with the task, in the group,
    and the server releases the slot and the lock."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from tests.conftest import ROOT

    pidfile = sink / "stalled-group.pid"
    monkeypatch.setenv("CDC_TEST_STALL_PIDFILE", str(pidfile))
    task = (
        "import json, sys\n"
        "from tests.integration.test_operators import capture_dag, make_capture\n"
        "from tests.support import airflow as af\n"
        "a = json.loads(sys.argv[1])\n"
        "db = type('Db', (), {'name': a['name'], 'slot': a['slot'], 'publication': a['publication']})\n"
        "capture = make_capture(db, a['conn_id'], a['sink'], spark_conn_id='spark_local', spark_application=a['app'],\n"
        "                       window_reader='stream')\n"  # it holds the slot for the whole read
        "af.run(capture_dag('killed_group_' + a['name'], capture, {}), 1)\n"
    )
    args = {
        "name": db.name,
        "slot": db.slot,
        "publication": db.publication,
        "conn_id": conn_id,
        "sink": str(sink),
        "app": str(ROOT / "tests" / "support" / "stalled_cdc_job.py"),
    }
    before = db.slot_status().confirmed_flush_lsn
    # Its own process group, as the supervisor starts a task.
    child = subprocess.Popen([sys.executable, "-c", task, json.dumps(args)], cwd=ROOT, process_group=0)
    processes: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while not pidfile.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert pidfile.exists(), f"the submitted job never held the slot (task exit code {child.poll()})"
        assert db.slot_status().active
        processes = psutil.Process(child.pid).children(recursive=True)  # spark-submit, its driver, ...
        assert int(pidfile.read_text()) in {p.pid for p in processes}
        os.killpg(child.pid, signal.SIGKILL)  # the supervisor's escalation
        child.wait(timeout=30)
        names = {p.pid: p.name() for p in processes}
        deadline = time.monotonic() + 10
        while any(_running(p.pid) for p in processes) and time.monotonic() < deadline:
            time.sleep(0.2)
        alive = {pid: name for pid, name in names.items() if _running(pid)}
        assert not alive, f"outlived the task's process group (spark-submit, its driver): {alive}"
    finally:
        for process in processes:  # never leave a stalled job behind, whatever failed
            with contextlib.suppress(psutil.Error):
                process.kill()
        if child.poll() is None:
            child.kill()
    _assert_released(db, before)


def _assert_released(db, before) -> None:
    import time

    from airflow_provider_cdc.cdc.sources.postgres import admin

    for _ in range(50):  # the server notices the closed replication connection
        if not db.slot_status().active:
            break
        time.sleep(0.1)
    assert not db.slot_status().active
    assert db.slot_status().confirmed_flush_lsn == before, "a killed run acknowledged the slot"
    with db.connect() as conn:
        admin.try_capture_lock(conn, "shop")  # free: raises naming the holder otherwise
        admin.release_capture_lock(conn, "shop")


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a killed process whose new parent has not reaped it yet does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_missing_spark_connection_is_a_clear_error(shop_db, tmp_path):
    db, conn_id = shop_db
    errors: dict = {}
    dag = capture_dag(f"nospark_{db.name}", make_capture(db, conn_id, tmp_path, spark_conn_id="nope"), errors)
    result = af.run(dag, 0, errors=errors)
    assert result.tasks["snapshot"] == "failed"
    assert "nope" in result.error("snapshot")


def mode_dag(db, conn_id, sink, mode: str, errors: dict):
    return capture_dag(f"mode_{mode}_{db.name}", make_capture(db, conn_id, sink, snapshot_mode=mode), errors)


def kinds(sink) -> list[str]:
    return [e.window.kind for e in committed_windows(str(sink), "shop")]


def test_snapshot_mode_always_snapshots_every_run(shop_db, tmp_path):
    db, conn_id = shop_db
    errors: dict = {}
    dag = mode_dag(db, conn_id, tmp_path, "always", errors)
    for hour in range(2):
        if hour:
            with db.connect() as conn:
                shop.mutate(conn, round_no=hour)
        result = af.run(dag, hour, errors=errors)
        assert result.tasks == {"setup": "success", "snapshot": "success", "window": "success"}, errors
        assert result.xcom["window"]["from_lsn"] == result.xcom["snapshot"]["to_lsn"]
    assert kinds(tmp_path) == ["snapshot", "stream", "snapshot", "stream"]
    assert_reproduces_source(db, tmp_path)


def test_snapshot_mode_never_streams_from_the_slot(shop_db, tmp_path):
    db, conn_id = shop_db
    errors: dict = {}
    dag = mode_dag(db, conn_id, tmp_path, "never", errors)
    first = af.run(dag, 0, errors=errors)
    assert first.tasks == {"setup": "success", "snapshot": "skipped", "window": "success"}, errors
    db.execute("INSERT INTO customers (email, name) VALUES ('late@example.com', 'Late')")
    second = af.run(dag, 1, errors=errors)
    assert second.xcom["window"]["events"] == {"shop.public.customers": {"c": 1}}
    assert kinds(tmp_path) == ["stream", "stream"]  # rows from before the slot are never read


def test_snapshot_mode_initial_only_never_streams(shop_db, tmp_path):
    db, conn_id = shop_db
    errors: dict = {}
    dag = mode_dag(db, conn_id, tmp_path, "initial_only", errors)
    first = af.run(dag, 0, errors=errors)
    assert first.tasks == {"setup": "success", "snapshot": "success", "window": "skipped"}, errors
    second = af.run(dag, 1, errors=errors)
    assert second.tasks == {"setup": "success", "snapshot": "skipped", "window": "skipped"}, errors
    assert kinds(tmp_path) == ["snapshot"]
    assert db.slot_status() is None  # no slot pins WAL for a capture that never streams
    assert_reproduces_source(db, tmp_path)


def test_snapshot_mode_when_needed_resnapshots_after_slot_loss(shop_db, tmp_path):
    db, conn_id = shop_db
    errors: dict = {}
    dag = mode_dag(db, conn_id, tmp_path, "when_needed", errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    db.execute(f"SELECT pg_drop_replication_slot('{db.slot}')")
    with db.connect() as conn:
        shop.mutate(conn, round_no=1)  # changes while no slot exists: only a snapshot can recover them
    # The setup task recreates the slot; the snapshot task notices the slot no longer covers the
    # stored offset and re-snapshots; the window continues from the new snapshot.
    result = af.run(dag, 1, errors=errors)
    assert result.tasks == {"setup": "success", "snapshot": "success", "window": "success"}, errors
    assert kinds(tmp_path) == ["snapshot", "stream", "snapshot", "stream"]
    assert_reproduces_source(db, tmp_path)
    with db.connect() as conn:
        shop.mutate(conn, round_no=2)
    result = af.run(dag, 2, errors=errors)
    assert result.tasks["snapshot"] == "skipped"
    assert_reproduces_source(db, tmp_path)


def test_initial_mode_fails_clearly_after_slot_loss(shop_db, tmp_path):
    db, conn_id = shop_db
    errors: dict = {}
    dag = mode_dag(db, conn_id, tmp_path, "initial", errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    db.execute(f"SELECT pg_drop_replication_slot('{db.slot}')")
    db.execute("UPDATE customers SET vip = NOT vip")
    result = af.run(dag, 1, errors=errors)
    # setup recreates the slot, but it starts after the stored offset: changes were lost
    assert result.tasks["window"] == "failed"
    assert "past the stored offset" in result.error("window")


def test_table_include_list_selects_tables_by_pattern(shop_db, tmp_path):
    db, conn_id = shop_db
    errors: dict = {}
    capture = make_capture(db, conn_id, tmp_path, tables=[], table_include_list=["public\\.(customers|orders)"])
    dag = capture_dag(f"patterns_{db.name}", capture, errors)
    first = af.run(dag, 0, errors=errors)
    assert first.state == "success", errors
    assert set(first.xcom["snapshot"]["events"]) == {"shop.public.customers", "shop.public.orders"}
    with db.connect() as conn:
        published = {r[0] for r in conn.execute("SELECT tablename FROM pg_publication_tables")}
        shop.mutate(conn, round_no=1)
    assert published == {"customers", "orders"}
    second = af.run(dag, 1, errors=errors)
    assert set(second.xcom["window"]["events"]) <= {"shop.public.customers", "shop.public.orders"}
    with db.connect() as conn:
        for table in ("public.customers", "public.orders"):
            assert_same_state(replay(events_of(tmp_path, "shop", table), ["id"]), source_rows(conn, table, ["id"]))


def test_a_table_joining_after_the_snapshot_is_snapshotted_incrementally(shop_db, tmp_path):
    db, conn_id = shop_db
    errors: dict = {}
    capture = make_capture(db, conn_id, tmp_path, tables=[], table_include_list=["public\\.(customers|orders|extra)"])
    dag = capture_dag(f"joinincr_{db.name}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    db.execute("CREATE TABLE extra (id int PRIMARY KEY, v text); INSERT INTO extra VALUES (1, 'a'), (2, 'b')")
    joined = af.run(dag, 1, errors=errors)  # setup publishes it; the window reads its rows as a chunk
    assert joined.state == "success", errors
    summary = joined.xcom["window"]["incremental_snapshot"]
    assert summary["staged_chunks"] == 1 and summary["finished"]["public.extra"]["status"] == "done"
    db.execute("UPDATE extra SET v = 'c' WHERE id = 2; INSERT INTO extra VALUES (3, 'd')")
    assert af.run(dag, 2, errors=errors).state == "success", errors  # emits the chunk
    events = events_of(tmp_path, "shop", "public.extra")
    assert sorted(e["after"]["id"] for e in events if e["op"] == "r") == [1, 2]
    assert {e["source"]["snapshot"] for e in events if e["op"] == "r"} == {"incremental"}
    with db.connect() as conn:
        assert_same_state(replay(events, ["id"]), source_rows(conn, "public.extra", ["id"]))


def test_a_table_joining_after_the_snapshot_is_refused_when_asked(shop_db, tmp_path):
    db, conn_id = shop_db
    errors: dict = {}
    pattern = ["public\\.(customers|orders|extra)"]
    capture = make_capture(db, conn_id, tmp_path, tables=[], table_include_list=pattern, new_table_snapshot="fail")
    dag = capture_dag(f"joining_{db.name}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    db.execute("CREATE TABLE extra (id int PRIMARY KEY); INSERT INTO extra VALUES (1), (2)")
    refused = af.run(dag, 1, errors=errors)  # setup adds it to the publication; the window refuses it
    assert refused.tasks["setup"] == "success" and refused.tasks["window"] == "failed"
    assert 'table(s) "public"."extra" joined capture' in refused.error("window")
    again = capture_dag(
        f"joining2_{db.name}",
        make_capture(
            db,
            conn_id,
            tmp_path,
            tables=[],
            table_include_list=pattern,
            snapshot_mode="always",
            new_table_snapshot="fail",
        ),
        errors,
    )
    assert af.run(again, 2, errors=errors).state == "success", errors
    assert af.run(dag, 3, errors=errors).state == "success", errors
    with db.connect() as conn:
        assert_same_state(
            replay(events_of(tmp_path, "shop", "public.extra"), ["id"]), source_rows(conn, "public.extra", ["id"])
        )


def test_airflow_signals_start_stop_and_refuse_bad_input(shop_db, tmp_path):
    db, conn_id = shop_db
    errors: dict = {}
    capture = make_capture(
        db,
        conn_id,
        tmp_path,
        incremental_chunk_size=3,
        incremental_chunks_per_run=1,
        run_conf_signals=["execute-snapshot", "stop-snapshot"],
    )
    dag = capture_dag(f"signals_{db.name}", capture, errors, signals="{{ params.get('signals', []) | tojson }}")
    assert af.run(dag, 0, errors=errors).state == "success", errors
    store = capture.store()
    before = af.variable(store.key("shop"))
    assert before is not None
    bad = af.run(dag, 1, errors=errors, conf={"cdc_signals": [{"type": "execute-snapshot", "data": {}}]})
    assert bad.tasks["window"] == "failed"
    assert "data-collections is required" in bad.error("window")
    assert af.variable(store.key("shop")) == before  # nothing was stored
    start = {"type": "execute-snapshot", "data": {"data-collections": ["public.orders"]}}
    started = af.run(dag, 2, errors=errors, conf={"cdc_signals": [start]})
    assert started.state == "success", errors
    assert started.xcom["window"]["incremental_snapshot"]["tables"]["public.orders"]["status"] == "running"
    stop = {"type": "stop-snapshot", "data": {"type": "incremental"}}
    stopped = af.run(dag, 3, errors=errors, conf={"cdc_signals": stop})
    assert stopped.state == "success", errors
    summary = stopped.xcom["window"]["incremental_snapshot"]
    assert summary["finished"]["public.orders"]["status"] == "stopped" and summary["staged_chunks"] == 0
    emitted = [e for e in events_of(tmp_path, "shop", "public.orders") if e["source"]["snapshot"] == "incremental"]
    assert emitted == []  # the chunk staged by run 2 was dropped with the stop
