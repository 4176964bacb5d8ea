"""The YugabyteDB source against the stand-in (docs/yugabytedb-standin.md), under real Airflow and Spark."""

from __future__ import annotations

import pytest

from tests.support.yugabyte.fixtures import airflow_connection, standin_for


@pytest.fixture
def yugabyte(request, pg15):
    yield from standin_for(request, pg15, active_window_ms=1000)


@pytest.fixture
def yugabyte_conn(yugabyte, airflow_db, spark, monkeypatch):
    """The stand-in, its Airflow connection id, with Airflow's metadata DB and Spark ready."""
    conn_id = f"yb_{yugabyte.database}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", airflow_connection(yugabyte))
    return yugabyte, conn_id
