"""Text → typed conversion shared by the snapshot and the stream."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.sources.postgres import types as t
from airflow_provider_cdc.cdc.sources.postgres.types import PgType, ValueConversionError, arrow_type, cast_text


def numeric(precision: int, scale: int) -> PgType:
    return PgType(t.NUMERIC, ((precision << 16) | (scale & 0x7FF)) + 4, f"numeric({precision},{scale})")


def convert(values, pg_type):
    return cast_text(pa.array(values, pa.string()), pg_type, column="c", table="s.t").to_pylist()


@pytest.mark.parametrize(
    ("pg_type", "text", "expected"),
    [
        (PgType(t.INT2), "-32768", -32768),
        (PgType(t.INT4), "2147483647", 2147483647),
        (PgType(t.INT8), "-9223372036854775808", -9223372036854775808),
        (PgType(t.BOOL), "t", True),
        (PgType(t.BOOL), "f", False),
        (numeric(12, 2), "1234567890.12", Decimal("1234567890.12")),
        (numeric(5, 0), "-99999", Decimal("-99999")),
        (
            PgType(t.NUMERIC),
            "3.14159265358979323846264338327950288419716939937510",
            "3.14159265358979323846264338327950288419716939937510",
        ),
        (PgType(t.TEXT), "multi\nline ✓", "multi\nline ✓"),
        (PgType(t.VARCHAR, 104), "", ""),
        (PgType(t.UUID), "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        (PgType(t.JSONB), '{"a": [1, 2]}', '{"a": [1, 2]}'),
        (PgType(t.DATE), "2024-02-29", dt.date(2024, 2, 29)),
        (PgType(t.TIMESTAMP), "2024-01-02 03:04:05.123456", dt.datetime(2024, 1, 2, 3, 4, 5, 123456)),
        (PgType(t.TIMESTAMP), "2024-01-02 03:04:05", dt.datetime(2024, 1, 2, 3, 4, 5)),
        (
            PgType(t.TIMESTAMPTZ),
            "2024-01-02 03:04:05.5+00",
            dt.datetime(2024, 1, 2, 3, 4, 5, 500000, tzinfo=dt.timezone.utc),
        ),
        (PgType(t.BYTEA), "\\x00ff10", b"\x00\xff\x10"),
        (PgType(t.BYTEA), "\\x", b""),
        (PgType(t.FLOAT8), "1.5", 1.5),
        (PgType(999999, -1, "some_enum"), "value", "value"),  # unmapped: text form
    ],
)
def test_conversions(pg_type, text, expected):
    got = convert([text, None], pg_type)
    assert got[1] is None
    if isinstance(expected, dt.datetime) and expected.tzinfo is not None:
        assert got[0] == expected and got[0].utcoffset() == dt.timedelta(0)
    else:
        assert got[0] == expected


def test_arrow_types():
    assert arrow_type(numeric(12, 2)) == pa.decimal128(12, 2)
    assert arrow_type(numeric(50, 2)) == pa.string()  # wider than Spark's decimals: lossless text
    assert arrow_type(numeric(5, -2)) == pa.string()  # negative scales: lossless text
    assert arrow_type(PgType(t.NUMERIC)) == pa.string()
    assert arrow_type(PgType(t.TIMESTAMP)) == pa.timestamp("us")
    assert arrow_type(PgType(t.TIMESTAMPTZ)) == pa.timestamp("us", tz="UTC")


@given(st.decimals(min_value=-(10**9), max_value=10**9, places=2, allow_nan=False))
def test_constrained_numeric_is_exact(value):
    assert convert([f"{value:.2f}"], numeric(12, 2)) == [value]


def test_unrepresentable_values_fail_naming_column_and_value():
    with pytest.raises(ValueConversionError, match=r"column 'c' of s\.t: value 'NaN'"):
        convert(["1.00", "NaN"], numeric(10, 2))
    with pytest.raises(ValueConversionError, match="'infinity'"):
        convert(["infinity"], PgType(t.TIMESTAMP))
