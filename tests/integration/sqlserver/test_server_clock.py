"""The server's clock and time zone: cdc.lsn_time_mapping holds the server's local time.

The stand-in's zone and clock are set (tests/support/sqlserver/clock.sql) so that commits land
just before and after a DST change in Europe/Berlin: 2026-10-25 01:00 UTC (03:00 CEST -> 02:00
CET, local 02:00-03:00 happens twice) and 2026-03-29 01:00 UTC (02:00 CET -> 03:00 CEST).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn
from tests.integration.sqlserver.test_capture import capture_dag, make_capture
from tests.support import airflow as af
from tests.support.oracle import events_of
from tests.support.sqlserver import workload
from tests.support.sqlserver.standin import SqlServerStandIn

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

BERLIN = "Europe/Berlin"
FALL_BACK = datetime(2026, 10, 25, 1, 0, tzinfo=timezone.utc)
SPRING_FORWARD = datetime(2026, 3, 29, 1, 0, tzinfo=timezone.utc)
#: cdc.lsn_time_mapping's times are datetime: 1/300 s.
ROUNDING_MS = 4


def _commit_at(standin: SqlServerStandIn, at: datetime, customer: int, balance: int) -> tuple[int, int]:
    """Commits one update with the server's clock at ``at``; returns the bounds (ms, UTC) of its commit time."""
    standin.set_clock(at)
    before = standin.server_now()
    standin.execute_tsql("UPDATE dbo.customers SET balance = ? WHERE id = ?", (balance, customer))
    after = standin.server_now()
    standin.wait_until_captured()  # rendered in the zone with this clock (set_clock's contract)
    return int(before.timestamp() * 1000) - ROUNDING_MS, int(after.timestamp() * 1000) + ROUNDING_MS


def _ts_by_balance(sink) -> dict[int, tuple[int, int]]:
    """Each update's event ts_ms and its transaction's ts_ms, by the balance it wrote."""
    transactions = {t["id"]: t["ts_ms"] for t in read_topic_arrow(str(sink), "shop", "shop.transaction").to_pylist()}
    found = {}
    for event in events_of(sink, "shop", "dbo.customers"):
        if event["op"] == "u":
            found[int(event["after"]["balance"])] = (
                event["source"]["ts_ms"],
                transactions[event["transaction"]["id"]],
            )
    return found


def _started(sqlserver_conn, tmp_path, name: str, at: datetime, **overrides):
    standin, conn_id = sqlserver_conn
    standin.set_time_zone(BERLIN)
    standin.set_clock(at)
    workload.create(standin, customers=6, orders_per_customer=1)
    standin.wait_until_captured()
    errors: dict = {}
    capture = make_capture(conn_id, tmp_path, standin.database, **overrides)
    dag = capture_dag(f"{name}_{standin.database}", capture, errors)
    return standin, dag, errors


def test_setup_fails_when_the_server_is_not_in_the_configured_zone(sqlserver_conn, tmp_path):
    # A Berlin server in summer (UTC+02:00) and the default server_time_zone="UTC": every ts_ms
    # would be two hours off. Setup refuses, naming both offsets and how to find the zone.
    standin, dag, errors = _started(sqlserver_conn, tmp_path, "zone", datetime(2026, 7, 1, 12, tzinfo=timezone.utc))
    first = af.run(dag, 0, errors=errors)
    assert first.tasks["setup"] == "failed"
    message = first.error("setup")
    assert "server_time_zone is 'UTC' (UTC+00:00" in message
    assert "UTC+02:00 (DATEPART(TZOFFSET, SYSDATETIMEOFFSET()) = 120)" in message
    assert "CURRENT_TIMEZONE_ID()" in message
    from airflow_provider_cdc.cdc.sources.sqlserver.pending import capture_job_readiness

    with standin.connect() as conn:  # the sensor (and its trigger) refuses too, instead of firing hours off
        refused = capture_job_readiness(conn, datetime(2026, 7, 1, 11, tzinfo=timezone.utc), "UTC")
    assert refused.state == "failed" and "DATEPART(TZOFFSET, SYSDATETIMEOFFSET()) = 120" in refused.message

    # The right zone passes; a server that later moves to another zone fails the next run.
    capture = make_capture(sqlserver_conn[1], tmp_path, standin.database, server_time_zone=BERLIN)
    berlin = capture_dag(f"zone_berlin_{standin.database}", capture, errors)
    assert af.run(berlin, 0, errors=errors).state == "success", errors
    from airflow.sdk import DAG

    from airflow_provider_cdc.operators.window import CdcWindowOperator

    errors.clear()
    with DAG(
        f"zone_windows_{standin.database}",
        schedule=None,
        start_date=af.START,
        default_args={"on_failure_callback": af.failure_recorder(errors)},
    ) as windows:
        CdcWindowOperator(task_id="window", capture=capture)
    af.register(windows)
    standin.set_time_zone("America/New_York")  # the server moved: the next window, not only setup, refuses
    moved = af.run(windows, 1, errors=errors)
    assert moved.tasks["window"] == "failed"
    assert "'Europe/Berlin' (UTC+02:00" in moved.error("window") and "= -240)" in moved.error("window")


