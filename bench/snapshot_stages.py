"""Where a snapshot's time goes: CPU per stage of one partition reader, the server's CPU, and
Spark's fixed cost per snapshot job.

    .venv/bin/python bench/snapshot_stages.py --rows 1000000 --repeat 3

Fills the benchmark table (``bench/workload.py``) with M rows in a throwaway PostgreSQL 15,
exports a snapshot, then reads the whole table the way one snapshot task reads its block range
(``snapshot.read_partition`` into ``write_parquet_file``), in this process, and reports per
stage the CPU seconds per 1 M rows (medians):

- read loop: ``PQgetCopyData`` per row and the chunk's buffer (the rest of the reading thread);
- framing (``copy_binary.frame_rows``), values (the codecs: ``CopyPlan.values``), envelope
  (``SnapshotBatches.batch``), all on the reading thread;
- Parquet: the background writer thread (process CPU minus the reading thread's);
- server: the CPU of the PostgreSQL cluster's processes during the read (its COPY output).

Then Spark's fixed cost: a snapshot job of a 1,000-row table (``run_job``, local[2]) and a job
that does nothing (``spark.range(2).mapInArrow``), medians after one warm-up. The sum of the
stages over the machine's cores, plus the fixed cost, bounds what ``bench/snapshot.py`` can
measure on this machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int | str) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tree_cpu(root: int) -> float:
    """CPU seconds used so far by ``root`` and its descendants, the exited ones included (their
    time is in their parent's children fields once reaped), from Linux's /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := _stat(name)) is not None:
            children.setdefault(int(fields[1]), []).append(int(name))
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        if (fields := _stat(pid)) is not None:
            total += sum(int(f) for f in fields[11:15]) / TICKS  # utime, stime, cutime, cstime
    return total


def timed(owner: object, name: str, stage: str, stages: Counter) -> None:
    """Wrap ``owner.name`` to add the calling thread's CPU time to ``stages[stage]``."""
    function = getattr(owner, name)

    def wrapper(*args, **kwargs):
        started = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            stages[stage] += time.thread_time() - started

    setattr(owner, name, wrapper)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=5, help="repetitions of each Spark fixed-cost job")
    args = parser.parse_args()

    import pyarrow as pa
    import workload

    from airflow_provider_cdc.cdc.basics.spark_session import get_or_create_session
    from airflow_provider_cdc.cdc.basics.window import Window
    from airflow_provider_cdc.cdc.planning.spec import SparkOptions
    from airflow_provider_cdc.cdc.sinks.parquet import write_parquet_file
    from airflow_provider_cdc.cdc.sources.postgres import admin, copy_binary
    from airflow_provider_cdc.cdc.sources.postgres.copy_plan import CopyPlan
    from airflow_provider_cdc.cdc.sources.postgres.events import EventContext, EventSettings, SnapshotBatches
    from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job
    from airflow_provider_cdc.cdc.sources.postgres.replication import ReplicationConnection
    from airflow_provider_cdc.cdc.sources.postgres.snapshot import BlockRange, SnapshotPoint, read_partition
    from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef

    stages: Counter = Counter()
    timed(copy_binary, "frame_rows", "framing", stages)
    timed(CopyPlan, "values", "values", stages)
    timed(SnapshotBatches, "batch", "envelope", stages)

    with workload.bench_cluster() as (cluster, work):
        with cluster.connect("bench") as conn:
            workload.create_table(conn)
            workload.fill(conn, args.rows)
            conn.execute("VACUUM (FREEZE, ANALYZE) accounts")
            conn.execute("CREATE TABLE small AS SELECT * FROM accounts LIMIT 1000")
            conn.execute("ALTER TABLE small ADD PRIMARY KEY (id)")
        postmaster = int((cluster.data_dir / "postmaster.pid").read_text().split()[0])
        spec = workload.job_spec(cluster, Window(1, "snapshot", None, None, 1), work / "lake")
        with cluster.connect("bench") as conn:
            table = admin.describe_tables(conn, [TableRef("public", "accounts")])[TableRef("public", "accounts")]

        runs: list[dict[str, float]] = []
        with ReplicationConnection(spec.connection) as replication:
            creation = replication.create_slot("bench_stages", temporary=True, export_snapshot=True)
            point = SnapshotPoint(creation.snapshot_name, int(creation.consistent_point), None, 0)
            for _ in range(args.repeat):
                stages.clear()
                server, process, thread = tree_cpu(postmaster), time.process_time(), time.thread_time()
                started = time.perf_counter()
                context = EventContext("bench", "bench", "x", 0)
                batches = read_partition(spec.connection, point, table, BlockRange(0, None), context, EventSettings())
                rows = write_parquet_file(str(work / "stages.parquet"), batches)
                wall = time.perf_counter() - started
                assert rows == args.rows, (rows, args.rows)
                reading = time.thread_time() - thread
                run = {
                    "read loop": reading - sum(stages.values()),
                    **stages,
                    "Parquet (writer thread)": time.process_time() - process - reading,
                    "server (PostgreSQL)": tree_cpu(postmaster) - server,
                    "wall": wall,
                }
                runs.append(run)
        scale = 1_000_000 / args.rows
        names = ["read loop", "framing", "values", "envelope", "Parquet (writer thread)", "server (PostgreSQL)"]
        medians = {n: statistics.median(r[n] for r in runs) * scale for n in [*names, "wall"]}
        print(f"one reader, whole table of {args.rows:,} rows, {args.repeat} runs; CPU seconds per 1 M rows (medians):")
        print("| stage | core-s per 1 M rows |")
        print("|---|---|")
        for name in names:
            print(f"| {name} | {medians[name]:.2f} |")
        client = sum(medians[n] for n in names[:-1])
        total = client + medians["server (PostgreSQL)"]
        print(f"client {client:.2f} + server {medians['server (PostgreSQL)']:.2f} = {total:.2f} core-s per 1 M rows")
        print(f"one reader's wall per 1 M rows: {medians['wall']:.2f}s")
        cores = os.cpu_count() or 1
        print(f"bound on {cores} cores: {total / cores:.2f}s per 1 M rows before fixed costs")

        spark = get_or_create_session(SparkOptions(master="local[2]"))

        def nothing(batches):
            for _ in batches:
                yield pa.RecordBatch.from_pydict({"x": [1]})

        small = type(spec)(**{**spec.__dict__, "tables": (TableRef("public", "small"),)})
        jobs, empty = [], []
        for attempt in range(args.jobs + 1):
            started = time.perf_counter()
            spark.range(0, 2, 1, 2).mapInArrow(nothing, "x long").collect()
            empty.append(time.perf_counter() - started)
            sink = work / f"small{attempt}"
            started = time.perf_counter()
            run_job(type(spec)(**{**small.__dict__, "sink_path": str(sink)}), spark_provider=lambda: spark)
            jobs.append(time.perf_counter() - started)
            shutil.rmtree(sink)
        print(f"Spark job doing nothing (range(2).mapInArrow): {statistics.median(empty[1:]):.2f}s")
        print(f"snapshot of a 1,000-row table (fixed cost per snapshot job): {statistics.median(jobs[1:]):.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
