"""Recovery from transient failures under real Airflow, PostgreSQL and Spark (no mocks).

A window task that loses its connection or its server mid-window must fail with a clear,
retryable error, leave the window pending (nothing committed, slot where it was), and the next
attempt must run that same window and lose or duplicate nothing. Retries are Airflow's own:
``dag.test()`` re-runs a task that ends ``up_for_retry`` in the same call (``retry_delay=0``),
and ``on_retry_callback`` runs in between, which is where these tests look at the state the
failed attempt left behind. Clearing a failed run is ``dag.test()`` on the same logical date,
which clears that date's task instances and runs the run again.

The offset stores' compare-and-set is checked with two writers and with racing threads.
"""

from __future__ import annotations

import shutil
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_provider_cdc.cdc.basics import faults
from airflow_provider_cdc.cdc.basics.errors import CdcTransientError, StaleOffsetError
from airflow_provider_cdc.cdc.basics.window import Window, window_id_for
from airflow_provider_cdc.cdc.sinks.commit_log import CommitLog
from airflow_provider_cdc.cdc.sinks.storage import storage_for
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.offset import OffsetIdentity, PostgresOffset
from airflow_provider_cdc.operators.setup import CdcSetupOperator
from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator
from airflow_provider_cdc.operators.window import CdcWindowOperator
from airflow_provider_cdc.testing import shop
from airflow_provider_cdc.testing.postgres_cluster import PostgresCluster, available_flavours, scratch_dir
from airflow_provider_cdc.version_compat import AirflowFailException
from tests.support import airflow as af
from tests.support.crash import CrashCapture, prepare_shop
from tests.support.databases import CaptureDatabase

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

KEYS = {"public.customers": ["id"], "public.orders": ["id"], "public.order_items": ["order_id", "line_no"]}
CHUNK = 5_000  # a bulk window (30k changes) writes six chunks: the tests interrupt it after the first


@pytest.fixture(autouse=True)
def no_faults(monkeypatch):
    """Fault counters are per process: start each test with none, and no fault configured."""
    monkeypatch.delenv(faults.ENV, raising=False)
    faults._hits.clear()
    yield
    faults._hits.clear()


def _prepare(db: CaptureDatabase, monkeypatch) -> str:
    return prepare_shop(db, monkeypatch, "rec", customers=12, orders_per_customer=2)


@pytest.fixture
def recovery_db(db15, airflow_db, spark, monkeypatch) -> tuple[CaptureDatabase, str]:
    return db15, _prepare(db15, monkeypatch)


class Attempts:
    """What each failed attempt of the window task left behind, seen from ``on_retry_callback``
    (after the failure, before Airflow runs the retry)."""

    def __init__(self, capture: CrashCapture, before_retry=None):
        self.capture = capture
        self.before_retry = before_retry
        self.retried: list[dict] = []

    def on_retry(self, context) -> None:
        try:
            if self.before_retry is not None:
                self.before_retry()
            self.retried.append(
                {
                    "task_id": context["task_instance"].task_id,
                    "try_number": context["task_instance"].try_number,
                    "exception": context.get("exception"),
                    "log_entries": log_entries(self.capture),
                    "offset": self.capture.stored_offset(),
                    "slot": self.capture.db.slot_status(self.capture.slot),
                }
            )
        except Exception as exc:  # Airflow would only log it: make the test see it
            self.retried.append({"callback_error": exc})


def recovery_dag(dag_id: str, capture: CrashCapture, errors: dict, *, retries: int, attempts: Attempts | None = None):
    from airflow.sdk import DAG

    default_args = {
        "on_failure_callback": af.failure_recorder(errors),
        "retries": retries,
        "retry_delay": timedelta(0),
    }
    if attempts is not None:
        default_args["on_retry_callback"] = attempts.on_retry
    with DAG(
        dag_id, schedule="@hourly", start_date=af.START, catchup=False, max_active_runs=1, default_args=default_args
    ) as dag:
        operator_capture = capture.capture()
        (
            CdcSetupOperator(task_id="setup", capture=operator_capture)
            >> CdcSnapshotOperator(task_id="snapshot", capture=operator_capture)
            >> CdcWindowOperator(task_id="window", capture=operator_capture)
        )
    af.register(dag)
    return dag


