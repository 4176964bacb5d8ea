"""The example DAG, as shipped, runs green through dag.test() (what the demo does)."""

from __future__ import annotations

import importlib.util

import pytest

from airflow_provider_cdc.cdc.lsn import Lsn
from airflow_provider_cdc.cdc.naming import Topic
from airflow_provider_cdc.cdc.state import read_state
from airflow_provider_cdc.testing import shop
from tests.conftest import ROOT
from tests.support import airflow as af
from tests.support.oracle import assert_same_state, events_of, replay, source_rows, spark_rows

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

KEYS = {"public.customers": ["id"], "public.orders": ["id"], "public.order_items": ["order_id", "line_no"]}


def load_example_dag():
    path = ROOT / "dags" / "examples" / "postgres_cdc_hourly.py"
    spec = importlib.util.spec_from_file_location("postgres_cdc_hourly", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag, module.capture


def example_setup(db, tmp_path, monkeypatch):
    """The shop database, the example DAG's environment, and the DAG with failures recorded."""
    from airflow.models import Variable

    with db.connect() as conn:
        shop.create_schema(conn)
        shop.seed(conn)
    monkeypatch.setenv("AIRFLOW_CONN_SHOP_DB", db.cluster.airflow_uri(db.name))
    monkeypatch.setenv("CDC_EXAMPLE_SINK_PATH", str(tmp_path))
    monkeypatch.setenv("CDC_EXAMPLE_STATE_PATH", str(tmp_path / "state"))
    Variable.delete("cdc_offset__shop")
    dag, capture = load_example_dag()
    errors: dict = {}
    dag.default_args["on_failure_callback"] = af.failure_recorder(errors)
    return dag, capture, errors


def test_example_dag_three_hourly_runs(db15, airflow_db, spark, tmp_path, monkeypatch, capfd):
    from airflow.models import Variable

    db = db15
    dag, capture, errors = example_setup(db, tmp_path, monkeypatch)
    results = []
    keep_size_warnings = []
    for hour in range(3):
        if hour:
            with db.connect() as conn:
                shop.mutate(conn, round_no=hour)
        capfd.readouterr()
        results.append(af.run(dag, hour, errors=errors))
        assert results[-1].state == "success", errors
        printed = capfd.readouterr()  # dag.test() prints the task logs
        keep_size_warnings.append([line for line in printed.out.splitlines() if "keep_size is -1" in line])
    # The test cluster keeps WAL without limit: said once, by the setup that created the slot.
    assert [len(lines) for lines in keep_size_warnings] == [1, 0, 0], keep_size_warnings
    assert "warning" in keep_size_warnings[0][0] and "PostgresCdcSetupOperator" in keep_size_warnings[0][0]
    assert [r.tasks["snapshot"] for r in results] == ["success", "skipped", "skipped"]
    windows = [r.xcom["capture_window"] for r in results]
    assert [w["from_lsn"] for w in windows[1:]] == [w["to_lsn"] for w in windows[:-1]]
    status = db.slot_status(capture.resolved_slot_name)
    assert status.confirmed_flush_lsn == Lsn(windows[-1]["to_lsn"])
    assert [r.tasks["current_state"] for r in results] == ["success"] * 3
    health = [r.xcom["slot_health"] for r in results]
    assert all(h["healthy"] and h["metrics"]["wal_status"] == "reserved" for h in health)
    assert health[-1]["metrics"]["confirmed_flush_lsn"] == windows[-1]["to_lsn"]
    with db.connect() as conn:
        for table, keys in KEYS.items():
            source = source_rows(conn, table, keys)
            assert_same_state(replay(events_of(tmp_path, "shop", table), keys), source)
            schema, name = table.split(".")
            state = read_state(
                spark,
                state_path=str(tmp_path / "state"),
                topic_prefix="shop",
                topic=Topic.for_table("shop", schema, name),
            )
            assert_same_state(spark_rows(state, keys), source)
    Variable.delete("cdc_offset__shop")
