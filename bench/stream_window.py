"""Stream-window throughput against the slot's raw decode rate, measured in the same run.

    .venv/bin/python bench/stream_window.py --changes 200000 --repeat 3

Builds a backlog of N changes (60 % insert, 30 % update, 10 % delete, transactions of about 100
changes) on a realistic table in a throwaway PostgreSQL 15, then measures, on that same backlog:

- limit: ``SELECT count(*) FROM pg_logical_slot_peek_binary_changes(...)``: the server decoding
  the backlog with pgoutput and nothing else;
- window: the capture job reading that window end to end (slot → decoded events → committed
  Parquet with the transaction side table, local sink, no Spark).

The job never acknowledges the slot, so every repetition reads the same backlog. Figures are
medians; the ratio window/limit is what to compare across machines.
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TABLE = """
CREATE TABLE accounts (
    id bigint PRIMARY KEY,
    a int, b int,
    balance numeric(12,2),
    note text,
    created_at timestamptz DEFAULT now(),
    updated_at timestamptz DEFAULT now(),
    active boolean DEFAULT true,
    attrs jsonb
)
"""


def build_backlog(conn, changes: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    next_id, live = 1, []
    done = 0
    while done < changes:
        with conn.transaction():
            for _ in range(min(100, changes - done)):
                roll = rng.random()
                if roll < 0.6 or len(live) < 10:
                    conn.execute(
                        "INSERT INTO accounts (id, a, b, balance, note, attrs) VALUES (%s, %s, %s, %s, %s, %s)",
                        (
                            next_id,
                            rng.randint(0, 1000),
                            rng.randint(0, 1000),
                            round(rng.uniform(0, 1e6), 2),
                            f"note {next_id:010d} lorem ipsum dolor sit",
                            '{"k": 1, "tags": ["a", "b"]}',
                        ),
                    )
                    live.append(next_id)
                    next_id += 1
                elif roll < 0.9:
                    conn.execute(
                        "UPDATE accounts SET balance = balance + 1, updated_at = now() WHERE id = %s",
                        (rng.choice(live),),
                    )
                else:
                    victim = live.pop(rng.randrange(len(live)))
                    conn.execute("DELETE FROM accounts WHERE id = %s", (victim,))
                done += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=100_000, help="max_changes_per_chunk")
    parser.add_argument(
        "--workload",
        choices=["mixed", "one-transaction"],
        default="mixed",
        help="mixed: transactions of ~100 changes; one-transaction: a single UPDATE of N rows",
    )
    args = parser.parse_args()

    from airflow_provider_cdc.cdc.sources.postgres import admin
    from airflow_provider_cdc.cdc.sources.postgres.connection import PgConnectionInfo
    from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job
    from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
    from airflow_provider_cdc.cdc.spec import CaptureOptions, PostgresJobSpec
    from airflow_provider_cdc.cdc.window import Window
    from airflow_provider_cdc.testing.postgres_cluster import PostgresCluster, available_flavours, scratch_dir

    work = scratch_dir("cdc-bench-")
    cluster = PostgresCluster(available_flavours()["pg15"], work / "pg").start()
    try:
        cluster.create_database("bench")
        with cluster.connect("bench") as conn:
            conn.execute(TABLE)
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
                build_backlog(conn, args.changes)
            target = admin.current_lsn(conn)
            print(
                f"backlog: {args.changes} changes, {target - status.confirmed_flush_lsn} bytes of WAL, "
                f"built in {time.monotonic() - started:.1f}s"
            )
        info = PgConnectionInfo(cluster.host, cluster.port, "bench", cluster.superuser, password=cluster.password)
        limits, windows = [], []
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
            sink = work / f"lake{attempt}"
            spec = PostgresJobSpec(
                topic_prefix="bench",
                connection=info,
                slot_name="bench_slot",
                publication_name="bench_pub",
                tables=(TableRef("public", "accounts"),),
                window=Window(1, "stream", status.confirmed_flush_lsn, target, 1),
                sink_path=str(sink),
                options=CaptureOptions(max_changes_per_chunk=args.chunk),
            )
            t0 = time.perf_counter()
            entry = run_job(spec, spark_provider=lambda: (_ for _ in ()).throw(AssertionError("no Spark")))
            windows.append(time.perf_counter() - t0)
            events = sum(d.events for d in entry.datasets if d.topic != "bench.transaction")
            assert events == args.changes, (events, args.changes)
            shutil.rmtree(sink)
        limit, window = statistics.median(limits), statistics.median(windows)
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"driver RSS before the first window: {rss_before:.0f} MiB")
        print(f"raw decode rows (peek): {rows}")
        print("| measure | median s | changes/s |")
        print("|---|---|---|")
        print(f"| limit: peek count(*) | {limit:.2f} | {args.changes / limit:,.0f} |")
        print(f"| window end to end | {window:.2f} | {args.changes / window:,.0f} |")
        print(f"ratio window/limit: {limit / window:.2f} (1.0 = as fast as the server's own decode)")
        print(f"driver peak RSS: {peak_mb:.0f} MiB (chunk {args.chunk})")
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
