"""The CDC-service example DAG (dags/examples/yugabytedb_cdc_service_hourly.py) under dag.test() on
the stand-in, as the scenario suite: under each record type, the snapshot, windows of exactly
their intervals, transactions whole across tablets, and the current state equal to the source."""

from __future__ import annotations

import importlib.util
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import pytest

from airflow_provider_cdc.cdc.basics.naming import Topic
from tests.support import airflow as af
from tests.support import yb_workload as workload
from tests.support.oracle import assert_same_state, events_of, replay, spark_rows
from tests.support.yugabyte_cdc import airflow_connection, standin_for

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.pg]
ROOT = Path(__file__).resolve().parents[3]


def load_example_dag():
    path = ROOT / "dags" / "examples" / "yugabytedb_cdc_service_hourly.py"
    spec = importlib.util.spec_from_file_location("yugabytedb_cdc_service_hourly", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag, module.capture


def _interval_ends_at(dag, when: datetime) -> None:
    dag.task_dict["interval_committed"].wait_until = when.isoformat()
    dag.task_dict["capture_window"].upto_time = when.isoformat()


@pytest.fixture
def yb(request, pg15):
    yield from standin_for(request, pg15, rpc_heartbeat_interval=0.3, snapshot_batch_size=4)


def ops(window: dict) -> dict[str, int]:
    return {op: sum(c.get(op, 0) for c in window["events"].values()) for op in "cud"}


@pytest.mark.parametrize("record_type", ["CHANGE"])  # ALL: test_capture.py, test_stream.py
def test_example_dag_reproduces_the_source(yb, airflow_db, spark, tmp_path, monkeypatch, record_type):
    from airflow.models import Variable

    from airflow_provider_cdc.cdc.state.jobs import read_state

    workload.create(yb, customers=8, orders_per_customer=2)
    yb.wait_caught_up()
    stream = yb.create_stream(record_type, "EXPLICIT", tables=["customers", "orders"])
    conn_id = f"ybx_{yb.database}"
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        airflow_connection(yb),
    )
    monkeypatch.setenv("CDC_EXAMPLE_YUGABYTEDB_CONN_ID", conn_id)
    monkeypatch.setenv("CDC_EXAMPLE_STREAM_ID", stream)
    lake, state_path = tmp_path / "lake", tmp_path / "state"
    monkeypatch.setenv("CDC_EXAMPLE_SINK_PATH", str(lake))
    monkeypatch.setenv("CDC_EXAMPLE_STATE_PATH", str(state_path))
    monkeypatch.setenv("CDC_EXAMPLE_SPARK_CONN_ID", "")
    Variable.delete("cdc_offset__shop")
    dag, _capture = load_example_dag()
    errors: dict = {}
    dag.default_args["on_failure_callback"] = af.failure_recorder(errors)
    af.register(dag)

    # written after the stream's snapshot time: not in the snapshot, in the first window
    early = workload.mutate(yb, 0)
    yb.wait_caught_up()
    _interval_ends_at(dag, datetime.now(timezone.utc))
    first = af.run(dag, 0, errors=errors)
    assert first.state == "success", errors
    assert set(first.tasks.values()) == {"success"}, first.tasks
    assert first.xcom["snapshot"]["events"] == {"shop.public.customers": {"r": 8}, "shop.public.orders": {"r": 16}}
    assert ops(first.xcom["capture_window"]) == early
    assert first.xcom["stream_health"]["healthy"] is True

    # each window holds exactly the commits before its interval's end
    made = workload.mutate(yb, 1)
    time.sleep(0.2)
    boundary = datetime.now(timezone.utc)
    time.sleep(0.2)
    later = workload.mutate(yb, 2)
    yb.wait_caught_up()
    _interval_ends_at(dag, boundary)
    second = af.run(dag, 1, errors=errors)
    assert second.state == "success", errors
    assert second.tasks["snapshot"] == "skipped"
    assert ops(second.xcom["capture_window"]) == made

    _interval_ends_at(dag, datetime.now(timezone.utc))
    third = af.run(dag, 2, errors=errors)
    assert third.state == "success", errors
    assert ops(third.xcom["capture_window"]) == later

    for table, keys in workload.KEYS.items():
        source = workload.source_rows(yb, table)
        assert_same_state(replay(events_of(lake, "shop", table), keys), source)
        schema, name = table.split(".")
        state = read_state(
            spark, state_path=str(state_path), topic_prefix="shop", topic=Topic.for_table("shop", schema, name)
        )
        assert_same_state(spark_rows(state, keys), source)

    # transactions are whole: every transaction's events in one window, as many as its END row says,
    # and the two-table transactions of the workload span tablets
    events = [e for t in workload.TABLES for e in events_of(lake, "shop", t) if e["op"] != "r"]
    tablets_of, windows_of, counts = defaultdict(set), defaultdict(set), defaultdict(int)
    for event in events:
        tx = event["transaction"]["id"]
        tablets_of[tx].add(event["source"]["tablet_id"])
        windows_of[tx].add(event["window_id"])
        counts[tx] += 1
    assert all(len(w) == 1 for w in windows_of.values())
    assert any(len(t) > 1 for t in tablets_of.values()), dict(list(tablets_of.items())[:5])
    ends = {r["id"]: r for r in events_of(lake, "shop", "transaction") if r["status"] == "END"}
    assert {tx: end["event_count"] for tx, end in ends.items()} == dict(counts)