def test_commits_across_the_autumn_change_get_their_utc_times(sqlserver_conn, tmp_path):
    from airflow_provider_cdc.cdc.sources.sqlserver.health import assess_retention
    from airflow_provider_cdc.cdc.sources.sqlserver.pending import capture_job_readiness

    standin, dag, errors = _started(
        sqlserver_conn, tmp_path, "autumn", FALL_BACK - timedelta(hours=2), server_time_zone=BERLIN
    )
    assert af.run(dag, 0, errors=errors).state == "success", errors
    expected = {
        # 02:40 CEST (first pass of the repeated hour)
        1: _commit_at(standin, FALL_BACK - timedelta(minutes=20), 1, 1),
    }
    assert af.run(dag, 1, errors=errors).state == "success", errors  # the first pass in its own window
    # 02:10 CET: its local time is *before* the previous commit's (02:40), it is an hour later.
    expected[2] = _commit_at(standin, FALL_BACK + timedelta(minutes=10), 2, 2)

    with standin.connect() as conn:
        ready = capture_job_readiness(conn, FALL_BACK + timedelta(minutes=5), BERLIN)
        assert ready.state == "ready", ready.message
        waiting = capture_job_readiness(conn, FALL_BACK + timedelta(minutes=15), BERLIN)
        assert waiting.state == "waiting", waiting.message

    expected[3] = _commit_at(standin, FALL_BACK + timedelta(minutes=50), 3, 3)  # 02:50 CET, after 02:40 CEST
    expected[4] = _commit_at(standin, FALL_BACK + timedelta(minutes=70), 4, 4)  # 03:10 CET

    # The oldest unread change is the 02:10 CET commit (01:10 UTC), not "02:10" read as CEST.
    unread = standin.admin_query("SELECT start_lsn FROM cdc.lsn_time_mapping ORDER BY start_lsn")[-3][0]
    with standin.connect() as conn:
        health = assess_retention(
            conn, SqlServerLsn(bytes(unread)), max_fraction=1.0, now=standin.server_now(), server_time_zone=BERLIN
        )
    low, high = expected[2]
    assert low <= datetime.fromisoformat(health.oldest_unread).timestamp() * 1000 <= high, health

    assert af.run(dag, 2, errors=errors).state == "success", errors
    found = _ts_by_balance(tmp_path)
    for balance, (low, high) in expected.items():
        event_ts, transaction_ts = found[balance]
        assert low <= event_ts <= high, (balance, event_ts, low, high)
        assert transaction_ts == event_ts


def test_commits_across_the_spring_change_get_their_utc_times(sqlserver_conn, tmp_path):
    from airflow_provider_cdc.cdc.sources.sqlserver.pending import capture_job_readiness

    standin, dag, errors = _started(
        sqlserver_conn, tmp_path, "spring", SPRING_FORWARD - timedelta(hours=1), server_time_zone=BERLIN
    )
    assert af.run(dag, 0, errors=errors).state == "success", errors
    expected = {
        1: _commit_at(standin, SPRING_FORWARD - timedelta(seconds=20), 1, 1),  # 01:59:40 CET
        2: _commit_at(standin, SPRING_FORWARD + timedelta(seconds=20), 2, 2),  # 03:00:20 CEST
    }
    with standin.connect() as conn:
        assert capture_job_readiness(conn, SPRING_FORWARD + timedelta(seconds=10), BERLIN).state == "ready"
        assert capture_job_readiness(conn, SPRING_FORWARD + timedelta(minutes=1), BERLIN).state == "waiting"
    assert af.run(dag, 1, errors=errors).state == "success", errors
    found = _ts_by_balance(tmp_path)
    for balance, (low, high) in expected.items():
        event_ts, transaction_ts = found[balance]
        assert low <= event_ts <= high, (balance, event_ts, low, high)
        assert transaction_ts == event_ts


