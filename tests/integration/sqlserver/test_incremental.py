"""Incremental snapshots on SQL Server (the stand-in): signals from the signal table and from
Airflow, watermark rows in the CDC-enabled signal table, chunks read at the end of one window and
emitted by the next, concurrent writers, tables that join later, and the failures a user can meet."""

from __future__ import annotations

import json
import random
import threading

import pytest

from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from tests.integration.sqlserver.test_capture import assert_reproduces_source, capture_dag, make_capture
from tests.support import airflow as af
from tests.support.oracle import events_of
from tests.support.sqlserver import workload

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

SIGNAL_DDL = (
    "CREATE TABLE dbo.cdc_signal (id varchar(42) NOT NULL PRIMARY KEY, type varchar(32) NOT NULL, "
    "data varchar(2048) NULL)"
)


def _shop_with_signal_table(standin, customers: int) -> None:
    workload.create(standin, customers=customers, orders_per_customer=1)
    standin.execute_tsql(SIGNAL_DDL)
    standin.enable_table("dbo", "cdc_signal")
    standin.wait_until_captured()


def _signal(standin, signal_id: str, kind: str, data: dict) -> None:
    standin.execute_tsql(
        "INSERT INTO dbo.cdc_signal (id, type, data) VALUES (?, ?, ?)", (signal_id, kind, json.dumps(data))
    )


def _incremental_rows(sink, table: str) -> list[dict]:
    return [e for e in events_of(sink, "shop", table) if e["op"] == "r" and e["source"]["snapshot"] == "incremental"]


