"""The snapshot's binary route equals the text route, value for value, on a live server.

For every codec that reads binary send forms (``Codec.binary``) and every handling mode,
Hypothesis generates values of the column's type (extremes, ``±infinity``, BC dates, years past
9999, NaN and signed zeros included); PostgreSQL produces both forms of each value in one binary
``COPY`` (the column itself and ``textin(<its output function>(column))``, the text the stream
sees), and the binary decoder must give exactly what the text conversion gives: the same bits
for floats, the same error for a value the codec cannot represent. Rows are read in small chunks,
so chunk boundaries, the COPY header and the trailer are exercised too.
"""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.sources.postgres import admin
from airflow_provider_cdc.cdc.sources.postgres import types as t
from airflow_provider_cdc.cdc.sources.postgres.connection import connect
from airflow_provider_cdc.cdc.sources.postgres.copy_binary import read_copy_chunks
from airflow_provider_cdc.cdc.sources.postgres.tables import TableRef
from airflow_provider_cdc.cdc.sources.postgres.types import ValueConversionError, ValueModes, cast_binary, cast_text
from tests.integration.postgres.test_type_matrix import MODES, clock, dates, offsets, timestamps


def floats(width: int):
    special = ["NaN", "Infinity", "-Infinity", "-0", "0"]
    finite = st.floats(width=width, allow_nan=False, allow_infinity=False).map(repr)
    return st.one_of(finite, st.sampled_from(special))


# column, SQL type, literal strategy
COLUMNS = [
    ("i2", "smallint", st.integers(-(2**15), 2**15 - 1).map(str)),
    ("i4", "integer", st.integers(-(2**31), 2**31 - 1).map(str)),
    ("i8", "bigint", st.integers(-(2**63), 2**63 - 1).map(str)),
    ("o", "oid", st.integers(0, 2**32 - 1).map(str)),
    ("f4", "real", floats(32)),
    ("f8", "double precision", floats(64)),
    ("b", "boolean", st.sampled_from(["true", "false"])),
    ("d", "date", st.one_of(dates, st.sampled_from(["4713-01-01 BC", "5874897-12-31"]))),
    ("ts", "timestamp", st.one_of(timestamps, st.sampled_from(["4713-01-01 00:00:00 BC", "294276-12-31 23:59:59"]))),
    ("ts3", "timestamp(3)", timestamps),
    (
        "tz",
        "timestamptz",
        st.one_of(
            st.builds(lambda ts, o: ts if "infinity" in ts else ts + o, timestamps, offsets),
            st.sampled_from(["294276-12-31 23:59:59+00", "4713-01-02 00:00:00+00 BC"]),
        ),
    ),
    ("tm", "time", st.one_of(clock, st.just("24:00:00"))),
    ("tm3", "time(3)", clock),
    ("u", "uuid", st.uuids().map(str)),
    ("by", "bytea", st.binary(max_size=40).map(lambda b: "\\x" + b.hex())),
    ("dm", "positive_big", st.integers(1, 2**63 - 1).map(str)),  # a domain reads as its base type
]
NAMES = [c[0] for c in COLUMNS]
ROWS = st.lists(st.fixed_dictionaries({n: st.one_of(st.none(), s) for n, _, s in COLUMNS}), min_size=1, max_size=30)


@pytest.fixture(scope="module", params=["pg15", "pg18"])
def values_db(clusters, request):
    from tests.support.databases import CaptureDatabase

    db = CaptureDatabase.create(clusters[request.param], "t_binary_values")
    db.execute(
        "CREATE DOMAIN positive_big AS bigint CHECK (VALUE > 0);"
        "CREATE TABLE v (id serial PRIMARY KEY, " + ", ".join(f"{n} {sql}" for n, sql, _ in COLUMNS) + ")"
    )
    with db.connect() as conn:
        table = admin.describe_tables(conn, [TableRef("public", "v")])[TableRef("public", "v")]
    yield db, {c.name: c.type for c in table.columns}
    db.drop()