def window_tries(dag, hour: int) -> int:
    """How many times the run's window task was tried (Airflow's try_number)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        run = session.scalar(
            select(DagRun).where(DagRun.dag_id == dag.dag_id, DagRun.logical_date == af.START.add(hours=hour))
        )
        return next(ti.try_number for ti in run.get_task_instances(session=session) if ti.task_id == "window")


def log_entries(capture: CrashCapture) -> list:
    """Every commit-log entry, superseded ones included, in log order."""
    return CommitLog(storage_for(str(capture.sink)), capture.prefix).entries()


def bulk_insert(db: CaptureDatabase, *, transactions: int = 30, rows: int = 1_000, tag: str = "bulk") -> int:
    """``transactions * rows`` customers with ~400-byte profiles: far more than socket buffers hold,
    so the window is still being read when it is interrupted. Returns the transactions made."""
    with db.connect() as conn:
        for t in range(transactions):
            conn.execute(
                "INSERT INTO customers (email, name, profile) SELECT %s || '.' || g || '@example.com', "
                "'Bulk ' || g, jsonb_build_object('pad', repeat('x', 400), 'n', g) FROM generate_series(1, %s) g",
                (f"{tag}{t}", rows),
            )
    return transactions


class WhenWindowWrites(threading.Thread):
    """Runs ``action`` once the first chunk of window ``seq`` is on disk (uncommitted), i.e. while
    the window is being read from the slot."""

    def __init__(self, sink: Path, seq: int, action, *, timeout: float = 90):
        super().__init__(daemon=True)
        self.pattern = f"window={window_id_for(seq)}/attempt=*/part-*.parquet"
        self.sink = sink
        self.action = action
        self.timeout = timeout
        self.fired_at: float | None = None
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout
        try:
            while not self.stop.is_set() and time.monotonic() < deadline:
                if next(self.sink.rglob(self.pattern), None) is not None:
                    self.fired_at = time.monotonic()
                    self.action()
                    return
                time.sleep(0.01)
        except BaseException as exc:
            self.error = exc


def terminate_walsender(db: CaptureDatabase, slot: str) -> int:
    """``pg_terminate_backend`` on the walsender streaming ``slot``; returns its pid."""
    with db.connect() as conn:
        (pid,) = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
        assert pid is not None, f"slot {slot} is not being read"
        assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
    return pid


def terminate_sql_reader(db: CaptureDatabase, slot: str) -> int:
    """``pg_terminate_backend`` on the session reading ``slot`` through the SQL functions (the
    slot is active only while the server decodes; the session then sends the result)."""
    with db.connect() as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND query LIKE %s",
            (f"%pg_logical_slot_peek_binary_changes(E'{slot}'%",),
        ).fetchone()
        assert row is not None, f"slot {slot} is not being read through SQL"
        assert conn.execute("SELECT pg_terminate_backend(%s)", (row[0],)).fetchone()[0]
    return row[0]


def assert_transient(exc: BaseException | None) -> str:
    """A retryable error (Airflow retries everything but AirflowFailException); its text."""
    assert exc is not None
    assert not isinstance(exc, AirflowFailException), f"terminal: {exc!r}"
    assert isinstance(exc, CdcTransientError), f"not a CdcTransientError: {exc!r}"
    return str(exc)


def assert_failed_attempt_left_window_pending(failed: dict, *, entries_before: list, slot_before, seq: int) -> Window:
    """Nothing of window ``seq`` was committed, the offset holds it as pending, the slot did not
    move; returns the pending window."""
    assert "callback_error" not in failed, failed
    assert [e.log_seq for e in failed["log_entries"]] == [e.log_seq for e in entries_before], "a new log entry"
    offset = failed["offset"]
    assert offset.window_seq == seq - 1
    pending = offset.pending
    assert pending is not None and pending.seq == seq and pending.kind == "stream"
    assert pending.from_lsn == offset.lsn
    assert failed["slot"].confirmed_flush_lsn == slot_before.confirmed_flush_lsn, "the slot moved"
    return pending


def assert_each_window_committed_once(capture: CrashCapture) -> None:
    seqs = [e.window.seq for e in log_entries(capture)]
    assert seqs == list(range(1, len(seqs) + 1)), f"windows committed more than once or out of order: {seqs}"


# -- 1. connection dropped ------------------------------------------------------------------------


@pytest.mark.parametrize("reader", ["stream", "sql"])
def test_connection_dropped_mid_window_fails_clearly_and_retry_succeeds(recovery_db, tmp_path, reader):
    """The session reading the window is terminated mid-window: the walsender (streaming reader)
    or the backend sending the peek's result (SQL reader)."""
    db, conn_id = recovery_db
    capture = CrashCapture(db, conn_id, "shop", tmp_path, KEYS, chunk=CHUNK, overrides={"window_reader": reader})
    terminate = terminate_walsender if reader == "stream" else terminate_sql_reader
    attempts = Attempts(capture)
    errors: dict = {}
    dag = recovery_dag(f"drop_{db.name}", capture, errors, retries=1, attempts=attempts)
    assert af.run(dag, 0, errors=errors).state == "success", errors  # snapshot = 1, window 2
    entries_before, slot_before = log_entries(capture), db.slot_status(capture.slot)

    made = bulk_insert(db)
    killed: list[int] = []
    killer = WhenWindowWrites(tmp_path, 3, lambda: killed.append(terminate(db, capture.slot)))
    killer.start()
    result = af.run(dag, 1, errors=errors)
    killer.stop.set()
    killer.join()
    assert killer.error is None and killed, f"the walsender was not terminated: {killer.error!r}"

    assert result.state == "success" and result.tasks["window"] == "success", (result.tasks, errors)
    (failed,) = attempts.retried
    assert failed["task_id"] == "window" and failed["try_number"] == 1 and window_tries(dag, 1) == 2
    message = assert_transient(failed["exception"])
    if reader == "stream":
        assert "lost the replication connection" in message and "retry streams the same changes again" in message
        assert "terminating connection due to administrator command" in message, message
    else:  # libpq in COPY mode reports the closed socket, or the server's FATAL text when it read it first
        assert f"lost the connection reading replication slot {capture.slot!r} through SQL" in message, message
        lost = ("server closed the connection", "terminating connection due to administrator command")
        assert any(sign in message for sign in lost), message
        assert "a retry reads the same window again" in message
    assert db.cluster.password not in message
    pending = assert_failed_attempt_left_window_pending(
        failed, entries_before=entries_before, slot_before=slot_before, seq=3
    )

    # The retry ran exactly the pending window, once, and captured every bulk transaction.
    summary = result.xcom["window"]
    assert (summary["window_id"], summary["from_lsn"], summary["to_lsn"]) == (
        pending.window_id,
        str(pending.from_lsn),
        str(pending.to_lsn),
    )
    assert summary["transactions"] == made and summary["events"]["shop.public.customers"] == {"c": 30_000}
    # The interrupted attempt's chunks never became visible and were deleted by the retry's commit.
    assert len({p.name for p in tmp_path.rglob(f"window={pending.window_id}/attempt=*")}) == 1
    assert_each_window_committed_once(capture)
    capture.verify()


