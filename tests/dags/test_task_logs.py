"""Task logs as a scheduler leaves them: nothing from Spark's or the JVM's start-up above INFO.

A scheduler's worker runs each task in a process whose standard error Airflow logs at ERROR
level, line by line, so whatever the JVM prints on start (``WARNING: Using incubator modules:
jdk.incubator.vector``) would land in every Spark task's log as an error. ``dag.test()`` cannot
show that (it runs tasks in its own process), so the DAG here runs under the task SDK's
supervisor (``tests/support/supervised.py``) in a fresh interpreter, and the test reads the task
logs it writes under ``AIRFLOW_HOME``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_cdc.testing import shop
from tests.conftest import ROOT

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

DAG_FILE = """
import pendulum
from airflow.sdk import DAG

from airflow_provider_cdc.capture import PostgresCapture
from airflow_provider_cdc.operators.setup import CdcSetupOperator
from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator
from airflow_provider_cdc.operators.window import CdcWindowOperator
from airflow_provider_cdc.operators.slot_maintenance import PostgresCdcSlotHealthOperator

capture = PostgresCapture(
    postgres_conn_id="task_logs_db",
    tables={tables!r},
    topic_prefix="task_logs",
    sink_path={sink!r},
    spark_master="local[2]",
)
with DAG("task_logs", schedule="@hourly", start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
    (
        CdcSetupOperator(task_id="setup", capture=capture)
        >> CdcSnapshotOperator(task_id="snapshot", capture=capture)
        >> CdcWindowOperator(task_id="window", capture=capture)
        >> PostgresCdcSlotHealthOperator(task_id="slot_health", capture=capture)
    )
"""

KEEP_SIZE_WARNING = "max_slot_wal_keep_size is -1 (unlimited)"


def test_spark_task_logs_carry_no_jvm_start_up_noise_above_info(db15, tmp_path):
    with db15.connect() as conn:
        shop.create_schema(conn)
        shop.seed(conn, customers=3, orders_per_customer=1)
    dags, home = tmp_path / "dags", tmp_path / "airflow"
    dags.mkdir()
    (dags / "task_logs.py").write_text(DAG_FILE.format(tables=list(shop.TABLES), sink=str(tmp_path / "lake")))
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__EXECUTOR": "tests.support.supervised.SupervisingExecutor",
        "AIRFLOW_CONN_TASK_LOGS_DB": db15.cluster.airflow_uri(db15.name),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.supervised", "task_logs", "2026-01-01T00:00:00+00:00"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["tasks"] == dict.fromkeys(("setup", "snapshot", "window", "slot_health"), "success"), result

    logs = {task: _records(home, task) for task in result["tasks"]}
    assert any("Spark session ready" in r["event"] for r in logs["snapshot"])  # the task started a JVM
    above_info = {
        task: [f"{r['level']} [{r.get('logger')}] {r['event']}" for r in records if r["level"] not in ("debug", "info")]
        for task, records in logs.items()
    }
    # The one warning of a healthy first run: setup created the slot on a server that keeps WAL without
    # limit, and says so once (the health check states it at INFO).
    assert [KEEP_SIZE_WARNING in line for line in above_info.pop("setup")] == [True], above_info
    assert above_info == {"snapshot": [], "window": [], "slot_health": []}
    (health,) = [r["event"] for r in logs["slot_health"] if "is healthy" in r["event"]]
    assert "max_slot_wal_keep_size unlimited" in health and "running-transactions record" in health


def _records(home: Path, task_id: str) -> list[dict]:
    """The JSON records of a task's log, where Airflow writes it (the default log_filename_template)."""
    (path,) = (home / "logs" / "dag_id=task_logs").glob(f"run_id=*/task_id={task_id}/attempt=1.log")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert records, path
    return records
