"""YugabyteDB's (logical replication) changes sensor in runs with and without a data interval, in
both modes."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.cdc.sources.yugabyte.admin import create_slot
from tests.integration.test_sensors import check_runs_with_and_without_an_interval, sensor_dag
from tests.integration.yugabyte.test_capture import make_capture
from tests.support import yb_workload as workload
from tests.support.yugabyte.fixtures import airflow_connection

pytestmark = [pytest.mark.airflow]


@pytest.mark.parametrize("deferrable", [False, True], ids=["poke", "deferrable"])
def test_the_sensor_runs_with_and_without_a_data_interval(yugabyte, airflow_db, tmp_path, monkeypatch, deferrable):
    conn_id = f"yb_{yugabyte.database}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", airflow_connection(yugabyte))
    workload.create(yugabyte, customers=1, orders_per_customer=0)
    errors: dict = {}
    capture = make_capture(conn_id, tmp_path, yugabyte.database)
    # The slot the snapshot task creates, without Spark.
    create_slot(yugabyte.connection_info(), capture.resolved_slot_name, capture.lsn_type)
    dag = sensor_dag(f"sensor_{yugabyte.database}", capture, errors, deferrable=deferrable)
    check_runs_with_and_without_an_interval(dag, errors, deferrable)
