"""YugabyteDB positions (X/Y text of a uint64) and hybrid-time helpers."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import InvalidLsnError
from airflow_provider_cdc.cdc.basics.positions import position_class
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.yugabyte.lsn import (
    MAX_HT,
    YbLsn,
    ht_from_datetime,
    ht_from_unix_us,
    ht_logical,
    ht_lsn_text,
    ht_text,
    ht_to_datetime,
    ht_to_unix_us,
    yb_lsn_or_none,
)

u64 = st.integers(0, MAX_HT)
# µs whose datetime stays within Python's range (year 9999 is far beyond any HT of 52 bits)
unix_us = st.integers(0, MAX_HT >> 12)
logical = st.integers(0, 4095)


@given(u64)
def test_text_form_round_trips(number):
    lsn = YbLsn(number)
    assert YbLsn(str(lsn)) == number
    assert YbLsn(repr(lsn)[7:-2]) == lsn
    assert YbLsn(str(int(lsn))) == lsn
    assert str(lsn) == str(Lsn(number))  # printed exactly as PostgreSQL prints an LSN


@given(u64, u64)
def test_order_is_the_numbers(a, b):
    assert (YbLsn(a) < YbLsn(b)) == (a < b)
    assert (YbLsn(a).hex16() < YbLsn(b).hex16()) == (a < b)


def test_text_forms_and_errors():
    assert YbLsn("0/2") == 2
    assert YbLsn(" 62D63025/5462E000 ") == 0x62D630255462E000
    assert YbLsn("7319277973024817152") == 7319277973024817152
    assert yb_lsn_or_none(None) is None and yb_lsn_or_none("0/5") == 5
    for bad in ("", "x/1", "1/2/3", "123456789/0", "-1"):
        with pytest.raises(InvalidLsnError, match="YugabyteDB LSN"):
            YbLsn(bad)
    for bad in (-1, 1 << 64):
        with pytest.raises(InvalidLsnError, match="out of range"):
            YbLsn(bad)
    with pytest.raises(InvalidLsnError):
        YbLsn(True)
    with pytest.raises(InvalidLsnError):
        YbLsn(1.5)  # type: ignore[arg-type]


def test_registered_as_a_source_position():
    assert position_class("yugabytedb") is YbLsn
    window = Window(3, "stream", YbLsn("0/5"), YbLsn("0/9"), 0)
    stored = window.to_dict()
    assert stored["source"] == "yugabytedb"
    again = Window.from_dict(stored)
    assert again == window and type(again.to_lsn) is YbLsn


@given(unix_us, logical)
def test_hybrid_time_parts_round_trip(us, n):
    ht = ht_from_unix_us(us, n)
    assert ht_to_unix_us(ht) == us and ht_logical(ht) == n
    assert ht >> 12 == us


@given(u64, u64)
def test_hybrid_time_order_is_the_clock_order(a, b):
    if ht_to_unix_us(a) < ht_to_unix_us(b):
        assert a < b
    assert (ht_to_datetime(a) <= ht_to_datetime(b)) or a > b


@given(unix_us, logical)
def test_datetime_round_trip(us, n):
    ht = ht_from_unix_us(us, n)
    moment = ht_to_datetime(ht)
    assert moment.tzinfo is not None and moment.utcoffset() == dt.timedelta(0)
    assert ht_from_datetime(moment, n) == ht
    assert ht_from_datetime(moment) == ht - n


def test_reference_hybrid_time_lsn():
    # yb_get_current_hybrid_time_lsn() → X/Y, as the reference's example prints it
    value = 0x62D630255462E000
    assert ht_lsn_text(value) == "62D63025/5462E000"
    assert YbLsn("62D63025/5462E000") == value
    assert ht_to_datetime(value) == dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(
        microseconds=value >> 12
    )
    assert ht_to_datetime(value).isoformat() == "2025-02-05T10:58:44.419118+00:00"
    assert ht_lsn_text(-1) == "FFFFFFFF/FFFFFFFF"  # a bigint's unsigned pattern
    with pytest.raises(InvalidLsnError):
        ht_lsn_text(1 << 64)


def test_read_time_literal_and_conversions():
    moment = dt.datetime(2021, 11, 25, 12, 0, tzinfo=dt.timezone.utc)
    ht = ht_from_datetime(moment)
    assert ht == 1637841600000000 << 12
    assert ht_text(ht) == f"{1637841600000000 << 12} ht"
    naive = dt.datetime(2021, 11, 25, 12, 0)
    assert ht_from_datetime(naive) == ht
    zoned = dt.datetime(2021, 11, 25, 17, 30, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30)))
    assert ht_from_datetime(zoned) == ht
    with pytest.raises(InvalidLsnError):
        ht_from_unix_us(1, logical=4096)
    with pytest.raises(InvalidLsnError):
        ht_from_unix_us(-1)
    with pytest.raises(InvalidLsnError):
        ht_text(-5)
    with pytest.raises(InvalidLsnError):
        ht_from_datetime(dt.datetime(1969, 12, 31, tzinfo=dt.timezone.utc))
