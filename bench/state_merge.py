"""Current-state refresh after one window: today's full rewrite against MERGE into Delta and Iceberg.

    .venv/bin/python bench/state_merge.py --rows 100000 1000000 --changes 1000 --repeat 2
    .venv/bin/python bench/state_merge.py --distribution uniform ...

For each size N, builds an ``orders`` state table of N rows (id bigint key, customer_id,
public_id uuid text, status, total decimal, ordered_at timestamp, note), written sorted by id
into files of a bounded size (``--file-mb``), three times: as today's Parquet state version, as a
Delta table and as an Iceberg table (SQLite catalog). Then, per repetition and distribution, one
stream window of about C changes shaped like an order system's load:

- 75 % updates of existing orders: with ``recent``, concentrated on the newest 2 % of ids (status
  changes of recent orders); with ``uniform``, spread uniformly over all live ids (the worst case
  for copy-on-write: every data file may hold a changed key);
- 20 % inserts at new ids (above the largest);
- 5 % deletes of existing orders (recent or uniform, as the updates);

and measures, on the same Spark session (local[2]), the current-state refresh of that window:

- full rewrite: ``state.fold(events, whole base)``, Parquet overwrite and row count, the steps
  ``apply_windows`` runs today;
- Delta MERGE and Iceberg MERGE: ``state_merge.merge_windows`` (affected keys, their rows read
  with a key filter, the same fold over them, one table commit).

Each table commit reports the data files it rewrote (of those the table had) and the bytes of
the data files it added. Every repetition is a new window on the tables the previous one left (the
distributions one after the other, on the same tables), and checks that the three states have the
same row count and the same rows for the window's keys. A first, unmeasured
window on the smallest size warms up the JVM and Spark's Python workers. Figures are medians;
each size's ratio to the smallest size says how each path scales with the table (MERGE should
stay flat: its work follows the window, not the table).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from airflow_provider_cdc.cdc.events.envelope import EventLayout  # noqa: E402
from airflow_provider_cdc.cdc.sinks.formats import WindowTag  # noqa: E402
from airflow_provider_cdc.cdc.sources.postgres.events import SOURCE_BLOCK  # noqa: E402
from airflow_provider_cdc.cdc.state.delta_table import DeltaStateTable  # noqa: E402
from airflow_provider_cdc.cdc.state.iceberg_table import IcebergStateTable  # noqa: E402
from airflow_provider_cdc.cdc.state.merge import merge_windows  # noqa: E402
from airflow_provider_cdc.cdc.state.spark_fold import fold  # noqa: E402
from airflow_provider_cdc.cdc.state.table_rows import plain_types  # noqa: E402

COLUMNS = (
    pa.field("id", pa.int64()),
    pa.field("customer_id", pa.int32()),
    pa.field("public_id", pa.string()),
    pa.field("status", pa.string()),
    pa.field("total", pa.decimal128(12, 2)),
    pa.field("ordered_at", pa.timestamp("us")),
    pa.field("note", pa.string()),
)
LAYOUT = EventLayout(COLUMNS, ("id",), SOURCE_BLOCK)
STATUSES = ("new", "paid", "packed", "shipped", "delivered", "cancelled")
UPDATES, INSERTS = 0.75, 0.20  # the rest are deletes
RECENT = 0.02  # updates and deletes hit the newest 2 % of ids
DISTRIBUTIONS = ("recent", "uniform")


def orders(ids: np.ndarray, status: str | None = None, seed: int = 0) -> pa.Table:
    """Order rows for ``ids`` (deterministic per id, ``status`` overriding the status)."""
    rng = np.random.default_rng(seed)
    n = len(ids)
    public = [f"{i:08x}-0000-4000-8000-{i * 2654435761 % 16**12:012x}" for i in ids.tolist()]
    statuses = pa.array([status] * n) if status else pa.array(np.array(STATUSES)[ids % len(STATUSES)])
    cents = ((ids * 7919) % 100_000).astype(np.int64) + rng.integers(0, 100, n)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "customer_id": pa.array((ids % 50_000).astype(np.int32)),
            "public_id": pa.array(public, pa.string()),
            "status": statuses,
            "total": _decimal(cents),
            "ordered_at": pa.array(1_767_225_600_000_000 + ids * 60_000_000, pa.timestamp("us")),
            "note": pa.array([f"order {i} for customer {i % 50_000}, standard shipping" for i in ids.tolist()]),
        }
    )


def _decimal(cents: np.ndarray) -> pa.Array:
    """Non-negative cents as decimal(12, 2), built from the 16-byte little-endian values directly."""
    words = np.zeros((len(cents), 2), dtype=np.int64)
    words[:, 0] = cents
    return pa.Array.from_buffers(pa.decimal128(12, 2), len(cents), [None, pa.py_buffer(words.tobytes())])


class Workload:
    """The ids an N-row table has, and windows of changes to it."""

    def __init__(self, rows: int, changes: int, seed: int):
        self.next_id, self.changes = rows, changes
        self.distribution = "recent"
        self.deleted: set[int] = set()
        self.rng = np.random.default_rng(seed)

    def window(self, seq: int) -> tuple[pa.Table, np.ndarray]:
        """One window's events (and the ids it touches)."""
        updates, inserts = int(self.changes * UPDATES), int(self.changes * INSERTS)
        deletes = self.changes - updates - inserts
        # The newest 2 % of ids (at least twice the keys needed, for small tables), or all of them.
        recent_from = max(0, self.next_id - max(int(self.next_id * RECENT), 2 * (updates + deletes)))
        if self.distribution == "uniform":
            recent_from = 0
        candidates = np.setdiff1d(np.arange(recent_from, self.next_id), np.fromiter(self.deleted, np.int64))
        touched = self.rng.choice(candidates, updates + deletes, replace=False)
        updated, removed = np.sort(touched[:updates]), np.sort(touched[updates:])
        inserted = np.arange(self.next_id, self.next_id + inserts)
        self.next_id += inserts
        self.deleted.update(removed.tolist())
        status = STATUSES[seq % len(STATUSES)]
        after = pa.concat_tables([orders(updated, status, seed=seq), orders(inserted, "new", seed=seq)])
        n_after, n = len(after), len(after) + len(removed)
        ops = ["u"] * len(updated) + ["c"] * len(inserted) + ["d"] * len(removed)
        nulls = pa.nulls(len(removed), LAYOUT.value_type)
        key_only = pa.StructArray.from_arrays(
            [pa.array(removed, pa.int64()) if f.name == "id" else pa.nulls(len(removed), f.type) for f in COLUMNS],
            fields=list(COLUMNS),
        )
        after_array = pa.StructArray.from_arrays(
            [after.column(f.name).combine_chunks() for f in COLUMNS], fields=list(COLUMNS)
        )
        lsn = np.arange(n, dtype=np.int64) * 100 + seq * 10_000_000
        source = pa.StructArray.from_arrays(
            [pa.repeat(pa.scalar(v, f.type), n) for f, v in zip(SOURCE_BLOCK, _source_constants())]
            + [pa.nulls(n, pa.int64()), pa.array(lsn), pa.nulls(n, pa.int64()), pa.array(lsn)],
            fields=list(SOURCE_BLOCK),
        )
        transaction = pa.array([{"id": str(x), "total_order": 1, "data_collection_order": 1} for x in lsn.tolist()])
        batch = LAYOUT.assemble(
            before=pa.concat_arrays([pa.nulls(n_after, LAYOUT.value_type), key_only]),
            after=pa.concat_arrays([after_array, nulls]),
            source=source,
            op=pa.array(ops),
            ts_ms=0,
            transaction=transaction.cast(LAYOUT.schema.field("transaction").type),
            window_id=f"{seq:010d}",
        )
        return pa.Table.from_batches([batch]), np.concatenate([updated, inserted, removed])


