"""Window write throughput with each sink format, against the Parquet sink in the same run.

    .venv/bin/python bench/lake_write.py --changes 200000 --repeat 3

Builds one backlog of N changes (60 % insert, 30 % update, 10 % delete, transactions of about
100 changes; bench/workload.py) in a throwaway PostgreSQL 15, then reads that same window end
to end (slot → events → committed sink, local path, no Spark) into a fresh sink of each format,
the formats interleaved in every repetition so load on the machine hits them alike:

- parquet: Parquet files plus the commit log (the default sink, the reference);
- iceberg: the same files committed to one Iceberg table per dataset (pyiceberg, SQLite catalog);
- delta: the same files committed to one Delta table per dataset (delta-rs).

A window is one table commit per dataset, so ``--windows K`` splits the backlog into K windows
to show the per-commit cost. Figures are medians; ``ratio <format>/parquet`` is the format's
throughput as a fraction of Parquet's (the issue's bar: at least 0.8).

``--store local s3`` (the default: both) also lands every format's window on an S3 API server
on loopback (SeaweedFS, started here as the test suite does: tests/support/s3_server.py), in the
same repetitions, interleaved with the local runs: Arrow's S3 file system for the Parquet files,
delta-rs's object store for Delta, pyiceberg's FileIO for Iceberg (its catalog a SQL catalog in
the benchmark's PostgreSQL: a bucket has no catalog of its own; locally it stays the SQLite file
beside the sink), the commit log by a conditional PUT. ``ratio <format> s3/local`` is the S3
throughput as a fraction of the local file system's.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

FORMATS = ("parquet", "iceberg", "delta")
STORES = ("local", "s3")


@contextlib.contextmanager
def s3_store(work: Path, wanted: bool) -> Iterator[object | None]:
    """SeaweedFS on loopback for the run (None when ``--store`` leaves S3 out)."""
    if not wanted:
        yield None
        return
    from tests.support import s3_server

    server = s3_server.start(work / "s3")
    try:
        yield server
    finally:
        server.stop()


def s3_sink(server, cluster, name: str) -> tuple[str, dict]:
    """A fresh prefix in the bucket and the job's options to reach it (Iceberg: a new SQL catalog
    database in the benchmark's PostgreSQL, so no table of an earlier run is found there)."""
    from tests.support.s3_server import BUCKET

    options: dict = {"object_store": server.access()}
    if name.startswith("iceberg"):
        cluster.create_database(f"catalog_{name}")
        uri = (
            f"postgresql+psycopg://{cluster.superuser}:{cluster.password}@{cluster.host}:{cluster.port}/catalog_{name}"
        )
        options["table_catalog"] = {"type": "sql", "uri": uri}
    return f"s3://{BUCKET}/bench/{name}", options


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--windows", type=int, default=1, help="windows the backlog is read in")
    parser.add_argument("--chunk", type=int, default=100_000, help="max_changes_per_chunk")
    parser.add_argument("--store", nargs="+", choices=STORES, default=list(STORES), help="where the sinks are")
    args = parser.parse_args()

    import workload

    from airflow_provider_cdc.cdc.basics.window import Window
    from airflow_provider_cdc.cdc.sinks import object_store
    from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
    from airflow_provider_cdc.cdc.sources.postgres import admin
    from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job
    from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef

    def no_spark():
        raise AssertionError("a local window must not start Spark")

    # A task process pays each library's import once; shown apart so the windows compare the sinks.
    for module in ("pyiceberg.catalog.sql", "deltalake"):
        started = time.perf_counter()
        __import__(module)
        print(f"import {module}: {time.perf_counter() - started:.2f}s (once per task process)")

    with workload.bench_cluster() as (cluster, work), s3_store(work, "s3" in args.store) as server:
        bounds = []
        with cluster.connect("bench") as conn:
            workload.create_table(conn)
            admin.ensure_publication(conn, "bench_pub", [TableRef("public", "accounts")])
            status, _ = admin.ensure_slot(conn, "bench_slot", "bench")
            start = status.confirmed_flush_lsn
            for _ in range(args.windows):
                workload.build_backlog(conn, args.changes // args.windows)
                end = admin.current_lsn(conn)
                bounds.append((start, end))
                start = end
        print(f"backlog: {args.changes} changes in {args.windows} window(s)")
        runs = [(f, store) for f in FORMATS for store in STORES if store in args.store]
        seconds: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
        for attempt in range(args.repeat):
            for sink_format, store in runs:
                name = f"{sink_format}{attempt}"
                if store == "s3":
                    sink, options = s3_sink(server, cluster, name)
                else:
                    sink, options = str(work / name), {}
                with object_store.using(options.get("object_store")):  # for the read-back and cleanup
                    started = time.perf_counter()
                    events = 0
                    for seq, (first, last) in enumerate(bounds, start=1):
                        spec = workload.job_spec(
                            cluster,
                            Window(seq, "stream", first, last, 1),
                            sink,
                            max_changes_per_chunk=args.chunk,
                            sink_format=sink_format,
                            **options,
                        )
                        entry = run_job(spec, spark_provider=no_spark)
                        events += sum(d.events for d in entry.datasets if d.topic != "bench.transaction")
                    seconds[(sink_format, store)].append(time.perf_counter() - started)
                    assert events == (args.changes // args.windows) * args.windows, (sink_format, store, events)
                    if attempt == 0:  # what landed reads back through the table, every event once
                        landed = read_topic_arrow(
                            sink, "bench", "bench.public.accounts", table_catalog=options.get("table_catalog")
                        )
                        assert landed is not None and landed.num_rows == events, (sink_format, store, landed)
                    if store == "s3":
                        object_store.delete_prefix(sink)
                    else:
                        shutil.rmtree(sink)
        report(args, seconds)
    return 0


def report(args, seconds: dict[tuple[str, str], list[float]]) -> None:
    """Medians per format and store, then the ratios: each format against Parquet (per store),
    and each format's S3 throughput against its local one."""
    import workload

    medians = {run: statistics.median(s) for run, s in seconds.items()}
    print(f"runs (s): {', '.join(f'{f} {s} {workload.rounded(v)}' for (f, s), v in seconds.items())}")

    def label(sink_format: str, store: str) -> str:
        return f"window(s) into {sink_format}" + ("" if store == "local" else f" on {store}")

    workload.print_table("changes", args.changes, [(label(f, s), m) for (f, s), m in medians.items()])
    for store in args.store:
        suffix = "" if store == "local" else f" on {store}"
        for sink_format in ("iceberg", "delta"):
            ratio = medians[("parquet", store)] / medians[(sink_format, store)]
            print(f"ratio {sink_format}/parquet{suffix}: {ratio:.3g} (throughput; 1.0 = as fast)")
    if set(args.store) == set(STORES):
        for sink_format in FORMATS:
            ratio = medians[(sink_format, "local")] / medians[(sink_format, "s3")]
            print(f"ratio {sink_format} s3/local: {ratio:.3g} (throughput on the S3 server / on the local disk)")


if __name__ == "__main__":
    sys.exit(main())
