"""The changes sensor and the triggers under real Airflow and real servers: runs with and without
a data interval in both modes, Airflow's ``default_deferrable``, triggers against a server that
never answers, and no blocking call in the triggerer's event loop."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from airflow_provider_cdc.testing import shop
from tests.support import airflow as af

pytestmark = [pytest.mark.airflow]


async def first_event(trigger) -> dict:
    async for event in trigger.run():
        return event.payload
    raise AssertionError("the trigger ended without an event")


def commit_soon(db, statement: str, delay: float = 1.0) -> threading.Thread:
    """Commit ``statement`` ``delay`` seconds from now (while a trigger waits inline)."""

    def later() -> None:
        time.sleep(delay)
        db.execute(statement)

    thread = threading.Thread(target=later, daemon=True)
    thread.start()
    return thread


# -- runs without a data interval, both modes (PostgreSQL; the other sources in their folders) ----


@pytest.fixture
def pg_capture(db15, airflow_db, tmp_path, monkeypatch):
    from airflow_provider_cdc.capture import PostgresCapture
    from airflow_provider_cdc.offsets.variable import VariableOffsetStore

    with db15.connect() as conn:
        shop.create_schema(conn)
        shop.seed(conn, customers=2, orders_per_customer=1)
    db15.setup_capture(list(shop.TABLES))
    conn_id = f"sense_{db15.name}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", db15.cluster.airflow_uri(db15.name))
    capture = PostgresCapture(
        postgres_conn_id=conn_id,
        tables=list(shop.TABLES),
        topic_prefix="shop",
        sink_path=str(tmp_path),
        slot_name=db15.slot,
        publication_name=db15.publication,
        offset_store=VariableOffsetStore(key_prefix=f"cdc_offset_{db15.name}__"),
    )
    return db15, conn_id, capture


def sensor_dag(dag_id: str, capture, errors: dict, *, setup: bool = False, **sensor_kwargs):
    """A DAG of one sensor with the default ``wait_until`` (after the capture's setup task if
    ``setup``)."""
    from airflow.sdk import DAG

    from airflow_provider_cdc.operators.setup import CdcSetupOperator
    from airflow_provider_cdc.sensors.cdc import CdcChangesSensor

    with DAG(
        dag_id,
        schedule="@hourly",
        start_date=af.START,
        default_args={"on_failure_callback": af.failure_recorder(errors)},
    ) as dag:
        wait = CdcChangesSensor(task_id="wait", capture=capture, poke_interval=0.2, timeout=60, **sensor_kwargs)
        if setup:
            CdcSetupOperator(task_id="setup", capture=capture) >> wait
    af.register(dag)
    return dag


def check_runs_with_and_without_an_interval(dag, errors: dict, deferrable: bool, commit=None) -> None:
    """The sources that wait for a time (SQL Server, YugabyteDB): a manual run "now", without a
    data interval, waits until its ``run_after`` (seconds ahead, so that deferrable, the first
    check finds the source short of it even on a loaded machine; ``commit`` gives SQL Server's
    capture job a commit after it); a scheduled run of an old interval finds its end passed."""
    import pendulum

    seconds = 3.0 if deferrable else 0.5
    ahead = pendulum.now("UTC").add(seconds=seconds)
    later = threading.Timer(seconds + 0.5, commit) if commit is not None else None
    if later is not None:
        later.start()
    now = af.run(dag, (ahead - af.START).total_seconds() / 3600, errors=errors, with_interval=False)
    if later is not None:
        later.join(5)
    assert now.state == "success", (now.tasks, errors)
    assert ("status" in now.xcom["wait"]) == deferrable, now.xcom  # deferrable: the trigger's event
    past = af.run(dag, 1, errors=errors, run_type="scheduled")
    assert past.state == "success", (past.tasks, errors)


@pytest.mark.parametrize("deferrable", [False, True], ids=["poke", "deferrable"])
def test_postgres_sensor_runs_with_and_without_a_data_interval(pg_capture, deferrable):
    """A manual run "now" and an asset-triggered run have no data interval: the default
    ``wait_until`` must not fail their rendering. Deferrable, the sensor waits in the trigger for a
    captured change (the first check finds none) and the trigger's event is its XCom."""
    db, _, capture = pg_capture
    errors: dict = {}
    dag_id = f"sense_{db.name}_{deferrable}"
    dag = sensor_dag(dag_id, capture, errors, deferrable=deferrable, require_captured_change=True)
    update = "UPDATE customers SET vip = NOT vip WHERE id = 1"
    runs = [(0, "manual", False), (1, "asset_triggered", False), (2, "scheduled", True)]
    for hour, kind, with_interval in runs[::2] if deferrable else runs:
        if deferrable:  # the first check finds nothing (even on a loaded machine); the trigger sees the change
            waiter = commit_soon(db, update, 2.5)
        else:
            db.execute(update)
        result = af.run(dag, hour, errors=errors, run_type=kind, with_interval=with_interval)
        assert result.tasks == {"wait": "success"}, (kind, errors)
        if deferrable:
            waiter.join(5)
            assert result.xcom["wait"]["status"] == "success", result.xcom  # the trigger's event
        else:
            assert result.xcom["wait"]["pending_bytes"] > 0
        db.execute(  # read the change: nothing is pending for the next run
            f"SELECT count(*) FROM pg_logical_slot_get_binary_changes('{db.slot}', NULL, NULL, "
            f"'proto_version', '1', 'publication_names', '{db.publication}')"
        )


