"""Snapshot throughput against raw COPY, the fastest peer and a plain Spark JDBC read, in one run.

    .venv/bin/python bench/snapshot.py --rows 1000000 --repeat 3

Fills the benchmark table (``bench/workload.py``) with M rows in a throwaway PostgreSQL 15,
then measures, on the same table and the same Spark session, in every round:

- limit: ``COPY accounts TO STDOUT (FORMAT binary)`` read by the client into nothing;
- peer: connectorx → Parquet, as dlt's ``sql_database`` uses it with its connectorx backend:
  ``connectorx.read_sql`` partitioned on the key (``partition_on`` the key, ``partition_num`` =
  the session's parallelism, binary protocol, Arrow return type), written with pyarrow;
- naive: a plain Spark JDBC read partitioned on the key (``spark.read.jdbc`` with ``column``,
  bounds and ``numPartitions`` = the session's parallelism, ``fetchsize`` 10 000) written to
  Parquet: what a DAG author would write without this provider;
- snapshot: the capture's initial snapshot end to end (exported snapshot → partitioned reads →
  typed Debezium ``op = r`` events → committed Parquet), the job the operator runs.

The peer and the naive read write flat rows; the snapshot writes the full Debezium envelope.
The SparkSession start is reported separately; a first, unmeasured round warms up the JVM, the
JDBC driver and Spark's Python workers for all of them; every figure after it is a median.
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

JDBC_JAR = Path("/usr/share/java/postgresql.jar")  # Debian's libpostgresql-jdbc-java


def copy_binary(conn) -> tuple[float, int]:
    started = time.perf_counter()
    size = 0
    with conn.cursor() as cur, cur.copy("COPY accounts TO STDOUT (FORMAT binary)") as copy:
        for block in copy:
            size += len(block)
    return time.perf_counter() - started, size


def connectorx_to_parquet(cluster, partitions: int, path: Path) -> float:
    import connectorx
    import pyarrow.parquet as pq

    started = time.perf_counter()
    table = connectorx.read_sql(
        cluster.airflow_uri("bench"),
        "SELECT * FROM accounts",
        return_type="arrow",
        protocol="binary",
        partition_on="id",
        partition_num=partitions,
    )
    pq.write_table(table, path)
    seconds = time.perf_counter() - started
    assert table.num_rows == pq.read_metadata(path).num_rows
    return seconds


def jdbc_to_parquet(spark, cluster, rows: int, path: Path) -> float:
    started = time.perf_counter()
    frame = spark.read.jdbc(
        url=f"jdbc:postgresql://{cluster.host}:{cluster.port}/bench",
        table="accounts",
        column="id",
        lowerBound=1,
        upperBound=rows,
        numPartitions=spark.sparkContext.defaultParallelism,
        properties={
            "user": cluster.superuser,
            "password": cluster.password,
            "driver": "org.postgresql.Driver",
            "fetchsize": "10000",
        },
    )
    frame.write.mode("overwrite").parquet(str(path))
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[2]", help="Spark master for all Spark measurements")
    parser.add_argument(
        "--warmup", type=int, default=1, help="unmeasured rounds first (JIT, JDBC driver, Python workers)"
    )
    args = parser.parse_args()
    if not JDBC_JAR.exists():
        raise SystemExit(f"{JDBC_JAR} is missing: run ./scripts/bootstrap.sh (installs libpostgresql-jdbc-java)")

    import workload

    from airflow_provider_cdc.cdc.basics.spark_session import get_or_create_session
    from airflow_provider_cdc.cdc.basics.window import Window
    from airflow_provider_cdc.cdc.planning.spec import SparkOptions
    from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job

    with workload.bench_cluster() as (cluster, work):
        with cluster.connect("bench") as conn:
            workload.create_table(conn)
            started = time.monotonic()
            workload.fill(conn, args.rows)
            conn.execute("VACUUM (FREEZE, ANALYZE) accounts")  # hint bits set: every reader sees the same heap
            size = conn.execute("SELECT pg_table_size('accounts')").fetchone()[0]
            print(f"table: {args.rows:,} rows, {size / 2**20:.0f} MiB, filled in {time.monotonic() - started:.1f}s")

        started = time.perf_counter()
        spark = get_or_create_session(SparkOptions(master=args.master, conf={"spark.jars": str(JDBC_JAR)}))
        spark_start = time.perf_counter() - started

        parallelism = spark.sparkContext.defaultParallelism
        copies, peers, naive, ours = [], [], [], []
        for attempt in range(-args.warmup, args.repeat):
            with cluster.connect("bench") as conn:
                seconds, copied = copy_binary(conn)
                copies.append(seconds)
            peers.append(connectorx_to_parquet(cluster, parallelism, work / f"cx{attempt}.parquet"))
            (work / f"cx{attempt}.parquet").unlink()
            naive.append(jdbc_to_parquet(spark, cluster, args.rows, work / f"jdbc{attempt}"))
            shutil.rmtree(work / f"jdbc{attempt}")
            spec = workload.job_spec(cluster, Window(1, "snapshot", None, None, 1), work / f"lake{attempt}")
            started = time.perf_counter()
            entry = run_job(spec, spark_provider=lambda: spark)
            ours.append(time.perf_counter() - started)
            events = sum(d.events for d in entry.datasets if d.topic == "bench.public.accounts")
            assert events == args.rows, (events, args.rows)
            shutil.rmtree(work / f"lake{attempt}")
            if attempt < 0:  # a warm-up round: measured above, not counted
                del copies[-1], peers[-1], naive[-1], ours[-1]

        copy_s, peer_s, naive_s, ours_s = (statistics.median(x) for x in (copies, peers, naive, ours))
        print(f"SparkSession start ({args.master}, with the JDBC jar): {spark_start:.1f}s (not in the figures below)")
        print(f"COPY binary bytes: {copied:,}; parallelism {parallelism}")
        runs = workload.rounded
        print(f"runs (s): COPY {runs(copies)}, connectorx {runs(peers)}, naive {runs(naive)}, snapshot {runs(ours)}")
        workload.print_table(
            "rows",
            args.rows,
            [
                ("limit: COPY (FORMAT binary) into nothing", copy_s),
                ("peer: connectorx partitioned read → Parquet", peer_s),
                ("naive: Spark JDBC partitioned read → Parquet", naive_s),
                ("snapshot end to end (typed events, committed)", ours_s),
            ],
        )
        print(f"ratio snapshot/COPY: {copy_s / ours_s:.3g} (target ≥ 0.5)")
        print(f"ratio snapshot/connectorx: {peer_s / ours_s:.3g} (target ≥ 1.3)")
        print(f"ratio connectorx/COPY: {copy_s / peer_s:.3g}")
        print(f"ratio snapshot/naive JDBC: {naive_s / ours_s:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
