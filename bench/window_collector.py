"""The stream window's collector alone: pgoutput messages → event batches, per message vs columnar.

    .venv/bin/python bench/window_collector.py --changes 400000 --repeat 3

Builds a backlog of N changes (the mixed workload of ``bench/stream_window.py``: 60 % insert,
30 % update, 10 % delete, transactions of 100 changes) in a throwaway PostgreSQL 15, captures the
window's pgoutput messages once with ``pg_logical_slot_peek_binary_changes`` (lsn, xid, data) into
an Arrow IPC file, then feeds the same messages to:

- **frames**: ``WindowCollector.consume``, one ``XLogData`` per message (what the replication
  connection hands it; building the frames is not timed);
- **batches**: ``BatchWindowCollector.consume_batches``, record batches of ``--batch-rows``
  messages (what the SQL interface through ADBC hands it).

Both collect with the job's chunk size into a ``flush`` that drops the batches (no sink), so the
figures are the collector's alone: message classification, ordinals, buffering and the columnar
build of the events. Each measurement runs in a fresh process (frames and batches alternate);
peak memory is the highest resident size sampled every 5 ms during the collect, above the
resident size before it (the input is loaded before). Figures are medians; the machine's load
shows as wall time above CPU time. ``WINDOW_COLLECTOR_PROFILE=1`` prints each collect's cProfile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(kind: str, path: str, dsn: dict, chunk: int, batch_rows: int) -> dict:
    """One collect of the captured window (run in a fresh process)."""
    import psycopg
    import pyarrow as pa

    from airflow_provider_cdc.cdc.basics.window import Window
    from airflow_provider_cdc.cdc.events.settings import EventContext
    from airflow_provider_cdc.cdc.sources.postgres import admin
    from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
    from airflow_provider_cdc.cdc.sources.postgres.replication import XLogData
    from airflow_provider_cdc.cdc.sources.postgres.stream import WindowCollector
    from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
    from airflow_provider_cdc.cdc.sources.postgres.types import TypeCache
    from airflow_provider_cdc.cdc.sources.postgres.window_batches import BatchWindowCollector

    with pa.OSFile(path, "rb") as source:
        captured = pa.ipc.open_file(source).read_all().combine_chunks()
    meta = json.loads(captured.schema.metadata[b"window"])
    window = Window(1, "stream", Lsn(meta["from_lsn"]), Lsn(meta["to_lsn"]), 1)
    if kind == "frames":
        feed = [XLogData(lsn, data) for lsn, data in zip(captured["lsn"].to_pylist(), captured["data"].to_pylist())]
    else:
        feed = captured.to_batches(max_chunksize=batch_rows)
    events = 0

    def flush(batches: dict, tx_batch) -> None:
        nonlocal events
        events += sum(b.num_rows for topic in batches.values() for b in topic if b.num_rows)

    with psycopg.connect(**dsn, autocommit=True) as catalog:
        tables = admin.describe_tables(catalog, [TableRef("public", "accounts")])
        known = {(c.type.oid, c.type.modifier): c.type for t in tables.values() for c in t.columns}
        cls = WindowCollector if kind == "frames" else BatchWindowCollector
        collector = cls(
            window=window,
            tables=tables,
            context=EventContext.of_window("bench", "bench", window),
            topic_prefix="bench",
            previous_commit_lsn=None,
            max_changes_per_chunk=chunk,
            flush=flush,
            types=TypeCache(catalog, known),
        )
        base = peak = _rss()
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not stop.wait(0.005):
                peak = max(peak, _rss())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        profiler = None
        if os.environ.get("WINDOW_COLLECTOR_PROFILE"):  # cProfile's top functions on stderr
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        cpu0, t0 = time.process_time(), time.perf_counter()
        if kind == "frames":
            collector.consume(feed)
        else:
            collector.consume_batches(feed)
        stats = collector.finish()
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        if profiler is not None:
            import pstats

            profiler.disable()
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
        stop.set()
        sampler.join()
    return {
        "seconds": seconds,
        "cpu": cpu,
        "peak_mib": (max(peak, _rss()) - base) / 2**20,
        "changes": stats.changes,
        "events": events,
        "chunks": stats.chunks,
        "messages": len(captured),
    }


def capture(args, cluster, work: Path) -> tuple[Path, dict]:
    """Build the backlog and capture its window's messages once; returns the file and the DSN."""
    import pyarrow as pa
    import workload

    from airflow_provider_cdc.cdc.sources.postgres import admin
    from airflow_provider_cdc.cdc.sources.postgres.stream import MARKER_PREFIX
    from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef

    with cluster.connect("bench") as conn:
        workload.create_table(conn)
        admin.ensure_publication(conn, "bench_pub", [TableRef("public", "accounts")])
        status, _ = admin.ensure_slot(conn, "bench_slot", "bench")
        workload.build_backlog(conn, args.changes)
        target = admin.current_lsn(conn)
        conn.execute("SELECT pg_logical_emit_message(false, %s, 'end')", (MARKER_PREFIX,))
        rows = conn.execute(
            "SELECT (lsn - '0/0')::bigint, xid::text::bigint, data FROM pg_logical_slot_peek_binary_changes("
            "'bench_slot', NULL, NULL, 'proto_version', '1', 'publication_names', 'bench_pub', 'messages', 'true')"
        ).fetchall()
    lsn, xid, data = (list(c) for c in zip(*rows))
    window = {"from_lsn": int(status.confirmed_flush_lsn), "to_lsn": int(target)}
    table = pa.table(
        {"lsn": pa.array(lsn, pa.int64()), "xid": pa.array(xid, pa.int64()), "data": pa.array(data, pa.binary())}
    ).replace_schema_metadata({"window": json.dumps(window)})
    path = work / "window.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    dsn = {"host": cluster.host, "port": cluster.port, "dbname": "bench", "user": cluster.superuser}
    dsn["password"] = cluster.password
    return path, dsn


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=400_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=100_000, help="max_changes_per_chunk")
    parser.add_argument("--batch-rows", type=int, default=65_536, help="messages per record batch")
    parser.add_argument("--measure", nargs=2, metavar=("KIND", "FILE"), help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        result = measure(args.measure[0], args.measure[1], json.loads(args.dsn), args.chunk, args.batch_rows)
        print(json.dumps(result))
        return 0

    import workload

    with workload.bench_cluster() as (cluster, work):
        path, dsn = capture(args, cluster, work)
        results: dict[str, list[dict]] = {"frames": [], "batches": []}
        for _ in range(args.repeat):
            for kind in results:
                command = [sys.executable, __file__, "--measure", kind, str(path), "--dsn", json.dumps(dsn)]
                command += ["--chunk", str(args.chunk), "--batch-rows", str(args.batch_rows)]
                out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT)
                if os.environ.get("WINDOW_COLLECTOR_PROFILE"):
                    print(f"--- {kind}\n{out.stderr}")
                results[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
    frames, batches = results["frames"], results["batches"]
    assert [r["events"] for r in frames] == [r["events"] for r in batches], "the collectors disagree"
    first = frames[0]
    print(f"window: {first['messages']} messages, {first['changes']} changes, {first['chunks']} chunks of {args.chunk}")
    print("| collector | median s | median CPU s | µs/change | peak MiB above input |")
    print("|---|---|---|---|---|")
    for label, runs in (("WindowCollector.consume (frames)", frames), ("BatchWindowCollector (batches)", batches)):
        seconds = statistics.median(r["seconds"] for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        peak = statistics.median(r["peak_mib"] for r in runs)
        print(f"| {label} | {seconds:.2f} | {cpu:.2f} | {cpu / first['changes'] * 1e6:.2f} | {peak:.0f} |")
    print(
        f"runs (s): frames {workload.rounded([r['seconds'] for r in frames])}, "
        f"batches {workload.rounded([r['seconds'] for r in batches])}"
    )
    for figure in ("seconds", "cpu"):
        ratios = [f[figure] / b[figure] for f, b in zip(frames, batches)]
        print(f"ratio frames/batches, {figure} (median of per-repeat ratios): {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
