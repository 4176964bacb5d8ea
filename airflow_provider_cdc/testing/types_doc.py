"""Generates docs/types.md from a live PostgreSQL: the real captured value of every type and mode.

Each example value is inserted into a real table and read back through the snapshot partition
reader (the code Spark tasks run), so the document shows what the provider produces, not what
it is meant to produce. ``tests/docs/test_types_doc.py`` regenerates it and fails when the
committed file is stale; ``scripts/gen_types_doc.py`` rewrites it.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json

import pyarrow as pa

MODES = {
    "spark (default)": {},
    "adaptive": {"time_precision": "adaptive"},
    "adaptive_time_microseconds": {"time_precision": "adaptive_time_microseconds"},
    "connect": {"time_precision": "connect"},
    "decimal=double": {"decimal": "double"},
    "decimal=string": {"decimal": "string"},
    "binary=base64": {"binary": "base64"},
    "binary=hex": {"binary": "hex"},
    "hstore=map": {"hstore": "map"},
    "interval=string": {"interval": "string"},
}

# (PostgreSQL type, example literal, which mode columns matter for it)
EXAMPLES = [
    ("smallint", "-32768", ()),
    ("integer", "2147483647", ()),
    ("bigint", "-9223372036854775808", ()),
    ("real", "3.14", ("decimal=double",)),
    ("double precision", "-Infinity", ()),
    ("numeric(12,4)", "12345678.1234", ("decimal=double", "decimal=string")),
    ("numeric(12,4)", "NaN", ("decimal=double", "decimal=string")),
    ("numeric", "3.141592653589793238462643383279", ("decimal=double", "decimal=string")),
    ("numeric", "NaN", ("decimal=double", "decimal=string")),
    ("numeric(60,2)", "123456789012345678901234567890123456789012.34", ("decimal=double",)),
    ("money", "-1234.56", ("decimal=double", "decimal=string")),
    ("boolean", "true", ()),
    ("char(5)", "ab", ()),
    ("varchar(20)", "héllo", ()),
    ("text", "multi\nline", ()),
    ("citext", "MiXeD", ()),
    ("bytea", "\\x00ff10", ("binary=base64", "binary=hex")),
    ("date", "2024-02-29", ("adaptive", "adaptive_time_microseconds", "connect")),
    ("date", "0044-03-15 BC", ("adaptive",)),
    ("date", "infinity", ("adaptive",)),
    ("time", "13:14:15.123456", ("adaptive", "adaptive_time_microseconds", "connect")),
    ("time(3)", "13:14:15.123", ("adaptive", "adaptive_time_microseconds", "connect")),
    ("time", "24:00:00", ()),
    ("timetz", "13:14:15.5+05:30", ()),
    ("timestamp", "2024-01-02 03:04:05.123456", ("adaptive", "adaptive_time_microseconds", "connect")),
    ("timestamp(0)", "2024-01-02 03:04:05", ("adaptive", "connect")),
    ("timestamp(3)", "2024-01-02 03:04:05.123", ("adaptive", "connect")),
    ("timestamp", "infinity", ("adaptive", "connect")),
    ("timestamp", "0044-03-15 12:00:00 BC", ("adaptive",)),
    ("timestamptz", "2024-01-02 03:04:05.5+02", ("adaptive", "adaptive_time_microseconds", "connect")),
    ("timestamptz", "-infinity", ("adaptive",)),
    ("interval", "1 year 2 months 3 days 04:05:06.78", ("interval=string",)),
    ("uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", ()),
    ("json", '{"b": 1, "a": [1, 2]}', ()),
    ("jsonb", '{"b": 1, "a": [1, 2]}', ()),
    ("xml", "<a>x</a>", ()),
    ("inet", "192.168.0.1/24", ()),
    ("cidr", "10.0.0.0/8", ()),
    ("macaddr", "08:00:2b:01:02:03", ()),
    ("macaddr8", "08:00:2b:01:02:03:04:05", ()),
    ("bit(1)", "1", ()),
    ("bit(4)", "1010", ()),
    ("varbit", "10111", ()),
    ("mood (enum)", "happy", ()),
    ("positive_int (domain over integer)", "42", ()),
    ("integer[]", "{1,NULL,3}", ()),
    ("text[]", '{a,"b c",NULL}', ()),
    ("numeric(5,2)[]", "{1.50,NULL}", ("decimal=string",)),
    ("date[]", "{2024-01-01,infinity}", ("adaptive",)),
    ("integer[] (two dimensions)", "{{1,2},{3,4}}", ()),
    ("int4range", "[1,5)", ()),
    ("int8range", "(,100]", ()),
    ("numrange", "[1.5,2.5)", ()),
    ("tsrange", "[2024-01-01 00:00,2024-01-02 00:00)", ()),
    ("tstzrange", "[2024-01-01 00:00+00,2024-01-02 00:00+00)", ()),
    ("daterange", "[2024-01-01,2024-02-01)", ()),
    ("hstore", 'a=>1, "b c"=>NULL', ("hstore=map",)),
    ("ltree", "Top.Science.Astronomy", ()),
    ("point", "(1.5,-2)", ()),
    ("tsvector (not mapped)", "a fat cat", ()),
    ("record type (not mapped)", "(1,x)", ()),
]

SETUP = """
CREATE EXTENSION IF NOT EXISTS hstore; CREATE EXTENSION IF NOT EXISTS ltree; CREATE EXTENSION IF NOT EXISTS citext;
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN positive_int AS integer CHECK (VALUE > 0);
CREATE TYPE pair AS (n integer, s text);
"""


def _sql_type(label: str) -> str:
    base = label.split(" (")[0]
    return {"integer[] (two dimensions)": "integer[]", "record type (not mapped)": "pair"}.get(label, base)


def _spark_type(arrow_type: pa.DataType) -> str:
    from pyspark.sql.pandas.types import from_arrow_type

    return from_arrow_type(arrow_type, prefer_timestamp_ntz=True).simpleString()


def _show(value) -> str:
    if isinstance(value, _Raw):
        return str(value)
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=_show, ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else str(value)


def _cell(arrow_type: pa.DataType | None, value) -> str:
    if arrow_type is None:
        return f"error: {value}"
    text = _show(value).replace("|", "\\|").replace("\n", "\\n")
    return f"`{_spark_type(arrow_type)}` {text}"


def render(conninfo) -> str:
    """The markdown of docs/types.md, computed against the database ``conninfo`` points to."""
    from airflow_provider_cdc.cdc.sources.postgres import admin
    from airflow_provider_cdc.cdc.sources.postgres.connection import connect
    from airflow_provider_cdc.cdc.sources.postgres.events import EventContext, EventSettings, TableEncoder
    from airflow_provider_cdc.cdc.sources.postgres.replication import ReplicationConnection
    from airflow_provider_cdc.cdc.sources.postgres.snapshot import BlockRange, SnapshotPoint, read_partition
    from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
    from airflow_provider_cdc.cdc.sources.postgres.types import ValueModes

    columns = [f"c{i}" for i in range(len(EXAMPLES))]
    with connect(conninfo) as conn:
        # The product's sessions look names up in pg_catalog only; this one creates the examples.
        conn.execute("SET search_path = public, pg_catalog")
        conn.execute(SETUP)
        conn.execute(
            "CREATE TABLE type_examples (id int PRIMARY KEY, "
            + ", ".join(f"{c} {_sql_type(label)}" for c, (label, _, _) in zip(columns, EXAMPLES))
            + ")"
        )
        conn.execute(
            "INSERT INTO type_examples VALUES (1, "
            + ", ".join(f"%s::{_sql_type(label)}" for label, _, _ in EXAMPLES)
            + ")",
            [literal for _, literal, _ in EXAMPLES],
        )
        table = admin.describe_tables(conn, [TableRef("public", "type_examples")])[TableRef("public", "type_examples")]
    results: dict[str, dict[str, tuple]] = {}
    with ReplicationConnection(conninfo) as replication:
        creation = replication.create_slot("types_doc", temporary=True, export_snapshot=True)
        point = SnapshotPoint(creation.snapshot_name, int(creation.consistent_point), None, 0)
        for mode_name, overrides in MODES.items():
            results[mode_name] = {}
            settings = EventSettings(modes=ValueModes(**overrides))
            encoder = TableEncoder(table, table.columns, settings)
            for column, codec in zip(encoder.columns[1:], encoder.codecs[1:]):
                try:
                    batches = list(
                        read_partition(
                            conninfo,
                            point,
                            _single_column(table, column.name),
                            BlockRange(0, None),
                            EventContext("doc", "doc", "0", 0),
                            settings,
                        )
                    )
                    results[mode_name][column.name] = (codec.arrow_type, _value(batches[0], column.name))
                except Exception as exc:  # shown in the document: a value some mode cannot hold
                    message = str(exc).split("(")[0].strip().split(": ", 1)[-1]
                    results[mode_name][column.name] = (None, message)
    time_modes = ["spark (default)", "adaptive", "adaptive_time_microseconds", "connect"]
    header = ["PostgreSQL type", "example", *time_modes, "other modes"]
    lines = [
        "# PostgreSQL types and how they are captured",
        "",
        "Generated by `scripts/gen_types_doc.py` against a live PostgreSQL through the snapshot reader",
        "(the stream produces identical values: `tests/integration/postgres/test_type_matrix.py`). Each cell",
        "shows the Spark type and the captured value of the example. Columns are the `time_precision_mode`",
        "values with every other mode at its default; the last column shows the other modes where they",
        "change something (`decimal_handling_mode`, `binary_handling_mode`, `hstore_handling_mode`,",
        "`interval_handling_mode`). Options are set on `PostgresCapture`.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for column, (label, literal, relevant) in zip(columns, EXAMPLES):
        default = results["spark (default)"][column]
        cells = [f"`{label}`", "`" + literal.replace("|", "\\|").replace("\n", "\\n") + "`"]
        for mode in time_modes:
            result = results[mode][column]
            cells.append("same" if mode != "spark (default)" and result == default else _cell(*result))
        others = [
            f"{mode}: {_cell(*results[mode][column])}"
            for mode in MODES
            if mode not in time_modes and mode in relevant and results[mode][column] != default
        ]
        cells.append("<br>".join(others))
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Notes:",
        "",
        "- `spark (default)` uses Spark's own types: `timestamp` → `timestamp_ntz`, `timestamptz` → `timestamp`",
        "  (UTC), `date` → `date`. ±infinity become the ends of Spark's range (0001-01-01 and",
        "  9999-12-31T23:59:59.999999); BC dates and years after 9999 are stored exactly (Spark and Python may",
        "  not display them). Times of day are microseconds since midnight (Spark has no time type).",
        "- `adaptive`, `adaptive_time_microseconds` and `connect` follow Debezium's `time.precision.mode`",
        "  (days, milliseconds and microseconds since the epoch, `ZonedTimestamp`/`ZonedTime` strings in UTC);",
        "  ±infinity use Debezium's constants (9223372036825200000 / -9223372036832400000 µs).",
        "- `numeric` without a scale, or wider than decimal(38), keeps its exact text in the default",
        "  `precise` mode (Spark has no variable-scale decimal; Debezium's struct cannot hold NaN).",
        "  `NaN` in a `numeric(p,s)` column cannot be a decimal: the window fails naming the column, value",
        "  and the fix (`decimal_handling_mode='string'` or `'double'`, or the column in `column_text_list`).",
        "- Types without a mapping (tsvector, composite types, geometric types other than point,",
        "  multiranges, ...) keep PostgreSQL's text form: never a crash, never a silent null.",
        "- Arrays map to lists of the element's mapping (the column's modifier applies to the elements);",
        "  a multi-dimensional value in an array column fails the window with a clear message.",
        "- `column_text_list` (regular expressions on `schema.table.column`) captures chosen columns in",
        "  PostgreSQL's text form whatever their type: the escape hatch for values a mapping cannot hold.",
        "- Generated columns are not captured: pgoutput does not send them, so snapshots leave them out too.",
        "- Unchanged TOASTed values (`REPLICA IDENTITY DEFAULT`): text, binary and text-array columns carry",
        "  `__debezium_unavailable_value`, other types null; every such column is listed in the event's",
        "  `unchanged_toast_columns`. Under `REPLICA IDENTITY FULL` the old row supplies the value.",
        *YUGABYTEDB_SECTION,
        "",
    ]
    return "\n".join(lines)


#: Static: YugabyteDB's differences from PostgreSQL (no live YugabyteDB in the generator; sources:
#: the issue 14 research note §2, §3, §8, and tests/unit/cdc/yugabyte/).
YUGABYTEDB_SECTION = [
    "",
    "## YugabyteDB",
    "",
    "YugabyteDB's logical replication (`yboutput`) sends pgoutput's tuples, so the table above applies. What",
    "differs from PostgreSQL:",
    "",
    "- Values: YSQL builds each datum from DocDB and prints it with PostgreSQL's type output functions, so",
    "  built-in types have PostgreSQL's text form and the same mapping. Only the text form is used (the",
    "  `binary` option is untested on YugabyteDB).",
    "- `bytea` follows the replication session's `bytea_output`: keep `hex` (the default; the only form",
    "  Debezium's YugabyteDB connector supports).",
    "- User-defined types (enums, domains, composites) are announced by Type messages as on PostgreSQL.",
    "  YugabyteDB's older CDC had gaps there (composite values sent as empty strings, enum/composite DDL",
    "  leaving stale types, enum arrays unsupported); unconfirmed for logical replication, so test such",
    "  columns before relying on them.",
    "- No TOAST: a `'u'` column is one the server did not send. Under replica identity CHANGE (YugabyteDB's",
    "  default) an update sends the key and the changed columns only: the others carry",
    "  `__debezium_unavailable_value` (text, binary, text arrays) or null and are listed in",
    "  `unchanged_toast_columns`, and the current-state table keeps their previous values. A column set",
    "  to NULL is sent as NULL: a real null, not listed. CHANGE and DEFAULT updates have no before image",
    "  (DEFAULT sends the full row); FULL sends both. A delete's before image is the key with null",
    "  columns (CHANGE, DEFAULT) or the full row (FULL). An old tuple without any value (older builds'",
    "  all-`'u'` key under CHANGE; FULL's all-null row of a row inserted in the same transaction) gives",
    "  `before` = null. Primary-key updates arrive as a delete and an insert.",
    "- Tables without a primary key: version-dependent (`yb_cdcsdk_stream_tables_without_primary_key` is",
    "  on by default in 2026.1, off before); capture tables that have one.",
    "- ±infinity dates and timestamps have PostgreSQL's text, so the mapping above (Debezium's constants",
    "  9223372036825200000 / -9223372036832400000 µs in the Debezium modes) is unchanged.",
    "- Generated columns are not sent, as on PostgreSQL.",
    "- Positions: a slot's LSN is a per-slot uint64 (not a WAL offset) printed as PostgreSQL prints one,",
    "  `X/Y` = the high and low 32 bits in hexadecimal (`62D63025/5462E000` = 7121932797620707328); a",
    "  decimal integer is accepted too. With `lsn_type` HYBRID_TIME it is the transaction's commit hybrid",
    "  time (HT). An HT is `physical µs since 1970-01-01 UTC << 12 | a 12-bit logical counter`: its",
    "  timestamp is `ht >> 12` µs (`to_timestamp((ht >> 12) / 1e6)`; `62D63025/5462E000` is",
    "  2025-02-05T10:58:44.419118Z, logical 0), and `yb_read_time` takes it as `'<ht> ht'` (a bare number",
    "  there means µs). `yb_get_current_hybrid_time_lsn()` returns a bigint HT; as an LSN it is",
    "  `upper(to_hex(v >> 32)) || '/' || upper(to_hex(v & 4294967295))`. The commit time in BEGIN and",
    "  COMMIT is read as PostgreSQL's (µs since 2000-01-01), as Debezium does (unconfirmed on YugabyteDB).",
]


def _value(batch: pa.RecordBatch, name: str):
    import pyarrow.compute as pc

    child = pc.struct_field(batch.column("after"), name)
    try:
        value = child.to_pylist()[0]
    except (ValueError, OverflowError):  # a date or timestamp outside Python's range
        if pa.types.is_date(child.type):
            number, unit = child.cast(pa.int32()).to_pylist()[0], "days"
        else:
            number, unit = (
                child.cast(pa.int64()).to_pylist()[0],
                {"ms": "milliseconds", "us": "microseconds"}[child.type.unit],
            )
        return _Raw(f"{number} ({unit} since 1970-01-01; beyond Python's datetime)")
    if pa.types.is_float32(child.type) and value is not None:
        return _Raw(f"{value:.7g}")
    return value


class _Raw(str):
    """Shown verbatim."""


def _single_column(table, name: str):
    """The table reduced to its key and one column (one failing column must not hide the rest)."""
    from dataclasses import replace

    return replace(table, columns=tuple(c for c in table.columns if c.name in ("id", name)))
