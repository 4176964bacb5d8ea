"""YugabyteDB windows land in Iceberg and Delta tables like PostgreSQL's (the sink is shared)."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.cdc.sinks.reader import committed_windows
from tests.integration.yugabyte.test_capture import assert_reproduces_source, capture_dag, make_capture
from tests.support import airflow as af
from tests.support import yb_workload as workload
from tests.support.crash import assert_tables_hold_the_log

pytestmark = [pytest.mark.airflow, pytest.mark.spark]


@pytest.mark.parametrize("sink_format", ["iceberg", "delta"])
def test_snapshot_and_windows_land_in_lake_tables(yugabyte_conn, tmp_path, sink_format):
    standin, conn_id = yugabyte_conn
    workload.create(standin)
    errors: dict = {}
    capture = make_capture(conn_id, tmp_path, standin.database, sink_format=sink_format)
    dag = capture_dag(f"yb_{sink_format}_{standin.database}", capture, errors)
    assert af.run(dag, 0, errors=errors).state == "success", errors
    made = workload.mutate(standin, 1)
    second = af.run(dag, 1, errors=errors)
    assert second.state == "success", errors
    window = second.xcom["window"]
    assert {op: sum(c.get(op, 0) for c in window["events"].values()) for op in "cud"} == made
    assert_reproduces_source(standin, tmp_path)
    entries = committed_windows(str(tmp_path), "shop")
    assert all(d.table and d.table["format"] == sink_format for e in entries for d in e.datasets)
    assert_tables_hold_the_log(str(tmp_path), "shop", entries, sink_format)
