"""Hourly change capture of a shop database: setup → snapshot → window → current state.

Each run captures one finite window of committed changes into Debezium-shaped Parquet
datasets (one per table, plus ``shop.transaction``) and acknowledges the slot afterwards.
The snapshot task runs once (``snapshot_mode="initial"``) and is skipped afterwards. Then one
task folds the new window into current-state tables (one row per key, like the source), and a
health check reports the slot's lag and fails (alerting) well before the server's
``max_slot_wal_keep_size`` would invalidate the slot, even when the window itself failed.

Configuration comes from the ``shop_db`` Airflow connection (type postgres) and the
``CDC_EXAMPLE_SINK_PATH`` / ``CDC_EXAMPLE_STATE_PATH`` environment variables; the demo
(scripts/demo.sh) sets them.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG

from airflow_provider_cdc.capture import PostgresCapture
from airflow_provider_cdc.operators.postgres_cdc import (
    PostgresCdcBatchOperator,
    PostgresCdcCurrentStateOperator,
    PostgresCdcSetupOperator,
    PostgresCdcSnapshotOperator,
)
from airflow_provider_cdc.operators.slot_maintenance import PostgresCdcSlotHealthOperator

capture = PostgresCapture(
    postgres_conn_id="shop_db",
    tables=["public.customers", "public.orders", "public.order_items"],
    topic_prefix="shop",
    sink_path=os.environ.get("CDC_EXAMPLE_SINK_PATH", "/tmp/airflow-provider-cdc/lake"),
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
    setup = PostgresCdcSetupOperator(task_id="setup", capture=capture)
    snapshot = PostgresCdcSnapshotOperator(task_id="snapshot", capture=capture)
    window = PostgresCdcBatchOperator(task_id="capture_window", capture=capture)
    state = PostgresCdcCurrentStateOperator(
        task_id="current_state",
        capture=capture,
        state_path=os.environ.get("CDC_EXAMPLE_STATE_PATH", "/tmp/airflow-provider-cdc/state"),
    )
    health = PostgresCdcSlotHealthOperator(task_id="slot_health", capture=capture, trigger_rule="all_done")
    setup >> snapshot >> window >> [state, health]