def _started(sqlserver_conn, tmp_path, name: str, customers: int, **settings):
    """A shop with a signal table, a capture of it with ``settings``, and its first run (the snapshot)."""
    standin, conn_id = sqlserver_conn
    _shop_with_signal_table(standin, customers=customers)
    errors: dict = {}
    capture = make_capture(conn_id, tmp_path, standin.database, signal_table="dbo.cdc_signal", **settings)
    dag = capture_dag(f"{name}_{standin.database}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    return standin, dag, errors


def _until_finished(dag, errors, table: str, start_hour: int, *, between=None, limit: int = 12) -> list[dict]:
    """Run windows until ``table``'s incremental snapshot is done and nothing is staged; their summaries."""
    summaries = []
    for hour in range(start_hour, start_hour + limit):
        if between is not None:
            between(hour)
        run = af.run(dag, hour, errors=errors)
        assert run.state == "success", errors
        summary = run.xcom["window"].get("incremental_snapshot", {})
        summaries.append(summary)
        if table in summary.get("finished", {}) and summary.get("staged_chunks") == 0:
            return summaries
    raise AssertionError(f"the incremental snapshot of {table} did not finish: {summaries[-1]}")


class Writer(threading.Thread):
    """Updates, inserts and deletes customers on its own connection until stopped."""

    def __init__(self, standin, seed: int):
        super().__init__(daemon=True)
        self.standin = standin
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.statements = 0
        self.failure: BaseException | None = None

    def run(self) -> None:
        conn = self.standin.connect(autocommit=True)
        try:
            cursor = conn.cursor()
            next_id = 5000
            while not self.stop.is_set():
                choice = self.rng.random()
                target = self.rng.randint(1, 60)
                if choice < 0.6:
                    cursor.execute("UPDATE dbo.customers SET balance = balance + 1 WHERE id = ?", target)
                elif choice < 0.8:
                    next_id += 1
                    cursor.execute(
                        "INSERT INTO dbo.customers (id, name, balance, active) VALUES (?, ?, 1, 1)",
                        next_id,
                        f"new {next_id}",
                    )
                else:
                    cursor.execute("DELETE FROM dbo.orders WHERE customer_id = ?", target)
                    cursor.execute("DELETE FROM dbo.customers WHERE id = ?", target)
                self.statements += 1
                self.stop.wait(0.01)
        except BaseException as exc:  # surfaced by the test
            self.failure = exc
        finally:
            conn.close()


def test_a_signal_row_snapshots_a_table_in_chunks_while_writers_change_it(sqlserver_conn, tmp_path):
    standin, dag, errors = _started(
        sqlserver_conn, tmp_path, "ss_incr", 60, incremental_chunk_size=7, incremental_chunks_per_run=3
    )

    _signal(standin, "snap-1", "execute-snapshot", {"data-collections": ["dbo.customers"], "type": "incremental"})
    _signal(standin, "log-1", "log", {"message": "signals arrive in commit order at {}"})
    standin.wait_until_captured()
    writer = Writer(standin, seed=7)
    writer.start()
    try:
        summaries = _until_finished(dag, errors, "dbo.customers", 1)
    finally:
        writer.stop.set()
        writer.join()
    assert writer.failure is None and writer.statements > 0
    standin.wait_until_captured()
    assert af.run(dag, 30, errors=errors).state == "success", errors  # the writer's last changes

    first = summaries[0]
    assert first["staged_chunks"] == 3  # read at the end of the window that saw the signal
    assert any("signals arrive in commit order at" in note for note in first["notes"])
    read = summaries[-1]["finished"]["dbo.customers"]["rows"]  # the rows of the 60 not deleted before their chunk
    assert read >= 30 and sum(s.get("emitted_chunks", 0) for s in summaries) == -(-read // 7)  # full chunks, one short
    rows = _incremental_rows(tmp_path, "dbo.customers")
    ids = [e["after"]["id"] for e in rows]
    assert len(ids) == len(set(ids))  # every row at most once
    superseded = sum(s.get("superseded_rows", 0) for s in summaries)
    assert len(ids) + superseded == read  # every row read is emitted, or superseded by the stream
    for event in rows:  # positioned at the chunk's high watermark, a commit LSN of the signal table
        assert event["source"]["commit_lsn"].count(":") == 2 and event["source"]["change_lsn"] is None
        assert event["transaction"] is None and event["before"] is None
    assert_reproduces_source(standin, tmp_path)

    # The signal table is read for its signals only: no topic, no transaction rows of its own.
    assert read_topic_arrow(str(tmp_path), "shop", "shop.dbo.cdc_signal") is None
    transactions = read_topic_arrow(str(tmp_path), "shop", "shop.transaction").to_pylist()
    named = {d["data_collection"] for t in transactions if t["status"] == "END" for d in t["data_collections"]}
    assert "dbo.cdc_signal" not in named
    # Its watermark rows: an open and a close row per chunk, written by the capture.
    kinds = standin.execute_tsql("SELECT type, COUNT_BIG(*) FROM dbo.cdc_signal GROUP BY type ORDER BY type")
    counts = {k: int(n) for k, n in kinds}
    chunks = sum(s.get("emitted_chunks", 0) for s in summaries)
    assert counts["snapshot-window-open"] == counts["snapshot-window-close"] >= chunks


def test_an_airflow_signal_and_a_table_that_joins_later_with_insert_delete_watermarks(sqlserver_conn, tmp_path):
    standin, conn_id = sqlserver_conn
    _shop_with_signal_table(standin, customers=15)
    errors: dict = {}
    settings = {
        "signal_table": "dbo.cdc_signal",
        "incremental_watermarks": "insert_delete",
        "incremental_chunk_size": 4,
        "incremental_chunks_per_run": 2,
        "new_table_snapshot": "incremental",
    }
    only_customers = make_capture(conn_id, tmp_path, standin.database, tables=["dbo.customers"], **settings)
    first_dag = capture_dag(f"ss_incr_join_a_{standin.database}", only_customers, errors)
    assert af.run(first_dag, 0, errors=errors).state == "success", errors

    # The orders table joins: snapshotted incrementally; a re-snapshot of customers comes from Airflow.
    both = make_capture(conn_id, tmp_path, standin.database, **settings)
    signal = {"id": "again-1", "type": "execute-snapshot", "data": {"data-collections": ["dbo.customers"]}}
    dag = capture_dag(f"ss_incr_join_b_{standin.database}", both, errors, signals=[signal])
    standin.execute_tsql("UPDATE dbo.orders SET amount = amount + 1 WHERE customer_id = 3")
    standin.wait_until_captured()
    _until_finished(dag, errors, "dbo.orders", 1)
    _until_finished(dag, errors, "dbo.customers", 20)
    orders = sorted(e["after"]["id"] for e in _incremental_rows(tmp_path, "dbo.orders"))
    assert orders == sorted(r[0] for r in standin.execute_tsql("SELECT id FROM dbo.orders"))
    customers = sorted(e["after"]["id"] for e in _incremental_rows(tmp_path, "dbo.customers"))
    assert customers == list(range(1, 16))  # the Airflow signal is applied once, not on every run
    assert_reproduces_source(standin, tmp_path)
    # insert_delete: each open row was deleted again, the signal table holds only the signal rows.
    assert standin.execute_tsql("SELECT COUNT_BIG(*) FROM dbo.cdc_signal")[0][0] == 0


def test_a_bad_condition_fails_its_table_only_and_a_late_capture_job_fails_the_window(sqlserver_conn, tmp_path):
    standin, dag, errors = _started(
        sqlserver_conn, tmp_path, "ss_incr_bad", 12, incremental_chunk_size=5, incremental_watermark_wait_seconds=3
    )
    _signal(
        standin,
        "bad-1",
        "execute-snapshot",
        {
            "data-collections": ["dbo.orders", "dbo.customers"],
            "additional-conditions": [{"data-collection": "dbo.orders", "filter": "no_such_column > 0"}],
        },
    )
    standin.wait_until_captured()

    lag = standin.capture.lag
    standin.set_capture_lag(60)  # a capture job far behind: the watermark rows are not captured in time
    try:
        failed = af.run(dag, 1, errors=errors)
    finally:
        standin.set_capture_lag(lag)
    assert failed.state == "failed"
    assert "did not capture the incremental snapshot's watermark rows" in str(errors)
    errors.clear()

    summaries = _until_finished(dag, errors, "dbo.customers", 2)
    finished = summaries[-1]["finished"]
    assert finished["dbo.orders"]["status"] == "failed"
    assert "names no_such_column, which is not one of its captured" in finished["dbo.orders"]["error"]
    assert finished["dbo.customers"]["status"] == "done"
    assert sorted(e["after"]["id"] for e in _incremental_rows(tmp_path, "dbo.customers")) == list(range(1, 13))
    assert not _incremental_rows(tmp_path, "dbo.orders")
    assert standin.execute_tsql("SELECT COUNT_BIG(*) FROM dbo.orders")[0][0] == 12
    assert_reproduces_source(standin, tmp_path)


def test_an_airflow_signal_without_a_signal_table_fails_before_anything_is_written(sqlserver_conn, tmp_path):
    standin, conn_id = sqlserver_conn
    workload.create(standin, customers=3, orders_per_customer=1)
    standin.wait_until_captured()
    errors: dict = {}
    capture = make_capture(conn_id, tmp_path, standin.database, run_conf_signals=["execute-snapshot"])
    signal = {"id": "x-1", "type": "execute-snapshot", "data": {"data-collections": ["dbo.customers"]}}
    dag = capture_dag(f"ss_incr_nosignal_{standin.database}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    landed = read_topic_arrow(str(tmp_path), "shop", "shop.dbo.customers").num_rows
    run = af.run(dag, 1, errors=errors, conf={"cdc_signals": [signal]})
    assert run.state == "failed"
    assert "incremental snapshots on SQL Server need signal_table" in str(errors)
    assert "nothing was written" in str(errors)
    assert read_topic_arrow(str(tmp_path), "shop", "shop.dbo.customers").num_rows == landed