def both_forms(db, names: list[str], chunk_bytes: int) -> dict[str, tuple]:
    """{column: (binary column chunks, text arrays)} of table v, in id order."""
    with connect(db.info) as conn:  # the capture's session settings
        outputs = dict(
            conn.execute(
                # its search_path is pg_catalog: an extension's output function is named with its schema
                "SELECT a.attname::text, ty.typoutput::regproc::text FROM pg_attribute a "
                "JOIN pg_type ty ON ty.oid = a.atttypid WHERE a.attrelid = 'public.v'::regclass AND a.attnum > 0"
            ).fetchall()
        )
        selected = ", ".join(f"{n}, pg_catalog.textin({outputs[n]}({n}))" for n in names)
        statement = f"COPY (SELECT {selected} FROM public.v ORDER BY id) TO STDOUT (FORMAT binary)"
        chunks = list(read_copy_chunks(conn, statement.encode(), 2 * len(names), chunk_bytes=chunk_bytes))
    return {
        n: (
            [c.column(2 * k) for c in chunks],
            pa.chunked_array([c.column(2 * k + 1).text() for c in chunks], pa.string()),
        )
        for k, n in enumerate(names)
    }


def bits(array: pa.Array) -> pa.Array:
    """Floats as their bit patterns (NaN == NaN, -0 != 0)."""
    if pa.types.is_float64(array.type):
        return array.view(pa.uint64())
    if pa.types.is_float32(array.type):
        return array.view(pa.uint32())
    return array


@pytest.mark.parametrize("mode_name", list(MODES))
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=ROWS, chunk_bytes=st.sampled_from([1, 700, 1 << 20]))
def test_binary_and_text_forms_give_the_same_values(values_db, mode_name, rows, chunk_bytes):
    db, types = values_db
    modes: ValueModes = MODES[mode_name]
    with db.connect() as conn:
        conn.execute("TRUNCATE v")
        for row in rows:
            conn.execute(
                "INSERT INTO v ("
                + ", ".join(NAMES)
                + ") VALUES ("
                + ", ".join(f"%s::{s}" for _, s, _ in COLUMNS)
                + ")",
                [row[n] for n in NAMES],
            )
    codecs = {n: t.codec_for(types[n], modes) for n in NAMES}
    binary = [n for n in NAMES if codecs[n].binary is not None]
    assert {"i4", "f8", "b", "d", "ts", "u"} <= set(binary)
    for name, (chunks, text) in both_forms(db, binary, chunk_bytes).items():
        codec = codecs[name]
        try:
            expected = cast_text(text.combine_chunks(), codec, column=name, table="v")
        except ValueConversionError as text_error:
            with pytest.raises(ValueConversionError) as binary_error:
                for chunk in chunks:
                    cast_binary(chunk, codec, column=name, table="v")
            assert str(binary_error.value).split(" (")[0] == str(text_error).split(" (")[0]
            continue
        got = pa.concat_arrays([cast_binary(chunk, codec, column=name, table="v") for chunk in chunks])
        assert got.type == codec.arrow_type, name
        assert bits(got).equals(bits(expected)), (name, got.to_pylist(), expected.to_pylist())


def test_float_nan_payloads_become_the_canonical_nan(values_db):
    """A NaN stored with another payload (binary input can do that) reads as the NaN text parses to."""
    db, types = values_db
    with db.connect() as conn:
        conn.execute("TRUNCATE v")
        odd = struct.unpack(">d", bytes.fromhex("fff8000000000001"))[0]
        conn.execute("INSERT INTO v (f8) VALUES (%s)", (odd,), binary=True)
    (chunks, text) = both_forms(db, ["f8"], 1 << 20)["f8"]
    codec = t.codec_for(types["f8"], ValueModes())
    assert text.to_pylist() == ["NaN"]
    assert bits(cast_binary(chunks[0], codec, column="f8", table="v")).equals(
        bits(cast_text(text.combine_chunks(), codec, column="f8", table="v"))
    )


def test_every_binary_codec_is_covered():
    """A type given a binary decoder must be generated above (in some mode)."""
    covered = {
        t.INT2, t.INT4, t.INT8, t.OID, t.FLOAT4, t.FLOAT8, t.BOOL, t.DATE, t.TIMESTAMP, t.TIMESTAMPTZ, t.TIME,
        t.UUID, t.BYTEA,
    }  # fmt: skip
    numeric_12_2 = ((12 << 16) | 2) + 4  # (numerics are read as text)
    for oid in range(1, 5000):
        pg_type = t.PgType(oid, numeric_12_2 if oid == t.NUMERIC else -1)
        for modes in MODES.values():
            if t.codec_for(pg_type, modes).binary is not None:
                assert oid in covered, oid
