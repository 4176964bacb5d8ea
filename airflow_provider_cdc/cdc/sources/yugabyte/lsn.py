"""YugabyteDB replication positions and hybrid times.

A YB slot's LSN is a per-slot uint64 that YSQL prints as PostgreSQL does (``X/Y``), but it is
not a WAL byte offset: with ``lsn_type HYBRID_TIME`` it is the transaction's commit hybrid
time (HT), with ``SEQUENCE`` a per-record counter. An HT is ``physical unix µs << 12 | logical``
(12-bit counter); ``yb_read_time`` takes it as ``'<ht> ht'`` and
``yb_get_current_hybrid_time_lsn()`` returns one as a ``bigint`` (see
issue 14's research, §1, §2, §5).
"""

from __future__ import annotations

import datetime as dt
from typing import ClassVar

from airflow_provider_cdc.cdc.basics.errors import InvalidLsnError
from airflow_provider_cdc.cdc.basics.positions import Position
from airflow_provider_cdc.cdc.sources.postgres.lsn import MAX_LSN, format_xy, parse_xy

HT_LOGICAL_BITS = 12
HT_LOGICAL_MASK = (1 << HT_LOGICAL_BITS) - 1
MAX_HT = MAX_LSN
_UTC = dt.timezone.utc
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)


class YbLsn(Position):
    """A YB slot position. ``YbLsn("62D63025/5462E000") == YbLsn(0x62D630255462E000)``."""

    __slots__ = ()
    SOURCE: ClassVar[str] = "yugabytedb"

    def __new__(cls, value: int | str | YbLsn) -> YbLsn:
        if isinstance(value, YbLsn):
            return value
        if isinstance(value, bool):
            raise InvalidLsnError(f"not a YugabyteDB LSN: {value!r}")
        if isinstance(value, int):
            number = value
        elif isinstance(value, str):
            number = parse_xy(value, "a YugabyteDB LSN")
        else:
            raise InvalidLsnError(f"not a YugabyteDB LSN: {value!r} (expected 'X/Y' text or an integer)")
        if not 0 <= number <= MAX_LSN:
            raise InvalidLsnError(f"YugabyteDB LSN out of range (0..2^64-1): {value!r}")
        return super().__new__(cls, number)

    def __str__(self) -> str:
        return format_xy(int(self))

    def __repr__(self) -> str:
        return f"YbLsn('{self}')"


def yb_lsn_or_none(value: int | str | None) -> YbLsn | None:
    return None if value is None else YbLsn(value)


def _check_ht(ht: int) -> int:
    if isinstance(ht, bool) or not isinstance(ht, int) or not 0 <= ht <= MAX_HT:
        raise InvalidLsnError(f"not a hybrid time (a uint64): {ht!r}")
    return ht


def ht_to_unix_us(ht: int) -> int:
    """The physical part of a hybrid time: microseconds since the Unix epoch."""
    return _check_ht(ht) >> HT_LOGICAL_BITS


def ht_logical(ht: int) -> int:
    """The 12-bit logical counter of a hybrid time."""
    return _check_ht(ht) & HT_LOGICAL_MASK


def ht_from_unix_us(unix_us: int, logical: int = 0) -> int:
    """The hybrid time of ``unix_us`` microseconds since the epoch and a logical counter."""
    if not 0 <= logical <= HT_LOGICAL_MASK:
        raise InvalidLsnError(f"a hybrid time's logical counter is 0..{HT_LOGICAL_MASK}, got {logical}")
    if not 0 <= unix_us <= MAX_HT >> HT_LOGICAL_BITS:
        raise InvalidLsnError(f"microseconds out of a hybrid time's range: {unix_us}")
    return (unix_us << HT_LOGICAL_BITS) | logical


def ht_to_datetime(ht: int) -> dt.datetime:
    """The physical time of a hybrid time, UTC-aware (the logical counter is dropped)."""
    return _EPOCH + dt.timedelta(microseconds=ht_to_unix_us(ht))


def ht_from_datetime(moment: dt.datetime, logical: int = 0) -> int:
    """The hybrid time of an aware datetime (a naive one is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=_UTC)
    delta = moment - _EPOCH
    return ht_from_unix_us((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds, logical)


def ht_text(ht: int) -> str:
    """The ``yb_read_time`` literal of a raw hybrid time: ``'<ht> ht'`` (a bare number would be µs)."""
    return f"{_check_ht(ht)} ht"


def ht_lsn_text(value: int) -> str:
    """``yb_get_current_hybrid_time_lsn()`` (a ``bigint``) as an ``X/Y`` LSN, as YSQL's
    ``upper(to_hex(v>>32))||'/'||upper(to_hex(v & 4294967295))`` prints it. A negative bigint
    (never, for a real clock) is taken as its unsigned 64-bit pattern."""
    if isinstance(value, bool) or not -(1 << 63) <= value <= MAX_HT:
        raise InvalidLsnError(f"not a bigint hybrid time: {value!r}")
    return format_xy(value & MAX_HT)


__all__ = [
    "HT_LOGICAL_BITS",
    "MAX_HT",
    "YbLsn",
    "ht_from_datetime",
    "ht_from_unix_us",
    "ht_logical",
    "ht_lsn_text",
    "ht_text",
    "ht_to_datetime",
    "ht_to_unix_us",
    "yb_lsn_or_none",
]


def window_bound_after(position: int) -> YbLsn:
    """The window bound just after ``position`` (a commit LSN or an end hybrid time): windows are
    ``[from, to)`` over commit LSNs, and YB's commit LSNs are the positions themselves."""
    return YbLsn(int(position) + 1)
