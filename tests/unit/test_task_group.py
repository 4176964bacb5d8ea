"""capture_task_group wires each source's tasks the way its DAG needs them (checked at parse)."""

from __future__ import annotations

import itertools

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_provider_cdc.captures.postgres import PostgresCapture
from airflow_provider_cdc.captures.sqlserver import SqlServerCapture
from airflow_provider_cdc.captures.yugabyte import YugabyteCapture
from airflow_provider_cdc.captures.yugabyte_cdc_service import YugabyteCdcServiceCapture
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.task_group import capture_task_group
from airflow_provider_cdc.utils.runs import RUN_END, run_end

COMMON = {"tables": ["public.orders"], "topic_prefix": "shop", "sink_path": "/tmp/lake"}
CAPTURES = {
    "postgres": lambda: PostgresCapture(postgres_conn_id="db", **COMMON),
    "sqlserver": lambda: SqlServerCapture(sqlserver_conn_id="db", **{**COMMON, "tables": ["dbo.orders"]}),
    "yugabyte": lambda: YugabyteCapture(postgres_conn_id="db", **COMMON),
    "yugabyte_cdc": lambda: YugabyteCdcServiceCapture(yugabytedb_conn_id="yb", stream_id="0" * 32, **COMMON),
}
HEALTH = {
    "postgres": ("slot_health", "PostgresCdcSlotHealthOperator"),
    "sqlserver": ("retention_health", "SqlServerCdcRetentionHealthOperator"),
    "yugabyte": ("slot_health", "YugabyteCdcSlotHealthOperator"),
    "yugabyte_cdc": ("stream_health", "YugabyteCdcStreamHealthOperator"),
}


def dag_with(source: str, **kwargs):
    with DAG("d", schedule="@hourly", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), max_active_runs=1) as dag:
        capture_task_group(CAPTURES[source](), **kwargs)
    return dag


def edges(dag) -> set[tuple[str, str]]:
    return {(t.task_id, d) for t in dag.tasks for d in t.downstream_task_ids}


@pytest.mark.parametrize("source", sorted(CAPTURES))
def test_each_source_gets_its_shape_and_trigger_rules(source):
    dag = dag_with(source, state_path="/tmp/state")
    health_id, health_class = HEALTH[source]
    g = "cdc_shop."
    tasks = dag.task_dict
    bounded = source != "postgres"
    chain = [g + "setup", g + "snapshot", *([g + "interval_complete"] if bounded else []), g + "capture_window"]
    expected = set(itertools.pairwise(chain)) | {
        (g + "capture_window", g + "current_state"),
        (g + "capture_window", g + health_id),
    }
    assert edges(dag) == expected
    assert type(tasks[g + health_id]).__name__ == health_class
    assert tasks[g + health_id].trigger_rule == "all_done"  # runs when the window failed too
    assert tasks[g + "capture_window"].trigger_rule == "none_failed"  # after a skipped snapshot
    if bounded:
        sensor = tasks[g + "interval_complete"]
        assert sensor.trigger_rule == "none_failed" and sensor.mode == "reschedule"
        # wait_until's default is the run's end (resolved at run time), the window's bound RUN_END.
        assert sensor.wait_until is None and tasks[g + "capture_window"].upto_time == RUN_END
    else:
        assert tasks[g + "capture_window"].upto_time is None


def test_options_drop_and_add_tasks_and_pass_arguments():
    dag = dag_with(
        "postgres",
        group_id="orders",
        wait_for_interval=True,
        health=False,
        sensor_kwargs={"deferrable": True, "poke_interval": 5},
        window_kwargs={"signals": [{"type": "execute-snapshot", "data": {"data-collections": ["public.orders"]}}]},
    )
    assert sorted(dag.task_dict) == [
        "orders.capture_window",
        "orders.interval_complete",
        "orders.setup",
        "orders.snapshot",
    ]
    sensor = dag.task_dict["orders.interval_complete"]
    assert sensor.deferrable and sensor.poke_interval == 5
    # PostgreSQL's window ends at the slot's position when it runs: no time bound.
    assert dag.task_dict["orders.capture_window"].upto_time is None
    assert dag.task_dict["orders.capture_window"].signals


def test_refuses_more_than_one_active_run_and_use_outside_a_dag():
    with pytest.raises(CdcConfigurationError, match="max_active_runs=1"):
        with DAG("d", schedule="@hourly", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), max_active_runs=4):
            capture_task_group(CAPTURES["postgres"]())
    with pytest.raises(CdcConfigurationError, match="capture object"):
        with DAG("d", schedule="@hourly", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), max_active_runs=1):
            capture_task_group({"postgres_conn_id": "db"})  # type: ignore[arg-type]


def test_run_end_renders_with_and_without_a_data_interval():
    import jinja2

    template = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(RUN_END)

    class Run:
        run_after = pendulum.datetime(2026, 3, 1, 12, tz="UTC")

    end = pendulum.datetime(2026, 3, 1, 11, tz="UTC")
    assert template.render(data_interval_end=end, dag_run=Run()) == str(end)
    assert template.render(dag_run=Run()) == str(Run.run_after)  # manual run: no interval in the context
    assert template.render(data_interval_end=None, dag_run=Run()) == str(Run.run_after)
    # The sensor's default resolves the same rule in Python.
    assert run_end({"data_interval_end": end, "dag_run": Run()}) == end
    assert run_end({"dag_run": Run()}) == Run.run_after
