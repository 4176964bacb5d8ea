"""The demo: the example DAG on embedded defaults, end to end, from nothing.

Starts a throwaway PostgreSQL (wal_level=logical), creates the shop schema with data, then
runs the example DAG ``postgres_cdc_hourly`` through Airflow (``dag.test()`` on a SQLite
metadata DB) for three hourly runs: setup → initial snapshot → window, then two windows with
inserts, updates and deletes made in between (some in multi-table transactions). Ends by
printing what landed. Everything lives under .work/demo and is recreated on every run.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".work" / "demo"
DAG_FILE = ROOT / "dags" / "examples" / "postgres_cdc_hourly.py"


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from airflow_provider_cdc.testing import shop
    from airflow_provider_cdc.testing.postgres_cluster import PostgresCluster, available_flavours, scratch_dir

    _stop_previous_cluster()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    flavours = available_flavours()
    flavour = "pg15" if "pg15" in flavours else next(iter(flavours))
    # The server's files go under the system temp dir: the checkout may sit in a private home
    # directory the postgres OS user cannot enter.
    pg_dir = scratch_dir("cdc-demo-pg-")
    (WORK / "pg_dir").write_text(str(pg_dir))
    print(f"== starting a throwaway PostgreSQL ({flavour}) under {pg_dir}")
    cluster = PostgresCluster(flavours[flavour], pg_dir).start()
    try:
        cluster.create_database("shop")
        with cluster.connect("shop") as conn:
            shop.create_schema(conn)
            seeded = shop.seed(conn)
        print(f"   shop database: {sum(seeded.inserts.values())} rows in {', '.join(shop.TABLES)}")
        return _run_airflow(cluster, shop)
    finally:
        cluster.stop()
        shutil.rmtree(pg_dir, ignore_errors=True)


def _run_airflow(cluster, shop) -> int:
    lake = WORK / "lake"
    os.environ.update(
        {
            "AIRFLOW_HOME": str(WORK / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAG_FILE.parent),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW_CONN_SHOP_DB": cluster.airflow_uri("shop"),
            "CDC_EXAMPLE_SINK_PATH": str(lake),
            "CDC_EXAMPLE_STATE_PATH": str(WORK / "state"),
        }
    )
    import pendulum
    from airflow.models.xcom import XComModel
    from airflow.sdk.log import configure_logging
    from airflow.utils import db
    from airflow.utils.session import create_session

    configure_logging()  # masks connection passwords in task logs
    db.initdb()
    spec = importlib.util.spec_from_file_location("postgres_cdc_hourly", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.dag

    start = pendulum.datetime(2026, 1, 1, tz="UTC")
    runs = []
    for hour in range(3):
        if hour:
            with cluster.connect("shop") as conn:
                made = shop.mutate(conn, round_no=hour)
            print(
                f"\n== hour {hour}: made {made.transactions} transactions in the shop database "
                f"(inserts {made.inserts}, updates {made.updates}, deletes {made.deletes})"
            )
        logical_date = start.add(hours=hour)
        print(f"\n== DAG run for {logical_date.isoformat()}")
        started = time.monotonic()
        run = dag.test(logical_date=logical_date, run_after=logical_date)
        states = {}
        with create_session() as session:
            for ti in run.get_task_instances(session=session):
                row = session.scalars(
                    XComModel.get_many(run_id=run.run_id, dag_ids=dag.dag_id, task_ids=ti.task_id, key="return_value")
                ).first()
                states[ti.task_id] = (ti.state, XComModel.deserialize_value(row) if row is not None else None)
        print(f"   run {run.run_id}: {run.state} in {time.monotonic() - started:.1f}s")
        for task_id in ("setup", "snapshot", "capture_window", "current_state", "slot_health"):
            print(f"     {task_id:15} {states.get(task_id, ('?', None))[0]}")
        if run.state != "success":
            print("\nthe DAG run failed; see the task logs above", file=sys.stderr)
            return 1
        runs.append((logical_date, states))
    _report(lake, runs)
    return _compare_state(cluster, runs)


def _report(lake: Path, runs) -> None:
    import pyarrow.compute as pc

    from airflow_provider_cdc.cdc.naming import side_topics
    from airflow_provider_cdc.cdc.sinks.reader import committed_windows, read_topic_arrow

    print("\n== what landed")
    print("\n   windows (commit log):")
    for entry in committed_windows(str(lake), "shop"):
        w = entry.window
        span = f"at {w.to_lsn}" if w.kind == "snapshot" else f"[{w.from_lsn}, {w.to_lsn})"
        events = sum(d.events for d in entry.datasets if d.topic not in side_topics("shop"))
        print(f"     {w.window_id} {w.kind:8} {span:28} {events:5} events {entry.transactions:3} transactions")
    print("\n   runs (XCom of the window task):")
    for logical_date, states in runs:
        summary = states["capture_window"][1] or {}
        print(
            f"     {logical_date:%H:%M} window {summary.get('window_id')} "
            f"LSN [{summary.get('from_lsn')}, {summary.get('to_lsn')}) "
            f"{summary.get('changes')} changes, slot confirmed at {summary.get('slot_confirmed_lsn')}"
        )
        health = (states.get("slot_health", (None, None))[1] or {}).get("metrics", {})
        print(
            f"           slot health: {health.get('wal_status')}, {health.get('retained_bytes')} bytes of WAL "
            f"retained, {health.get('lag_bytes')} bytes behind"
        )
    print("\n   events per table and op:")
    for table in ("customers", "orders", "order_items"):
        events = read_topic_arrow(str(lake), "shop", f"shop.public.{table}")
        counts = (
            {}
            if events is None
            else {item["values"]: item["counts"] for item in pc.value_counts(events.column("op")).to_pylist()}
        )
        print(f"     shop.public.{table:12} " + "  ".join(f"{op}={counts.get(op, 0):<4}" for op in "rcud"))
    tx = read_topic_arrow(str(lake), "shop", "shop.transaction")
    print("\n   transactions (END rows of shop.transaction):")
    if tx is not None:
        for row in tx.filter(pc.equal(tx.column("status"), "END")).to_pylist():
            collections = ", ".join(f"{c['data_collection']}={c['event_count']}" for c in row["data_collections"])
            print(f"     window {row['window_id']} tx {row['id']:>20}: {row['event_count']:2} events ({collections})")
    print(f"\n   files: {lake}")
    for path in sorted(p for p in lake.iterdir()):
        print(f"     {path.name}/")


def _compare_state(cluster, runs) -> int:
    """The current-state tables after the last run, against the source tables."""
    from airflow_provider_cdc.cdc.naming import Topic
    from airflow_provider_cdc.cdc.spark_session import get_or_create_session
    from airflow_provider_cdc.cdc.state import read_state

    spark = get_or_create_session()
    print(f"\n   current-state tables (rebuilt from the events) vs the source: {WORK / 'state'}")
    mismatches = 0
    with cluster.connect("shop") as conn:
        for table in ("customers", "orders", "order_items"):
            state = read_state(
                spark,
                state_path=str(WORK / "state"),
                topic_prefix="shop",
                topic=Topic.for_table("shop", "public", table),
            )
            source = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            built = state.count()
            mismatches += built != source
            verdict = "ok" if built == source else "DIFFERENT"
            print(f"     {table:12} state {built:5} rows, source {source:5} rows {verdict}")
    return 1 if mismatches else 0


def _stop_previous_cluster() -> None:
    """A demo interrupted before it stopped its cluster leaves a server on the old data dir."""
    from airflow_provider_cdc.testing.postgres_cluster import PostgresCluster, available_flavours

    marker = WORK / "pg_dir"
    if not marker.exists():
        return
    pg_dir = Path(marker.read_text().strip())
    if (pg_dir / "data" / "postmaster.pid").exists():
        for bin_dir in available_flavours().values():
            PostgresCluster(bin_dir, pg_dir).stop()
    shutil.rmtree(pg_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
