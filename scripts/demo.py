"""The demo: the example DAG on embedded defaults, end to end, from nothing.

Starts a throwaway PostgreSQL (wal_level=logical), creates the shop schema with data, then
runs the example DAG ``postgres_cdc_hourly`` through Airflow (``dag.test()`` on a SQLite
metadata DB) for three hourly runs: setup → initial snapshot → window, then two windows with
inserts, updates and deletes made in between (some in multi-table transactions). Ends by
printing what landed. Everything lives under .work/demo and is recreated on every run.

The terminal shows the demo's progress and its report only. Everything else the processes
print (Airflow's and the tasks' logs, Spark's JVM, library warnings) goes to .work/demo/demo.log,
whose path the output names; when a run fails, the output shows the end of it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".work" / "demo"
LOG = WORK / "demo.log"
DAG_FILE = ROOT / "dags" / "examples" / "postgres_cdc_hourly.py"
RULE = "=" * 100

_terminal: TextIO = sys.stdout


def say(text: str = "") -> None:
    """The demo's own output: progress and the report, on the terminal."""
    print(text, file=_terminal, flush=True)


def main() -> int:
    sys.path.insert(0, str(ROOT))
    _stop_previous_cluster()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    _logs_to_file()
    try:
        return _demo()
    except BaseException as exc:
        say(f"\nthe demo failed: {type(exc).__name__}: {exc}")
        _show_log_tail()
        raise SystemExit(1) from None