# -- 2. server restarted --------------------------------------------------------------------------


@pytest.fixture
def own_pg15(airflow_db, spark, monkeypatch):
    """A PostgreSQL 15 cluster of this test alone: it gets restarted, the suite's clusters must not."""
    cluster = PostgresCluster(available_flavours()["pg15"], scratch_dir("cdc-test-restart-")).start()
    try:
        db = CaptureDatabase.create(cluster, "restart_shop")
        yield db, _prepare(db, monkeypatch)
    finally:
        cluster.stop()
        shutil.rmtree(cluster.base_dir, ignore_errors=True)


def test_postgres_restart_mid_window(own_pg15, tmp_path):
    """``pg_ctl restart -m fast`` then ``-m immediate`` while a window is read.

    A fast shutdown terminates the ordinary sessions (the run's lock and catalog sessions) at
    once but keeps walsenders until they have sent their WAL, so the window is read to its end
    and lands in the sink; the run then fails storing its offset, and the retry adopts the
    landed window. An immediate shutdown cuts the stream itself: nothing lands and the retry
    reads the window again. Either way nothing is lost or duplicated. (The walsender's behaviour:
    the streaming reader; a session of the SQL reader is an ordinary one, terminated mid-window as
    in the dropped-connection test.)"""
    db, conn_id = own_pg15
    capture = CrashCapture(db, conn_id, "shop", tmp_path, KEYS, chunk=CHUNK, overrides={"window_reader": "stream"})
    restarts: list[WhenWindowWrites] = []
    # Airflow retries at once (retry_delay=0): let the server finish coming back first.
    attempts = Attempts(capture, before_retry=lambda: restarts[-1].join(timeout=120))
    errors: dict = {}
    dag = recovery_dag(f"restart_{db.name}", capture, errors, retries=1, attempts=attempts)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    made = 0

    for hour, mode in ((1, "fast"), (2, "immediate")):
        entries_before, slot_before = log_entries(capture), db.slot_status(capture.slot)
        seq = entries_before[-1].window.seq + 1
        made += bulk_insert(db, tag=mode)
        restarts.append(WhenWindowWrites(tmp_path, seq, lambda mode=mode: db.cluster.restart(mode)))
        restarts[-1].start()
        result = af.run(dag, hour, errors=errors)
        restarts[-1].join(timeout=120)
        assert restarts[-1].error is None and restarts[-1].fired_at is not None, f"no restart: {restarts[-1].error!r}"

        assert result.state == "success" and result.tasks["window"] == "success", (mode, result.tasks, errors)
        failed = attempts.retried[-1]
        assert len(attempts.retried) == hour and "callback_error" not in failed, failed
        assert window_tries(dag, hour) == 2
        message = assert_transient(failed["exception"])
        assert db.cluster.password not in message
        offset = failed["offset"]
        pending = offset.pending
        assert pending is not None and pending.seq == seq and offset.window_seq == seq - 1
        landed = [e.window for e in failed["log_entries"] if e.window.seq == seq]
        if mode == "fast":
            assert message.startswith(f"cannot connect to PostgreSQL at {db.info.describe()}: "), message
            assert "the database system is shutting down" in message, message
            assert landed == [pending]  # read to its end during the shutdown: the retry adopts it
            # ... and reports it: the run's window has landed (the next run takes what came since).
            assert result.xcom["window"]["window_id"] == window_id_for(seq) and result.xcom["window"]["replayed"]
        else:
            assert message.startswith(f"lost the replication connection to {db.info.describe()} while streaming: ")
            assert "immediate shutdown" in message or "server closed the connection" in message, message
            assert landed == []  # cut mid-stream: the retry reads the same window again
            assert result.xcom["window"]["window_id"] == pending.window_id
            assert result.xcom["window"]["to_lsn"] == str(pending.to_lsn)
        # The slot never moves past what the sink holds (after a crash it may even move back).
        assert failed["slot"].confirmed_flush_lsn <= slot_before.confirmed_flush_lsn

    assert_each_window_committed_once(capture)
    stats = capture.verify()
    assert stats["transactions"] >= made


