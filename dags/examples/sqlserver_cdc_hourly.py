"""Hourly change capture of a SQL Server shop database: setup → snapshot → wait → window → current state.

Each run captures exactly its data interval's commits (``upto_time``: the window ends after the
last commit before the interval's end, mapped through ``sys.fn_cdc_map_time_to_lsn``), once the
sensor has seen SQL Server's capture job pass that time. The snapshot task runs once
(``snapshot_mode="initial"``) and is skipped afterwards. Then one task folds the new window into
current-state tables, and a health check fails (alerting) well before the cleanup job's
retention would purge changes the capture has not read, even when the window itself failed.

The DBA enables CDC first (docs/sqlserver.md): ``EXEC sys.sp_cdc_enable_db`` and
``EXEC sys.sp_cdc_enable_table`` for each table, snapshot isolation for the default
``snapshot_isolation_mode``, and a login with SELECT on the tables and the ``cdc`` schema.

Everything it needs is in the settings below: the ``shop_mssql`` Airflow connection (type
``mssql_cdc``; schema = the database; the ``driver`` extra names the ODBC driver) and two directories.
The Spark jobs run in the task's process unless ``SPARK_CONN_ID`` names a Spark connection. The
tests point the settings elsewhere through the ``CDC_EXAMPLE_*`` environment variables; nothing
else is read from the environment.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG

from airflow_provider_cdc.capture import SqlServerCapture
from airflow_provider_cdc.operators.current_state import CdcCurrentStateOperator
from airflow_provider_cdc.operators.setup import CdcSetupOperator
from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator
from airflow_provider_cdc.operators.sqlserver_health import SqlServerCdcRetentionHealthOperator
from airflow_provider_cdc.operators.window import CdcWindowOperator
from airflow_provider_cdc.sensors.cdc import CdcChangesSensor
from airflow_provider_cdc.utils.runs import RUN_END

# -- Settings ------------------------------------------------------------------------------------
# An Airflow connection of type mssql_cdc (or mssql); its "schema" field is the database (here: shop).
SQLSERVER_CONN_ID = os.environ.get("CDC_EXAMPLE_SQLSERVER_CONN_ID", "shop_mssql")
# Captured tables: each needs a capture instance (sys.sp_cdc_enable_table) and a primary key.
TABLES = ["dbo.customers", "dbo.orders"]
# Names the topics (shop.dbo.orders, ...) and the stored offset (the Airflow Variable cdc_offset__shop).
TOPIC_PREFIX = "shop"
# Where the change events land (a directory every worker can write, or a Hadoop URI such as
# s3a://bucket/cdc), and where the current-state tables are rebuilt. /tmp is for trying it out.
SINK_PATH = os.environ.get("CDC_EXAMPLE_SINK_PATH", "/tmp/airflow-provider-cdc/sqlserver-lake")
STATE_PATH = os.environ.get("CDC_EXAMPLE_STATE_PATH", "/tmp/airflow-provider-cdc/sqlserver-state")
# Where the Spark jobs run: None runs them in the task's own process (embedded local Spark);
# the id of an Airflow "spark" connection submits them with spark-submit (spark://..., yarn,
# k8s://...; client mode; see docs/deployment.md).
SPARK_CONN_ID = os.environ.get("CDC_EXAMPLE_SPARK_CONN_ID") or None
# --------------------------------------------------------------------------------------------------

capture = SqlServerCapture(
    sqlserver_conn_id=SQLSERVER_CONN_ID,
    tables=TABLES,
    topic_prefix=TOPIC_PREFIX,
    sink_path=SINK_PATH,
    spark_conn_id=SPARK_CONN_ID,
    snapshot_mode="initial",
)

with DAG(
    dag_id="sqlserver_cdc_hourly",
    schedule="@hourly",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # one reader per capture (also enforced by the operators' capture lock)
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30)},
    tags=["cdc", "example", "sqlserver"],
) as dag:
    setup = CdcSetupOperator(task_id="setup", capture=capture)
    snapshot = CdcSnapshotOperator(task_id="snapshot", capture=capture)
    # The capture job works asynchronously: wait until it has processed the whole interval.
    complete = CdcChangesSensor(
        task_id="interval_captured",
        capture=capture,
        mode="reschedule",
        poke_interval=30,
        timeout=3600,
        trigger_rule="none_failed",  # after a snapshot task that is skipped once the snapshot exists
    )
    window = CdcWindowOperator(task_id="capture_window", capture=capture, upto_time=RUN_END)
    state = CdcCurrentStateOperator(task_id="current_state", capture=capture, state_path=STATE_PATH)
    health = SqlServerCdcRetentionHealthOperator(task_id="retention_health", capture=capture, trigger_rule="all_done")
    setup >> snapshot >> complete >> window >> [state, health]
