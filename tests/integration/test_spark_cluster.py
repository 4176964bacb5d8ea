"""The example DAG with its Spark jobs on a real Spark standalone cluster (a master and two
workers on loopback, ``tests/support/spark_cluster.py``), submitted through Airflow's
``SparkSubmitHook`` in client mode: the snapshot, the windows and the current-state fold.

The same workload is captured at the same time by a second capture on the same database that
runs its jobs in the task's own process (embedded local Spark). Both slots decode the same
transactions, so the two lakes must hold the same events, except fields that name the capture
or the moment it ran (listed in ``comparable``); and the current-state tables must be equal. The
snapshot's tasks must have run on both workers' executors, read from Spark's own event log.
"""

from __future__ import annotations

import json

import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from airflow_provider_cdc.cdc.state.jobs import read_state
from airflow_provider_cdc.testing import shop
from tests.dags.test_example_dag import KEYS, load_example_dag
from tests.support import airflow as af
from tests.support.oracle import assert_same_state, events_of, replay, source_rows, spark_rows
from tests.support.spark_cluster import SparkCluster

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    started = SparkCluster(tmp_path_factory.mktemp("spark-cluster")).start()
    try:
        yield started
    finally:
        started.stop()


def use_cluster(monkeypatch, cluster: SparkCluster, **extra) -> None:
    for key, value in cluster.env.items():
        monkeypatch.setenv(key, value)
    host, port = cluster.master.rsplit(":", 1)
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_CLUSTER",
        json.dumps({"conn_type": "spark", "host": host, "port": int(port), "extra": extra}),
    )


def local_dag(capture, state_path: str, errors: dict):
    """The example DAG's tasks for a capture whose jobs run in the task's process."""
    from airflow.sdk import DAG

    from airflow_provider_cdc.operators.current_state import CdcCurrentStateOperator
    from airflow_provider_cdc.operators.setup import CdcSetupOperator
    from airflow_provider_cdc.operators.snapshot import CdcSnapshotOperator
    from airflow_provider_cdc.operators.window import CdcWindowOperator

    with DAG(
        "local_twin",
        schedule="@hourly",
        start_date=af.START,
        catchup=False,
        default_args={"on_failure_callback": af.failure_recorder(errors)},
    ) as dag:
        (
            CdcSetupOperator(task_id="setup", capture=capture)
            >> CdcSnapshotOperator(task_id="snapshot", capture=capture)
            >> CdcWindowOperator(task_id="capture_window", capture=capture)
            >> CdcCurrentStateOperator(
                task_id="current_state", capture=capture, state_path=state_path, state_engine="spark"
            )
        )
    af.register(dag)
    return dag


def comparable(event: dict) -> dict:
    """An event without what differs by nature between two captures of the same changes:
    the envelope's ``ts_ms`` (when the capture processed it), ``source.name`` (the topic prefix),
    and for snapshot reads the snapshot's own point (a transaction row's ``ts_ms`` is the commit's
    time and is kept) (``source.lsn``, ``ts_ms``, ``sequence``,
    ``txId``: each capture's snapshot ran at its own slot's consistent point)."""
    out = {k: v for k, v in event.items() if k not in ("ts_ms", "ts_us", "ts_ns")}
    if "source" not in event:  # a transaction row: its id, counts and tables are the source's own
        return {**out, "ts_ms": event.get("ts_ms")}
    source = dict(out["source"])
    source["name"] = None
    if event["op"] == "r":
        for key in ("lsn", "ts_ms", "sequence", "txId", "xmin", "commit_lsn"):
            source.pop(key, None)
    out["source"] = source
    return out


def rows(sink, prefix: str, topic: str) -> list[str]:
    table = read_topic_arrow(str(sink), prefix, f"{prefix}.{topic}")
    assert table is not None, topic
    return sorted(json.dumps(comparable(e), sort_keys=True, default=str) for e in table.to_pylist())