def _source_constants() -> list:
    return ["bench", "postgresql", "bench", 0, "false", "bench", None, "public", "orders"]


def tag(seq: int, kind: str = "stream") -> WindowTag:
    return WindowTag("bench", seq, f"{seq:010d}", kind, None, None, f"a{seq}")


def full_rewrite(spark, events, base_dir: Path, out_dir: Path) -> float:
    """Today's refresh: fold over the whole base, Parquet overwrite, count (as apply_windows)."""
    started = time.perf_counter()
    folded = fold(spark, events, spark.read.parquet(str(base_dir)))
    folded.write.mode("overwrite").parquet(str(out_dir))
    spark.read.parquet(str(out_dir)).count()
    return time.perf_counter() - started


def file_sizes(state) -> dict[str, int]:
    """{data file: bytes} of the state table's current version."""
    if isinstance(state, DeltaStateTable):
        actions = pa.table(state._table().get_add_actions(flatten=True))
        return dict(zip(actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist()))
    return {t.file.file_path: t.file.file_size_in_bytes for t in state._table().scan().plan_files()}


def keyed_rows(table: pa.Table, ids: np.ndarray) -> list[tuple]:
    picked = plain_types(table).filter(pc.is_in(table.column("id"), pa.array(ids, pa.int64())))
    return sorted(tuple(sorted(r.items())) for r in picked.to_pylist())


