"""Not authorized is not disabled: ``sys.fn_cdc_get_min_lsn`` returns 0x00 both for a capture
instance that does not exist and for a caller who may not read its changes ("Returns
0x00000000000000000000 when the capture instance does not exist or when the caller is not authorized
to access the change data associated with the capture instance"; reading them needs SELECT on every
captured column of the source table and, with a gating role, membership of it:
learn.microsoft.com/en-us/sql/relational-databases/system-functions/sys-fn-cdc-get-min-lsn-transact-sql,
Remarks and Permissions). The stand-in enforces that rule (catalog.sql, standin.can_read_instance);
the product must tell the two apart, fail with the grant to add, and never take it for a disabled
instance (which records a gap and re-snapshots).
"""

from __future__ import annotations

import pyodbc
import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcStateError, ServerConfigurationError
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.sources.sqlserver import admin, change_queries
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn

LOGIN, PASSWORD = "cdc_perm_reader", "s3cret!"
ORDERS = TableRef("dbo", "orders")


@pytest.fixture
def gated(sqlserver):
    """dbo.orders captured with gating role cdc_gate (created by sp_cdc_enable_table), one change
    captured, and a login with the cdc schema grant only."""
    sqlserver.execute_tsql(
        "CREATE TABLE [dbo].[orders] ([id] int NOT NULL PRIMARY KEY, [name] nvarchar(100) NULL, [secret] int NULL)"
    )
    sqlserver.enable_db()
    sqlserver.enable_table("dbo", "orders", role_name="cdc_gate", captured_column_list="[id], [name]")
    sqlserver.execute_tsql("INSERT INTO [dbo].[orders] VALUES (?, ?, ?)", (1, "a", 7))
    sqlserver.wait_until_captured()
    sqlserver.create_login(LOGIN, PASSWORD)
    sqlserver.execute_tsql(f"GRANT SELECT ON SCHEMA::[cdc] TO [{LOGIN}]")
    conn = pyodbc.connect(sqlserver.connection_string(user=LOGIN, password=PASSWORD), autocommit=True)
    try:
        yield sqlserver, conn
    finally:
        conn.close()


def _described(conn) -> admin.TableInfo:
    found, problems = admin.describe_tables(conn, [ORDERS])
    assert problems == []
    return found[ORDERS]


def test_an_unauthorized_caller_is_told_the_grants_not_that_the_instance_is_gone(gated):
    _, conn = gated
    assert admin.value(conn, "SELECT sys.fn_cdc_get_min_lsn(?)", "dbo_orders") == b"\x00" * 10
    with pytest.raises(ServerConfigurationError) as raised:
        admin.min_lsn(conn, "dbo_orders")
    message = str(raised.value)
    assert "not authorized" in message
    assert f"ALTER ROLE [cdc_gate] ADD MEMBER [{LOGIN}];" in message
    assert f"GRANT SELECT ON [dbo].[orders] TO [{LOGIN}];" in message


def test_check_retention_does_not_take_unauthorized_for_disabled(gated):
    _, conn = gated
    table = _described(conn)
    part = change_queries.InstanceRange(table.instances[0], SqlServerLsn(1), SqlServerLsn(2))
    with pytest.raises(ServerConfigurationError, match="ADD MEMBER") as raised:
        change_queries.check_retention(conn, [part], {"dbo_orders"})
    assert not isinstance(raised.value, CdcStateError)


def test_the_preflight_reports_the_missing_role_membership_and_select(gated):
    """As setup checks it: the table's SELECT once (check_table_access), the gating role with the
    changes (check_change_access)."""
    _, conn = gated
    problems = admin.check_table_access(conn, [ORDERS]) + admin.check_change_access(conn, [_described(conn)])
    assert len(problems) == 2, problems
    assert f"GRANT SELECT ON [dbo].[orders] TO [{LOGIN}];" in problems[0]
    assert f"ALTER ROLE [cdc_gate] ADD MEMBER [{LOGIN}];" in problems[1]
    assert "GRANT SELECT ON [dbo].[orders]" not in problems[1]


def test_the_preflight_names_the_table_grant_once_for_a_partial_column_grant(gated):
    """SELECT on one captured column only: the snapshot cannot read the table (229, check_table_access
    names the table's GRANT SELECT), which also lets the changes be read: not repeated."""
    sqlserver, conn = gated
    sqlserver.execute_tsql(f"ALTER ROLE [cdc_gate] ADD MEMBER [{LOGIN}]")
    sqlserver.execute_tsql(f"GRANT SELECT ([id]) ON [dbo].[orders] TO [{LOGIN}]")
    with pytest.raises(ServerConfigurationError):
        admin.min_lsn(conn, "dbo_orders")
    problems = admin.check_table_access(conn, [ORDERS]) + admin.check_change_access(conn, [_described(conn)])
    assert len(problems) == 1 and f"GRANT SELECT ON [dbo].[orders] TO [{LOGIN}];" in problems[0], problems


