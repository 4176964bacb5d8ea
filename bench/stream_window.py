"""Stream-window throughput against the slot's raw decode rate, measured in the same run.

    .venv/bin/python bench/stream_window.py --changes 200000 --repeat 3

Builds a backlog of N changes (60 % insert, 30 % update, 10 % delete, transactions of about 100
changes) on a realistic table in a throwaway PostgreSQL 15, then measures, on that same backlog:

- limit: ``SELECT count(*) FROM pg_logical_slot_peek_binary_changes(...)``: the server decoding
  the backlog with pgoutput and nothing else;
- protocol ceiling: PostgreSQL's own C client ``pg_recvlogical`` streaming the same window over
  the replication protocol into /dev/null (on a copy of the slot): what any streaming client
  can reach, because the walsender sends and flushes every change as its own message;
- window: the capture job reading that window end to end (slot → decoded events → committed
  Parquet with the transaction side table, local sink, no Spark).

The job never acknowledges the slot, so every repetition reads the same backlog. Figures are
medians; the ratio window/limit is what to compare across machines.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def recvlogical_seconds(cluster, target: int) -> float | None:
    """The streaming protocol's own ceiling: PostgreSQL's C client ``pg_recvlogical`` draining
    the same window into /dev/null, on a copy of the slot (it acknowledges what it reads)."""
    import os
    import subprocess

    from airflow_provider_cdc.cdc.lsn import Lsn

    binary = cluster.bin_dir / "pg_recvlogical"
    if not binary.exists():
        return None
    with cluster.connect("bench") as conn:
        conn.execute("SELECT pg_copy_logical_replication_slot('bench_slot', 'bench_probe')")
    try:
        command = [str(binary), "-h", cluster.host, "-p", str(cluster.port), "-U", cluster.superuser, "-d", "bench"]
        command += ["-S", "bench_probe", "--start", "--no-loop", "-F", "0", "-E", str(Lsn(target)), "-f", "/dev/null"]
        command += ["-o", "proto_version=1", "-o", "publication_names=bench_pub"]
        started = time.perf_counter()
        subprocess.run(command, check=True, env={**os.environ, "PGPASSWORD": cluster.password}, capture_output=True)
        return time.perf_counter() - started
    finally:
        with cluster.connect("bench") as conn:
            conn.execute("SELECT pg_drop_replication_slot('bench_probe')")


def _profiler(path: str | None):
    if path is None:
        return None
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.001)
    profiler.start()
    return profiler


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=100_000, help="max_changes_per_chunk")
    parser.add_argument("--profile", metavar="HTML", help="profile the last window with pyinstrument into this file")
    parser.add_argument(
        "--workload",
        choices=["mixed", "one-transaction"],
        default="mixed",
        help="mixed: transactions of ~100 changes; one-transaction: a single UPDATE of N rows",
    )
    args = parser.parse_args()

    import workload

    from airflow_provider_cdc.cdc.sources.postgres import admin
    from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job
    from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
    from airflow_provider_cdc.cdc.window import Window

    with workload.bench_cluster() as (cluster, work):
        with cluster.connect("bench") as conn:
            workload.create_table(conn)
            if args.workload == "one-transaction":
                conn.execute(
                    "INSERT INTO accounts (id, a, b, balance, note, attrs) SELECT g, g, g, g, 'note ' || g, "
                    "'{\"k\": 1}' FROM generate_series(1, %s) g",
                    (args.changes,),
                )
            admin.ensure_publication(conn, "bench_pub", [TableRef("public", "accounts")])
            status, _ = admin.ensure_slot(conn, "bench_slot", "bench")
            started = time.monotonic()
            if args.workload == "one-transaction":
                conn.execute("UPDATE accounts SET balance = balance + 1, updated_at = now()")
            else:
                workload.build_backlog(conn, args.changes)
            target = admin.current_lsn(conn)
            print(
                f"backlog: {args.changes} changes, {target - status.confirmed_flush_lsn} bytes of WAL, "
                f"built in {time.monotonic() - started:.1f}s"
            )
        limits, ceilings, windows = [], [], []
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        for attempt in range(args.repeat):
            with cluster.connect("bench") as conn:
                t0 = time.perf_counter()
                rows = conn.execute(
                    "SELECT count(*) FROM pg_logical_slot_peek_binary_changes("
                    "'bench_slot', %s::pg_lsn, NULL, 'proto_version', '1', 'publication_names', 'bench_pub')",
                    (str(target),),
                ).fetchone()[0]
                limits.append(time.perf_counter() - t0)
            ceiling = recvlogical_seconds(cluster, target)
            if ceiling is not None:
                ceilings.append(ceiling)
            sink = work / f"lake{attempt}"
            window = Window(1, "stream", status.confirmed_flush_lsn, target, 1)
            spec = workload.job_spec(cluster, window, sink, max_changes_per_chunk=args.chunk)
            profiler = _profiler(args.profile if attempt == args.repeat - 1 else None)
            t0 = time.perf_counter()
            entry = run_job(spec, spark_provider=lambda: (_ for _ in ()).throw(AssertionError("no Spark")))
            windows.append(time.perf_counter() - t0)
            if profiler is not None:
                profiler.stop()
                Path(args.profile).write_text(profiler.output_html())
                print(profiler.output_text(unicode=False, color=False, show_all=False))
            events = sum(d.events for d in entry.datasets if d.topic != "bench.transaction")
            assert events == args.changes, (events, args.changes)
            shutil.rmtree(sink)
        limit, window = statistics.median(limits), statistics.median(windows)
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"driver RSS before the first window: {rss_before:.0f} MiB")
        runs = workload.rounded
        print(f"runs (s): peek {runs(limits)}, pg_recvlogical {runs(ceilings)}, window {runs(windows)}")
        print(f"raw decode rows (peek): {rows}")
        ceiling = statistics.median(ceilings) if ceilings else None
        measures = [("limit: peek count(*)", limit)]
        if ceiling is not None:
            measures.append(("protocol ceiling: pg_recvlogical → /dev/null", ceiling))
        workload.print_table("changes", args.changes, [*measures, ("window end to end", window)])
        print(f"ratio window/limit: {limit / window:.3g} (1.0 = as fast as the server's own decode)")
        if ceiling is not None:
            print(f"ratio pg_recvlogical/limit: {limit / ceiling:.3g} (what streaming itself allows)")
            print(f"ratio window/pg_recvlogical: {ceiling / window:.3g}")
        print(f"SparkSession started by the window: {'pyspark' in sys.modules} (local sinks are written with Arrow)")
        print(f"driver peak RSS: {peak_mb:.0f} MiB (chunk {args.chunk})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
