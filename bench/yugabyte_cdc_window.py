"""YugabyteDB CDC-service stream-window throughput against fetching the same records, in the same run.

    .venv/bin/python bench/yugabyte_cdc_window.py --changes 50000 --repeat 3

Runs on the CDC-service stand-in (tests/support/yugabyte_cdc: masters and tablet servers speaking
YB's framed-protobuf RPC on loopback, serving the changes of a throwaway PostgreSQL 15 cut into
hash-partitioned tablets, docs/yugabytedb-cdc-standin.md), so the absolute figures say nothing about
a real YugabyteDB; the *ratio* says how much the capture adds on top of fetching the records
through the same client. Builds a backlog of N changes (60 % insert, 30 % update, 10 % delete, in
transactions of 100) on one table spread over ``--tablets`` tablets, captured by a CHANGE stream
with explicit checkpoints, then measures, from the same start checkpoints to the same end:

- limit ("fetch"): every tablet's ``GetChanges`` pages polled through the product's RPC client
  (``YbCdcClient`` over ``RpcConnection``, the job's own requests: explicit checkpoint, schema on
  the first call), protobuf decoded, records counted and dropped: the protocol's own cost;
- window: the stream-window job end to end (``yugabyte_cdc.jobs.run_job``: records → merged
  transactions in commit order → Debezium events → committed Parquet with the transaction side
  table, local sink, no Spark).

Every run checks its result: the fetch counts N change records in the window, the window writes N
events with the backlog's exact insert/update/delete counts and one transaction per 100 changes.
It also reports the job's peak memory (RSS high-water mark of a child process running the job
alone) at N and at 4N changes (``--no-memory`` skips both). Figures are medians.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from airflow_provider_cdc.cdc.sources.yugabyte_cdc.spec import YbCdcJobSpec

PREFIX = "bench"
TABLE = "events"
TABLE_DDL = (
    f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, account int NOT NULL, amount numeric(12,2) NOT NULL, note text)"
)
PER_TX = 100
#: Give up on a tablet whose safe time stops short of the window end (the stand-in's heartbeat
#: moves it every 0.1 s, so this never fires unless something is broken).
IDLE_TIMEOUT = 60.0


class Backlog:
    """Changes on ``events`` where every statement changes exactly one row: the live ids are
    ``[oldest, next_id)``, deletes take the oldest, updates a live id picked deterministically."""

    def __init__(self) -> None:
        self.oldest = self.next_id = 1
        self.ops: Counter[str] = Counter()  # the Debezium ops (c/u/d) of every change so far

    def build(self, conn: Any, changes: int) -> None:
        """Append ``changes`` changes, ``PER_TX`` per transaction (one round trip each)."""
        ops = self.ops
        made = 0
        while made < changes:
            statements = []
            for i in range(min(PER_TX, changes - made)):
                kind, live = i % 10, self.next_id - self.oldest
                if kind < 6 or live < 10:
                    n = self.next_id
                    statements.append(
                        f"INSERT INTO {TABLE} VALUES ({n}, {n % 97}, {n * 0.25:.2f}, 'event {n} lorem ipsum dolor')"
                    )
                    self.next_id += 1
                    ops["c"] += 1
                elif kind < 9:
                    victim = self.oldest + (made + i) * 7919 % live
                    statements.append(f"UPDATE {TABLE} SET amount = amount + 1 WHERE id = {victim}")
                    ops["u"] += 1
                else:
                    statements.append(f"DELETE FROM {TABLE} WHERE id = {self.oldest}")
                    self.oldest += 1
                    ops["d"] += 1
            # One simple-query message per transaction: building the backlog is not what is measured.
            conn.execute("BEGIN; " + "; ".join(statements) + "; COMMIT")
            made += len(statements)


def fetch_records(spec: YbCdcJobSpec) -> tuple[int, int]:
    """The limit: every tablet's pages from its start position to the window end through the
    product's client, as the job requests them; returns (records, change records in the window)."""
    from airflow_provider_cdc.cdc.sources.yugabyte_cdc.addresses import parse_addresses
    from airflow_provider_cdc.cdc.sources.yugabyte_cdc.client import YbCdcClient
    from airflow_provider_cdc.cdc.sources.yugabyte_cdc.jobs import IdleWait
    from airflow_provider_cdc.cdc.sources.yugabyte_cdc.pages import poll_pages
    from airflow_provider_cdc.cdc.sources.yugabyte_cdc.protocol import yb_cdc_pb2 as pb

    dml = {pb.RowMessage.INSERT, pb.RowMessage.UPDATE, pb.RowMessage.DELETE}
    from_ht, to_ht = int(spec.window.from_lsn), int(spec.window.to_lsn)
    records = changes = 0
    with YbCdcClient(parse_addresses(spec.master_addresses), spec.stream_id, tls=spec.tls) as client:
        for tablet, position in spec.tablets.polled().items():
            fetch = client.fetcher(tablet, explicit=position.checkpoint)
            # The job's end (to_ht - 1: the window is [from, to)) and its idle handling.
            for page in poll_pages(fetch, position, to_ht - 1, on_idle=IdleWait(tablet, IDLE_TIMEOUT)):
                records += len(page.records)
                for record in page.records:
                    row = record.row_message
                    if row.op in dml and from_ht <= row.commit_time < to_ht:
                        changes += 1
    return records, changes