def test_lost_control_session_mid_window_is_a_clear_transient_error(recovery_db, tmp_path):
    """The run's own session (it holds the capture lock and acknowledges the slot) is killed while
    the window is read: the window lands and its offset is stored, the acknowledgement fails with
    a clear retryable error, and the retry acknowledges before going on."""
    db, conn_id = recovery_db
    capture = CrashCapture(db, conn_id, "shop", tmp_path, KEYS, chunk=CHUNK)
    attempts = Attempts(capture)
    errors: dict = {}
    dag = recovery_dag(f"control_{db.name}", capture, errors, retries=1, attempts=attempts)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    slot_before = db.slot_status(capture.slot)

    def kill_lock_holder() -> None:
        with db.connect() as conn:
            (pid,) = conn.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()
            assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]

    made = bulk_insert(db)
    killer = WhenWindowWrites(tmp_path, 3, kill_lock_holder)
    killer.start()
    result = af.run(dag, 1, errors=errors)
    killer.join(timeout=120)
    assert killer.error is None and killer.fired_at is not None, f"nothing was killed: {killer.error!r}"

    assert result.state == "success" and result.tasks["window"] == "success", (result.tasks, errors)
    (failed,) = attempts.retried
    assert "callback_error" not in failed, failed
    message = assert_transient(failed["exception"])
    assert message.startswith("lost the connection to PostgreSQL during the run (AdminShutdown: "), message
    assert "terminating connection due to administrator command" in message, message
    # The window landed and the offset records it; only the acknowledgement is missing.
    assert [e.window.seq for e in failed["log_entries"]][-1] == 3
    assert failed["offset"].window_seq == 3 and failed["offset"].pending is None
    assert failed["slot"].confirmed_flush_lsn == slot_before.confirmed_flush_lsn
    # The retry acknowledges and reports the run's landed window.
    assert result.xcom["window"]["window_id"] == window_id_for(3) and result.xcom["window"]["replayed"]
    assert db.slot_status(capture.slot).confirmed_flush_lsn == Lsn(result.xcom["window"]["to_lsn"])
    assert_each_window_committed_once(capture)
    assert capture.verify()["transactions"] >= made


