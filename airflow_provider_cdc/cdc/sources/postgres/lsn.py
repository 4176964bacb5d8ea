"""PostgreSQL log sequence numbers (LSNs): parsing, formatting, comparison.

An LSN is a 64-bit byte position in the write-ahead log. PostgreSQL prints it as two
hexadecimal halves (``16/B374D848``); Debezium stores it as a plain integer. ``Lsn`` is an
``int`` so it compares, sorts and serialises like one, and prints like PostgreSQL.
"""

from __future__ import annotations

import re
from typing import ClassVar

from airflow_provider_cdc.cdc.basics.errors import InvalidLsnError
from airflow_provider_cdc.cdc.basics.positions import Position

_TEXT_FORM = re.compile(r"^\s*([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})\s*$")
MAX_LSN = (1 << 64) - 1


class Lsn(Position):
    """A WAL position. ``Lsn("0/16B3748") == Lsn(23803720)``."""

    __slots__ = ()
    SOURCE: ClassVar[str] = "postgresql"

    def __new__(cls, value: int | str | Lsn) -> Lsn:
        if isinstance(value, Lsn):
            return value
        if isinstance(value, bool):
            raise InvalidLsnError(f"not an LSN: {value!r}")
        if isinstance(value, int):
            number = value
        elif isinstance(value, str):
            number = parse_xy(value)
        else:
            raise InvalidLsnError(f"not an LSN: {value!r} (expected 'X/Y' text or an integer)")
        if not 0 <= number <= MAX_LSN:
            raise InvalidLsnError(f"LSN out of range: {value!r}")
        return super().__new__(cls, number)

    def __str__(self) -> str:
        return format_xy(int(self))

    def __repr__(self) -> str:
        return f"Lsn('{self}')"


def parse_xy(text: str, what: str = "an LSN") -> int:
    """``X/Y`` (two hexadecimal 32-bit halves) or a decimal integer → the number (unchecked range).

    Shared with sources that print positions as PostgreSQL does (YugabyteDB)."""
    match = _TEXT_FORM.match(text)
    if match:
        return (int(match.group(1), 16) << 32) | int(match.group(2), 16)
    stripped = text.strip()
    if stripped.isdigit():
        return int(stripped)
    raise InvalidLsnError(
        f"not {what}: {text!r} (expected PostgreSQL's 'X/Y' hexadecimal form, e.g. '0/16B3748', or a decimal integer)"
    )


def format_xy(number: int) -> str:
    """PostgreSQL's ``X/Y`` text of a 64-bit position (upper-case hex, no padding)."""
    return f"{number >> 32:X}/{number & 0xFFFFFFFF:X}"


def lsn_or_none(value: int | str | None) -> Lsn | None:
    return None if value is None else Lsn(value)