def test_example_dag_on_a_spark_cluster_lands_what_local_spark_lands(
    cluster, db15, airflow_db, spark, tmp_path, monkeypatch
):
    from dataclasses import replace

    from airflow.models import Variable

    db = db15
    with db.connect() as conn:
        shop.create_schema(conn)
        shop.seed(conn)
        conn.execute(
            "INSERT INTO customers (email, name, profile) SELECT 'bulk' || g || '@example.com', 'Bulk ' || g, "
            "jsonb_build_object('note', repeat('x', 200)) FROM generate_series(1, 12000) g"
        )
        conn.execute("ANALYZE customers")
    monkeypatch.setenv("AIRFLOW_CONN_SHOP_DB", db.cluster.airflow_uri(db.name))
    monkeypatch.setenv("CDC_EXAMPLE_SINK_PATH", str(tmp_path / "cluster-lake"))
    monkeypatch.setenv("CDC_EXAMPLE_STATE_PATH", str(tmp_path / "cluster-state"))
    monkeypatch.setenv("CDC_EXAMPLE_SPARK_CONN_ID", "spark_cluster")
    use_cluster(monkeypatch, cluster)
    for key in ("cdc_offset__shop", "cdc_offset__twin"):
        Variable.delete(key)
    dag, capture = load_example_dag()
    assert capture.spark_conn_id == "spark_cluster"
    # Split the snapshot finer than the 256 MiB default (at its 1 MiB minimum), so the customers
    # table (made ~3 MiB below) is read in partitions for both workers.
    capture = replace(capture, snapshot_partition_bytes=1024 * 1024, snapshot_max_partitions=4)
    for task in dag.tasks:
        task.capture = capture
    errors: dict = {}
    dag.default_args["on_failure_callback"] = af.failure_recorder(errors)
    twin = replace(capture, topic_prefix="twin", sink_path=str(tmp_path / "local-lake"), spark_conn_id=None)
    twin_dag = local_dag(twin, str(tmp_path / "local-state"), errors)

    snapshot_window = None
    for hour in range(2):
        # The fold submitted to the cluster first; then state_engine="auto" folds the small window
        # on Arrow in the task's process (no spark-submit) over the cluster's version. The twin's
        # fold runs in embedded Spark: the states must be equal.
        dag.get_task("current_state").state_engine = "auto" if hour else "spark"
        if hour:
            with db.connect() as conn:
                shop.mutate(conn, round_no=hour)
        on_cluster = af.run(dag, hour, errors=errors)
        assert on_cluster.state == "success", errors
        local = af.run(twin_dag, hour, errors=errors)
        assert local.state == "success", errors
        snapshot_window = snapshot_window or on_cluster.xcom["snapshot"]["window_id"]
        window = on_cluster.xcom["capture_window"]
        assert window["job_pid"] != local.xcom["capture_window"]["job_pid"]  # the driver was spark-submit's
        assert window["changes"] == local.xcom["capture_window"]["changes"]
        engines = {r["engine"] for r in on_cluster.xcom["current_state"]}
        assert engines == ({"arrow"} if hour else {"spark"}), on_cluster.xcom["current_state"]
    assert on_cluster.xcom["capture_window"]["changes"] > 0

    # Spark's own record: the snapshot's application ran its tasks on both workers' executors.
    executors = cluster.task_executors()
    assert executors[f"cdc-shop-{snapshot_window}"] == {"0", "1"}, executors

    for table in KEYS:
        assert rows(tmp_path / "cluster-lake", "shop", table) == rows(tmp_path / "local-lake", "twin", table)
    assert rows(tmp_path / "cluster-lake", "shop", "transaction") == rows(
        tmp_path / "local-lake", "twin", "transaction"
    )
    with db.connect() as conn:
        for table, keys in KEYS.items():
            source = source_rows(conn, table, keys)
            assert_same_state(replay(events_of(tmp_path / "cluster-lake", "shop", table), keys), source)
            schema, name = table.split(".")
            for prefix, state in (("shop", "cluster-state"), ("twin", "local-state")):
                frame = read_state(
                    spark,
                    state_path=str(tmp_path / state),
                    topic_prefix=prefix,
                    topic=Topic.for_table(prefix, schema, name),
                )
                assert_same_state(spark_rows(frame, keys), source)
    for key in ("cdc_offset__shop", "cdc_offset__twin"):
        Variable.delete(key)


def test_cluster_deploy_mode_is_refused_before_anything_runs(cluster, tmp_path, monkeypatch, airflow_db):
    from airflow_provider_cdc import spark_runner

    use_cluster(monkeypatch, cluster, **{"deploy-mode": "cluster"})
    before = {a["id"] for a in cluster.status().get("completedapps", []) + cluster.status().get("activeapps", [])}
    with pytest.raises(CdcConfigurationError, match=r"deploy mode 'cluster'.*Nothing was submitted"):
        spark_runner.submit("{}", name="refused", secrets={}, spark_conn_id="spark_cluster", conf={})
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_CLUSTER")
    use_cluster(monkeypatch, cluster)
    with pytest.raises(CdcConfigurationError, match=r"spark\.submit\.deployMode"):
        spark_runner.submit(
            "{}", name="refused", secrets={}, spark_conn_id="spark_cluster", conf={"spark.submit.deployMode": "cluster"}
        )
    status = cluster.status()
    assert {a["id"] for a in status.get("completedapps", []) + status.get("activeapps", [])} == before