def test_a_time_bounded_window_in_the_repeated_hour_ends_at_the_right_commit(sqlserver_conn, tmp_path):
    # upto_time 00:50 UTC (02:50 CEST): the 02:10 CET commit (01:10 UTC) has an earlier local time
    # but is after it; the 02:40 CEST commit (00:40 UTC) is before it.
    from airflow.sdk import DAG

    from airflow_provider_cdc.operators.window import CdcWindowOperator

    standin, dag, errors = _started(
        sqlserver_conn, tmp_path, "bounded", FALL_BACK - timedelta(hours=2), server_time_zone=BERLIN
    )
    assert af.run(dag, 0, errors=errors).state == "success", errors
    _commit_at(standin, FALL_BACK - timedelta(minutes=20), 1, 1)
    _commit_at(standin, FALL_BACK + timedelta(minutes=10), 2, 2)
    capture = dag.task_dict["window"].capture
    with DAG(f"bounded_w_{standin.database}", schedule=None, start_date=af.START) as bounded:
        CdcWindowOperator(task_id="window", capture=capture, upto_time=(FALL_BACK - timedelta(minutes=10)).isoformat())
    af.register(bounded)
    run = af.run(bounded, 1, errors=errors)
    assert run.state == "success", errors
    window_id = run.xcom["window"]["window_id"]
    balances = [
        int(e["after"]["balance"])
        for e in events_of(tmp_path, "shop", "dbo.customers")
        if e["op"] == "u" and e["window_id"] == window_id
    ]
    assert balances == [1]


def test_the_standins_clock_functions_are_local_to_its_zone(sqlserver):
    # What each function returns (Microsoft Learn, each function's page; clock.sql): GETDATE() and
    # SYSDATETIME() local time, SYSUTCDATETIME()/GETUTCDATE() UTC, DATEPART(TZOFFSET,
    # SYSDATETIMEOFFSET()) the zone's offset now in minutes; lsn_time_mapping the local commit time.
    sqlserver.set_time_zone(BERLIN)
    sqlserver.execute_tsql("CREATE TABLE dbo.t (id int NOT NULL PRIMARY KEY)")
    sqlserver.enable_db()
    sqlserver.enable_table("dbo", "t")
    for at, offset in ((FALL_BACK - timedelta(minutes=20), 120), (FALL_BACK + timedelta(minutes=10), 60)):
        sqlserver.set_clock(at)
        local, utc, utc_ms, tz = sqlserver.execute_tsql(
            "SELECT SYSDATETIME(), SYSUTCDATETIME(), GETUTCDATE(), DATEPART(TZOFFSET, SYSDATETIMEOFFSET())"
        )[0]
        getdate = sqlserver.execute_tsql("SELECT GETDATE()")[0][0]
        assert tz == offset
        assert abs(utc.replace(tzinfo=timezone.utc) - at) < timedelta(seconds=5)
        assert abs(utc_ms - utc) < timedelta(seconds=1)
        assert abs((local - utc) - timedelta(minutes=offset)) < timedelta(milliseconds=10)
        assert abs((getdate - utc) - timedelta(minutes=offset)) < timedelta(seconds=1)
        sqlserver.execute_tsql("INSERT INTO dbo.t (id) VALUES (?)", (offset,))
        sqlserver.wait_until_captured()
        end_time = sqlserver.execute_tsql(
            "SELECT TOP (1) tran_end_time FROM cdc.lsn_time_mapping ORDER BY start_lsn DESC"
        )[0][0]
        assert abs(end_time - (at + timedelta(minutes=offset)).replace(tzinfo=None)) < timedelta(seconds=5)
