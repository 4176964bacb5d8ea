"""SQL Server stream-window throughput against fetching the same change rows, in the same run.

    .venv/bin/python bench/sqlserver_window.py --changes 100000 --repeat 3

Runs on the SQL Server stand-in (tests/support/sqlserver: PostgreSQL 15 emulating SQL Server's
CDC, reached through pyodbc + psqlODBC + the T-SQL proxy), so the absolute figures say nothing
about a real SQL Server; the *ratio* says how much the capture adds on top of fetching the rows
through the same driver. Builds a backlog of N changes (60 % insert, 30 % update, 10 % delete, in
transactions of 100) on one table, waits for the emulated capture job, then measures:

- limit: fetching the window's change rows through pyodbc into nothing, with the query and the
  select list the window job sends in the query mode measured (``--mode``: ``direct``, the default,
  reads ``cdc.<instance>_CT`` in ``__$command_id`` order; ``function`` reads
  ``cdc.fn_cdc_get_all_changes_<instance>``);
- window: the capture job reading that window end to end (change rows → typed Debezium events →
  committed Parquet with the transaction side table, local sink, no Spark).

It also reports the job's peak memory (RSS high-water mark of a child process running the job
alone) at N and at 4N changes: chunks of ``max_changes_per_chunk`` bound what the job holds, and
the stand-in's driver reads results through cursors a page at a time (psqlODBC's
``UseDeclareFetch=1``, a default of the driver entry tests/support/odbc.py registers), as a real
SQL Server driver streams them. Figures are medians.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def build_backlog(standin, changes: int, first_id: int = 0) -> None:
    """N changes in transactions of 100 on dbo.events (60 % insert, 30 % update, 10 % delete),
    new rows from ``first_id + 1``."""
    conn = standin.connect(autocommit=False)
    cursor = conn.cursor()
    inserted, made = first_id, 0
    while made < changes:
        for i in range(100):
            kind = (made + i) % 10
            if kind < 6 or inserted < first_id + 10:
                inserted += 1
                cursor.execute(
                    "INSERT INTO dbo.events (id, account, amount, note) VALUES (?, ?, ?, ?)",
                    inserted,
                    inserted % 97,
                    inserted * 0.25,
                    f"event {inserted}",
                )
            elif kind < 9:
                cursor.execute("UPDATE dbo.events SET amount = amount + 1 WHERE id = ?", inserted - 5)
            else:
                cursor.execute("DELETE FROM dbo.events WHERE id = ?", inserted - 9)
        conn.commit()
        made += 100
    conn.close()


def job_peak_mib(spec, password: str) -> float:
    """The window job's peak RSS, run alone in a child process (the same spec, a fresh sink)."""
    import json
    import os
    import subprocess
    from dataclasses import replace

    child = replace(spec, sink_path=spec.sink_path + "-memory")
    code = (
        "import resource, sys; from airflow_provider_cdc.cdc.jobs import spec_from_json, run_window_job; "
        "from dataclasses import replace; spec = spec_from_json(sys.stdin.read()); "
        "run_window_job(replace(spec, connection=spec.connection.with_password_from_env()), lambda: None); "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    env = {**os.environ, child.connection.password_env: password, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(child.to_dict()), capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return int(done.stdout.strip().splitlines()[-1]) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=50_000, help="max_changes_per_chunk")
    parser.add_argument("--no-memory", action="store_true", help="skip the 4N memory run")
    parser.add_argument("--mode", choices=("direct", "function"), default="direct", help="data_query_mode")
    args = parser.parse_args()

    from airflow_provider_cdc.cdc.basics.tables import TableRef
    from airflow_provider_cdc.cdc.basics.window import Window
    from airflow_provider_cdc.cdc.events.settings import EventSettings
    from airflow_provider_cdc.cdc.planning.spec import CaptureOptions
    from airflow_provider_cdc.cdc.sources.sqlserver import admin
    from airflow_provider_cdc.cdc.sources.sqlserver.change_queries import changes_sql
    from airflow_provider_cdc.cdc.sources.sqlserver.connection import SqlServerConnectionInfo
    from airflow_provider_cdc.cdc.sources.sqlserver.events import TableEncoder
    from airflow_provider_cdc.cdc.sources.sqlserver.jobs import run_job
    from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn
    from airflow_provider_cdc.cdc.sources.sqlserver.spec import SqlServerJobSpec
    from airflow_provider_cdc.testing.postgres_cluster import PostgresCluster, available_flavours, scratch_dir
    from tests.support import odbc
    from tests.support.sqlserver import ODBC_DRIVER, SqlServerStandIn

    odbc.install()  # the stand-in's driver entry, before the first ODBC use (the memory child inherits it)
    cluster = PostgresCluster(available_flavours()["pg15"], scratch_dir("bench-sqlserver-")).start()
    sink_root = Path(tempfile.mkdtemp(prefix="bench-sqlserver-sink-"))
    try:
        standin = SqlServerStandIn(cluster, "bench", poll_interval=0.05).start()
        standin.execute_tsql(
            "CREATE TABLE dbo.events (id bigint NOT NULL PRIMARY KEY, account int NOT NULL, "
            "amount decimal(12,2) NOT NULL, note nvarchar(200) NULL)"
        )
        standin.enable_db()
        standin.enable_table("dbo", "events")
        info = SqlServerConnectionInfo(
            host="127.0.0.1",
            port=standin.proxy.port,
            database="bench",
            user=cluster.superuser,
            password=cluster.password,
            driver=ODBC_DRIVER,
        )

        def measure(changes: int, repeat: int, label: str, start: SqlServerLsn | None = None) -> dict:
            conn = standin.connect()
            if start is None:
                start = SqlServerLsn(admin.max_lsn(conn) or 0).next()
            conn.close()
            started = time.perf_counter()
            build_backlog(standin, changes, first_id=10 * changes if label == "4N" else 0)
            standin.wait_until_captured(timeout=600)
            print(f"{label}: backlog of {changes:,} changes built and captured in {time.perf_counter() - started:.1f}s")
            conn = standin.connect()
            end = admin.max_lsn(conn).next()
            found, _problems = admin.describe_tables(conn, [TableRef("dbo", "events")])
            table = found[TableRef("dbo", "events")]
            start = max(start, admin.min_lsn(conn, table.instances[-1].name) or start)  # where the instance begins
            encoder = TableEncoder(table, table.columns, EventSettings())
            statement = changes_sql(table.instances[-1], encoder, args.mode).sql
            fetch, window = [], []
            for i in range(repeat):
                began = time.perf_counter()
                cursor = conn.cursor()
                cursor.execute(statement, start.to_bytes(), end.previous().to_bytes())
                rows = 0
                while page := cursor.fetchmany(2000):
                    rows += len(page)
                cursor.close()
                fetch.append(time.perf_counter() - began)
                spec = SqlServerJobSpec(
                    topic_prefix="bench",
                    connection=info,
                    tables=(TableRef("dbo", "events"),),
                    window=Window(seq=1, kind="stream", from_lsn=start, to_lsn=end, planned_at_ms=0),
                    sink_path=str(sink_root / f"{label}-{i}"),
                    options=CaptureOptions(max_changes_per_chunk=args.chunk),
                    data_query_mode=args.mode,
                )
                began = time.perf_counter()
                entry = run_job(spec, spark_provider=lambda: None)
                window.append(time.perf_counter() - began)
                assert entry.stats["changes"] <= rows  # an update's two rows are one event
            conn.close()
            return {
                "start": start,
                "peak_mib": job_peak_mib(spec, cluster.password),
                "rows": rows,
                "events": entry.stats["changes"],
                "fetch": statistics.median(fetch),
                "window": statistics.median(window),
                "fetch_runs": fetch,
                "window_runs": window,
            }

        first = measure(args.changes, args.repeat, "N")
        fetch_runs = [round(x, 2) for x in first["fetch_runs"]]
        window_runs = [round(x, 2) for x in first["window_runs"]]
        rows, fetch, window = first["rows"], first["fetch"], first["window"]
        print(f"runs (s): fetch {fetch_runs}, window {window_runs}")
        print("| measure | median s | change rows/s |")
        print("|---|---|---|")
        print(f"| limit: fetch the change rows through pyodbc | {fetch:.2f} | {rows / fetch:,.0f} |")
        print(f"| window: events committed to Parquet | {window:.2f} | {rows / window:,.0f} |")
        print(f"ratio window/fetch: {fetch / window:.2f} (the window's speed as a share of the fetch's)")
        print(f"window job's peak RSS (own process), {rows:,} change rows: {first['peak_mib']:.0f} MiB")
        if not args.no_memory:
            more = measure(3 * args.changes, 1, "4N", start=first["start"])  # one window over the whole 4N backlog
            print(f"window job's peak RSS (own process), {more['rows']:,} change rows: {more['peak_mib']:.0f} MiB")
        standin.stop()
    finally:
        cluster.stop()
        shutil.rmtree(cluster.base_dir, ignore_errors=True)
        shutil.rmtree(sink_root, ignore_errors=True)
        odbc.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