def test_with_the_grants_the_instance_is_readable(gated):
    sqlserver, conn = gated
    sqlserver.execute_tsql(f"ALTER ROLE [cdc_gate] ADD MEMBER [{LOGIN}]")
    # SELECT on the captured columns is enough (the uncaptured [secret] is not needed)
    sqlserver.execute_tsql(f"GRANT SELECT ([id], [name]) ON [dbo].[orders] TO [{LOGIN}]")
    assert admin.min_lsn(conn, "dbo_orders") is not None
    assert admin.check_change_access(conn, [_described(conn)]) == []


def test_membership_alone_is_not_enough(gated):
    sqlserver, conn = gated
    sqlserver.execute_tsql(f"ALTER ROLE [cdc_gate] ADD MEMBER [{LOGIN}]")
    sqlserver.execute_tsql(f"GRANT SELECT ([id]) ON [dbo].[orders] TO [{LOGIN}]")  # not [name]
    with pytest.raises(ServerConfigurationError) as raised:
        admin.min_lsn(conn, "dbo_orders")
    assert "ADD MEMBER" not in str(raised.value)
    assert f"GRANT SELECT ON [dbo].[orders] TO [{LOGIN}];" in str(raised.value)


def test_a_disabled_instance_is_still_reported_as_gone(gated):
    sqlserver, conn = gated
    sqlserver.disable_table("dbo", "orders")
    assert admin.min_lsn(conn, "dbo_orders") is None


def _login_capture(sqlserver, monkeypatch, tmp_path):
    """A capture of dbo.orders through an Airflow connection logging in as LOGIN."""
    import json

    from airflow_provider_cdc.captures.sqlserver import SqlServerCapture
    from tests.support.sqlserver.fixtures import DRIVER_IN_EXTRA_ALLOWED, airflow_connection

    conn_id = f"mssql_perm_{sqlserver.database}"
    fields = {**json.loads(airflow_connection(sqlserver)), "login": LOGIN, "password": PASSWORD}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))
    monkeypatch.setenv(*DRIVER_IN_EXTRA_ALLOWED)
    return SqlServerCapture(
        sqlserver_conn_id=conn_id, tables=["dbo.orders"], topic_prefix="perm", sink_path=str(tmp_path / "sink")
    )


def test_setup_fails_naming_the_gating_role_then_passes_and_notes_the_retention_grant(
    gated, airflow_db, monkeypatch, tmp_path, caplog
):
    import logging

    sqlserver, _conn = gated
    sqlserver.set_snapshot_isolation(True)
    sqlserver.execute_tsql(f"GRANT SELECT ON [dbo].[orders] TO [{LOGIN}]")
    capture = _login_capture(sqlserver, monkeypatch, tmp_path)
    with pytest.raises(Exception) as refused:
        capture.setup(logging.getLogger("perm"))
    message = str(refused.value)
    assert "missing permissions" in message and f"ALTER ROLE [cdc_gate] ADD MEMBER [{LOGIN}];" in message
    assert "no longer exists" not in message and "disabled" not in message

    sqlserver.execute_tsql(f"ALTER ROLE [cdc_gate] ADD MEMBER [{LOGIN}]")
    with caplog.at_level(logging.WARNING, logger="perm"):
        summary = capture.setup(logging.getLogger("perm"))
    assert summary["retention_readable"] is False  # noted, not a failure: only the health check reads it
    assert f"GRANT SELECT ON dbo.cdc_jobs TO [{LOGIN}];" in caplog.text


def test_a_run_fails_with_the_grant_and_records_no_gap(gated, monkeypatch, tmp_path):
    """A run's status (the min LSN of every instance) raises the terminal configuration error: it
    never reaches changes_lost, which would record a gap and re-snapshot."""
    from airflow_provider_cdc.captures.sqlserver import SqlServerRun

    sqlserver, conn = gated
    capture = _login_capture(sqlserver, monkeypatch, tmp_path)
    run = SqlServerRun(capture, capture.hook(), conn, None)  # type: ignore[arg-type]
    run.tables = (ORDERS,)
    with pytest.raises(ServerConfigurationError, match=r"ADD MEMBER") as raised:
        run.status()
    assert raised.value.terminal