def test_deferrable_defaults_to_airflows_operators_default_deferrable(monkeypatch, tmp_path):
    """As Airflow's own sensors, read when the module is imported: a fresh copy of the module is
    loaded under another name with the setting on (the imported one stays as it is)."""
    import importlib.util

    from airflow_provider_cdc.capture import PostgresCapture
    from airflow_provider_cdc.sensors import cdc

    capture = PostgresCapture(postgres_conn_id="x", tables=["public.t"], topic_prefix="p", sink_path=str(tmp_path))
    assert cdc.CdcChangesSensor(task_id="w", capture=capture).deferrable is False  # the setting unset
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
    spec = importlib.util.spec_from_file_location("cdc_sensor_fresh_copy", cdc.__file__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    assert fresh.CdcChangesSensor(task_id="w", capture=capture).deferrable is True
    assert fresh.CdcChangesSensor(task_id="v", capture=capture, deferrable=False).deferrable is False


# -- a server that accepts TCP and never answers -------------------------------------------------


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts connections (the kernel completes the handshake) and never says a word."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def _silent_triggers(port: int, monkeypatch) -> dict:
    from airflow_provider_cdc.triggers.postgres_cdc import PostgresCdcChangesTrigger, PostgresCdcSlotHealthTrigger
    from airflow_provider_cdc.triggers.sqlserver_cdc import SqlServerCdcChangesTrigger
    from airflow_provider_cdc.triggers.yugabyte_cdc import YugabyteCdcChangesTrigger
    from airflow_provider_cdc.triggers.yugabyte_cdc_service import YugabyteCdcServiceChangesTrigger
    from tests.support.sqlserver.fixtures import DRIVER_IN_EXTRA_ALLOWED
    from tests.support.sqlserver.standin import ODBC_DRIVER

    common = {"host": "127.0.0.1", "port": port, "schema": "db", "login": "u", "password": "p"}
    connections = {
        "silent_pg": {"conn_type": "postgres", **common},
        "silent_mssql": {"conn_type": "mssql", **common, "extra": {"driver": ODBC_DRIVER}},
        "silent_ybc": {
            "conn_type": "yugabytedb_cdc",
            **common,
            "extra": {"master_addresses": f"127.0.0.1:{port}", "rpc_sslmode": "disable"},
        },
    }
    for conn_id, conn in connections.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    monkeypatch.setenv(*DRIVER_IN_EXTRA_ALLOWED)
    timeout = {"check_timeout": 3.0}
    return {
        "postgres": PostgresCdcChangesTrigger("silent_pg", "s", poll_interval=0.2, **timeout),
        "postgres health": PostgresCdcSlotHealthTrigger("silent_pg", "s", {}, poll_interval=0.2, **timeout),
        "sqlserver": SqlServerCdcChangesTrigger("silent_mssql", None, 0.2, driver=ODBC_DRIVER, **timeout),
        "yugabytedb": YugabyteCdcChangesTrigger("silent_pg", "s", None, 0.2, **timeout),
        "yugabytedb cdc service": YugabyteCdcServiceChangesTrigger("silent_ybc", "0" * 32, None, 0.2, **timeout),
    }


@pytest.mark.timeout(120)  # a hung trigger fails here instead of holding the suite
@pytest.mark.parametrize("source", ["postgres", "postgres health", "sqlserver", "yugabytedb", "yugabytedb cdc service"])
def test_a_trigger_against_a_server_that_never_answers_fails_within_its_timeout(
    source, silent_server, airflow_db, monkeypatch
):
    path, kwargs = _silent_triggers(silent_server, monkeypatch)[source].serialize()
    assert kwargs["check_timeout"] == 3.0  # it survives the trip to the triggerer
    module, _, name = path.rpartition(".")
    trigger = getattr(importlib.import_module(module), name)(**kwargs)
    started = time.monotonic()
    try:
        event = asyncio.run(asyncio.wait_for(first_event(trigger), 30))
    except asyncio.TimeoutError:
        pytest.fail(f"the {source} trigger hung on a server that never answers")
    elapsed = time.monotonic() - started
    assert event["status"] == "error", event
    assert "did not answer within 3" in event["message"] or "timeout" in event["message"].lower(), event
    assert elapsed < 3.0 + 4.0, elapsed  # its timeout, plus the loop's slack


# -- nothing blocks the triggerer's event loop ----------------------------------------------------


class _SlowCallbacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.slow: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "took" in record.getMessage() and "Executing" in record.getMessage():
            self.slow.append(record.getMessage())


def _run_in_debug_loop(trigger) -> tuple[dict, list[str]]:
    """Run ``trigger`` to its first event in an asyncio debug loop that reports every step that
    held the loop longer than 0.2 s (what would stall every other trigger of the triggerer)."""
    handler = _SlowCallbacks()
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = 0.2
    try:
        event = loop.run_until_complete(asyncio.wait_for(first_event(trigger), 30))
    finally:
        loop.close()
        logger.removeHandler(handler)
    return event, handler.slow


def test_the_psycopg_triggers_poll_with_async_connections_and_never_block_the_loop(pg_capture, monkeypatch):
    """Every poll of the PostgreSQL and YugabyteDB (logical replication) triggers talks to the
    server through psycopg's async connection (no synchronous driver connect, in the loop or in
    a thread), and no step holds the loop for more than 0.2 s."""
    import psycopg

    from airflow_provider_cdc.triggers.postgres_cdc import PostgresCdcChangesTrigger, PostgresCdcSlotHealthTrigger
    from airflow_provider_cdc.triggers.yugabyte_cdc import YugabyteCdcChangesTrigger

    db, conn_id, _ = pg_capture
    opened: list[str] = []
    sync_connect, async_connect = psycopg.Connection.connect.__func__, psycopg.AsyncConnection.connect.__func__

    def observe_sync(cls, *args, **kwargs):
        opened.append(f"sync in {threading.current_thread().name}")
        return sync_connect(cls, *args, **kwargs)

    async def observe_async(cls, *args, **kwargs):
        opened.append("async")
        return await async_connect(cls, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(observe_sync))
    monkeypatch.setattr(psycopg.AsyncConnection, "connect", classmethod(observe_async))
    # The PostgreSQL trigger waits (several polls) for a captured change committed after 1 s.
    # The YugabyteDB trigger reads a slot through YugabyteDB's views; PostgreSQL has none, so it
    # reports the slot missing: enough to see how it connects.
    triggers = {
        "postgres": PostgresCdcChangesTrigger(conn_id, db.slot, poll_interval=0.05, publication_name=db.publication),
        "postgres health": PostgresCdcSlotHealthTrigger(conn_id, db.slot, {}, poll_interval=0.05, watch_seconds=0.3),
        "yugabytedb": YugabyteCdcChangesTrigger(conn_id, db.slot, None, 0.05),
    }
    for name, trigger in triggers.items():
        opened.clear()
        waiter = commit_soon(db, "UPDATE customers SET vip = NOT vip WHERE id = 2", 1.0) if name == "postgres" else None
        event, slow = _run_in_debug_loop(trigger)
        if waiter is not None:
            waiter.join(5)
        assert slow == [], (name, slow)
        polls = [o for o in opened if o == "async"]
        assert len(polls) >= (2 if name != "yugabytedb" else 1), (name, opened)
        assert all(o == "async" for o in opened[1:]), (name, opened)  # the first may be the TLS probe
        assert event["status"] in ("success", "healthy", "error"), event


# -- an IAM login (the connection's ``iam`` extra) ------------------------------------------------


def test_the_psycopg_triggers_log_in_with_an_iam_token_fetched_off_the_event_loop(db15, airflow_db, monkeypatch):
    """With the ``iam`` extra, the triggers log in as the task does (``PostgresCdcHook.connection_info``
    -> ``PostgresHook.get_iam_token``), not with the stored password, and the token is fetched in a
    thread, never in the triggerer's event loop. AWS is not what is tested here: ``get_iam_token``
    is overridden with a stand-in token source that returns the password of a real role of the
    server; the stored password is wrong, so only the token logs in. Before each connection (the TLS
    settling and every poll): tokens expire within minutes, a deferred wait may last hours."""
    from psycopg import sql

    from airflow_provider_cdc.hooks.postgres_cdc import PostgresCdcHook
    from airflow_provider_cdc.triggers.postgres_cdc import PostgresCdcSlotHealthTrigger
    from airflow_provider_cdc.triggers.yugabyte_cdc import YugabyteCdcChangesTrigger

    db15.execute("CREATE TABLE t (id int PRIMARY KEY)")
    db15.setup_capture(["t"])
    role, token = f"iam_{db15.name}"[:60], "fresh-iam-token"
    db15.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(token)))
    db15.created_roles.append(role)
    cluster = db15.cluster
    conn = {"conn_type": "postgres_cdc", "host": cluster.host, "port": cluster.port, "schema": db15.name}
    extra = {"iam": True, "sslmode": "disable"}
    monkeypatch.setenv("AIRFLOW_CONN_PG_IAM", json.dumps({**conn, "login": role, "password": "stale", "extra": extra}))
    asked_in: list[str] = []

    def token_source(self, connection) -> tuple[str, str, int]:  # AWS's generate_db_auth_token, in effect
        asked_in.append(threading.current_thread().name)
        return connection.login, token, connection.port

    monkeypatch.setattr(PostgresCdcHook, "get_iam_token", token_source)
    health = asyncio.run(first_event(PostgresCdcSlotHealthTrigger("pg_iam", db15.slot, {}, watch_seconds=0)))
    assert health["status"] in ("healthy", "unhealthy"), health  # it read the slot: the token logged in
    # The YugabyteDB trigger reads YugabyteDB's slot view, which PostgreSQL lacks: past the login.
    yugabyte = asyncio.run(first_event(YugabyteCdcChangesTrigger("pg_iam", db15.slot, None, 0.05)))
    assert "authentication" not in yugabyte.get("message", ""), yugabyte
    # Asked for before each connection (a token lasts minutes, a wait hours), never in the loop's thread.
    assert len(asked_in) >= 4 and threading.main_thread().name not in asked_in, asked_in


