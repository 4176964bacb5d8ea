"""PostgreSQL text-form parsers, checked against Python's calendar and hand-made cases."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.sources.postgres import values as pgv

EPOCH = dt.date(1970, 1, 1)


@given(st.dates())
def test_days_from_civil_matches_python(date):
    days = pgv.days_from_civil(date.year, date.month, date.day)
    assert days == (date - EPOCH).days
    assert pgv.civil_from_days(days) == (date.year, date.month, date.day)


@given(st.integers(-2_500_000, 2_000_000_000))
def test_civil_round_trip_far_outside_python_dates(days):
    assert pgv.days_from_civil(*pgv.civil_from_days(days)) == days


@given(st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59, 999999)))
def test_timestamps_match_python(value):
    expected = (value - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    text = value.isoformat(sep=" ")
    assert pgv.parse_timestamp(text) == expected
    assert pgv.parse_timestamp(text + "+00") == expected
    assert pgv.parse_timestamp(text + "+05:30") == expected - 19_800_000_000


@pytest.mark.parametrize(
    ("text", "days"),
    # (date - '1970-01-01') as PostgreSQL 15 computes it
    [
        ("0001-01-01 BC", -719528),
        ("0001-03-01 BC", -719468),
        ("0002-01-01 BC", -719893),
        ("0004-03-01 BC", -720564),
        ("0005-03-01 BC", -720929),
        ("0001-01-01", -719162),
    ],
)
def test_bc_dates_agree_with_postgres(text, days):
    assert pgv.parse_date(text) == days
    assert pgv.civil_from_days(days) == (pgv._year(text[:4], " BC" if text.endswith("BC") else None), int(text[5:7]), 1)


def test_postgres_special_dates_and_timestamps():
    assert pgv.parse_date("0001-01-01 BC") == pgv.days_from_civil(0, 1, 1)  # 1 BC is year 0
    assert pgv.parse_date("4713-01-01 BC") == pgv.days_from_civil(-4712, 1, 1)
    assert pgv.parse_date("10000-01-01") == pgv.days_from_civil(10000, 1, 1)
    assert pgv.parse_date("infinity") == "infinity" and pgv.parse_date("-infinity") == "-infinity"
    assert pgv.parse_timestamp("0044-03-15 12:00:00.5+00 BC") == (
        pgv.days_from_civil(-43, 3, 15) * pgv.US_PER_DAY + 43_200_500_000
    )
    assert pgv.parse_timestamp("294276-12-31 23:59:59.999999") > 9 * 10**18
    with pytest.raises(pgv.ParseError):
        pgv.parse_timestamp("2024-13-01 garbage")


def test_times():
    assert pgv.parse_time("24:00:00") == pgv.US_PER_DAY
    assert pgv.parse_time("12:00:00.123") == 43_200_123_000
    assert pgv.parse_timetz("13:14:15.5+05:30") == (47_655_500_000, 19_800)
    assert pgv.format_zoned_time(*pgv.parse_timetz("13:14:15.5+05:30")) == "07:44:15.500Z"
    assert pgv.format_zoned_time(*pgv.parse_timetz("23:00:00-08")) == "07:00:00Z"
    with pytest.raises(pgv.ParseError):
        pgv.parse_time("13:14:15+01")


def test_zoned_timestamp_format_is_javas_iso_form():
    assert pgv.format_zoned_timestamp(0) == "1970-01-01T00:00:00Z"
    assert pgv.format_zoned_timestamp(1529507596945104) == "2018-06-20T15:13:16.945104Z"
    assert pgv.format_zoned_timestamp(1529507596945000) == "2018-06-20T15:13:16.945Z"


@pytest.mark.parametrize(
    ("text", "months", "days", "micros"),
    [
        ("P1Y2M3DT4H5M6.78S", 14, 3, (4 * 3600 + 5 * 60) * 10**6 + 6_780_000),
        ("P-1Y-2M3DT-4H-5M-6S", -14, 3, -(4 * 3600 + 5 * 60 + 6) * 10**6),
        ("PT0S", 0, 0, 0),
        ("PT-0.5S", 0, 0, -500_000),
        ("P1DT-1S", 0, 1, -1_000_000),
        ("P178000000Y", 178000000 * 12, 0, 0),
    ],
)
def test_intervals(text, months, days, micros):
    assert pgv.parse_interval(text) == (months, days, micros)


def test_interval_micros_uses_debezium_month_length():
    assert pgv.interval_micros("P1M") == round(30.4375 * pgv.US_PER_DAY)
    assert pgv.interval_micros("P1Y") == round(365.25 * pgv.US_PER_DAY)


def test_money_and_point():
    assert pgv.parse_money("$1,234,567.89") == Decimal("1234567.89")
    assert pgv.parse_money("-$5.00") == Decimal("-5.00")
    assert pgv.parse_point("(1.5,-2)") == (1.5, -2.0)


def test_arrays():
    assert pgv.parse_array('{a,"b c",NULL,"\\"q\\"","x\\\\y","NULL"}') == ["a", "b c", None, '"q"', "x\\y", "NULL"]
    assert pgv.parse_array("{}") == []
    assert pgv.parse_array('{""}') == [""]
    assert pgv.parse_array("[0:1]={1,2}") == ["1", "2"]
    with pytest.raises(pgv.ParseError, match="multi-dimensional"):
        pgv.parse_array("{{1,2},{3,4}}")


@given(st.lists(st.one_of(st.none(), st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0")))))
def test_array_round_trip(items):
    def quote(item):
        if item is None:
            return "NULL"
        return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'

    assert pgv.parse_array("{" + ",".join(quote(i) for i in items) + "}") == items


def test_hstore():
    assert pgv.parse_hstore('"a"=>"1", "q\\""=>"x\\\\y", "b c"=>NULL') == [("a", "1"), ('q"', "x\\y"), ("b c", None)]
    assert pgv.parse_hstore("") == []
