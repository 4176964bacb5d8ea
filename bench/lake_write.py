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
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

FORMATS = ("parquet", "iceberg", "delta")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--windows", type=int, default=1, help="windows the backlog is read in")
    parser.add_argument("--chunk", type=int, default=100_000, help="max_changes_per_chunk")
    args = parser.parse_args()

    import workload

    from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
    from airflow_provider_cdc.cdc.sources.postgres import admin
    from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job
    from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
    from airflow_provider_cdc.cdc.window import Window

    def no_spark():
        raise AssertionError("a local window must not start Spark")

    # A task process pays each library's import once; shown apart so the windows compare the sinks.
    for module in ("pyiceberg.catalog.sql", "deltalake"):
        started = time.perf_counter()
        __import__(module)
        print(f"import {module}: {time.perf_counter() - started:.2f}s (once per task process)")

    with workload.bench_cluster() as (cluster, work):
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
        seconds: dict[str, list[float]] = {f: [] for f in FORMATS}
        for attempt in range(args.repeat):
            for sink_format in FORMATS:
                sink = work / f"{sink_format}{attempt}"
                started = time.perf_counter()
                events = 0
                for seq, (first, last) in enumerate(bounds, start=1):
                    spec = workload.job_spec(
                        cluster,
                        Window(seq, "stream", first, last, 1),
                        sink,
                        max_changes_per_chunk=args.chunk,
                        sink_format=sink_format,
                    )
                    entry = run_job(spec, spark_provider=no_spark)
                    events += sum(d.events for d in entry.datasets if d.topic != "bench.transaction")
                seconds[sink_format].append(time.perf_counter() - started)
                assert events == (args.changes // args.windows) * args.windows, (sink_format, events)
                if attempt == 0:  # what landed reads back through the table, every event once
                    landed = read_topic_arrow(str(sink), "bench", "bench.public.accounts")
                    assert landed is not None and landed.num_rows == events, (sink_format, landed)
                shutil.rmtree(sink)
        medians = {f: statistics.median(s) for f, s in seconds.items()}
        print(f"runs (s): {', '.join(f'{f} {workload.rounded(s)}' for f, s in seconds.items())}")
        workload.print_table("changes", args.changes, [(f"window(s) into {f}", medians[f]) for f in FORMATS])
        for sink_format in ("iceberg", "delta"):
            ratio = medians["parquet"] / medians[sink_format]
            print(f"ratio {sink_format}/parquet: {ratio:.3g} (throughput; 1.0 = as fast)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
