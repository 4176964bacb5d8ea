"""SQL Server LSNs for the stand-in: 10 bytes, compared bytewise like binary(10).

A real LSN is VLF sequence (4 bytes) : log block offset (4 bytes) : slot (2 bytes). The stand-in
maps PostgreSQL's 64-bit WAL position into the first 8 bytes (big-endian, so byte order is WAL
order) and uses the last 2 bytes as a slot counter for changes that share one WAL record.
"""

from __future__ import annotations

LSN_LENGTH = 10
ZERO_LSN = bytes(LSN_LENGTH)


def from_pg(pg_lsn: str | int, slot: int = 0) -> bytes:
    """``'16/B374D848'`` (or its integer) -> 10-byte LSN."""
    if isinstance(pg_lsn, str):
        high, low = pg_lsn.split("/")
        pg_lsn = (int(high, 16) << 32) | int(low, 16)
    return pg_lsn.to_bytes(8, "big") + slot.to_bytes(2, "big")


def to_int(lsn: bytes) -> int:
    if len(lsn) != LSN_LENGTH:
        raise ValueError(f"an LSN is {LSN_LENGTH} bytes, got {len(lsn)}")
    return int.from_bytes(lsn, "big")


def from_int(value: int) -> bytes:
    return value.to_bytes(LSN_LENGTH, "big")


def increment(lsn: bytes) -> bytes:
    """``sys.fn_cdc_increment_lsn``: the next possible LSN value (not necessarily one that exists)."""
    return from_int(to_int(lsn) + 1)


def decrement(lsn: bytes) -> bytes:
    return from_int(to_int(lsn) - 1)


def debezium_string(lsn: bytes | None) -> str | None:
    """Debezium's ``xxxxxxxx:xxxxxxxx:xxxx`` form."""
    if lsn is None:
        return None
    return f"{lsn[:4].hex()}:{lsn[4:8].hex()}:{lsn[8:].hex()}"
