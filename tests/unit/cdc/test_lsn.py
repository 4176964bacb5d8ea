from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.cdc.basics.errors import InvalidLsnError
from airflow_provider_cdc.cdc.sources.postgres.lsn import MAX_LSN, Lsn


@given(st.integers(0, MAX_LSN))
def test_text_form_round_trips_and_orders_like_integers(number):
    lsn = Lsn(number)
    assert Lsn(str(lsn)) == number
    assert Lsn(repr(lsn)[5:-2]) == lsn
    assert Lsn(int(lsn.hex16(), 16)) == lsn


@given(st.integers(0, MAX_LSN), st.integers(0, MAX_LSN))
def test_hex16_sorts_like_the_number(a, b):
    assert (Lsn(a).hex16() < Lsn(b).hex16()) == (a < b)


def test_postgres_text_form():
    assert Lsn("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert str(Lsn((0x16 << 32) | 0xB374D848)) == "16/B374D848"
    assert Lsn("0/0") == 0
    assert Lsn(" 0/16B3748 ") == 0x16B3748
    assert Lsn("23803720") == 23803720


@pytest.mark.parametrize("bad", ["", "x/1", "0/", "/1", "1/2/3", "123456789/0", "-1", "0x10", "1.5", None, 1.5, True])
def test_invalid_lsns_are_refused_with_a_hint(bad):
    with pytest.raises(InvalidLsnError, match=r"not an LSN|out of range"):
        Lsn(bad)


def test_out_of_range():
    with pytest.raises(InvalidLsnError, match="out of range"):
        Lsn(MAX_LSN + 1)
    with pytest.raises(InvalidLsnError):
        Lsn(-1)
