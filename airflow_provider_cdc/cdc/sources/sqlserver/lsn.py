"""SQL Server log sequence numbers: 10 bytes, compared bytewise, printed as Debezium prints them.

SQL Server's CDC functions take and return an LSN as ``binary(10)``: the virtual log file
number (4 bytes), the log block (4 bytes) and the record's slot (2 bytes), big-endian, so the
byte order is the log order. ``SqlServerLsn`` is that value as an integer (it compares and
serialises like one, as every source's position does) that prints like Debezium's
``Lsn.toString()``: ``0000002a:00000bd8:0003``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from airflow_provider_cdc.cdc.basics.errors import InvalidLsnError
from airflow_provider_cdc.cdc.basics.positions import Position

if TYPE_CHECKING:  # numpy and pyarrow load where events are built, not when a DAG file is parsed
    import pyarrow as pa

LSN_BYTES = 10
MAX_SQLSERVER_LSN = (1 << (8 * LSN_BYTES)) - 1
_TEXT_FORM = re.compile(r"^\s*([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,4})\s*$")
_HEX_FORM = re.compile(r"^\s*0x([0-9A-Fa-f]{1,20})\s*$")


class SqlServerLsn(Position):
    """A SQL Server LSN. ``SqlServerLsn("0000002a:00000bd8:0003") == SqlServerLsn(b"...")``."""

    __slots__ = ()
    SOURCE: ClassVar[str] = "sqlserver"
    WIDTH: ClassVar[int] = 2 * LSN_BYTES

    def __new__(cls, value: int | str | bytes | bytearray | SqlServerLsn) -> SqlServerLsn:
        if isinstance(value, SqlServerLsn):
            return value
        if isinstance(value, bool):
            raise InvalidLsnError(f"not a SQL Server LSN: {value!r}")
        if isinstance(value, (bytes, bytearray)):
            if len(value) != LSN_BYTES:
                raise InvalidLsnError(f"a SQL Server LSN has {LSN_BYTES} bytes, got {len(value)}: {bytes(value)!r}")
            number = int.from_bytes(value, "big")
        elif isinstance(value, int):
            number = value
        elif isinstance(value, str):
            number = _parse_text(value)
        else:
            raise InvalidLsnError(f"not a SQL Server LSN: {value!r}")
        if not 0 <= number <= MAX_SQLSERVER_LSN:
            raise InvalidLsnError(f"SQL Server LSN out of range: {value!r}")
        return super().__new__(cls, number)

    def __str__(self) -> str:
        number = int(self)
        return f"{number >> 48:08x}:{(number >> 16) & 0xFFFFFFFF:08x}:{number & 0xFFFF:04x}"

    def __repr__(self) -> str:
        return f"SqlServerLsn('{self}')"

    def to_bytes(self) -> bytes:  # type: ignore[override]
        """The ``binary(10)`` form SQL Server's functions take."""
        return int(self).to_bytes(LSN_BYTES, "big")

    def previous(self) -> SqlServerLsn:
        """The LSN just before (``sys.fn_cdc_decrement_lsn``): an exclusive end as an inclusive one."""
        if int(self) == 0:
            raise InvalidLsnError("there is no LSN before 00000000:00000000:0000")
        return SqlServerLsn(int(self) - 1)

    def next(self) -> SqlServerLsn:
        """The LSN just after (``sys.fn_cdc_increment_lsn``)."""
        return SqlServerLsn(int(self) + 1)


def _parse_text(text: str) -> int:
    match = _TEXT_FORM.match(text)
    if match:
        vlf, block, slot = (int(part, 16) for part in match.groups())
        return (vlf << 48) | (block << 16) | slot
    match = _HEX_FORM.match(text)
    if match:
        return int(match.group(1), 16)
    stripped = text.strip()
    if stripped.isdigit():
        return int(stripped)
    raise InvalidLsnError(
        f"not a SQL Server LSN: {text!r} (expected Debezium's 'vlf:block:slot' form, e.g. "
        "'0000002a:00000bd8:0003', SQL Server's '0x0000002A00000BD80003', or a decimal integer)"
    )


def lsn_or_none(value: int | str | bytes | None) -> SqlServerLsn | None:
    return None if value is None else SqlServerLsn(value)


_HEX_DIGITS = b"0123456789abcdef"
_LSN_TEXT_WIDTH = 22  # vvvvvvvv:bbbbbbbb:ssss


def lsn_texts(lsns: Sequence[int]) -> pa.Array:
    """``str(SqlServerLsn(v))`` of every value, as one string array: the 10 bytes of each LSN
    are hex-printed with numpy (a per-value ``str()`` cost as much as the rest of an event)."""
    import numpy as np
    import pyarrow as pa

    hex_digits = np.frombuffer(_HEX_DIGITS, np.uint8)
    n = len(lsns)
    to_bytes = int.to_bytes  # not SqlServerLsn.to_bytes(), which takes no arguments
    raw = np.frombuffer(b"".join([to_bytes(v, LSN_BYTES, "big") for v in lsns]), np.uint8).reshape(n, LSN_BYTES)
    digits = np.empty((n, 2 * LSN_BYTES), np.uint8)
    digits[:, 0::2] = hex_digits[raw >> 4]
    digits[:, 1::2] = hex_digits[raw & 0x0F]
    text = np.empty((n, _LSN_TEXT_WIDTH), np.uint8)
    text[:, 0:8], text[:, 9:17], text[:, 18:22] = digits[:, 0:8], digits[:, 8:16], digits[:, 16:20]
    text[:, 8] = text[:, 17] = ord(":")
    offsets = np.arange(0, _LSN_TEXT_WIDTH * (n + 1), _LSN_TEXT_WIDTH, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(text)])
