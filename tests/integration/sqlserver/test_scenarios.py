"""SQL Server scenarios on the stand-in: key changes, the direct query mode, a time-bounded window,
a capture-instance switch after a schema change, and the purge policy of snapshot_mode='when_needed'."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from tests.integration.sqlserver.test_capture import assert_reproduces_source, capture_dag, make_capture
from tests.support import airflow as af
from tests.support.oracle import assert_same_state, events_of, replay
from tests.support.sqlserver import workload

pytestmark = [pytest.mark.airflow, pytest.mark.spark]


def _started(sqlserver_conn, tmp_path, name: str, **overrides):
    standin, conn_id = sqlserver_conn
    workload.create(standin, customers=4, orders_per_customer=1)
    standin.wait_until_captured()
    errors: dict = {}
    capture = make_capture(conn_id, tmp_path, standin.database, **overrides)
    dag = capture_dag(f"{name}_{standin.database}", capture, errors)
    first = af.run(dag, 0, errors=errors)
    assert first.state == "success", errors
    return standin, dag, errors


def test_key_change_is_a_delete_and_a_create_in_direct_mode(sqlserver_conn, tmp_path):
    # SQL Server logs an update of the clustered key as a delete and an insert (a "split update":
    # __$operation 1 and 2), as Debezium documents: a d and a c event in one transaction.
    standin, dag, errors = _started(sqlserver_conn, tmp_path, "keys", data_query_mode="direct")
    standin.execute_tsql("UPDATE dbo.customers SET id = 40, name = N'moved' WHERE id = 4")
    standin.wait_until_captured()
    run = af.run(dag, 1, errors=errors)
    assert run.state == "success", errors
    events = [e for e in events_of(tmp_path, "shop", "dbo.customers") if e["op"] != "r"]
    assert [e["op"] for e in events] == ["d", "c"]
    delete, create = events
    assert delete["before"]["id"] == 4 and delete["after"] is None
    assert create["after"] == {**delete["before"], "id": 40, "name": "moved"} and create["before"] is None
    assert delete["source"]["commit_lsn"] == create["source"]["commit_lsn"]
    # One change in the log: both rows share __$seqval (change_lsn); __$operation orders them.
    assert delete["source"]["change_lsn"] == create["source"]["change_lsn"]
    assert delete["transaction"]["id"] == create["transaction"]["id"]
    assert_reproduces_source(standin, tmp_path)


def test_a_time_bounded_window_holds_exactly_the_commits_before_its_end(sqlserver_conn, tmp_path):
    from airflow.sdk import DAG

    from airflow_provider_cdc.operators.window import CdcWindowOperator

    standin, _dag, errors = _started(sqlserver_conn, tmp_path, "timed")
    standin.execute_tsql("INSERT INTO dbo.customers (id, name, balance, active) VALUES (50, N'early', 1, 1)")
    standin.execute_tsql("INSERT INTO dbo.customers (id, name, balance, active) VALUES (51, N'early too', 1, 1)")
    standin.wait_until_captured()
    time.sleep(0.3)
    boundary = datetime.now(timezone.utc)
    time.sleep(0.3)
    standin.execute_tsql("INSERT INTO dbo.customers (id, name, balance, active) VALUES (52, N'late', 1, 0)")
    standin.wait_until_captured()

    capture = make_capture(_dag.task_dict["window"].capture.sqlserver_conn_id, tmp_path, standin.database)
    with DAG(f"bounded_{standin.database}", schedule=None, start_date=af.START) as bounded:
        CdcWindowOperator(task_id="window", capture=capture, upto_time=boundary.isoformat())
    af.register(bounded)
    first = af.run(bounded, 1, errors=errors)
    assert first.state == "success", errors

    def names(window_id: str) -> list[str]:
        return sorted(
            e["after"]["name"] for e in events_of(tmp_path, "shop", "dbo.customers") if e["window_id"] == window_id
        )

    assert names(first.xcom["window"]["window_id"]) == ["early", "early too"]
    second = af.run(_dag, 2, errors=errors)  # unbounded: up to the capture job's newest commit
    assert second.state == "success", errors
    assert names(second.xcom["window"]["window_id"]) == ["late"]
    assert_reproduces_source(standin, tmp_path)


def test_a_second_capture_instance_takes_over_at_its_start_and_nothing_is_lost(sqlserver_conn, tmp_path):
    standin, dag, errors = _started(sqlserver_conn, tmp_path, "switch")
    standin.execute_tsql("UPDATE dbo.customers SET name = N'before the change' WHERE id = 1")
    standin.execute_tsql("ALTER TABLE dbo.customers ADD email nvarchar(200) NULL")
    standin.execute_tsql("UPDATE dbo.customers SET email = N'unseen@old' WHERE id = 2")  # old instance: no email
    standin.wait_until_captured()
    standin.enable_table("dbo", "customers", capture_instance="dbo_customers_v2")
    standin.execute_tsql("UPDATE dbo.customers SET email = N'a@b.c', name = N'after' WHERE id = 3")
    standin.execute_tsql("INSERT INTO dbo.customers (id, name, balance, active, email) VALUES (60, N'n', 1, 1, N'x@y')")
    standin.wait_until_captured()

    run = af.run(dag, 1, errors=errors)
    assert run.state == "success", errors
    events = [e for e in events_of(tmp_path, "shop", "dbo.customers") if e["op"] != "r"]
    assert [(e["op"], (e["after"] or e["before"])["id"]) for e in events] == [("u", 1), ("u", 2), ("u", 3), ("c", 60)]
    assert "email" not in events[0]["after"] or events[0]["after"]["email"] is None
    assert events[2]["after"]["email"] == "a@b.c" and events[3]["after"]["email"] == "x@y"
    lsns = [e["source"]["commit_lsn"] for e in events]
    assert lsns == sorted(lsns) and len(set(lsns)) == 4

    # The old instance can go now; the capture goes on with the new one alone.
    standin.disable_table("dbo", "customers", "dbo_customers")
    standin.execute_tsql("DELETE FROM dbo.customers WHERE id = 60")
    standin.wait_until_captured()
    after = af.run(dag, 2, errors=errors)
    assert after.state == "success", errors
    assert after.xcom["window"]["events"]["shop.dbo.customers"] == {"d": 1}
    # SQL Server recorded row 2's new e-mail only in the old instance, which has no such column:
    # a value written to a new column before its capture instance exists is not in any change row
    # (docs/sqlserver.md says to enable the new instance right after the ALTER). Everything else holds.
    source = workload.source_rows(standin, "dbo.customers")
    source[(2,)] = {**source[(2,)], "email": None}
    assert_same_state(replay(events_of(tmp_path, "shop", "dbo.customers"), ["id"]), source)
    assert_same_state(
        replay(events_of(tmp_path, "shop", "dbo.orders"), ["id"]), workload.source_rows(standin, "dbo.orders")
    )


def test_the_newest_instance_is_the_one_created_last_when_a_cleanup_gave_both_one_start(sqlserver_conn, tmp_path):
    # After a schema change and one cleanup both instances start at the low water mark: only
    # cdc.change_tables.create_date tells them apart (Debezium: SqlServerConnection's
    # ROW_NUMBER() ... ORDER BY ct.create_date DESC). The new instance's name sorts first here.
    standin, dag, errors = _started(sqlserver_conn, tmp_path, "newest")
    standin.execute_tsql("ALTER TABLE dbo.customers ADD email nvarchar(200) NULL")
    standin.enable_table("dbo", "customers", capture_instance="a_customers_v2")
    standin.execute_tsql("UPDATE dbo.customers SET email = N'first@v2' WHERE id = 1")
    standin.wait_until_captured()
    assert af.run(dag, 1, errors=errors).state == "success", errors
    assert standin.cleanup(retention_minutes=0) is not None  # everything read; both starts raised
    starts = standin.admin_query("SELECT capture_instance, start_lsn FROM cdc.change_tables ORDER BY create_date")
    customers = [bytes(lsn) for name, lsn in starts if name in ("dbo_customers", "a_customers_v2")]
    assert len(customers) == 2 and customers[0] == customers[1]

    standin.execute_tsql("UPDATE dbo.customers SET email = N'second@v2' WHERE id = 2")
    standin.wait_until_captured()
    run = af.run(dag, 2, errors=errors)
    assert run.state == "success", errors
    latest = [
        e for e in events_of(tmp_path, "shop", "dbo.customers") if e["window_id"] == run.xcom["window"]["window_id"]
    ]
    assert [(e["op"], e["after"]["id"], e["after"].get("email")) for e in latest] == [("u", 2, "second@v2")]
    assert_reproduces_source(standin, tmp_path)


def test_when_needed_resnapshots_after_a_purge_and_records_the_gap(sqlserver_conn, tmp_path):
    standin, dag, errors = _started(sqlserver_conn, tmp_path, "purge", snapshot_mode="when_needed")
    standin.execute_tsql("UPDATE dbo.customers SET name = N'purged away' WHERE id = 1")
    standin.wait_until_captured()
    time.sleep(0.05)
    standin.execute_tsql("UPDATE dbo.orders SET note = N'also purged' WHERE id = 100")
    standin.wait_until_captured()
    assert standin.cleanup(retention_minutes=0) is not None  # the capture has not read these yet

    run = af.run(dag, 1, errors=errors)
    assert run.state == "success", errors
    assert run.xcom["snapshot"]["kind"] == "snapshot" and run.xcom["snapshot"]["gap"]["reason"] == "changes_purged"
    gaps = read_topic_arrow(str(tmp_path), "shop", "shop.capture_gap").to_pylist()
    assert [g["reason"] for g in gaps] == ["changes_purged"]
    assert gaps[0]["window_id"] == run.xcom["snapshot"]["window_id"]
    assert_reproduces_source(standin, tmp_path)


def test_sensor_waits_for_the_capture_job_to_pass_the_interval_end(sqlserver_conn, tmp_path):
    import asyncio
    import json
    from datetime import timedelta

    from airflow.sdk import DAG

    from airflow_provider_cdc.sensors.cdc import CdcChangesSensor
    from airflow_provider_cdc.triggers.sqlserver_cdc import SqlServerCdcChangesTrigger

    standin, conn_id = sqlserver_conn
    workload.create(standin, customers=2, orders_per_customer=1)
    standin.wait_until_captured()
    capture = make_capture(conn_id, tmp_path, standin.database)
    errors: dict = {}
    soon = datetime.now(timezone.utc) + timedelta(seconds=2)
    with DAG(f"sensor_{standin.database}", schedule=None, start_date=af.START) as dag:
        sensor = CdcChangesSensor(
            task_id="wait", capture=capture, wait_until=soon.isoformat(), mode="reschedule", poke_interval=1, timeout=5
        )
    af.register(dag)
    assert not sensor.poke({}).is_done  # nothing committed after `soon` yet
    time.sleep(2.2)
    standin.execute_tsql("UPDATE dbo.customers SET balance = 0 WHERE id = 1")
    standin.wait_until_captured()
    done = sensor.poke({})
    assert done.is_done and done.xcom_value["max_lsn"].count(":") == 2

    async def first_event(trigger):
        async for event in trigger.run():
            return event.payload

    later = (datetime.now(timezone.utc) + timedelta(seconds=1)).isoformat()
    trigger = SqlServerCdcChangesTrigger(conn_id, later, poll_interval=0.3)
    path, kwargs = trigger.serialize()
    assert path == "airflow_provider_cdc.triggers.sqlserver_cdc.SqlServerCdcChangesTrigger"
    assert standin.cluster.password not in json.dumps(kwargs)

    def commit_later() -> None:
        time.sleep(1.5)
        standin.execute_tsql("UPDATE dbo.customers SET balance = 1 WHERE id = 1")

    import threading

    threading.Thread(target=commit_later).start()
    event = asyncio.run(asyncio.wait_for(first_event(SqlServerCdcChangesTrigger(**kwargs)), 30))
    assert event["status"] == "success", event
    standin.execute_tsql("EXEC sys.sp_cdc_disable_db")
    event = asyncio.run(asyncio.wait_for(first_event(SqlServerCdcChangesTrigger(**kwargs)), 30))
    assert event["status"] == "error" and "not enabled" in event["message"]
    assert errors == {}


def test_retention_health_reports_the_oldest_unread_change_and_fails_near_the_edge(sqlserver_conn, tmp_path):
    from airflow.sdk import DAG

    from airflow_provider_cdc.operators.sqlserver_health import SqlServerCdcRetentionHealthOperator

    standin, dag, errors = _started(sqlserver_conn, tmp_path, "health")
    capture = dag.task_dict["window"].capture
    with DAG(
        f"health_{standin.database}",
        schedule=None,
        start_date=af.START,
        default_args={"on_failure_callback": af.failure_recorder(errors)},
    ) as checks:
        SqlServerCdcRetentionHealthOperator(task_id="relaxed", capture=capture, max_retention_fraction=0.8)
        SqlServerCdcRetentionHealthOperator(task_id="strict", capture=capture, max_retention_fraction=0.00001)
    af.register(checks)
    standin.admin_query("UPDATE standin.msdb_cdc_jobs SET retention = 60 WHERE job_type = 'cleanup'")
    caught_up = af.run(checks, 0, errors=errors)
    assert caught_up.tasks == {"relaxed": "success", "strict": "success"}, errors  # nothing unread
    assert caught_up.xcom["relaxed"]["retention_minutes"] == 60 and caught_up.xcom["relaxed"]["oldest_unread"] is None

    standin.execute_tsql("UPDATE dbo.customers SET balance = 5 WHERE id = 2")
    standin.wait_until_captured()
    time.sleep(0.5)
    behind = af.run(checks, 1, errors=errors)
    assert behind.tasks == {"relaxed": "success", "strict": "failed"}
    assert 0 < behind.xcom["relaxed"]["used_fraction"] < 0.8 and behind.xcom["relaxed"]["seconds_to_purge"] < 3600
    assert "sp_cdc_change_job" in behind.error("strict")
