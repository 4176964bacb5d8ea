"""A table whose schema and name need escaping in a directory name (a space, a quote, a
semicolon, ``%``, ``:`` and non-ASCII) flows through the operators in every sink format that
can hold it: the snapshot and a window land it, the current state folds it (Spark reads the
escaped directory through Hadoop, where ``%`` and ``:`` are special), maintenance compacts it,
and the outlets (Airflow Assets, OpenLineage datasets) name the directories that hold it. Delta
cannot (delta-rs opens no path with ``%``): it is refused when the DAG is parsed."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from airflow_provider_cdc.cdc.state.jobs import read_state
from airflow_provider_cdc.operators.current_state import CdcCurrentStateOperator
from airflow_provider_cdc.operators.table_maintenance import CdcTableMaintenanceOperator
from airflow_provider_cdc.operators.window import CdcWindowOperator
from tests.support.crash import CrashCapture
from tests.support.oracle import assert_same_state, spark_rows

pytestmark = [pytest.mark.spark]

SCHEMA, TABLE = "Sales Dept; 100%", "o'rders: été%20"
NAME = f'"{SCHEMA}"."{TABLE}"'


@pytest.mark.parametrize("sink_format", ["parquet", "iceberg", "delta"])
def test_escaped_names_flow_from_window_to_state_and_maintenance(db15, spark, tmp_path, monkeypatch, sink_format):
    from psycopg import sql

    lake, state_path = tmp_path / "lake", str(tmp_path / "state")
    conn_id = f"esc_{db15.name}"
    capture = CrashCapture(db15, conn_id, "acc", lake, {NAME: ["id"]}, overrides={"sink_format": sink_format})
    if sink_format == "delta":
        with pytest.raises(CdcConfigurationError, match="sink_format='delta' cannot hold table"):
            capture.capture()
        return
    table = sql.SQL("{}.{}").format(sql.Identifier(SCHEMA), sql.Identifier(TABLE))
    with db15.connect() as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
        conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text)").format(table))
        conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'a'), (2, 'b')").format(table))
        conn.execute("CREATE SCHEMA cdc_state")
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", db15.cluster.airflow_uri(db15.name))
    capture.run("setup")
    capture.run("snapshot")
    with db15.connect() as conn:
        conn.execute(sql.SQL("UPDATE {} SET note = 'c' WHERE id = 1").format(table))
        conn.execute(sql.SQL("INSERT INTO {} VALUES (3, 'd')").format(table))
    capture.catch_up()
    topic = Topic.for_table("acc", SCHEMA, TABLE)
    assert read_topic_arrow(str(lake), "acc", topic.name).num_rows == 4  # 2 r, 1 u, 1 c

    state = CdcCurrentStateOperator(task_id="state", capture=capture.capture(), state_path=state_path)
    assert [r["action"] for r in state.execute({})] == ["applied"]
    frame = read_state(spark, state_path=state_path, topic_prefix="acc", topic=topic, sink_format=sink_format)
    expected = {(1,): {"id": 1, "note": "c"}, (2,): {"id": 2, "note": "b"}, (3,): {"id": 3, "note": "d"}}
    assert_same_state(spark_rows(frame, ["id"]), expected)
    if sink_format != "parquet":
        done = CdcTableMaintenanceOperator(task_id="maintain", capture=capture.capture(), retain_hours=0).execute({})
        assert topic.name in done["tables"]

    # Each outlet's URI path (OpenLineage's dataset name) is the directory that holds the data.
    window = CdcWindowOperator(task_id="window", capture=capture.capture())
    (events,) = [o.uri for o in window.outlets if o.extra["topic"] == topic.name]
    (current,) = [o.uri for o in state.outlets]
    assert urlparse(events).path == str(lake / topic.directory) and (lake / topic.directory).is_dir()
    assert urlparse(current).path == f"{state_path}/{topic.directory}"
