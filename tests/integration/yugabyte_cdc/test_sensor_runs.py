"""The CDC-service capture's changes sensor in runs with and without a data interval, in both
modes (deferrable: the cluster's clock watched from the triggerer)."""

from __future__ import annotations

import pytest

from tests.integration.test_sensors import check_runs_with_and_without_an_interval, sensor_dag
from tests.integration.yugabyte_cdc.test_capture import make_capture
from tests.support.yugabyte_cdc import airflow_connection, standin_for

pytestmark = [pytest.mark.airflow, pytest.mark.pg]


@pytest.fixture(scope="module")
def yb(request, clusters):
    yield from standin_for(request, clusters["pg15"], rpc_heartbeat_interval=0.3)


@pytest.mark.parametrize("deferrable", [False, True], ids=["poke", "deferrable"])
def test_the_sensor_runs_with_and_without_a_data_interval(yb, airflow_db, tmp_path, monkeypatch, deferrable):
    conn_id = f"ybc_{yb.database}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", airflow_connection(yb))
    with yb.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS sensed (id int PRIMARY KEY)")
    yb.wait_caught_up()
    stream = yb.create_stream("CHANGE", "EXPLICIT", tables=["sensed"])
    capture = make_capture(conn_id, stream, tmp_path, ["public.sensed"], snapshot_mode="never")
    errors: dict = {}
    dag = sensor_dag(f"sensor_{yb.database}_{deferrable}", capture, errors, deferrable=deferrable)
    check_runs_with_and_without_an_interval(dag, errors, deferrable)
