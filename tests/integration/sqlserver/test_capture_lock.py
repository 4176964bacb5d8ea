"""The capture lock (``admin.LOCK_SQL``) is a real T-SQL batch, run as one against the stand-in.

``sys.sp_getapplock`` is called in a batch that returns its return code with ``SELECT @result``.
On SQL Server every statement of a batch that changes rows (also inside a procedure) sends a row
count (a DONE token, which the ODBC driver turns into a result without columns) unless SET NOCOUNT
is ON (KB 240882; learn.microsoft.com/en-us/sql/t-sql/statements/set-nocount-transact-sql). The
stand-in runs batches statement by statement with that rule (tests/support/sqlserver/translate.py,
translate_batch), and its sp_getapplock records the request with one row of DML, so the old batch
(no NOCOUNT, reading the first result) meets a row count where it expected the code.
"""

from __future__ import annotations

import pyodbc
import pytest

from airflow_provider_cdc.cdc.basics.errors import ConcurrentCaptureError
from airflow_provider_cdc.cdc.sources.sqlserver import admin

#: The batch the product sent before SET NOCOUNT ON (admin.py before this change).
OLD_LOCK_SQL = (
    "DECLARE @result int; "
    "EXEC @result = sys.sp_getapplock @Resource = ?, @LockMode = N'Exclusive', @LockOwner = N'Session', "
    "@LockTimeout = 0; "
    "SELECT @result"
)


def test_the_lock_batch_is_in_the_statement_registry():
    from tests.support.sqlserver.statements import STATEMENTS

    assert admin.LOCK_SQL.replace("?", "N'airflow-provider-cdc:0'") in STATEMENTS


def test_the_old_batch_without_nocount_meets_a_row_count_first(sqlserver):
    conn = sqlserver.connect()
    try:
        cursor = conn.cursor()
        cursor.execute(OLD_LOCK_SQL, admin.lock_resource("old"))
        assert cursor.description is None  # the procedure's row count comes first
        with pytest.raises(pyodbc.ProgrammingError):
            cursor.fetchall()  # "No results. Previous SQL was not a query."
        assert cursor.nextset() and [tuple(r) for r in cursor.fetchall()] == [(0,)]  # the code only in the next result
    finally:
        conn.close()


def test_the_products_batch_takes_and_releases_the_lock(sqlserver):
    first, second = sqlserver.connect(), sqlserver.connect()
    try:
        admin.try_capture_lock(first, "shop")
        with pytest.raises(ConcurrentCaptureError, match="already running in another session"):
            admin.try_capture_lock(second, "shop")
        admin.try_capture_lock(second, "another capture")  # another resource: no conflict
        admin.release_capture_lock(first, "shop")
        admin.try_capture_lock(second, "shop")
    finally:
        first.close()
        second.close()


def test_the_lock_is_released_when_its_session_ends(sqlserver):
    first = sqlserver.connect()
    admin.try_capture_lock(first, "shop")
    first.close()
    second = sqlserver.connect()
    try:
        admin.try_capture_lock(second, "shop")
    finally:
        second.close()