def _logs_to_file() -> None:
    """Send this process's standard output and error (and so its children's: Spark's JVM and
    Python workers) to the log file; keep the terminal for :func:`say`."""
    global _terminal
    _terminal = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    log = os.open(LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
        os.dup2(log, stream.fileno())
    os.close(log)


def _show_log_tail(lines: int = 40) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    tail = LOG.read_text(errors="replace").splitlines()[-lines:]
    say(f"\n-- the last {len(tail)} lines of {_shown(LOG)}:")
    for line in tail:
        say(f"   {line}")


def _shown(path: Path) -> str:
    """``path`` relative to the current directory when it is inside it (shorter output)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _demo() -> int:
    from airflow_provider_cdc.testing import shop
    from airflow_provider_cdc.testing.postgres_cluster import PostgresCluster, available_flavours, scratch_dir

    flavours = available_flavours()
    flavour = "pg15" if "pg15" in flavours else next(iter(flavours))
    # The server's files go under the system temp dir: the checkout may sit in a private home
    # directory the postgres OS user cannot enter.
    pg_dir = scratch_dir("cdc-demo-pg-")
    (WORK / "pg_dir").write_text(str(pg_dir))
    say(f"== starting a throwaway PostgreSQL ({flavour}) under {pg_dir}")
    say(f"   Airflow's, Spark's and the tasks' logs go to {_shown(LOG)}")
    cluster = PostgresCluster(flavours[flavour], pg_dir).start()
    try:
        cluster.create_database("shop")
        with cluster.connect("shop") as conn:
            shop.create_schema(conn)
            seeded = shop.seed(conn)
        say(f"   shop database: {sum(seeded.inserts.values())} rows in {', '.join(shop.TABLES)}")
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
            # sslmode=disable: the demo's throwaway server is on loopback without TLS; stated, it is
            # logged at INFO instead of the WARNING a connection without sslmode gets for clear text.
            "AIRFLOW_CONN_SHOP_DB": cluster.airflow_uri("shop", sslmode="disable"),
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
            say(
                f"\n== hour {hour}: made {made.transactions} transactions in the shop database "
                f"(inserts {made.inserts}, updates {made.updates}, deletes {made.deletes})"
            )
        logical_date = start.add(hours=hour)
        say(f"\n== DAG run for {logical_date.isoformat()}")
        started = time.monotonic()
        run = dag.test(logical_date=logical_date, run_after=logical_date)
        states = {}
        with create_session() as session:
            for ti in run.get_task_instances(session=session):
                row = session.scalars(
                    XComModel.get_many(run_id=run.run_id, dag_ids=dag.dag_id, task_ids=ti.task_id, key="return_value")
                ).first()
                states[ti.task_id] = (ti.state, XComModel.deserialize_value(row) if row is not None else None)
        say(f"   run {run.run_id}: {run.state} in {time.monotonic() - started:.1f}s")
        for task_id in ("setup", "snapshot", "capture_window", "current_state", "slot_health"):
            say(f"     {task_id:15} {states.get(task_id, ('?', None))[0]}")
        if run.state != "success":
            say(f"\nthe DAG run failed; its task logs are in {_shown(LOG)}")
            _show_log_tail()
            return 1
        runs.append((logical_date, states))
    _report(lake, runs)
    return _compare_state(cluster, runs)


def _report(lake: Path, runs) -> None:
    import pyarrow.compute as pc

    from airflow_provider_cdc.cdc.basics.naming import side_topics
    from airflow_provider_cdc.cdc.sinks.reader import committed_windows, read_topic_arrow

    say(f"\n{RULE}\n REPORT: what the three runs landed in {_shown(lake)}\n{RULE}")
    say("\n   windows (the sink's commit log):")
    for entry in committed_windows(str(lake), "shop"):
        w = entry.window
        span = f"at {w.to_lsn}" if w.kind == "snapshot" else f"[{w.from_lsn}, {w.to_lsn})"
        events = sum(d.events for d in entry.datasets if d.topic not in side_topics("shop"))
        say(f"     {w.window_id} {w.kind:8} {span:28} {events:5} events {entry.transactions:3} transactions")
    say("\n   runs (XCom of the capture_window and slot_health tasks):")
    for logical_date, states in runs:
        summary = states["capture_window"][1] or {}
        say(
            f"     {logical_date:%H:%M} window {summary.get('window_id')} "
            f"LSN [{summary.get('from_lsn')}, {summary.get('to_lsn')}) "
            f"{summary.get('changes')} changes, slot confirmed at {summary.get('slot_confirmed_lsn')}"
        )
        health = (states.get("slot_health", (None, None))[1] or {}).get("metrics", {})
        say(
            f"           slot health: {health.get('wal_status')}, {health.get('lag_bytes')} bytes behind, "
            f"{health.get('retained_bytes')} bytes of WAL retained"
        )
    say(
        "     (bytes behind: WAL written since the slot's acknowledged position, starting with the window's\n"
        "      96-byte end-of-window message; retained: WAL kept from restart_lsn, which trails the acknowledged\n"
        '      position by about one window. See "Reading the slot\'s numbers" in docs/reliability.md)'
    )
    say("\n   events per table and op (r = snapshot read, c = insert, u = update, d = delete):")
    for table in ("customers", "orders", "order_items"):
        events = read_topic_arrow(str(lake), "shop", f"shop.public.{table}")
        counts = (
            {}
            if events is None
            else {item["values"]: item["counts"] for item in pc.value_counts(events.column("op")).to_pylist()}
        )
        say(f"     shop.public.{table:12} " + "  ".join(f"{op}={counts.get(op, 0):<4}" for op in "rcud"))
    tx = read_topic_arrow(str(lake), "shop", "shop.transaction")
    say("\n   transactions (END rows of shop.transaction):")
    if tx is not None:
        for row in tx.filter(pc.equal(tx.column("status"), "END")).to_pylist():
            collections = ", ".join(f"{c['data_collection']}={c['event_count']}" for c in row["data_collections"])
            say(f"     window {row['window_id']} tx {row['id']:>20}: {row['event_count']:2} events ({collections})")
    say(f"\n   files: {lake}")
    for path in sorted(p for p in lake.iterdir()):
        say(f"     {path.name}/")
    say(
        "   read them (committed windows only): from airflow_provider_cdc.cdc.sinks.reader import "
        f"read_topic_arrow; read_topic_arrow({str(lake)!r}, 'shop', 'shop.public.orders')"
    )


def _compare_state(cluster, runs) -> int:
    """The current-state tables after the last run, against the source tables."""
    from airflow_provider_cdc.cdc.basics.naming import Topic
    from airflow_provider_cdc.cdc.basics.spark_session import get_or_create_session
    from airflow_provider_cdc.cdc.state.jobs import read_state

    spark = get_or_create_session()
    say(f"\n   current-state tables (rebuilt from the events) vs the source: {WORK / 'state'}")
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
            say(f"     {table:12} state {built:5} rows, source {source:5} rows {verdict}")
    say(f"\n{RULE}\n logs of Airflow, Spark and every task: {_shown(LOG)}\n{RULE}")
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
