"""The SQL Server source end to end on the stand-in: the shared operators under dag.test(), real Spark."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.captures.sqlserver import SqlServerCapture
from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from airflow_provider_cdc.operators.setup import CdcSetupOperator
from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator
from airflow_provider_cdc.operators.window import CdcWindowOperator
from tests.support import airflow as af
from tests.support.oracle import assert_same_state, events_of, replay
from tests.support.sqlserver import workload

pytestmark = [pytest.mark.airflow, pytest.mark.spark]


def make_capture(conn_id: str, sink, database: str, **overrides) -> SqlServerCapture:
    from airflow_provider_cdc.offsets.variable import VariableOffsetStore

    overrides.setdefault("offset_store", VariableOffsetStore(key_prefix=f"cdc_offset_{database}__"))
    overrides.setdefault("tables", list(workload.TABLES))
    return SqlServerCapture(
        sqlserver_conn_id=conn_id,
        topic_prefix="shop",
        sink_path=str(sink),
        **{"spark_master": "local[2]", **overrides},
    )


def capture_dag(dag_id: str, capture: SqlServerCapture, errors: dict, **window_kwargs):
    from airflow.sdk import DAG

    with DAG(
        dag_id,
        schedule="@hourly",
        start_date=af.START,
        catchup=False,
        max_active_runs=1,
        default_args={"on_failure_callback": af.failure_recorder(errors)},
    ) as dag:
        (
            CdcSetupOperator(task_id="setup", capture=capture)
            >> CdcSnapshotOperator(task_id="snapshot", capture=capture)
            >> CdcWindowOperator(task_id="window", capture=capture, **window_kwargs)
        )
    af.register(dag)
    return dag


def assert_reproduces_source(standin, sink) -> None:
    for table, keys in workload.KEYS.items():
        assert_same_state(replay(events_of(sink, "shop", table), keys), workload.source_rows(standin, table))


def test_snapshot_and_windows_reproduce_the_source(sqlserver_conn, tmp_path):
    standin, conn_id = sqlserver_conn
    workload.create(standin)
    standin.wait_until_captured()
    errors: dict = {}
    dag = capture_dag(f"ss_{standin.database}", make_capture(conn_id, tmp_path, standin.database), errors)

    first = af.run(dag, 0, errors=errors)
    assert first.state == "success", errors
    snapshot, window = first.xcom["snapshot"], first.xcom["window"]
    assert snapshot["events"] == {"shop.dbo.customers": {"r": 10}, "shop.dbo.orders": {"r": 20}}
    assert window["from_lsn"] == snapshot["to_lsn"]
    assert_reproduces_source(standin, tmp_path)

    made = workload.mutate(standin, 1)
    standin.wait_until_captured()
    second = af.run(dag, 1, errors=errors)
    assert second.state == "success", errors
    ops = {t: dict(c) for t, c in second.xcom["window"]["events"].items()}
    total = {op: sum(c.get(op, 0) for c in ops.values()) for op in "cud"}
    assert total == made
    assert second.xcom["window"]["transactions"] == 4
    assert_reproduces_source(standin, tmp_path)

    # The two-table transaction: one BEGIN/END pair whose counts name both tables.
    transactions = read_topic_arrow(str(tmp_path), "shop", "shop.transaction").to_pylist()
    ends = [t for t in transactions if t["status"] == "END" and t["event_count"] == 3]
    assert len(ends) == 1
    assert {d["data_collection"]: d["event_count"] for d in ends[0]["data_collections"]} == {
        "dbo.customers": 1,
        "dbo.orders": 2,
    }
    events = events_of(tmp_path, "shop", "dbo.customers")
    update = next(e for e in events if e["op"] == "u")
    assert update["before"]["name"] + "!" == update["after"]["name"]
    assert update["source"]["connector"] == "sqlserver" and update["source"]["commit_lsn"].count(":") == 2
