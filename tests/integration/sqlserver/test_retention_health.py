"""Retention health without db_owner: ``msdb.dbo.cdc_jobs`` is in msdb, which a login reads only
with a grant there (the stand-in enforces it: a ``create_login`` login cannot read it until
``grant_msdb_cdc_jobs``), and Azure SQL Database has no names into msdb at all (error 40515).
``sys.sp_cdc_help_jobs`` reports the same rows in the database, but needs db_owner
(learn.microsoft.com/en-us/sql/relational-databases/system-stored-procedures/sys-sp-cdc-help-jobs-transact-sql,
Permissions). The health check uses the first it can read, or a retention configured on the
operator, and otherwise says the retention is unknown and what to grant.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pyodbc
import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.sqlserver import health
from tests.support.sqlserver import SqlServerStandIn

LOGIN, PASSWORD = "cdc_health_reader", "s3cret!"


def _prepared(standin: SqlServerStandIn) -> None:
    standin.execute_tsql("CREATE TABLE [dbo].[orders] ([id] int NOT NULL PRIMARY KEY)")
    standin.enable_db()
    standin.enable_table("dbo", "orders")
    standin.create_login(LOGIN, PASSWORD)


def _login(standin: SqlServerStandIn):
    return pyodbc.connect(standin.connection_string(user=LOGIN, password=PASSWORD), autocommit=True)


def _assess(conn, **kwargs) -> health.RetentionHealth:
    return health.assess_retention(conn, None, max_fraction=0.8, now=datetime.now(timezone.utc), **kwargs)


def test_a_public_only_login_gets_retention_unknown_with_the_grants(sqlserver):
    _prepared(sqlserver)
    conn = _login(sqlserver)
    try:
        result = _assess(conn)
    finally:
        conn.close()
    assert result.healthy is False
    assert result.retention_minutes is None and result.retention_source == "unknown"
    assert "(229)" in result.message  # msdb.dbo.cdc_jobs: SELECT denied
    assert "(22904)" in result.message  # sys.sp_cdc_help_jobs: db_owner only
    assert f"USE msdb; CREATE USER [{LOGIN}] FOR LOGIN [{LOGIN}]; GRANT SELECT ON dbo.cdc_jobs TO [{LOGIN}];" in (
        result.message
    )
    assert "retention_minutes" in result.message


def test_the_msdb_grant_is_enough(sqlserver):
    _prepared(sqlserver)
    sqlserver.grant_msdb_cdc_jobs(LOGIN)
    conn = _login(sqlserver)
    try:
        result = _assess(conn)
    finally:
        conn.close()
    assert (result.healthy, result.retention_minutes, result.retention_source) == (True, 4320, "msdb.dbo.cdc_jobs")


def test_a_configured_retention_needs_no_access(sqlserver):
    _prepared(sqlserver)
    conn = _login(sqlserver)
    try:
        result = _assess(conn, retention_minutes=60)
    finally:
        conn.close()
    assert (result.healthy, result.retention_minutes, result.retention_source) == (True, 60, "configured")
    with pytest.raises(CdcConfigurationError, match="retention_minutes"):
        _assess(conn, retention_minutes=0)


def test_the_preflight_names_the_grant_without_failing(sqlserver):
    _prepared(sqlserver)
    conn = _login(sqlserver)
    try:
        warning = health.retention_access_warning(conn)
    finally:
        conn.close()
    assert warning is not None and "GRANT SELECT ON dbo.cdc_jobs" in warning


@pytest.fixture
def azure(request, pg15):
    """A stand-in under the Azure SQL Database setting (no three-part names into msdb)."""
    standin = SqlServerStandIn(pg15, "ss_azure_health", azure_sql_database=True, poll_interval=0.05).start()
    try:
        yield standin
    finally:
        standin.stop()


def test_azure_sql_database_refuses_msdb_and_sp_cdc_help_jobs_answers_a_db_owner(azure):
    _prepared(azure)
    conn = azure.connect()  # the superuser: db_owner's stand-in
    try:
        with pytest.raises(pyodbc.Error, match=r"Reference to database and/or server name in 'msdb.dbo.cdc_jobs'"):
            conn.cursor().execute(health.RETENTION_SQL)
        result = _assess(conn)
    finally:
        conn.close()
    assert (result.healthy, result.retention_minutes, result.retention_source) == (True, 4320, "sys.sp_cdc_help_jobs")