# -- 3. Airflow retries -----------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["window.chunk_written:raise:1", "operator.offset_saved:raise:1"])
def test_airflow_retries_recover_from_a_transient_failure(recovery_db, tmp_path, monkeypatch, fault):
    db, conn_id = recovery_db
    capture = CrashCapture(db, conn_id, "shop", tmp_path, KEYS, chunk=CHUNK)
    attempts = Attempts(capture)
    errors: dict = {}
    dag = recovery_dag(
        f"retry_{fault.split(':')[0].replace('.', '_')}_{db.name}", capture, errors, retries=1, attempts=attempts
    )
    assert af.run(dag, 0, errors=errors).state == "success", errors
    with db.connect() as conn:
        made = shop.mutate(conn, round_no=1)

    monkeypatch.setenv(faults.ENV, fault)  # raises the first time the point is reached in this process
    result = af.run(dag, 1, errors=errors)
    assert result.state == "success", (result.tasks, errors)
    assert result.tasks == {"setup": "success", "snapshot": "skipped", "window": "success"}
    (failed,) = attempts.retried
    assert failed["task_id"] == "window" and failed["try_number"] == 1 and window_tries(dag, 1) == 2
    point = fault.split(":")[0]
    assert assert_transient(failed["exception"]) == f"fault injected at {point}"
    if point == "window.chunk_written":
        assert faults._hits[point] >= 2  # the retry passed the point again, without failing

    offset = failed["offset"]
    if point == "window.chunk_written":  # failed before the sink commit: the retry ran window 3 again
        assert offset.pending is not None and offset.pending.seq == 3
        assert result.xcom["window"]["window_id"] == window_id_for(3)
        assert result.xcom["window"]["transactions"] == made.transactions
    else:  # failed after storing the offset: the retry acknowledged window 3 and reports it
        assert offset.pending is None and offset.window_seq == 3
        assert Lsn(failed["slot"].confirmed_flush_lsn) < offset.lsn
        assert result.xcom["window"]["window_id"] == window_id_for(3) and result.xcom["window"]["replayed"]
        assert db.slot_status(capture.slot).confirmed_flush_lsn == offset.lsn
    assert_each_window_committed_once(capture)
    capture.verify()


