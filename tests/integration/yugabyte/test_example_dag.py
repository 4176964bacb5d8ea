"""The YugabyteDB example DAG (dags/examples/yugabytedb_cdc_hourly.py) under dag.test() on the stand-in."""

from __future__ import annotations

import importlib.util
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.support import airflow as af
from tests.support import yb_workload as workload
from tests.support.oracle import assert_same_state, events_of, replay

pytestmark = [pytest.mark.airflow, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[3]


def load_example_dag():
    path = ROOT / "dags" / "examples" / "yugabytedb_cdc_hourly.py"
    spec = importlib.util.spec_from_file_location("yugabytedb_cdc_hourly", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag, module.capture


def _interval_ends_at(dag, when: datetime) -> None:
    """dag.test() runs at fixed logical dates; point the run's interval end at ``when`` instead, the
    way ``{{ data_interval_end }}`` would for a scheduled run ending then."""
    dag.task_dict["interval_committed"].wait_until = when.isoformat()
    dag.task_dict["capture_window"].upto_time = when.isoformat()


def test_example_dag_captures_each_interval_exactly(yugabyte_conn, tmp_path, monkeypatch):
    from airflow.models import Variable

    standin, conn_id = yugabyte_conn
    workload.create(standin, customers=8, orders_per_customer=2)
    monkeypatch.setenv("CDC_EXAMPLE_YUGABYTEDB_CONN_ID", conn_id)
    monkeypatch.setenv("CDC_EXAMPLE_SINK_PATH", str(tmp_path / "lake"))
    monkeypatch.setenv("CDC_EXAMPLE_STATE_PATH", str(tmp_path / "state"))
    Variable.delete("cdc_offset__shop")
    dag, _capture = load_example_dag()
    errors: dict = {}
    dag.default_args["on_failure_callback"] = af.failure_recorder(errors)
    af.register(dag)

    _interval_ends_at(dag, datetime.now(timezone.utc))
    first = af.run(dag, 0, errors=errors)  # the snapshot, and an empty window after it
    assert first.state == "success", errors
    assert set(first.tasks.values()) == {"success"}, first.tasks
    assert first.xcom["snapshot"]["events"] == {"shop.public.customers": {"r": 8}, "shop.public.orders": {"r": 16}}
    assert first.xcom["capture_window"]["changes"] == 0
    assert first.xcom["slot_health"]["healthy"] is True

    # Each window holds exactly the commits before its interval's end.
    made = workload.mutate(standin, 1)
    time.sleep(0.2)
    boundary = datetime.now(timezone.utc)
    time.sleep(0.2)
    later = workload.mutate(standin, 2)
    _interval_ends_at(dag, boundary)
    second = af.run(dag, 1, errors=errors)
    assert second.state == "success", errors
    assert second.tasks["snapshot"] == "skipped"
    window = second.xcom["capture_window"]
    assert {op: sum(c.get(op, 0) for c in window["events"].values()) for op in "cud"} == made

    _interval_ends_at(dag, datetime.now(timezone.utc))
    third = af.run(dag, 2, errors=errors)
    assert third.state == "success", errors
    window = third.xcom["capture_window"]
    assert {op: sum(c.get(op, 0) for c in window["events"].values()) for op in "cud"} == later
    for table, keys in workload.KEYS.items():
        assert_same_state(
            replay(events_of(tmp_path / "lake", "shop", table), keys), workload.source_rows(standin, table)
        )
    states = {r["topic"]: r["rows"] for r in third.xcom["current_state"]}
    assert states == {f"shop.{t}": len(workload.source_rows(standin, t)) for t in workload.TABLES}
    health = third.xcom["slot_health"]
    assert health["healthy"] is True and 0 < health["ms_to_expiry"] <= 8 * 3_600_000
