"""Stream-window throughput against the slot's raw decode rate, measured in the same run.

    .venv/bin/python bench/stream_window.py --changes 200000 --repeat 3 --workload mixed

Builds a backlog of N changes (``mixed``: 60 % insert, 30 % update, 10 % delete, transactions of
about 100 changes; ``one-transaction``: one UPDATE of N rows) on a realistic table in a
throwaway PostgreSQL 15, then measures, on that same backlog:

- limit: ``SELECT count(*) FROM pg_logical_slot_peek_binary_changes(...)``: the server decoding
  the backlog with pgoutput and nothing else;
- protocol ceiling: PostgreSQL's own C client ``pg_recvlogical`` streaming the same window over
  the replication protocol into /dev/null (on a copy of the slot): what any streaming client
  can reach, because the walsender sends and flushes every change as its own message;
- window (stream), window (sql): the capture job reading that window end to end (slot → decoded
  events → committed Parquet with the transaction side table, local sink, no Spark) with each
  ``window_reader``, each run in its own subprocess so its CPU time and peak RSS are its own;
  for the SQL reader also the server's temporary-file bytes (``pg_stat_database.temp_bytes``);
- server CPU: what the server's processes used for the peek and for each reader's window
  (``BENCH_SPLIT_MIN_BYTES=<huge>`` reads every SQL window as one range, as before the split).

The job never acknowledges the slot, so every repetition reads the same backlog. Figures are
medians; the ratios are what to compare across machines.
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


def peek_seconds(cluster, target: int, work_mem_kb: int | None) -> tuple[float, float, int]:
    """The server decoding the window with pgoutput and nothing else (``peek count(*)``), with
    ``logical_decoding_work_mem`` at ``work_mem_kb`` (None: the server's default): seconds,
    server CPU seconds, rows."""
    with cluster.connect("bench") as conn:
        if work_mem_kb is not None:
            conn.execute(f"SET logical_decoding_work_mem = '{int(work_mem_kb)}kB'")
        cpu = server_cpu(cluster)
        started = time.perf_counter()
        rows = conn.execute(
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes("
            "'bench_slot', %s::pg_lsn, NULL, 'proto_version', '1', 'publication_names', 'bench_pub')",
            (str(target),),
        ).fetchone()[0]
        return time.perf_counter() - started, server_cpu(cluster) - cpu, rows


def recvlogical_seconds(cluster, target: int, work_mem_kb: int | None = None) -> float | None:
    """The streaming protocol's own ceiling: PostgreSQL's C client ``pg_recvlogical`` draining
    the same window into /dev/null, on a copy of the slot (it acknowledges what it reads), with
    its walsender's ``logical_decoding_work_mem`` at ``work_mem_kb`` (None: the server's default)."""
    import os
    import subprocess

    from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn

    binary = cluster.bin_dir / "pg_recvlogical"
    if not binary.exists():
        return None
    with cluster.connect("bench") as conn:
        conn.execute("SELECT pg_copy_logical_replication_slot('bench_slot', 'bench_probe')")
    try:
        command = [str(binary), "-h", cluster.host, "-p", str(cluster.port), "-U", cluster.superuser, "-d", "bench"]
        command += ["-S", "bench_probe", "--start", "--no-loop", "-F", "0", "-E", str(Lsn(target)), "-f", "/dev/null"]
        command += ["-o", "proto_version=1", "-o", "publication_names=bench_pub"]
        env = {**os.environ, "PGPASSWORD": cluster.password}
        if work_mem_kb is not None:
            env["PGOPTIONS"] = f"-c logical_decoding_work_mem={int(work_mem_kb)}kB"
        started = time.perf_counter()
        subprocess.run(command, check=True, env=env, capture_output=True)
        return time.perf_counter() - started
    finally:
        with cluster.connect("bench") as conn:
            conn.execute("SELECT pg_drop_replication_slot('bench_probe')")


class _Profile:
    """cProfile of one window, its top functions printed to stderr and its stats saved to a file."""

    def __init__(self, path: str):
        import cProfile

        self.path = path
        self.profiler = cProfile.Profile()
        self.profiler.enable()

    def stop(self) -> None:
        import pstats

        self.profiler.disable()
        self.profiler.dump_stats(self.path)
        pstats.Stats(self.profiler, stream=sys.stderr).sort_stats("tottime").print_stats(25)


def run_child(spec_file: str, profile: str | None) -> int:
    """One window in this process (``--child``): prints its seconds, CPU seconds and peak RSS as JSON."""
    import json
    import os
    from dataclasses import replace

    from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job
    from airflow_provider_cdc.cdc.sources.postgres.spec import PostgresJobSpec

    spec = PostgresJobSpec.from_json(Path(spec_file).read_text(encoding="utf-8"))
    spec = replace(spec, connection=spec.connection.with_password_from_env())
    if os.environ.get("BENCH_PREFETCH"):
        from airflow_provider_cdc.cdc.sources.postgres import sql_window

        sql_window.PREFETCH_BATCHES = int(os.environ["BENCH_PREFETCH"])
    if os.environ.get("BENCH_SPLIT_MIN_BYTES"):  # e.g. a huge value: one range, as before the split
        from airflow_provider_cdc.cdc.sources.postgres import sql_window

        sql_window.SPLIT_MIN_BYTES = int(os.environ["BENCH_SPLIT_MIN_BYTES"])
    if os.environ.get("BENCH_BATCH_BYTES"):
        from airflow_provider_cdc.cdc.sources.postgres import sql_window

        sql_window.BATCH_SIZE_HINT_BYTES = int(os.environ["BENCH_BATCH_BYTES"])
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # A first window warms the process (lazy imports compile ~3 s of modules): the second is measured.
    run_job(replace(spec, sink_path=spec.sink_path + "-warm"), spark_provider=lambda: None)
    shutil.rmtree(spec.sink_path + "-warm", ignore_errors=True)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    profiler = _Profile(profile) if profile else None
    started = time.perf_counter()
    entry = run_job(spec, spark_provider=lambda: (_ for _ in ()).throw(AssertionError("no Spark")))
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    if profiler is not None:
        profiler.stop()
    events = sum(d.events for d in entry.datasets if d.topic != "bench.transaction")
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    print(
        json.dumps(
            {
                "seconds": seconds,
                "cpu": cpu,
                "rss": after.ru_maxrss / 1024,
                "rss_before": rss_before,
                "events": events,
                "spark": "pyspark" in sys.modules,
            }
        )
    )
    return 0


def window_in_subprocess(spec, reader: str, profile: str | None = None) -> dict:
    """The window of ``spec`` read with ``reader`` in a fresh interpreter (its own CPU and RSS)."""
    import json
    import os
    import subprocess
    import tempfile
    from dataclasses import replace

    spec = replace(spec, options=replace(spec.options, window_reader=reader))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        handle.write(spec.to_json())
    try:
        command = [sys.executable, __file__, "--child", handle.name, *(["--profile", profile] if profile else [])]
        env = {**os.environ, spec.connection.password_env: spec.connection.password or ""}
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"the {reader} window failed:\n{done.stderr[-4000:]}")
    finally:
        os.unlink(handle.name)
    if profile:
        print(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def server_cpu(cluster) -> float:
    """CPU seconds the server has used so far: its live processes', and what its exited backends
    used (the postmaster's reaped children). Read around a window, it is that window's server cost."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    postmaster = int((cluster.data_dir / "postmaster.pid").read_text().split()[0])
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = (Path("/proc") / entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(entry) == postmaster:
            total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])  # own + reaped children
        elif int(fields[1]) == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def temp_bytes(cluster) -> int:
    with cluster.connect("bench") as conn:
        return int(conn.execute("SELECT temp_bytes FROM pg_stat_database WHERE datname = 'bench'").fetchone()[0])