def measure(
    spark, rows: int, args, work: Path, windows: int, distributions: tuple[str, ...], first_seq: int = 2
) -> dict[str, dict[str, list[float]]]:
    directory = work / f"n{rows}"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    target = int(args.file_mb * 1024 * 1024)
    started = time.perf_counter()
    table = orders(np.arange(rows, dtype=np.int64))
    base_dir = directory / "parquet" / "version=1"
    base_dir.mkdir(parents=True)
    rows_per_file = max(1, int(rows * target / max(table.nbytes, 1)))
    for i, start in enumerate(range(0, rows, rows_per_file)):
        pq.write_table(table.slice(start, rows_per_file), base_dir / f"part-{i:05d}.parquet", row_group_size=65_536)
    delta = DeltaStateTable(str(directory / "delta"), target_file_size=target)
    iceberg = IcebergStateTable(
        directory / "catalog.db", "bench.orders", f"file://{directory}/iceberg", target_file_size=target
    )
    delta.overwrite(table, tag(1, "snapshot"), keys=["id"])
    iceberg.overwrite(table, tag(1, "snapshot"), keys=["id"])
    del table
    files = {"delta": len(delta.data_files()), "iceberg": len(iceberg.data_files())}
    print(
        f"  built {rows:,} rows in {time.perf_counter() - started:.1f}s: files parquet "
        f"{len(list(base_dir.glob('*.parquet')))}, delta {files['delta']}, iceberg {files['iceberg']}",
        flush=True,
    )
    workload = Workload(rows, args.changes, seed=rows)
    results: dict[str, dict[str, list[float]]] = {}
    seq = first_seq
    for distribution in distributions:
        workload.distribution = distribution
        results[distribution] = times = {k: [] for k in METRICS}
        for _ in range(windows):
            _window(spark, workload, seq, directory, base_dir, delta, iceberg, times)
            base_dir = directory / "parquet" / f"version={seq}"
            print(
                f"  {distribution} window {seq}: full {times['full'][-1]:.2f}s, delta {times['delta'][-1]:.2f}s "
                f"({times['delta_files'][-1]:.0f}/{times['delta_total'][-1]:.0f} files, "
                f"{times['delta_mb'][-1]:.1f} MB), iceberg {times['iceberg'][-1]:.2f}s "
                f"({times['iceberg_files'][-1]:.0f}/{times['iceberg_total'][-1]:.0f} files, "
                f"{times['iceberg_mb'][-1]:.1f} MB)",
                flush=True,
            )
            seq += 1
    return results


# Per window: seconds of each path; per format, files rewritten, files before, MB of files added.
METRICS = ("full", "delta", "iceberg", *(f"{f}_{m}" for f in ("delta", "iceberg") for m in ("files", "total", "mb")))


