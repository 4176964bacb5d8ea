"""A DAG wired by capture_task_group, run for real (dag.test, the SQL Server stand-in, Spark), in
runs without a data interval: the sensor and the window end at the run's ``run_after``."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from airflow_provider_cdc.captures.sqlserver import SqlServerCapture
from airflow_provider_cdc.offsets.variable import VariableOffsetStore
from airflow_provider_cdc.task_group import capture_task_group
from tests.support import airflow as af
from tests.support.oracle import assert_same_state, events_of, replay
from tests.support.sqlserver import workload

pytestmark = [pytest.mark.airflow, pytest.mark.spark]


def triggered_now(standin, noise: int) -> float:
    """``af.run``'s hour whose ``run_after`` is now (a manual run's ``run_after`` is when it was
    triggered), then a commit after it: the sensor waits for the capture job to pass ``run_after``,
    which a real SQL Server's idle capture job does by itself; the stand-in's needs a commit."""
    time.sleep(1.0)  # af.run gives run_after in whole seconds: after every commit made so far
    hour = (datetime.now(timezone.utc) - af.START).total_seconds() / 3600
    time.sleep(0.2)
    standin.execute_tsql(f"INSERT INTO dbo.heartbeat (id) VALUES ({noise})")  # a table outside the capture
    standin.wait_until_captured()
    return hour


def test_manual_runs_of_a_grouped_dag_capture_up_to_their_run_after(sqlserver_conn, tmp_path):
    from airflow.sdk import DAG

    standin, conn_id = sqlserver_conn
    workload.create(standin, customers=4, orders_per_customer=2)
    standin.execute_tsql("CREATE TABLE dbo.heartbeat (id int NOT NULL PRIMARY KEY)")
    standin.enable_table("dbo", "heartbeat")
    standin.wait_until_captured()
    capture = SqlServerCapture(
        sqlserver_conn_id=conn_id,
        tables=list(workload.TABLES),
        topic_prefix="shop",
        sink_path=str(tmp_path / "lake"),
        offset_store=VariableOffsetStore(key_prefix=f"cdc_offset_group_{standin.database}__"),
        spark_master="local[2]",
    )
    errors: dict = {}
    with DAG(
        f"grouped_{standin.database}",
        schedule="@hourly",
        start_date=af.START,
        max_active_runs=1,
        default_args={"on_failure_callback": af.failure_recorder(errors)},
    ) as dag:
        capture_task_group(
            capture, state_path=str(tmp_path / "state"), sensor_kwargs={"poke_interval": 1, "timeout": 60}
        )
    af.register(dag)

    first = af.run(dag, triggered_now(standin, 1), errors=errors, with_interval=False)
    assert first.state == "success", errors
    assert set(first.tasks.values()) == {"success"}, first.tasks
    assert first.xcom["cdc_shop.capture_window"]["changes"] == 0

    made = workload.mutate(standin, 1)
    standin.wait_until_captured()
    second = af.run(dag, triggered_now(standin, 2), errors=errors, with_interval=False)
    assert second.state == "success", errors
    assert second.tasks["cdc_shop.snapshot"] == "skipped"
    assert second.tasks["cdc_shop.retention_health"] == "success"
    window = second.xcom["cdc_shop.capture_window"]
    assert {op: sum(c.get(op, 0) for c in window["events"].values()) for op in "cud"} == made
    for table, keys in workload.KEYS.items():
        assert_same_state(
            replay(events_of(tmp_path / "lake", "shop", table), keys), workload.source_rows(standin, table)
        )
    states = {r["topic"]: r["rows"] for r in second.xcom["cdc_shop.current_state"]}
    assert states == {f"shop.{t}": len(workload.source_rows(standin, t)) for t in workload.TABLES}