# -- 4. clearing a failed run ---------------------------------------------------------------------


@pytest.mark.parametrize("point", ["sink.committed", "window.read_done"])
def test_manual_clear_of_a_failed_run_is_safe(recovery_db, tmp_path, monkeypatch, point):
    """``sink.committed``: the window landed, the offset did not record it; ``window.read_done``:
    the window was read and written but not committed."""
    db, conn_id = recovery_db
    capture = CrashCapture(db, conn_id, "shop", tmp_path, KEYS, chunk=CHUNK)
    errors: dict = {}
    dag = recovery_dag(f"clear_{point.replace('.', '_')}_{db.name}", capture, errors, retries=0)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    with db.connect() as conn:
        made = shop.mutate(conn, round_no=1)

    monkeypatch.setenv(faults.ENV, f"{point}:raise:1")
    failed = af.run(dag, 1, errors=errors)
    assert failed.state == "failed" and failed.tasks["window"] == "failed", failed.tasks
    assert failed.error("window") == f"CdcTransientError: fault injected at {point}"
    offset = capture.stored_offset()
    window = offset.pending
    assert window is not None and window.seq == 3 and offset.window_seq == 2
    landed = [e.window for e in log_entries(capture) if e.window.seq == 3]
    assert landed == ([window] if point == "sink.committed" else [])

    with db.connect() as conn:  # the source moves on before anyone clears the run
        shop.mutate(conn, round_no=2)
    cleared = af.run(dag, 1, errors=errors)  # dag.test clears the date's task instances, runs again
    assert cleared.state == "success" and cleared.tasks["window"] == "success", (cleared.tasks, errors)
    committed = {e.window.seq: e.window for e in capture_windows(capture)}
    assert committed[3] == window  # same id, same bounds, same planned time: the window that failed
    summary = cleared.xcom["window"]
    if point == "sink.committed":
        # The cleared run adopted the landed window and reports it; the next run takes what came since.
        assert summary["window_id"] == window.window_id and summary["replayed"]
        assert summary["transactions"] == made.transactions
    else:
        # The cleared run ran the failed window again, as planned: the later changes are not in it.
        assert (summary["window_id"], summary["to_lsn"]) == (window.window_id, str(window.to_lsn))
        assert summary["transactions"] == made.transactions
    with db.connect() as conn:
        shop.mutate(conn, round_no=3)
    further = af.run(dag, 2, errors=errors)
    assert further.state == "success", errors
    assert further.xcom["window"]["from_lsn"] == summary["to_lsn"]
    assert further.xcom["window"]["window_id"] == window_id_for(int(summary["window_id"]) + 1)
    assert_each_window_committed_once(capture)
    capture.verify()


def capture_windows(capture: CrashCapture) -> list:
    return CommitLog(storage_for(str(capture.sink)), capture.prefix).committed()


# -- 5. offset compare-and-set ------------------------------------------------------------------


IDENTITY = OffsetIdentity(topic_prefix="cas", system_identifier="7000000000000000001", database="db", slot_name="s")


def _offset(lsn: int) -> PostgresOffset:
    return PostgresOffset(identity=IDENTITY, lsn=Lsn(lsn), window_seq=lsn, snapshot_completed=True)


def _stale_writer_scenario(make_store) -> dict:
    from airflow_provider_cdc.offsets.base import load_offset, save_offset

    save_offset(make_store(), _offset(1), previous=None)  # a fresh capture: nothing stored yet
    writer_a, writer_b = make_store(), make_store()
    read_a, read_b = load_offset(writer_a, "cas"), load_offset(writer_b, "cas")
    assert read_a == read_b and read_a.revision == 1
    saved_a = save_offset(writer_a, _offset(2), previous=read_a)
    outcome: dict = {"saved_a": saved_a}
    try:
        save_offset(writer_b, _offset(3), previous=read_b)
    except StaleOffsetError as exc:
        outcome["stale"] = exc
    outcome["stored"] = load_offset(make_store(), "cas")
    # B re-reads and builds on A's offset: accepted.
    outcome["rebased"] = save_offset(writer_b, _offset(3), previous=load_offset(writer_b, "cas"))
    outcome["final"] = load_offset(make_store(), "cas")
    return outcome


