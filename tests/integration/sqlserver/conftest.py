"""The SQL Server source against the stand-in (docs/sqlserver-standin.md), under real Airflow and Spark."""

from __future__ import annotations

import pytest

from tests.support.sqlserver import StatementRecorder
from tests.support.sqlserver.fixtures import airflow_connection, standin_for

#: Every statement the product and the tests send in this folder, checked as T-SQL by the last test.
RECORDER = StatementRecorder()


@pytest.fixture
def sqlserver(request, pg15):
    yield from standin_for(request, pg15, RECORDER)


@pytest.fixture
def sqlserver_conn(sqlserver, airflow_db, spark, monkeypatch):
    """The stand-in, its Airflow connection id, with Airflow's metadata DB and Spark ready."""
    conn_id = f"mssql_{sqlserver.database}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", airflow_connection(sqlserver))
    return sqlserver, conn_id
