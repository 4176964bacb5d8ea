"""Where the Arrow current-state engine's time crosses Spark's: a Parquet state refresh by size.

    .venv/bin/python bench/state_engine.py --rows 10000,100000,1000000 --events 1000

For each state size (rows of the current version; a Parquet rebuild reads it whole) a window of
``--events`` changes (updates, inserts, deletes; a few unchanged-TOAST updates and key changes) is
folded into it and the new version written, once per engine, each in a fresh process as a task
runs it: ``arrow`` (read, fold and write on Arrow), ``spark`` (an embedded session started in the
process, then read, fold and write in Spark: what the task paid before). Reported per run: the
whole time in the process (imports and session start included), the fold's own time (read +
fold + write), and the process's peak RSS (for Spark: the Python side only; the JVM is another
process). The same files are read by both engines, and their results are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _make(directory: Path, rows: int, events: int) -> None:
    """A state version of ``rows`` rows and one window of ``events`` events over it."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_cdc.cdc.events.envelope import EventLayout
    from airflow_provider_cdc.cdc.sources.postgres.events import SOURCE_BLOCK

    ids = np.arange(rows, dtype=np.int64)
    body = pa.array([f"body of row {i} " * 4 for i in range(rows)])
    state = pa.table({"id": ids, "v": np.zeros(rows, np.int64), "body": body})
    (directory / "state").mkdir(parents=True)
    pq.write_table(state, directory / "state" / "part-0.parquet")
    layout = EventLayout(
        (pa.field("id", pa.int64()), pa.field("v", pa.int64()), pa.field("body", pa.string())), ("id",), SOURCE_BLOCK
    )
    rng = np.random.default_rng(7)
    out = []
    for n in range(events):
        kind = rng.choice(["u", "u", "u", "c", "d", "t"])  # "t": an update with an unchanged TOAST column
        key = int(rng.integers(0, rows)) if kind != "c" else rows + n
        lsn = 1000 + n
        source = {
            "version": "b",
            "connector": "postgresql",
            "name": "b",
            "ts_ms": 0,
            "snapshot": "false",
            "db": "db",
            "schema": "public",
            "table": "t",
            "lsn": lsn,
            "commit_lsn": lsn,
        }
        after = (
            None
            if kind == "d"
            else {"id": key, "v": n, "body": "__debezium_unavailable_value" if kind == "t" else f"new {n}"}
        )
        out.append(
            {
                "before": {"id": key, "v": None, "body": None} if kind == "d" else None,
                "after": after,
                "source": source,
                "op": {"t": "u"}.get(kind, kind),
                "ts_ms": 0,
                "transaction": {"id": str(lsn), "total_order": 1},
                "id": key,
                "unchanged_toast_columns": ["body"] if kind == "t" else None,
                "truncate": None,
                "__debezium_oldkey": None,
                "__debezium_newkey": None,
                "window_id": "0000000002",
            }
        )
    window = directory / "events" / "window=0000000002"
    window.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(out, schema=layout.schema), window / "part-0.parquet")


def _child(engine: str, directory: Path) -> dict:
    started = time.monotonic()
    if engine == "arrow":
        from airflow_provider_cdc.cdc.state import arrow as state_arrow
        from airflow_provider_cdc.cdc.state import arrow_fold as state_fold_arrow

        ready = time.monotonic()
        events = state_arrow.read_parquet_arrow([str(directory / "events")])
        base = state_arrow.read_parquet_arrow([str(directory / "state")])
        rows = state_arrow.write_version_arrow(state_fold_arrow.fold(events, base), str(directory / "out-arrow"))
    else:
        from airflow_provider_cdc.cdc.basics.spark_session import get_or_create_session
        from airflow_provider_cdc.cdc.planning.spec import SparkOptions
        from airflow_provider_cdc.cdc.sinks.spark_files import spark_read_merged
        from airflow_provider_cdc.cdc.state import spark_fold as state

        spark = get_or_create_session(SparkOptions(master="local[2]"))
        ready = time.monotonic()
        events = spark_read_merged(spark, [str(directory / "events")])
        base = spark.read.parquet(str(directory / "state"))
        rows = state._write_version(spark, state.fold(spark, events, base), str(directory / "out-spark"))
    done = time.monotonic()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"total": done - started, "fold": done - ready, "rows": rows, "rss": peak}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="10000,100000,1000000", help="state sizes, comma-separated")
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(_child(args.child[0], Path(args.child[1]))))
        return 0
    print(
        "| state rows | events | arrow: process s | arrow: fold s | arrow: peak RSS MB | spark: process s | "
        "spark: fold s | spark fold / arrow fold | same rows |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        directory = Path(tempfile.mkdtemp(prefix="cdc-bench-state-"))
        try:
            _make(directory, rows, args.events)
            results = {}
            for engine in ("arrow", "spark"):
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", engine, str(directory)],
                    capture_output=True,
                    text=True,
                    env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
                )
                line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
                if line is None:
                    sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
                    return 1
                results[engine] = json.loads(line[len("RESULT ") :])
            a, s = results["arrow"], results["spark"]
            print(
                f"| {rows:,} | {args.events:,} | {a['total']:.2f} | {a['fold']:.2f} | {a['rss'] / 1e6:.0f} | "
                f"{s['total']:.2f} | {s['fold']:.2f} | {s['fold'] / a['fold']:.1f} | {a['rows'] == s['rows']} |"
            )
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
