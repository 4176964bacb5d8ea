"""What a real SQL Server shows a least-privileged login, beyond the tables it reads: the database's
GUID (the offset's identity), CDC's catalog, and change tables written before ``__$command_id``
existed. Each case was found by a review of the product's T-SQL against Microsoft's pages, and each
fails with the statement that fixes it instead of a wrong identity, a raw error, or an instance taken
for disabled.
"""

from __future__ import annotations

import logging

import pyodbc
import pytest

from airflow_provider_cdc.cdc.basics.errors import ServerConfigurationError
from airflow_provider_cdc.cdc.sources.sqlserver import admin
from tests.integration.sqlserver.test_permissions import LOGIN, PASSWORD, _login_capture

pytestmark = [pytest.mark.airflow]


@pytest.fixture
def shop(sqlserver):
    """dbo.orders captured (one change), a login with every grant docs/sqlserver.md documents."""
    sqlserver.execute_tsql(
        "CREATE TABLE [dbo].[orders] ([id] int NOT NULL PRIMARY KEY, [qty] int NULL, [price] int NULL)"
    )
    sqlserver.enable_db()
    sqlserver.set_snapshot_isolation(True)
    sqlserver.enable_table("dbo", "orders")
    sqlserver.execute_tsql("INSERT INTO [dbo].[orders] VALUES (?, ?, ?)", (1, 2, 3))
    sqlserver.wait_until_captured()
    sqlserver.create_login(LOGIN, PASSWORD)
    sqlserver.execute_tsql(f"GRANT SELECT ON [dbo].[orders] TO [{LOGIN}]")
    sqlserver.execute_tsql(f"GRANT SELECT ON SCHEMA::[cdc] TO [{LOGIN}]")
    conn = pyodbc.connect(sqlserver.connection_string(user=LOGIN, password=PASSWORD), autocommit=True)
    try:
        yield sqlserver, conn
    finally:
        conn.close()


def test_a_hidden_database_guid_is_refused_not_stored_as_an_identity(shop, airflow_db, monkeypatch, tmp_path):
    """Learn, sys.database_recovery_status: a database other than master and tempdb shows there only
    to its owner or with VIEW ANY DATABASE, which public holds unless revoked (a common hardening).
    The GUID then reads as NULL: setup and every run refuse, naming the grant, where the offset's
    identity would otherwise have been the same text for every such database."""
    sqlserver, conn = shop
    assert admin.server_info(conn).database_guid is not None  # public's default VIEW ANY DATABASE
    sqlserver.execute_tsql("REVOKE VIEW ANY DATABASE FROM public")
    info = admin.server_info(conn)
    assert info.database_guid is None and info.login == LOGIN
    grant = f"GRANT VIEW ANY DATABASE TO [{LOGIN}];"
    assert any(grant in p for p in admin.check_server(info, needs_snapshot_isolation=True))
    with pytest.raises(ServerConfigurationError, match=r"GRANT VIEW ANY DATABASE"):
        info.require_guid()

    capture = _login_capture(sqlserver, monkeypatch, tmp_path)
    with pytest.raises(Exception, match=r"GRANT VIEW ANY DATABASE") as refused:
        capture.setup(logging.getLogger("access"))
    assert "NONE" not in str(refused.value)
    with pytest.raises(ServerConfigurationError, match=r"GRANT VIEW ANY DATABASE"):
        with capture.open_run(logging.getLogger("access")):
            pass

    sqlserver.execute_tsql(grant)
    assert admin.server_info(conn).database_guid == admin.server_info(sqlserver.connect()).database_guid
    capture.setup(logging.getLogger("access"))


def test_an_unreadable_cdc_catalog_is_named_with_its_grant(shop):
    """cdc.change_tables refused (error 229: a server that does not show CDC's catalog to a login
    without the cdc schema's SELECT; Debezium's checkIfConnectedUserHasAccessToCDCTable reads that
    query's failure so too) is reported with the grant, not raised as a driver error."""
    sqlserver, conn = shop
    sqlserver.admin_query(f'REVOKE SELECT ON cdc.change_tables FROM "{LOGIN}"')
    sqlserver.execute_tsql(f"REVOKE SELECT ON SCHEMA::[cdc] FROM [{LOGIN}]")
    found, problems = admin.describe_tables(conn, [admin.TableRef("dbo", "orders")])
    assert found == {}
    assert len(problems) == 1 and f"GRANT SELECT ON SCHEMA::[cdc] TO [{LOGIN}];" in problems[0], problems
    assert "cdc.change_tables" in problems[0]


def test_a_change_table_without_command_id_is_refused_at_setup(shop, airflow_db, monkeypatch, tmp_path):
    """KB3030352 added __$command_id in a cumulative update of 2012-2016; change tables that
    sp_vupgrade_replication did not upgrade (an Always On secondary upgraded first, no replication
    components: Microsoft's "CDC functionality may break after upgrading to the latest CU") lack it,
    and both query modes order by it: setup names the upgrade."""
    sqlserver, conn = shop
    sqlserver.admin_query('ALTER TABLE cdc."dbo_orders_CT" DROP COLUMN "__$command_id"')
    found, _ = admin.describe_tables(conn, [admin.TableRef("dbo", "orders")])
    problems = admin.check_command_ids(conn, list(found.values()))
    assert len(problems) == 1 and "'dbo_orders'" in problems[0] and "sp_vupgrade_replication" in problems[0]
    with pytest.raises(Exception, match=r"sp_vupgrade_replication"):
        _login_capture(sqlserver, monkeypatch, tmp_path).setup(logging.getLogger("access"))


def test_a_computed_column_without_select_is_named_not_taken_for_a_disabled_instance(sqlserver):
    """Reading change data needs SELECT on *all* captured columns of the source table (Learn,
    sys.fn_cdc_get_min_lsn, Permissions); a computed column is a captured column (cdc.captured_columns
    lists it, is_computed = 1) though the product leaves its NULLs out of the events."""
    sqlserver.execute_tsql(
        "CREATE TABLE [dbo].[priced] ([id] int NOT NULL PRIMARY KEY, [qty] int NULL, "
        "[total] AS (CAST([qty] * 2 AS int)))"
    )
    sqlserver.enable_db()
    sqlserver.enable_table("dbo", "priced")
    sqlserver.execute_tsql("INSERT INTO [dbo].[priced] ([id], [qty]) VALUES (1, 2)")
    sqlserver.wait_until_captured()
    sqlserver.create_login(LOGIN, PASSWORD)
    sqlserver.execute_tsql(f"GRANT SELECT ON SCHEMA::[cdc] TO [{LOGIN}]")
    sqlserver.execute_tsql(f"GRANT SELECT ([id], [qty]) ON [dbo].[priced] TO [{LOGIN}]")
    conn = pyodbc.connect(sqlserver.connection_string(user=LOGIN, password=PASSWORD), autocommit=True)
    try:
        assert admin.value(conn, "SELECT sys.fn_cdc_get_min_lsn(?)", "dbo_priced") == b"\x00" * 10
        with pytest.raises(ServerConfigurationError) as raised:
            admin.min_lsn(conn, "dbo_priced")
        assert "[total]" in str(raised.value) and "not authorized" in str(raised.value)
        sqlserver.execute_tsql(f"GRANT SELECT ([total]) ON [dbo].[priced] TO [{LOGIN}]")
        assert admin.min_lsn(conn, "dbo_priced") is not None
    finally:
        conn.close()
