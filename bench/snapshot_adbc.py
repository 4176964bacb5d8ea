"""The snapshot's binary COPY: the hand-written parser against the ADBC PostgreSQL driver.

    .venv/bin/python bench/snapshot_adbc.py --rows 1000000 --repeat 3

Fills two tables in a throwaway PostgreSQL 15: ``accounts`` (``bench/workload.py``, the
realistic table) and ``wide`` (one column of every type the snapshot reads in binary, plus the
usual text-routed ones), exports a snapshot, and reads each whole table the way one snapshot
task reads its block range, side by side in one run (alternating, medians):

- **parser**: ``COPY (SELECT ...) TO STDOUT (FORMAT binary)`` through psycopg,
  ``copy_binary.read_copy_chunks`` and ``CopyPlan.values`` (today's path);
- **ADBC**: the same ``SELECT`` through ``adbc_driver_postgresql`` (which runs it as a binary
  COPY and parses it in C into Arrow), then the casts that turn its arrays into the arrays
  today's path gives (:class:`AdbcColumn` feeds them to the same codecs).

Both start from a new connection that imports the snapshot (``SET TRANSACTION SNAPSHOT``) and
end with the typed Arrow arrays of every kept column, so what is compared is "bytes on the socket
→ today's arrays". The first run of each table asserts the two give equal arrays, bit for bit
(floats compared by their bits). ``--matrix`` also reads a table holding the type matrix's edge
values (±infinity, BC dates, years past 9999, NaN, 24:00) both ways in every value mode and
asserts equality.

Wall time is mostly the server's COPY output (both read the same COPY); the client's CPU is what
differs, reported as core-seconds per 1 M rows (process CPU, every thread).
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

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

WIDE = """
CREATE TABLE wide (
    id bigint PRIMARY KEY, i2 smallint, i4 integer, f4 real, f8 double precision, b boolean,
    by bytea, d date, tm time, ts timestamp, tstz timestamptz, u uuid,
    n numeric(12,2), v varchar(20), tx text, iv interval, jb jsonb, ai integer[]
)
"""
WIDE_FILL = """
INSERT INTO wide
SELECT g, (g %% 30000)::smallint, ((g * 7919) %% 2147483647)::int, (g * 0.37)::real, g * 1.0001, g %% 3 = 0,
       decode(lpad(to_hex(g), 16, '0'), 'hex'), date '2000-01-01' + (g %% 20000)::int,
       time '00:00' + make_interval(secs => g %% 86400), timestamp '2020-01-01' + make_interval(secs => g),
       timestamptz '2020-01-01 00:00+00' + make_interval(secs => g * 3),
       md5(g::text)::uuid, round((g * 1.37)::numeric %% 1e9, 2), 'v' || g, 'text value ' || g,
       make_interval(days => (g %% 400)::int, secs => g %% 3600), jsonb_build_object('k', g %% 7),
       ARRAY[g %% 10, g %% 100]::int[]