def _in_task(dag_id: str, function):
    """Run ``function`` inside an Airflow task (Variables are only reachable from tasks)."""
    from airflow.providers.standard.operators.python import PythonOperator
    from airflow.sdk import DAG

    box: dict = {}

    def call():
        try:
            box["result"] = function()
        except BaseException as exc:
            box["error"] = exc

    with DAG(dag_id, schedule=None, start_date=af.START) as dag:
        PythonOperator(task_id="call", python_callable=call)
    af.register(dag)
    assert af.run(dag, 0).tasks == {"call": "success"}
    if "error" in box:
        raise box["error"]
    return box["result"]


@pytest.fixture
def offset_stores(db15, airflow_db, monkeypatch):
    conn_id = f"cas_{db15.name}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", db15.cluster.airflow_uri(db15.name))

    def variable():
        from airflow_provider_cdc.offsets.variable import VariableOffsetStore

        return VariableOffsetStore(key_prefix=f"cdc_offset_{db15.name}__")

    def state_table():
        from airflow_provider_cdc.offsets.state_table import PostgresStateTableOffsetStore

        return PostgresStateTableOffsetStore(conn_id, "public.cdc_offsets")

    return {"variable": variable, "state_table": state_table}


@pytest.mark.parametrize("kind", ["variable", "state_table"])
def test_stale_offset_writer_cannot_overwrite_a_newer_offset(offset_stores, kind):
    make_store = offset_stores[kind]
    outcome = _in_task(f"cas_{kind}", lambda: _stale_writer_scenario(make_store))
    stale = outcome.get("stale")
    assert isinstance(stale, StaleOffsetError), outcome
    assert "another run wrote it" in str(stale)
    assert not isinstance(stale, CdcTransientError) and stale.terminal  # a lost race is not retried blindly
    assert outcome["stored"] == outcome["saved_a"] and outcome["stored"].lsn == Lsn(2)
    assert outcome["stored"].revision == 2
    assert outcome["final"] == outcome["rebased"] and outcome["final"].revision == 3


def test_state_table_compare_and_set_has_one_winner_per_round(offset_stores):
    """Writers race on the same revision (a barrier lines them up): exactly one wins each round,
    including the very first insert. The Variable store has no atomic compare-and-set (Airflow
    Variables offer none); runs of a capture are serialised by the capture lock instead."""
    from airflow_provider_cdc.offsets.base import load_offset, save_offset

    writers, rounds = 4, 10
    stores = [offset_stores["state_table"]() for _ in range(writers)]
    for store in stores:  # creates the table once, before the race
        assert store.load("cas") is None
    barrier = threading.Barrier(writers)

    def write(i: int, round_no: int, outcomes: dict[str, list]) -> None:
        try:
            previous = load_offset(stores[i], "cas")
            barrier.wait(timeout=30)  # every writer has read the same revision
            save_offset(stores[i], _offset(100 * round_no + i + 1), previous=previous)
            outcomes["won"].append(i)
        except StaleOffsetError:
            outcomes["stale"].append(i)
        except BaseException as exc:
            outcomes["other"].append(exc)

    for round_no in range(rounds):
        outcomes: dict[str, list] = {"won": [], "stale": [], "other": []}
        threads = [threading.Thread(target=write, args=(i, round_no, outcomes)) for i in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not outcomes["other"], outcomes
        assert len(outcomes["won"]) == 1 and len(outcomes["stale"]) == writers - 1, (round_no, outcomes)
        stored = load_offset(stores[0], "cas")
        assert stored.revision == round_no + 1
        assert stored.lsn == Lsn(100 * round_no + outcomes["won"][0] + 1), "the stored offset is not the winner's"
