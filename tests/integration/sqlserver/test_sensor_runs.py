"""SQL Server's changes sensor in runs with and without a data interval, in both modes."""

from __future__ import annotations

import pytest

from tests.integration.sqlserver.test_capture import make_capture
from tests.integration.test_sensors import check_runs_with_and_without_an_interval, sensor_dag
from tests.support.sqlserver import workload
from tests.support.sqlserver.fixtures import DRIVER_IN_EXTRA_ALLOWED, airflow_connection

pytestmark = [pytest.mark.airflow]


@pytest.mark.parametrize("deferrable", [False, True], ids=["poke", "deferrable"])
def test_the_sensor_runs_with_and_without_a_data_interval(sqlserver, airflow_db, tmp_path, monkeypatch, deferrable):
    standin = sqlserver
    conn_id = f"mssql_{standin.database}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", airflow_connection(standin))
    monkeypatch.setenv(*DRIVER_IN_EXTRA_ALLOWED)
    workload.create(standin, customers=1, orders_per_customer=0)
    standin.wait_until_captured()
    errors: dict = {}
    capture = make_capture(conn_id, tmp_path, standin.database)
    dag = sensor_dag(f"sensor_{standin.database}", capture, errors, deferrable=deferrable)

    def commit() -> None:
        standin.execute_tsql("UPDATE dbo.customers SET balance = 0 WHERE id = 1")

    check_runs_with_and_without_an_interval(dag, errors, deferrable, commit)