FROM generate_series(%(first)s::bigint, %(last)s::bigint) g
"""
#: Rows of the type matrix's edge values: the ones a library is most likely to convert its own way.
EDGES = """
CREATE TABLE edges (
    id bigint PRIMARY KEY, i2 smallint, i4 integer, i8 bigint, o oid, f4 real, f8 double precision,
    b boolean, by bytea, d date, tm time, tm3 time(3), ts timestamp, ts3 timestamp(3), tstz timestamptz,
    u uuid, c char(5), nm name, dm positive_int, e mood, n numeric, iv interval, ai integer[]
);
INSERT INTO edges VALUES
 (1, -32768, -2147483648, -9223372036854775808, 0, 'NaN', '-Infinity', false, '\\x', 'infinity', '24:00:00',
  '00:00:00', 'infinity', '-infinity', 'infinity', '00000000-0000-0000-0000-000000000000', '', 'n', 1, 'sad',
  'NaN', '-10000 years 3 mons', '{}'),
 (2, 32767, 2147483647, 9223372036854775807, 4294967295, 'Infinity', 'NaN', true, '\\x00ff', '-infinity',
  '23:59:59.999999', '12:34:56.789', '-infinity', 'infinity', '-infinity', 'ffffffff-ffff-ffff-ffff-ffffffffffff',
  'ab', 'name', 2147483647, 'happy', '-Infinity', '1 day -00:00:01', '{1,NULL}'),
 (3, 0, 0, 0, 1, '-0', '-0', NULL, NULL, '4713-01-01 BC', NULL, NULL, '4713-01-01 00:00:00 BC',
  '200000-12-31 23:59:59.999', '0001-01-01 00:00:00+00 BC', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
 (4, NULL, NULL, NULL, NULL, '1.4e-45', '4.9e-324', NULL, NULL, '5874897-12-31', NULL, NULL,
  '294246-12-31 23:59:59.999999', '1970-01-01 00:00:00.001', '294246-12-31 23:59:59.999999+00', NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL),
 (5, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL);
-- Text-routed types (selected as their text output on both paths): ADBC returns them as strings.
ALTER TABLE edges ADD m money, ADD jb jsonb, ADD ip inet, ADD r4 int4range, ADD vb varbit, ADD tz timetz,
    ADD at text[], ADD pt point;
UPDATE edges SET m = '-92233720368547758.08', jb = '{"a": [1, null, "\u00e9"]}', ip = '::1/64', r4 = 'empty',
    vb = '', tz = '24:00:00-15:59', at = '{"a b",NULL,""}', pt = '(NaN,-0)' WHERE id = 1;
UPDATE edges SET m = '92233720368547758.07', jb = '[]', ip = '10.0.0.1', r4 = '(,5]', vb = '10101',
    tz = '00:00:00+15:59', at = '{}', pt = '(1e300,-1e-300)' WHERE id = 2
"""


class AdbcColumn:
    """One ADBC result array, seen as the :class:`~.binary_values.BinaryColumn` of the same
    column of a binary COPY, so that the codecs' ``binary`` decoders convert it unchanged.

    ADBC's arrays are the send forms parsed, with two changes it makes its own way and that are
    undone here: dates and timestamps are shifted from PostgreSQL's epoch (2000-01-01) to
    1970-01-01 in wrapping integer arithmetic (so ``±infinity`` and years past 294246 come back as
    wrapped counts, not as the sentinels: subtracting the shift in the same arithmetic restores
    PostgreSQL's count exactly), and ``uuid``/``numeric``/unknown types come as extension types."""

    def __init__(self, array: pa.Array):
        if isinstance(array.type, pa.BaseExtensionType):
            array = array.storage
        self.array = array
        self.valid = ~np.asarray(array.is_null(), bool)
        self.mask = None if array.null_count == 0 else ~self.valid

    def __len__(self) -> int:
        return len(self.array)

    def check_width(self, width: int) -> None:
        """Fixed-width types came parsed: their widths were checked by the driver."""

    def big_endian(self, dtype: str) -> np.ndarray:
        from airflow_provider_cdc.cdc.sources.postgres import binary_values as bv

        kind = self.array.type
        if pa.types.is_date32(kind):
            days = self._numbers(pa.int32())
            with np.errstate(over="ignore"):
                return (days - np.int32(bv.PG_EPOCH_DAYS)).astype(np.dtype(dtype).newbyteorder("="))
        if pa.types.is_timestamp(kind):
            micros = self._numbers(pa.int64())
            with np.errstate(over="ignore"):
                return micros - np.int64(bv.PG_EPOCH_MICROS)
        if pa.types.is_time64(kind):
            return self._numbers(pa.int64())
        return self._numbers(kind).astype(np.dtype(dtype).newbyteorder("="), copy=False)

    def _numbers(self, as_type: pa.DataType) -> np.ndarray:
        # The value buffer as it is (garbage in NULL rows, like a BinaryColumn's).
        array = self.array
        width = as_type.bit_width // 8
        data = array.buffers()[1]
        return np.frombuffer(data, as_type.to_pandas_dtype(), count=len(array), offset=array.offset * width)

    def fixed(self, width: int) -> np.ndarray:
        array = self.array
        if pa.types.is_boolean(array.type):
            return np.asarray(array.fill_null(False), np.uint8).reshape(-1, 1)
        data = np.frombuffer(array.buffers()[1], np.uint8)
        return data[array.offset * width : (array.offset + len(array)) * width].reshape(-1, width)

    def binary(self) -> pa.Array:
        return self.array.cast(pa.binary())

    def text(self) -> pa.Array:
        return self.array.cast(pa.string())


def adbc_values(batch: pa.RecordBatch, plan, encoder) -> list[pa.Array]:
    """The typed values of every kept column from one ADBC batch of :meth:`CopyPlan.select`,
    converted by the same codecs as :meth:`CopyPlan.values`."""
    from airflow_provider_cdc.cdc.sources.postgres.copy_plan import Route

    out = []
    for k, route in enumerate(plan.routes):
        column = AdbcColumn(batch.column(k))
        if route == Route.BINARY:
            out.append(encoder.typed_binary(k, column))  # type: ignore[arg-type]
        else:
            out.append(encoder.typed_text(k, column.text()))
    return out


def read_parser(info, snapshot: str, plan, encoder, statement) -> list[list[pa.Array]]:
    from airflow_provider_cdc.cdc.sources.postgres.connection import connect
    from airflow_provider_cdc.cdc.sources.postgres.copy_binary import read_copy_chunks
    from airflow_provider_cdc.cdc.sources.postgres.snapshot import import_snapshot

    with connect(info) as conn:
        import_snapshot(conn, snapshot)
        return _timed(read_copy_chunks(conn, statement, len(encoder.columns)), lambda c: plan.values(c, encoder))


def read_adbc(info, snapshot: str, plan, encoder, select: str) -> list[list[pa.Array]]:
    import adbc_driver_postgresql.dbapi as adbc

    # The same libpq parameters (session settings included) as the capture's own connections.
    with adbc.connect(info.conninfo(), autocommit=True) as conn, conn.cursor() as cursor:
        cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        cursor.execute(f"SET TRANSACTION SNAPSHOT '{snapshot}'")
        cursor.execute(select)
        return _timed(iter(cursor.fetch_record_batch()), lambda b: adbc_values(b, plan, encoder))


#: CPU seconds of the last read: reading and parsing (to CopyChunks / ADBC batches), converting.
STAGES = {"parse": 0.0, "convert": 0.0}


def _timed(chunks, convert) -> list[list[pa.Array]]:
    """``convert`` every chunk; the CPU of producing and of converting the chunks in :data:`STAGES`."""
    out, parse, converting = [], 0.0, 0.0
    try:
        while True:
            started = time.process_time()
            chunk = next(chunks, None)
            parse += time.process_time() - started
            if chunk is None:
                break
            started = time.process_time()
            out.append(convert(chunk))
            converting += time.process_time() - started
    finally:
        # On an error, end the COPY now: the traceback keeps this frame (and the reader) alive
        # while the connection's ``with`` closes, and psycopg cannot roll back inside a COPY.
        if hasattr(chunks, "close"):
            chunks.close()
    STAGES.update(parse=parse, convert=converting)
    return out


def combined(chunks: list[list[pa.Array]], width: int) -> list[pa.Array]:
    return [pa.chunked_array([c[k] for c in chunks]).combine_chunks() for k in range(width)]


def assert_equal(ours: list[pa.Array], theirs: list[pa.Array], names: list[str], label: str) -> None:
    """Equal arrays, bit for bit: same type, same nulls, same values (floats by their bits)."""
    for name, a, b in zip(names, ours, theirs):
        assert a.type == b.type, (label, name, a.type, b.type)
        assert _bits(a).equals(_bits(b)), (label, name, a.to_pylist()[:5], b.to_pylist()[:5])


def _bits(array: pa.Array) -> pa.Array:
    """``array`` with every float (nested ones too) as the integer of its bits: NaN == NaN."""
    kind = array.type
    if pa.types.is_floating(kind):
        return array.view(pa.int32() if kind == pa.float32() else pa.int64())
    mask = array.is_null() if array.null_count else None
    if pa.types.is_struct(kind):
        children = [_bits(array.field(i)) for i in range(kind.num_fields)]
        return pa.StructArray.from_arrays(children, names=[f.name for f in kind], mask=mask)
    if pa.types.is_list(kind):
        return pa.ListArray.from_arrays(array.offsets, _bits(array.values), mask=mask)
    return array


def setup(cluster, rows: int, matrix: bool) -> None:
    import workload

    with cluster.connect("bench") as conn:
        workload.create_table(conn)
        workload.fill(conn, rows)
        conn.execute(WIDE)
        for first in range(1, rows + 1, 1_000_000):
            conn.execute(WIDE_FILL, {"first": first, "last": min(rows, first + 999_999)})
        if matrix:
            conn.execute(
                "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');"
                "CREATE DOMAIN positive_int AS integer CHECK (VALUE > 0);" + EDGES
            )
        conn.execute("VACUUM (FREEZE, ANALYZE)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--matrix", action="store_true", help="also compare both on the type matrix's edge values")
    parser.add_argument("--tables", default="accounts,wide", help="which tables to time (comma-separated)")
    args = parser.parse_args()

    import workload

    from airflow_provider_cdc.cdc.basics.window import Window
    from airflow_provider_cdc.cdc.sources.postgres import admin
    from airflow_provider_cdc.cdc.sources.postgres.connection import connect
    from airflow_provider_cdc.cdc.sources.postgres.copy_plan import CopyPlan
    from airflow_provider_cdc.cdc.sources.postgres.events import EventSettings, TableEncoder
    from airflow_provider_cdc.cdc.sources.postgres.replication import ReplicationConnection
    from airflow_provider_cdc.cdc.sources.postgres.snapshot import BlockRange
    from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
    from airflow_provider_cdc.cdc.sources.postgres.types import ValueModes

    with workload.bench_cluster() as (cluster, work):
        setup(cluster, args.rows, args.matrix)
        info = workload.job_spec(cluster, Window(1, "snapshot", None, None, 1), work / "lake").connection

        def prepared(name: str, modes: ValueModes | None = None):
            with connect(info) as conn:
                table = admin.describe_tables(conn, [TableRef("public", name)])[TableRef("public", name)]
                encoder = TableEncoder(table, table.columns, EventSettings(modes=modes or ValueModes()))
                plan = CopyPlan.of(conn, encoder)
                whole = BlockRange(0, None)
                return encoder, plan, plan.statement(encoder, whole), plan.select(encoder, whole).as_string(conn)

        with ReplicationConnection(info) as replication:
            snapshot = replication.create_slot("bench_adbc", temporary=True, export_snapshot=True).snapshot_name
            if args.matrix:
                modes = {
                    "default": ValueModes(),
                    "adaptive": ValueModes(decimal="string", time_precision="adaptive", binary="base64"),
                    "micro": ValueModes(decimal="double", time_precision="adaptive_time_microseconds", binary="hex"),
                    "connect": ValueModes(time_precision="connect"),
                }
                for label, mode in modes.items():
                    encoder, plan, statement, select = prepared("edges", mode)
                    width, names = len(encoder.columns), [c.name for c in encoder.columns]
                    ours = combined(read_parser(info, snapshot, plan, encoder, statement), width)
                    theirs = combined(read_adbc(info, snapshot, plan, encoder, select), width)
                    assert_equal(ours, theirs, names, f"edges/{label}")
                print(f"type matrix edge values: ADBC + casts equal to the parser in {len(modes)} value modes")

            print(f"{args.rows:,} rows per table, {args.repeat} runs each, medians")
            print(
                "core-s per 1 M rows: client CPU in all, of which reading + parsing, and converting to today's arrays"
            )
            print("| table | reader | wall s | rows/s | client CPU | reading + parsing | converting |")
            print("|---|---|---|---|---|---|---|")
            ratios = {}
            for name in args.tables.split(","):
                encoder, plan, statement, select = prepared(name)
                width, names = len(encoder.columns), [c.name for c in encoder.columns]
                runs: dict[str, list[tuple[float, ...]]] = {"parser": [], "ADBC": []}
                for attempt in range(args.repeat):
                    results = {}
                    for reader, read, query in (("parser", read_parser, statement), ("ADBC", read_adbc, select)):
                        wall, cpu = time.perf_counter(), time.process_time()
                        chunks = read(info, snapshot, plan, encoder, query)
                        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                        runs[reader].append((wall, cpu, STAGES["parse"], STAGES["convert"]))
                        results[reader] = chunks
                    if attempt == 0:
                        ours, theirs = (combined(results[r], width) for r in ("parser", "ADBC"))
                        assert len(ours[0]) == args.rows, (len(ours[0]), args.rows)
                        assert_equal(ours, theirs, names, name)
                    del results
                scale = 1_000_000 / args.rows
                medians = {
                    reader: [statistics.median(r[i] for r in rs) for i in range(4)] for reader, rs in runs.items()
                }
                for reader, (wall, cpu, parse, convert) in medians.items():
                    print(
                        f"| {name} | {reader} | {wall:.2f} | {args.rows / wall:,.0f} | {cpu * scale:.2f} "
                        f"| {parse * scale:.2f} | {convert * scale:.2f} |"
                    )
                ratios[name] = (medians["parser"][0] / medians["ADBC"][0], medians["parser"][1] / medians["ADBC"][1])
                print(
                    f"  {name} runs: "
                    + "; ".join(f"{r} {workload.rounded([r[0] for r in rs])}" for r, rs in runs.items())
                )
            for name, (wall, cpu) in ratios.items():
                print(f"ratio {name} ADBC/parser speed (wall): {wall:.2f}")
                print(f"ratio {name} ADBC/parser speed (client CPU): {cpu:.2f}")
            print("arrays equal, bit for bit: yes (first run of each table)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