def main() -> int:
    from airflow_provider_cdc.cdc.planning.spec import DEFAULT_DECODING_WORK_MEM_BYTES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=100_000, help="max_changes_per_chunk")
    parser.add_argument(
        "--profile", metavar="HTML", help="profile the last SQL window with pyinstrument into this file"
    )
    parser.add_argument("--readers", default="stream,sql", help="window readers to measure, comma-separated")
    parser.add_argument(
        "--decoding-work-mem-mb",
        type=int,
        default=DEFAULT_DECODING_WORK_MEM_BYTES // 2**20,
        help="the capture's decoding_work_mem_bytes in MiB (0: the server's logical_decoding_work_mem); the peek "
        "and pg_recvlogical are measured at the server's default and at this setting",
    )
    parser.add_argument("--child", metavar="SPEC", help=argparse.SUPPRESS)
    parser.add_argument(
        "--workload",
        choices=["mixed", "one-transaction"],
        default="mixed",
        help="mixed: transactions of ~100 changes; one-transaction: a single UPDATE of N rows",
    )
    args = parser.parse_args()
    if args.child:
        return run_child(args.child, args.profile)

    import workload

    from airflow_provider_cdc.cdc.basics.window import Window
    from airflow_provider_cdc.cdc.sources.postgres import admin
    from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef

    readers = [r for r in args.readers.split(",") if r]
    memory = args.decoding_work_mem_mb * 2**20 or None
    tuned_kb = None if memory is None else memory // 1024
    with workload.bench_cluster() as (cluster, work):
        with cluster.connect("bench") as conn:
            workload.create_table(conn)
            if args.workload == "one-transaction":
                workload.seed_one_transaction(conn, args.changes)
            admin.ensure_publication(conn, "bench_pub", [TableRef("public", "accounts")])
            status, _ = admin.ensure_slot(conn, "bench_slot", "bench")
            started = time.monotonic()
            if args.workload == "one-transaction":
                workload.one_transaction(conn)
            else:
                workload.build_backlog(conn, args.changes)
            target = admin.current_lsn(conn)
            print(
                f"backlog ({args.workload}): {args.changes} changes, {target - status.confirmed_flush_lsn} bytes of "
                f"WAL, built in {time.monotonic() - started:.1f}s"
            )
        limits: list[float] = []
        ceilings: list[float] = []
        tuned_limits: list[float] = []
        tuned_ceilings: list[float] = []
        runs: dict[str, list[dict]] = {reader: [] for reader in readers}
        temps: list[int] = []
        servers: dict[str, list[float]] = {"peek": [], **{reader: [] for reader in readers}}
        for attempt in range(args.repeat):
            seconds, cpu, rows = peek_seconds(cluster, target, None)
            limits.append(seconds)
            servers["peek"].append(cpu)
            ceiling = recvlogical_seconds(cluster, target)
            if ceiling is not None:
                ceilings.append(ceiling)
            if tuned_kb is not None:
                tuned_limits.append(peek_seconds(cluster, target, tuned_kb)[0])
                tuned = recvlogical_seconds(cluster, target, tuned_kb)
                if tuned is not None:
                    tuned_ceilings.append(tuned)
            for reader in readers:
                sink = work / f"lake-{reader}-{attempt}"
                window = Window(1, "stream", status.confirmed_flush_lsn, target, 1)
                spec = workload.job_spec(
                    cluster, window, sink, max_changes_per_chunk=args.chunk, decoding_work_mem_bytes=memory
                )
                profile = args.profile if attempt == args.repeat - 1 and reader == "sql" else None
                before, cpu = temp_bytes(cluster), server_cpu(cluster)
                result = window_in_subprocess(spec, reader, profile)
                # Two windows (the warm-up and the measured) and their backends have exited.
                servers[reader].append((server_cpu(cluster) - cpu) / 2)
                if reader == "sql":
                    # The reader's backends flushed their stats at exit.
                    temps.append((temp_bytes(cluster) - before) // 2)
                assert result["events"] == args.changes, (result["events"], args.changes)
                assert not result["spark"]
                runs[reader].append(result)
                shutil.rmtree(sink)
        report(args, rows, limits, ceilings, runs, temps, servers)
        if tuned_kb is not None:
            report_tuned(args, tuned_limits, tuned_ceilings, runs)
    return 0


def report(
    args, rows: int, limits: list[float], ceilings: list[float], runs: dict, temps: list[int], servers: dict
) -> None:
    import workload

    limit = statistics.median(limits)
    ceiling = statistics.median(ceilings) if ceilings else None
    print(f"runs (s): peek {workload.rounded(limits)}, pg_recvlogical {workload.rounded(ceilings)}", end="")
    for reader, results in runs.items():
        print(f", window[{reader}] {workload.rounded([r['seconds'] for r in results])}", end="")
    print(f"\nraw decode rows (peek): {rows}")
    measures = [("limit: peek count(*)", limit)]
    if ceiling is not None:
        measures.append(("protocol ceiling: pg_recvlogical → /dev/null", ceiling))
    for reader, results in runs.items():
        measures.append(
            (f"window end to end, window_reader={reader!r}", statistics.median(r["seconds"] for r in results))
        )
    workload.print_table("changes", args.changes, measures)
    for reader, results in runs.items():
        window = statistics.median(r["seconds"] for r in results)
        cpu = statistics.median(r["cpu"] for r in results)
        rss = max(r["rss"] for r in results)
        base = min(r["rss_before"] for r in results)
        line = f"{reader}: window/peek {limit / window:.3g}"
        if ceiling is not None:
            line += f", window vs pg_recvlogical {ceiling / window:.3g}x"
        line += f", client CPU {cpu * 1e6 / args.changes:.2f} µs/change ({cpu / window:.2f} cores)"
        line += f", peak RSS {rss:.0f} MiB (imported: {base:.0f} MiB; chunk {args.chunk})"
        print(line)
        print(f"ratio window[{reader}]/limit: {limit / window:.3g}")
        if ceiling is not None:
            print(f"ratio window[{reader}]/pg_recvlogical: {ceiling / window:.3g}")
        print(f"peak RSS window[{reader}]: {rss:.0f} MiB")
    print(f"pyspark imported by a window: {any(r['spark'] for results in runs.values() for r in results)}")
    if temps:
        print(
            f"sql: server temporary files per window: {statistics.median(temps) / 1e6:.1f} MB "
            f"({statistics.median(temps) / args.changes:.0f} bytes/change)"
        )
    print(
        "server CPU per window (s, median): "
        + ", ".join(f"{name} {statistics.median(values):.2f}" for name, values in servers.items() if values)
    )
    if ceiling is not None:
        print(f"ratio pg_recvlogical/limit: {limit / ceiling:.3g} (what streaming itself allows)")


def report_tuned(args, limits: list[float], ceilings: list[float], runs: dict) -> None:
    """The readers against the peek and ``pg_recvlogical`` given the readers' own
    ``logical_decoding_work_mem``: what the server and the protocol reach with the same memory."""
    import workload

    limit = statistics.median(limits)
    ceiling = statistics.median(ceilings) if ceilings else None
    memory = f"logical_decoding_work_mem={args.decoding_work_mem_mb}MB"
    print(f"with {memory}: peek {workload.rounded(limits)}, pg_recvlogical {workload.rounded(ceilings)}")
    for reader, results in runs.items():
        window = statistics.median(r["seconds"] for r in results)
        line = f"ratio window[{reader}]/limit at the same memory: {limit / window:.3g}"
        if ceiling is not None:
            line += f"; window[{reader}]/pg_recvlogical at the same memory: {ceiling / window:.3g}"
        print(line)


if __name__ == "__main__":
    sys.exit(main())
