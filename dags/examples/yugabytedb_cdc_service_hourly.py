"""Hourly change capture of a YugabyteDB shop database through its CDC service (the "gRPC" protocol).

For clusters that cannot use logical replication: a DB stream created by the DBA with
``yb-admin create_change_data_stream ysql.shop EXPLICIT ALL`` is read tablet by tablet over
YugabyteDB's own RPC. Each run captures exactly the transactions committed up to its data
interval's end (``upto_time``; positions are commit hybrid times), once the sensor has seen the
cluster's clock pass it. The snapshot task runs once: it reads the stream's consistent snapshot,
tablet by tablet on Spark. Then one task folds the new window into current-state tables, and a
health check fails (alerting) well before YugabyteDB expires a stream that is not read for
``cdc_intent_retention_ms`` (8 h), even when the window itself failed.

Prerequisites (docs/yugabytedb.md#the-cdc-service-grpc-connector): an EXPLICIT stream holding the
captured tables (each with a primary key), a role that can read them over YSQL, and the masters'
RPC port (7100) reachable from the workers.

Everything it needs is in the settings below: the ``shop_yb`` Airflow connection (type
``yugabytedb_cdc``: a YSQL endpoint, schema = the database, extra ``{"master_addresses":
"m1:7100,m2:7100,m3:7100", "rpc_ssl_root_cert": "/path/to/ca.crt"}``: the RPC client speaks
verified TLS unless the extra says ``"rpc_sslmode": "disable"``), the stream id and two
directories. The tests point them elsewhere through the ``CDC_EXAMPLE_*`` environment variables;
nothing else is read from the environment.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG

from airflow_provider_cdc.capture import YugabyteCdcServiceCapture
from airflow_provider_cdc.operators.current_state import CdcCurrentStateOperator
from airflow_provider_cdc.operators.setup import CdcSetupOperator
from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator
from airflow_provider_cdc.operators.window import CdcWindowOperator
from airflow_provider_cdc.operators.yugabyte_health import YugabyteCdcStreamHealthOperator
from airflow_provider_cdc.sensors.cdc import CdcChangesSensor
from airflow_provider_cdc.utils.runs import RUN_END

# -- Settings ------------------------------------------------------------------------------------
# An Airflow connection of type yugabytedb_cdc to a YSQL endpoint; its extra names the masters.
YUGABYTEDB_CONN_ID = os.environ.get("CDC_EXAMPLE_YUGABYTEDB_CONN_ID", "shop_yb")
# The DB stream (`yb-admin list_change_data_streams` prints it): EXPLICIT checkpoints, any record type.
STREAM_ID = os.environ.get("CDC_EXAMPLE_STREAM_ID", "00000000000000000000000000000000")
TABLES = ["public.customers", "public.orders"]
# Names the topics (shop.public.orders, ...) and the stored offset (the Airflow Variable cdc_offset__shop).
TOPIC_PREFIX = "shop"
SINK_PATH = os.environ.get("CDC_EXAMPLE_SINK_PATH", "/tmp/airflow-provider-cdc/yugabytedb-cdc-lake")
STATE_PATH = os.environ.get("CDC_EXAMPLE_STATE_PATH", "/tmp/airflow-provider-cdc/yugabytedb-cdc-state")
# None runs the Spark jobs in the task's own process; an Airflow "spark" connection submits them.
SPARK_CONN_ID = os.environ.get("CDC_EXAMPLE_SPARK_CONN_ID") or None
# --------------------------------------------------------------------------------------------------

capture = YugabyteCdcServiceCapture(
    yugabytedb_conn_id=YUGABYTEDB_CONN_ID,
    stream_id=STREAM_ID,
    tables=TABLES,
    topic_prefix=TOPIC_PREFIX,
    sink_path=SINK_PATH,
    spark_conn_id=SPARK_CONN_ID,
    snapshot_mode="initial",
)

with DAG(
    dag_id="yugabytedb_cdc_service_hourly",
    schedule="@hourly",  # setup refuses a schedule slower than the stream's retention
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # one reader per stream (the capture lock enforces it too)
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30)},
    tags=["cdc", "example", "yugabytedb"],
) as dag:
    setup = CdcSetupOperator(task_id="setup", capture=capture)
    snapshot = CdcSnapshotOperator(task_id="snapshot", capture=capture)
    complete = CdcChangesSensor(
        task_id="interval_committed",
        capture=capture,
        mode="reschedule",
        poke_interval=30,
        timeout=3600,
        trigger_rule="none_failed",  # after a snapshot task that is skipped once the snapshot exists
    )
    window = CdcWindowOperator(task_id="capture_window", capture=capture, upto_time=RUN_END)
    state = CdcCurrentStateOperator(task_id="current_state", capture=capture, state_path=STATE_PATH)
    health = YugabyteCdcStreamHealthOperator(task_id="stream_health", capture=capture, trigger_rule="all_done")
    setup >> snapshot >> complete >> window >> [state, health]
