"""Source log positions: one integer type per source, printed the way that source prints it.

A position is an ``int`` (it compares, sorts and serialises as a number, as Debezium stores
offsets), subclassed per source for its text form: PostgreSQL's LSN ``16/B374D848``, SQL
Server's 10-byte LSN ``0000002a:00000bd8:0003``. Stored windows and offsets name their
source, and :func:`position_class` turns the stored numbers back into that source's type
without the core importing any source up front.
"""

from __future__ import annotations

from importlib import import_module
from typing import ClassVar

# source name -> "module:Class"; imported on first use so the core stays source-free.
_CLASSES = {
    "postgresql": "airflow_provider_cdc.cdc.sources.postgres.lsn:Lsn",
    "sqlserver": "airflow_provider_cdc.cdc.sources.sqlserver.lsn:SqlServerLsn",
    "yugabytedb": "airflow_provider_cdc.cdc.sources.yugabyte.lsn:YbLsn",
}
#: What a stored window or offset without a source name was written by (before there were two).
LEGACY_SOURCE = "postgresql"


class Position(int):
    """A position in a source's change log. Subclasses set ``SOURCE`` and ``WIDTH`` and print
    themselves as their database does."""

    __slots__ = ()
    SOURCE: ClassVar[str] = ""
    WIDTH: ClassVar[int] = 16  # hex digits of the fixed-width form

    def hex16(self) -> str:
        """Fixed-width hexadecimal that sorts lexically like the number (used in file names)."""
        return f"{int(self):0{self.WIDTH}X}"


def position_class(source: str | None) -> type[Position]:
    """The position type of ``source`` (``None``: a record written before sources were named)."""
    name = source or LEGACY_SOURCE
    try:
        module, _, attr = _CLASSES[name].partition(":")
    except KeyError:
        raise ValueError(f"unknown source {name!r} (known: {', '.join(sorted(_CLASSES))})") from None
    return getattr(import_module(module), attr)


def position_or_none(value: int | str | None, cls: type[Position]) -> Position | None:
    return None if value is None else cls(value)