def _window(spark, workload: Workload, seq: int, directory: Path, base_dir: Path, delta, iceberg, times) -> None:
    """One window applied three ways (measured), then the three states compared."""
    events_table, touched = workload.window(seq)
    events_dir = directory / "events" / f"window={seq:010d}"
    events_dir.mkdir(parents=True)
    pq.write_table(events_table, events_dir / "part-0.parquet")
    events = spark.read.parquet(str(events_dir))
    out_dir = directory / "parquet" / f"version={seq}"
    times["full"].append(full_rewrite(spark, events, base_dir, out_dir))
    base_dir = out_dir
    for name, state in (("delta", delta), ("iceberg", iceberg)):
        before = file_sizes(state)
        started = time.perf_counter()
        result = merge_windows(spark, events, state, tag=tag(seq), keys=["id"])
        times[name].append(time.perf_counter() - started)
        assert result.action == "merged", result
        after = file_sizes(state)
        times[f"{name}_files"].append(len(set(before) - set(after)))
        times[f"{name}_total"].append(len(before))
        times[f"{name}_mb"].append(sum(size for path, size in after.items() if path not in before) / 1e6)
    # The three states agree: same row count, same rows for the window's keys.
    expected = spark.read.parquet(str(base_dir))
    count = expected.count()
    wanted = keyed_rows(plain_types(expected.filter(expected.id.isin(touched.tolist())).toArrow()), touched)
    for name, state in (("delta", delta), ("iceberg", iceberg)):
        current = state.read_version()
        assert len(current) == count, f"{name}: {len(current)} rows, the rewrite has {count}"
        assert keyed_rows(state.read_keys(["id"], pa.table({"id": pa.array(touched)})), touched) == wanted, name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000], help="state table sizes")
    parser.add_argument("--changes", type=int, default=1000, help="changes in the window")
    parser.add_argument("--repeat", type=int, default=2, help="windows measured per size")
    parser.add_argument("--file-mb", type=float, default=8.0, help="target data file size (MiB, Arrow bytes)")
    parser.add_argument(
        "--distribution", nargs="+", choices=DISTRIBUTIONS, default=list(DISTRIBUTIONS), help="key spread of a window"
    )
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--work", help="scratch directory (default: a temporary one, removed after)")
    args = parser.parse_args()

    from airflow_provider_cdc.cdc.basics.spark_session import get_or_create_session
    from airflow_provider_cdc.cdc.planning.spec import SparkOptions

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-state-merge-"))
    started = time.perf_counter()
    spark = get_or_create_session(SparkOptions(master="local[2]", conf={"spark.driver.memory": args.driver_memory}))
    print(f"SparkSession start (local[2]): {time.perf_counter() - started:.1f}s", flush=True)
    sizes = sorted(args.rows)
    distributions = tuple(args.distribution)
    results = {}
    try:
        print("warm-up (not measured):", flush=True)
        measure(spark, min(10_000, sizes[0]), args, work / "warmup", windows=1, distributions=distributions[:1])
        for rows in sizes:
            print(f"size {rows:,}:", flush=True)
            results[rows] = measure(spark, rows, args, work, windows=args.repeat, distributions=distributions)
    finally:
        spark.stop()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    for distribution in distributions:
        report(args, sizes, distribution, {n: r[distribution] for n, r in results.items()})
    return 0


def report(args, sizes: list[int], distribution: str, results: dict[int, dict[str, list[float]]]) -> None:
    updates, inserts = int(args.changes * UPDATES), int(args.changes * INSERTS)
    spread = f"on the newest {RECENT:.0%} of ids" if distribution == "recent" else "uniformly over all ids"
    print()
    print(
        f"{distribution} window: {args.changes:,} changes = {updates:,} updates {spread}, "
        f"{inserts:,} inserts at new ids, {args.changes - updates - inserts:,} deletes (as the updates); "
        f"files of ~{args.file_mb:g} MiB (Arrow bytes), sorted by id; medians of {args.repeat} window(s)"
    )
    print()
    print(
        "| state rows | full rewrite s | Delta MERGE s | Iceberg MERGE s | Delta files rewritten / total "
        "| Iceberg files rewritten / total | Delta MB written | Iceberg MB written |"
    )
    print("|---|---|---|---|---|---|---|---|")
    med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in results.items()}
    for n in sizes:
        m = med[n]
        print(
            f"| {n:,} | {m['full']:.2f} | {m['delta']:.2f} | {m['iceberg']:.2f} "
            f"| {m['delta_files']:.0f} / {m['delta_total']:.0f} | {m['iceberg_files']:.0f} / {m['iceberg_total']:.0f} "
            f"| {m['delta_mb']:.1f} | {m['iceberg_mb']:.1f} |"
        )
    print()
    smallest = sizes[0]
    for n in sizes[1:]:
        for key, label in (("full", "full rewrite"), ("delta", "Delta MERGE"), ("iceberg", "Iceberg MERGE")):
            print(f"{distribution}: ratio {label} {n:,}/{smallest:,}: {med[n][key] / med[smallest][key]:.3g}")
    for n in sizes:
        print(f"{distribution}: ratio full rewrite/Delta MERGE at {n:,}: {med[n]['full'] / med[n]['delta']:.3g}")
        print(f"{distribution}: ratio full rewrite/Iceberg MERGE at {n:,}: {med[n]['full'] / med[n]['iceberg']:.3g}")


if __name__ == "__main__":
    raise SystemExit(main())
