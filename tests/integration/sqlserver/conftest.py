"""The SQL Server source against the stand-in (docs/sqlserver-standin.md), under real Airflow and Spark."""

from __future__ import annotations

import pytest

from tests.support.sqlserver import StatementRecorder
from tests.support.sqlserver.fixtures import DRIVER_IN_EXTRA_ALLOWED, airflow_connection, standin_for

#: A recorder for stand-ins a module starts itself (checked by that module).
RECORDER = StatementRecorder()


@pytest.fixture
def sqlserver(request, pg15):
    """A stand-in for the test; afterwards, every statement sent to it (by the product and the test)
    must parse as T-SQL, so invalid T-SQL cannot hide behind the stand-in's translation."""
    recorder = StatementRecorder()
    yield from standin_for(request, pg15, recorder)
    assert recorder.statements(), "nothing reached the stand-in"
    assert recorder.invalid() == []


@pytest.fixture
def sqlserver_conn(sqlserver, airflow_db, spark, monkeypatch):
    """The stand-in, its Airflow connection id, with Airflow's metadata DB and Spark ready."""
    conn_id = f"mssql_{sqlserver.database}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", airflow_connection(sqlserver))
    monkeypatch.setenv(*DRIVER_IN_EXTRA_ALLOWED)
    return sqlserver, conn_id
