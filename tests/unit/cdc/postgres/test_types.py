"""Text → typed conversion (shared by snapshot and stream), for every type and handling mode.

Inputs are PostgreSQL's real text output under the capture session settings. The property-based
round trip against a live server is in tests/integration/postgres/test_type_matrix.py.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sources.postgres import types as t
from airflow_provider_cdc.cdc.sources.postgres import values as pgv
from airflow_provider_cdc.cdc.sources.postgres.types import (
    PgType,
    ValueConversionError,
    ValueModes,
    cast_text,
    codec_for,
)

SPARK = ValueModes()
UTC = dt.timezone.utc


def numeric(precision: int, scale: int) -> PgType:
    return PgType(t.NUMERIC, ((precision << 16) | (scale & 0x7FF)) + 4, f"numeric({precision},{scale})", "numeric")


def convert(values, pg_type, modes=SPARK):
    codec = codec_for(pg_type, modes)
    return cast_text(pa.array(values, pa.string()), codec, column="c", table="s.t").to_pylist(), codec.arrow_type


def one(text, pg_type, modes=SPARK):
    values, _ = convert([text, None], pg_type, modes)
    assert values[1] is None
    return values[0]


def micros(*args) -> int:
    return (dt.datetime(*args) - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)


@pytest.mark.parametrize(
    ("pg_type", "text", "expected"),
    [
        (PgType(t.INT2), "-32768", -32768),
        (PgType(t.INT4), "2147483647", 2147483647),
        (PgType(t.INT8), "-9223372036854775808", -9223372036854775808),
        (PgType(t.FLOAT4), "3.4028235e+38", pytest.approx(3.4028235e38)),
        (PgType(t.FLOAT8), "-Infinity", float("-inf")),
        (PgType(t.BOOL), "t", True),
        (PgType(t.BOOL), "f", False),
        (numeric(12, 2), "1234567890.12", Decimal("1234567890.12")),
        (numeric(5, 0), "-99999", Decimal("-99999")),
        (PgType(t.NUMERIC), "3.14159265358979323846264338327950288", "3.14159265358979323846264338327950288"),
        (PgType(t.NUMERIC), "NaN", "NaN"),
        (PgType(t.NUMERIC), "-Infinity", "-Infinity"),
        (numeric(50, 2), "1.00", "1.00"),  # wider than decimal(38): exact text
        (PgType(t.MONEY), "-$1,234,567.89", Decimal("-1234567.89")),
        (PgType(t.TEXT), "multi\nline ✓", "multi\nline ✓"),
        (PgType(t.VARCHAR, 104), "", ""),
        (PgType(t.UUID), "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        (PgType(t.JSONB), '{"a": [1, 2]}', '{"a": [1, 2]}'),
        (PgType(t.XML), "<a>x</a>", "<a>x</a>"),
        (PgType(869, name="inet"), "192.168.0.1/24", "192.168.0.1/24"),
        (PgType(t.BIT, 1), "1", True),
        (PgType(t.BIT, 3), "101", "101"),
        (PgType(t.VARBIT), "1011", "1011"),
        (PgType(t.BYTEA), "\\x00ff10", b"\x00\xff\x10"),
        (PgType(t.BYTEA), "\\x", b""),
        (PgType(t.DATE), "2024-02-29", dt.date(2024, 2, 29)),
        (PgType(t.TIMESTAMP), "2024-01-02 03:04:05.123456", dt.datetime(2024, 1, 2, 3, 4, 5, 123456)),
        (PgType(t.TIMESTAMP), "2024-01-02 03:04:05", dt.datetime(2024, 1, 2, 3, 4, 5)),
        (PgType(t.TIMESTAMPTZ), "2024-01-02 03:04:05.5+00", dt.datetime(2024, 1, 2, 3, 4, 5, 500000, tzinfo=UTC)),
        (PgType(t.TIME), "24:00:00", 86_400_000_000),
        (PgType(t.TIME, 3), "12:00:00.123", 43_200_123_000),
        (PgType(t.TIMETZ), "13:14:15.5+05:30", "07:44:15.500Z"),
        (PgType(t.INTERVAL), "P1DT-1S", 86_399_000_000),
        (PgType(t.POINT), "(1.5,-2)", {"x": 1.5, "y": -2.0}),
        (PgType(3904, name="int4range", kind="r"), "[1,5)", "[1,5)"),
        (PgType(99999, name="mood", kind="e"), "happy", "happy"),
        (PgType(88888, type_name="ltree"), "Top.Science", "Top.Science"),
        (PgType(77777, type_name="citext"), "MiXeD", "MiXeD"),
        (PgType(77778, type_name="hstore"), '"a"=>"1", "b"=>NULL', '{"a": "1", "b": null}'),
        (PgType(55555, name="composite", kind="c"), '(1,"x y")', '(1,"x y")'),  # unmapped: text form
    ],
)
def test_default_mode(pg_type, text, expected):
    assert one(text, pg_type) == expected


def test_domains_use_their_base_type_and_modifier():
    domain = PgType(60000, -1, "positive_money", "positive_money", kind="d", base=numeric(10, 2))
    assert one("12.50", domain) == Decimal("12.50")
    domain_without_modifier = PgType(
        60001, 655366, "d2", "d2", kind="d", base=PgType(t.NUMERIC, -1, "numeric", "numeric")
    )
    assert convert(["1.50"], domain_without_modifier)[1] == pa.decimal128(10, 2)


def test_arrays_of_mapped_types():
    ints = PgType(1007, name="integer[]", type_name="_int4", category="A", element=PgType(t.INT4))
    assert convert(["{1,2,NULL}", "{}", None], ints) == ([[1, 2, None], [], None], pa.list_(pa.int32()))
    texts = PgType(1009, name="text[]", type_name="_text", category="A", element=PgType(t.TEXT))
    assert one('{a,"b c",NULL,"\\"q\\""}', texts) == ["a", "b c", None, '"q"']
    dates = PgType(1182, name="date[]", type_name="_date", category="A", element=PgType(t.DATE))
    assert one("{2024-01-01,infinity}", dates) == [dt.date(2024, 1, 1), dt.date(9999, 12, 31)]
    stamps = PgType(1115, type_name="_timestamp", category="A", element=PgType(t.TIMESTAMP))
    assert one('{"2024-01-01 00:00:00"}', stamps) == [dt.datetime(2024, 1, 1)]
    with pytest.raises(ValueConversionError, match="one-dimensional"):
        one("{{1,2},{3,4}}", ints)
    # the column's modifier applies to the elements
    decimals = PgType(1231, numeric(5, 2).modifier, type_name="_numeric", category="A", element=PgType(t.NUMERIC))
    assert convert(["{1.50,NULL}"], decimals) == ([[Decimal("1.50"), None]], pa.list_(pa.decimal128(5, 2)))


class TestTemporalModes:
    ADAPTIVE = ValueModes(time_precision="adaptive")
    MICRO = ValueModes(time_precision="adaptive_time_microseconds")
    CONNECT = ValueModes(time_precision="connect")

    def test_adaptive(self):
        assert one("2024-02-29", PgType(t.DATE), self.ADAPTIVE) == (dt.date(2024, 2, 29) - dt.date(1970, 1, 1)).days
        assert one("12:00:00.123", PgType(t.TIME, 3), self.ADAPTIVE) == 43_200_123
        assert one("12:00:00.123456", PgType(t.TIME, 6), self.ADAPTIVE) == 43_200_123_456
        assert one("12:00:00.123456", PgType(t.TIME), self.ADAPTIVE) == 43_200_123_456
        assert one("2018-06-20 15:13:16.945", PgType(t.TIMESTAMP, 3), self.ADAPTIVE) == 1529507596945
        assert one("2018-06-20 15:13:16.945104", PgType(t.TIMESTAMP), self.ADAPTIVE) == 1529507596945104
        assert one("2018-06-20 15:13:16.945104+00", PgType(t.TIMESTAMPTZ), self.ADAPTIVE) == (
            "2018-06-20T15:13:16.945104Z"
        )

    def test_adaptive_time_microseconds(self):
        assert one("12:00:00.123", PgType(t.TIME, 3), self.MICRO) == 43_200_123_000

    def test_connect(self):
        assert one("12:00:00.123456", PgType(t.TIME), self.CONNECT) == 43_200_123
        assert one("2024-01-02 03:04:05.123456", PgType(t.TIMESTAMP), self.CONNECT) == dt.datetime(
            2024, 1, 2, 3, 4, 5, 123000
        )
        assert convert(["2024-01-02 03:04:05"], PgType(t.TIMESTAMP), self.CONNECT)[1] == pa.timestamp("ms")
        # before the epoch, truncating to milliseconds rounds towards the past (Java's floorDiv)
        assert one("1969-12-31 23:59:59.9995", PgType(t.TIMESTAMP), self.CONNECT) == dt.datetime(
            1969, 12, 31, 23, 59, 59, 999000
        )

    def test_infinity_and_ancient_dates(self):
        assert one("infinity", PgType(t.TIMESTAMP)) == dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
        assert one("-infinity", PgType(t.DATE)) == dt.date(1, 1, 1)
        assert one("infinity", PgType(t.TIMESTAMP), self.ADAPTIVE) == t.POS_INFINITY_MICROS
        assert one("-infinity", PgType(t.TIMESTAMP), self.ADAPTIVE) == t.NEG_INFINITY_MICROS
        assert one("infinity", PgType(t.TIMESTAMPTZ), self.ADAPTIVE) == "infinity"
        bc = "0044-03-15 12:00:00.5 BC"
        assert one(bc, PgType(t.TIMESTAMP), self.ADAPTIVE) == pgv.parse_timestamp(bc)
        stored = codec_for(PgType(t.TIMESTAMP), SPARK).convert(pa.array([bc, "2024-01-01 00:00:00"]))
        assert stored.type == pa.timestamp("us")  # the exact instant, even where Python cannot show it
        assert stored.cast(pa.int64()).to_pylist() == [pgv.parse_timestamp(bc), micros(2024, 1, 1)]
        days = codec_for(PgType(t.DATE), SPARK).convert(pa.array(["0044-03-15 BC", "10000-01-01"]))
        assert days.cast(pa.int32()).to_pylist() == [pgv.days_from_civil(-43, 3, 15), pgv.days_from_civil(10000, 1, 1)]


def test_decimal_modes():
    double, string = ValueModes(decimal="double"), ValueModes(decimal="string")
    assert one("NaN", numeric(10, 2), double) != one("NaN", numeric(10, 2), double)  # NaN
    assert one("1.25", numeric(10, 2), double) == 1.25
    assert one("1.25", numeric(10, 2), string) == "1.25"
    assert one("-$5.00", PgType(t.MONEY), string) == "-5.00"
    with pytest.raises(ValueConversionError, match=r"value 'NaN'.*decimal_handling_mode='string'"):
        convert(["1.00", "NaN"], numeric(10, 2))


def test_binary_modes():
    assert one("\\x00ff", PgType(t.BYTEA), ValueModes(binary="base64")) == base64.b64encode(b"\x00\xff").decode()
    assert one("\\x00ff", PgType(t.BYTEA), ValueModes(binary="hex")) == "00ff"


def test_hstore_and_interval_modes():
    hstore = PgType(77778, type_name="hstore")
    assert one('"a"=>"1", "b"=>NULL', hstore, ValueModes(hstore="map")) == [("a", "1"), ("b", None)]
    assert json.loads(one('"q\\""=>"x"', hstore)) == {'q"': "x"}
    assert one("P1Y2M3DT4H5M6.78S", PgType(t.INTERVAL), ValueModes(interval="string")) == "P1Y2M3DT4H5M6.78S"


def test_unchanged_toast_placeholders_per_type():
    modes = ValueModes(unavailable_value_placeholder="hex:c0ffee")
    assert codec_for(PgType(t.TEXT), SPARK).placeholder == "__debezium_unavailable_value"
    assert codec_for(PgType(t.BYTEA), modes).placeholder == b"\xc0\xff\xee"
    texts = PgType(1009, type_name="_text", category="A", element=PgType(t.TEXT))
    assert codec_for(texts, SPARK).placeholder == ["__debezium_unavailable_value"]
    assert codec_for(numeric(10, 2), SPARK).placeholder is None  # no room for a marker: null + listed


def test_unknown_modes_are_refused():
    with pytest.raises(CdcConfigurationError, match="decimal handling mode 'exact'"):
        ValueModes(decimal="exact")
    with pytest.raises(CdcConfigurationError, match="time_precision"):
        ValueModes(time_precision="nanoseconds")


@given(st.decimals(min_value=-(10**9), max_value=10**9, places=2, allow_nan=False))
def test_constrained_numeric_is_exact(value):
    assert one(f"{value:.2f}", numeric(12, 2)) == value
