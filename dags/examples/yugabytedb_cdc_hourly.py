"""Hourly change capture of a YugabyteDB shop database: setup → snapshot → wait → window → current state.

YugabyteDB's logical replication (``yboutput``, ``HYBRID_TIME`` slots): each run captures exactly
the transactions committed up to its data interval's end (``upto_time``: a commit's position is
its commit hybrid time), once the sensor has seen the server's clock pass that time. The snapshot
task runs once (``snapshot_mode="initial"``): it creates the slot and reads every table at the
slot's consistent hybrid time. Then one task folds the new window into current-state tables
(under YugabyteDB's default REPLICA IDENTITY CHANGE an update carries only the columns it changed;
the fold keeps the others), and a health check fails (alerting) well before YugabyteDB expires a
slot that is not read for ``cdc_intent_retention_ms`` (8 h), even when the window itself failed.

Prerequisites (docs/yugabytedb.md): YugabyteDB v2024.2 or newer with logical replication enabled,
a role with REPLICATION and SELECT on the tables (and, unless it is a superuser, the
``set_yb_read_time`` procedure of the docs for the snapshot), primary keys on captured tables.

Everything it needs is in the settings below: the ``shop_yb`` Airflow connection (type ``yugabytedb_cdc``,
pointing at a YSQL endpoint; schema = the database) and two directories; the Spark jobs run in
the task's process unless ``SPARK_CONN_ID`` names a Spark connection. The tests point them
elsewhere through the ``CDC_EXAMPLE_*`` environment variables; nothing else is read from the
environment.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG

from airflow_provider_cdc.capture import YugabyteCapture
from airflow_provider_cdc.operators.current_state import CdcCurrentStateOperator
from airflow_provider_cdc.operators.setup import CdcSetupOperator
from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator
from airflow_provider_cdc.operators.window import CdcWindowOperator
from airflow_provider_cdc.operators.yugabyte_health import YugabyteCdcSlotHealthOperator
from airflow_provider_cdc.sensors.cdc import CdcChangesSensor
from airflow_provider_cdc.utils.runs import RUN_END

# -- Settings ------------------------------------------------------------------------------------
# An Airflow connection of type yugabytedb_cdc (or postgres) to a YSQL endpoint; its "schema" field is the database.
YUGABYTEDB_CONN_ID = os.environ.get("CDC_EXAMPLE_YUGABYTEDB_CONN_ID", "shop_yb")
# Captured tables: each needs a primary key.
TABLES = ["public.customers", "public.orders"]
# Names the topics (shop.public.orders, ...), the slot and publication (cdc_shop) and the stored
# offset (the Airflow Variable cdc_offset__shop).
TOPIC_PREFIX = "shop"
# Where the change events land (a directory every worker can write, or a Hadoop URI such as
# s3a://bucket/cdc), and where the current-state tables are rebuilt. /tmp is for trying it out.
SINK_PATH = os.environ.get("CDC_EXAMPLE_SINK_PATH", "/tmp/airflow-provider-cdc/yugabytedb-lake")
STATE_PATH = os.environ.get("CDC_EXAMPLE_STATE_PATH", "/tmp/airflow-provider-cdc/yugabytedb-state")
# Where the Spark jobs run: None runs them in the task's own process (embedded local Spark);
# the id of an Airflow "spark" connection submits them with spark-submit (spark://..., yarn,
# k8s://...; client mode; see docs/deployment.md).
SPARK_CONN_ID = os.environ.get("CDC_EXAMPLE_SPARK_CONN_ID") or None
# --------------------------------------------------------------------------------------------------

capture = YugabyteCapture(
    yugabytedb_conn_id=YUGABYTEDB_CONN_ID,
    tables=TABLES,
    topic_prefix=TOPIC_PREFIX,
    sink_path=SINK_PATH,
    spark_conn_id=SPARK_CONN_ID,
    snapshot_mode="initial",
)

with DAG(
    dag_id="yugabytedb_cdc_hourly",
    schedule="@hourly",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    # One reader per slot: YugabyteDB does not lock a slot to one consumer (the operators' capture
    # lock enforces it too).
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30)},
    tags=["cdc", "example", "yugabytedb"],
) as dag:
    setup = CdcSetupOperator(task_id="setup", capture=capture)
    snapshot = CdcSnapshotOperator(task_id="snapshot", capture=capture)
    # Commits up to the interval's end have hybrid times before the server's clock passes it.
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
    health = YugabyteCdcSlotHealthOperator(task_id="slot_health", capture=capture, trigger_rule="all_done")
    setup >> snapshot >> complete >> window >> [state, health]
