"""Hourly change capture of a shop database: setup → snapshot → window → current state.

Each run captures one finite window of committed changes into Debezium-shaped Parquet
datasets (one per table, plus ``shop.transaction``) and acknowledges the slot afterwards.
The snapshot task runs once (``snapshot_mode="initial"``) and is skipped afterwards. Then one
task folds the new window into current-state tables (one row per key, like the source), and a
health check reports the slot's lag and fails (alerting) well before the server's
``max_slot_wal_keep_size`` would invalidate the slot, even when the window itself failed.

Everything it needs is in the settings below: the ``shop_db`` Airflow connection and two
directories (or object-store prefixes, with an ``aws`` connection); the Spark jobs run in the
task's process unless ``SPARK_CONN_ID`` names a Spark connection. To run it under your
scheduler, copy this file into your DAGs folder and change them (README: "Run it under your
scheduler"). The demo and the tests point the directories (and the tests the Spark connection,
the object store and the sink format) elsewhere through the ``CDC_EXAMPLE_*`` environment
variables; nothing else is read from the environment.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG

from airflow_provider_cdc.capture import PostgresCapture
from airflow_provider_cdc.operators.current_state import CdcCurrentStateOperator
from airflow_provider_cdc.operators.setup import CdcSetupOperator
from airflow_provider_cdc.operators.slot_maintenance import PostgresCdcSlotHealthOperator
from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator
from airflow_provider_cdc.operators.window import CdcWindowOperator

# -- Settings ------------------------------------------------------------------------------------
# An Airflow connection of type postgres_cdc (or postgres); its "schema" field is the database (here: shop).
POSTGRES_CONN_ID = "shop_db"
# Captured tables: each needs a primary key or REPLICA IDENTITY FULL.
TABLES = ["public.customers", "public.orders", "public.order_items"]
# Names the topics (shop.public.orders, ...), the slot and publication (cdc_shop) and the stored
# offset (the Airflow Variable cdc_offset__shop).
TOPIC_PREFIX = "shop"
# Where the change events land (a directory every worker can write, an object store such as
# s3://bucket/cdc, or a Hadoop URI), and where the current-state tables are rebuilt. /tmp is for
# trying it out.
SINK_PATH = os.environ.get("CDC_EXAMPLE_SINK_PATH", "/tmp/airflow-provider-cdc/lake")
STATE_PATH = os.environ.get("CDC_EXAMPLE_STATE_PATH", "/tmp/airflow-provider-cdc/state")
# For paths on S3 (or an S3-compatible store): an Airflow "aws" connection (keys or role, and for
# S3-compatible stores endpoint_url and path-style addressing in its extra). None: the workers'
# own AWS credentials (instance role, environment).
OBJECT_STORE_CONN_ID = os.environ.get("CDC_EXAMPLE_OBJECT_STORE_CONN_ID") or None
# How the datasets are stored: "parquet", or lake tables "delta" or "iceberg" (an Iceberg sink on
# an object store needs a catalog: TABLE_CATALOG_CONN_ID, a connection holding its properties).
SINK_FORMAT = os.environ.get("CDC_EXAMPLE_SINK_FORMAT", "parquet")
TABLE_CATALOG_CONN_ID = os.environ.get("CDC_EXAMPLE_TABLE_CATALOG_CONN_ID") or None
# Where the Spark jobs run: None runs them in the task's own process (embedded local Spark);
# the id of an Airflow "spark" connection submits them with spark-submit (spark://..., yarn,
# k8s://...; client mode; see docs/deployment.md).
SPARK_CONN_ID = os.environ.get("CDC_EXAMPLE_SPARK_CONN_ID") or None
# --------------------------------------------------------------------------------------------------

capture = PostgresCapture(
    postgres_conn_id=POSTGRES_CONN_ID,
    tables=TABLES,
    topic_prefix=TOPIC_PREFIX,
    sink_path=SINK_PATH,
    sink_format=SINK_FORMAT,
    table_catalog_conn_id=TABLE_CATALOG_CONN_ID,
    object_store_conn_id=OBJECT_STORE_CONN_ID,
    spark_conn_id=SPARK_CONN_ID,
    snapshot_mode="initial",
)

with DAG(
    dag_id="postgres_cdc_hourly",
    schedule="@hourly",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # one reader per slot (also enforced by the operators' capture lock)
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30)},
    tags=["cdc", "example"],
) as dag:
    setup = CdcSetupOperator(task_id="setup", capture=capture)
    snapshot = CdcSnapshotOperator(task_id="snapshot", capture=capture)
    window = CdcWindowOperator(task_id="capture_window", capture=capture)
    state = CdcCurrentStateOperator(
        task_id="current_state",
        capture=capture,
        state_path=STATE_PATH,
    )
    health = PostgresCdcSlotHealthOperator(task_id="slot_health", capture=capture, trigger_rule="all_done")
    setup >> snapshot >> window >> [state, health]
