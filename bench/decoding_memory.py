"""The server's decode of one large transaction at each ``logical_decoding_work_mem``.

    .venv/bin/python bench/decoding_memory.py --changes 500000 --settings 64MB 128MB 256MB 512MB 1GB

Builds one UPDATE of N rows on the benchmark table in a throwaway PostgreSQL 15 and times
``SELECT count(*) FROM pg_logical_slot_peek_binary_changes(...)`` (the server decoding it with
pgoutput and nothing else) with the session's ``logical_decoding_work_mem`` at each setting, and
the reorder buffer's spill to disk at each (``pg_stat_replication_slots.spill_bytes``). Past the
setting the server writes the transaction's changes to ``pg_replslot/`` and reads them back at
the commit: what the capture's ``decoding_work_mem_bytes`` avoids (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=500_000)
    parser.add_argument("--settings", nargs="+", default=["64MB", "128MB", "256MB", "512MB", "1GB"])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    import workload

    from airflow_provider_cdc.cdc.sources.postgres import admin
    from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef

    with workload.bench_cluster() as (cluster, _work):
        with cluster.connect("bench") as conn:
            workload.create_table(conn)
            workload.seed_one_transaction(conn, args.changes)
            admin.ensure_publication(conn, "bench_pub", [TableRef("public", "accounts")])
            status, _ = admin.ensure_slot(conn, "bench_slot", "bench")
            workload.one_transaction(conn)
            target = admin.current_lsn(conn)
        print(f"one transaction of {args.changes} changes, {target - status.confirmed_flush_lsn} bytes of WAL")
        print("| logical_decoding_work_mem | peek s (median) | runs | spilled MB |")
        print("|---|---|---|---|")
        for setting in args.settings:
            runs, spilled = [], 0
            for _ in range(args.repeat):
                with cluster.connect("bench") as conn:
                    conn.execute("SELECT set_config('logical_decoding_work_mem', %s, false)", (setting,))
                    conn.execute("SELECT pg_stat_reset_replication_slot('bench_slot')")
                    started = time.perf_counter()
                    conn.execute(
                        "SELECT count(*) FROM pg_logical_slot_peek_binary_changes("
                        "'bench_slot', %s::pg_lsn, NULL, 'proto_version', '1', 'publication_names', 'bench_pub')",
                        (str(target),),
                    ).fetchone()
                    runs.append(time.perf_counter() - started)
                    spilled = conn.execute(
                        "SELECT spill_bytes FROM pg_stat_replication_slots WHERE slot_name = 'bench_slot'"
                    ).fetchone()[0]
            print(
                f"| {setting} | {statistics.median(runs):.2f} | {', '.join(f'{r:.2f}' for r in runs)} "
                f"| {spilled / 1e6:.0f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