def check_window(sink: str, committed: int, ops: Counter[str]) -> None:
    """The window wrote exactly the backlog (``committed``: its commit entry's change count): the
    backlog's ops, one transaction per ``PER_TX`` changes."""
    from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow

    changes = sum(ops.values())
    events = read_topic_arrow(sink, PREFIX, f"{PREFIX}.public.{TABLE}")
    written = Counter() if events is None else Counter(events.column("op").to_pylist())
    assert written == ops, f"events written {dict(written)} != backlog {dict(ops)}"
    assert committed == changes, (committed, changes)
    side = read_topic_arrow(sink, PREFIX, f"{PREFIX}.transaction")
    assert side is not None, "no transaction side table"
    ends = [r for r in side.select(["status", "event_count"]).to_pylist() if r["status"] == "END"]
    assert len(ends) == -(-changes // PER_TX) and sum(r["event_count"] for r in ends) == changes, len(ends)


def job_peak_mib(spec: YbCdcJobSpec) -> tuple[float, float, int]:
    """The window job run alone in a child process (the spec as the operator would hand it over):
    (peak RSS in MiB, seconds, changes committed)."""
    code = (
        "import resource, sys, time; from airflow_provider_cdc.cdc.sources.yugabyte_cdc.jobs import run_job; "
        "from airflow_provider_cdc.cdc.sources.yugabyte_cdc.spec import YbCdcJobSpec; "
        "spec = YbCdcJobSpec.from_json(sys.stdin.read()); began = time.perf_counter(); "
        "entry = run_job(spec, lambda: None); took = time.perf_counter() - began; "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, took, entry.stats['changes'])"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], input=spec.to_json(), capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    kib, seconds, committed = done.stdout.split()[-3:]
    return int(kib) / 1024, float(seconds), int(committed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tablets", type=int, default=4, help="tablets of the captured table")
    parser.add_argument("--chunk", type=int, default=100_000, help="max_changes_per_chunk")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-RSS runs (N and 4N)")
    args = parser.parse_args()

    from airflow_provider_cdc.cdc.basics.tables import TableRef
    from airflow_provider_cdc.cdc.basics.window import Window
    from airflow_provider_cdc.cdc.planning.spec import CaptureOptions
    from airflow_provider_cdc.cdc.sources.yugabyte.lsn import YbLsn
    from airflow_provider_cdc.cdc.sources.yugabyte_cdc.jobs import run_job
    from airflow_provider_cdc.cdc.sources.yugabyte_cdc.spec import YbCdcJobSpec
    from airflow_provider_cdc.testing.postgres_cluster import PostgresCluster, available_flavours, scratch_dir
    from tests.support.yugabyte_cdc import YugabyteCdcStandIn
    from tests.support.yugabyte_cdc.starts import start_streaming

    def no_spark() -> None:
        raise AssertionError("a stream window on a local sink must not start Spark")

    cluster = PostgresCluster(available_flavours()["pg15"], scratch_dir("bench-ybcdc-")).start()
    sink_root = Path(tempfile.mkdtemp(prefix="bench-ybcdc-sink-"))
    yb = YugabyteCdcStandIn(cluster, "bench", tablets_per_table=args.tablets)
    try:
        yb.start()
        with yb.connect() as conn:
            conn.execute(TABLE_DDL)
        deadline = time.monotonic() + 30
        while not yb.tablets(TABLE):  # the stand-in cuts a new table into tablets at its next catalog poll
            assert time.monotonic() < deadline, "the stand-in gave the table no tablets"
            time.sleep(0.2)
        stream = yb.create_stream("CHANGE", "EXPLICIT", tables=[TABLE])
        start = start_streaming(yb, stream, TABLE)
        assert len(start) == args.tablets, start
        from_ht = yb.wait_caught_up() + 1
        backlog = Backlog()

        def spec_to(to_ht: int, sink: str) -> YbCdcJobSpec:
            return YbCdcJobSpec(
                topic_prefix=PREFIX,
                master_addresses=yb.master_addresses_flag,
                stream_id=stream,
                database=yb.database,
                tables=(TableRef("public", TABLE),),
                window=Window(1, "stream", YbLsn(from_ht), YbLsn(to_ht), 1_700_000_000_000),
                sink_path=sink,
                tablets=start,
                record_type="CHANGE",
                options=CaptureOptions(max_changes_per_chunk=args.chunk, idle_timeout_seconds=IDLE_TIMEOUT),
                tls=None,  # the stand-in's RPC ports are plaintext
            )

        def build(changes: int, label: str) -> int:
            """Appends ``changes`` to the backlog; returns the end of a window over all of it."""
            began = time.perf_counter()
            with yb.connect() as conn:
                backlog.build(conn, changes)
            to_ht = yb.wait_caught_up(timeout=600) + 1  # every commit above is at or below the safe time
            took = time.perf_counter() - began
            print(f"{label}: backlog of {changes:,} changes built and in the tablet logs in {took:.1f}s")
            return to_ht

        to_ht = build(args.changes, "N")
        ops = Counter(backlog.ops)
        changes = sum(ops.values())
        fetch_runs, window_runs = [], []
        records = 0
        for i in range(args.repeat):
            spec = spec_to(to_ht, str(sink_root / f"N-{i}"))
            began = time.perf_counter()
            records, fetched = fetch_records(spec)
            fetch_runs.append(time.perf_counter() - began)
            assert fetched == changes, f"fetched {fetched} change records, the backlog has {changes}"
            began = time.perf_counter()
            entry = run_job(spec, no_spark)
            window_runs.append(time.perf_counter() - began)
            check_window(spec.sink_path, entry.stats["changes"], ops)
        fetch, window = statistics.median(fetch_runs), statistics.median(window_runs)
        print(f"tablets: {len(start)}, records fetched (BEGIN/COMMIT/DDL/SAFEPOINT included): {records:,}")
        print(f"runs (s): fetch {[round(x, 2) for x in fetch_runs]}, window {[round(x, 2) for x in window_runs]}")
        print("| measure | median s | changes/s |")
        print("|---|---|---|")
        print(f"| limit: GetChanges of every tablet, product's client | {fetch:.2f} | {changes / fetch:,.0f} |")
        print(f"| window: events committed to Parquet | {window:.2f} | {changes / window:,.0f} |")
        print(f"ratio window/fetch: {fetch / window:.2f} (the window's speed as a share of the fetch's)")

        if not args.no_memory:
            spec = spec_to(to_ht, str(sink_root / "N-memory"))
            peak, took, committed = job_peak_mib(spec)
            check_window(spec.sink_path, committed, ops)
            print(f"window job's peak RSS (own process), {changes:,} changes: {peak:.0f} MiB (job {took:.2f}s)")
            to_ht = build(3 * args.changes, "4N")  # one window from the same start over the whole 4N backlog
            spec = spec_to(to_ht, str(sink_root / "4N-memory"))
            peak, took, committed = job_peak_mib(spec)
            check_window(spec.sink_path, committed, backlog.ops)
            more = sum(backlog.ops.values())
            print(f"window job's peak RSS (own process), {more:,} changes: {peak:.0f} MiB (job {took:.2f}s)")
    finally:
        yb.stop(drop=False)  # no need to drop its database: the whole cluster goes
        cluster.stop()
        shutil.rmtree(cluster.base_dir, ignore_errors=True)
        shutil.rmtree(sink_root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