# -- a SQL Server that accepts the login, then stalls ---------------------------------------------


@pytest.fixture
def stalled_sqlserver(request, pg15, airflow_db, monkeypatch) -> Iterator[tuple[object, str]]:
    """A SQL Server stand-in whose catalog is locked by another session: the login succeeds, the
    trigger's first query waits for the lock (what a server that stalls after the login looks like
    to the driver). Its Airflow connection id with it."""
    from tests.support.sqlserver import StatementRecorder
    from tests.support.sqlserver.fixtures import DRIVER_IN_EXTRA_ALLOWED, airflow_connection, standin_for

    for standin in standin_for(request, pg15, StatementRecorder()):
        monkeypatch.setenv("AIRFLOW_CONN_MSSQL_STALLED", airflow_connection(standin))
        monkeypatch.setenv(*DRIVER_IN_EXTRA_ALLOWED)
        with pg15.connect(standin.database) as locker, locker.transaction():
            locker.execute("LOCK TABLE sys.databases IN ACCESS EXCLUSIVE MODE")  # held until the test ends
            yield standin, "mssql_stalled"


@pytest.mark.timeout(60)
def test_the_sqlserver_triggers_check_is_bounded_after_the_login_too(stalled_sqlserver):
    """ODBC's login timeout does not cover a query: without a query timeout a server that accepts
    the login and then stalls holds the check's thread (``asyncio.to_thread``) for ever, even after
    the trigger gave up waiting for it. The check must end within ``check_timeout`` by itself.
    The stand-in's driver (psqlODBC) refuses the connection attribute pyodbc sets a query timeout
    through, so this exercises the check's own deadline (its statements cancelled, driver-independent);
    the query timeout itself (Microsoft's drivers take it) cannot be exercised without one."""
    from airflow.sdk import BaseHook

    from airflow_provider_cdc.triggers.sqlserver_cdc import SqlServerCdcChangesTrigger
    from tests.support.sqlserver.standin import ODBC_DRIVER

    _, conn_id = stalled_sqlserver
    trigger = SqlServerCdcChangesTrigger(conn_id, None, 0.2, driver=ODBC_DRIVER, check_timeout=2.0)
    info = trigger.connection_info(BaseHook.get_connection(conn_id))
    outcome: list[object] = []

    def check() -> None:
        try:
            outcome.append(trigger.check(info))
        except Exception as exc:
            outcome.append(exc)

    worker = threading.Thread(target=check, daemon=True)  # daemon: a stalled one must not hold pytest
    started = time.monotonic()
    worker.start()
    worker.join(2.0 + 8.0)
    assert not worker.is_alive(), "the check's thread is still blocked in a query of the stalled server"
    assert time.monotonic() - started < 2.0 + 8.0
    assert len(outcome) == 1 and isinstance(outcome[0], TimeoutError), outcome
    assert "did not answer within 2 s" in str(outcome[0]), outcome
