"""The snapshot's ``COPY (SELECT ...) TO STDOUT (FORMAT binary)``: one route per column.

- **binary**: the column's codec converts the binary send form (``Codec.binary``: integers,
  floats, booleans, dates, timestamps, times, uuid, bytea; see :mod:`.binary_values`), so the
  column is selected as it is;
- **text**: every other column is selected as its text output, the same text pgoutput sends
  and the codec converts on the stream:

  - ``text``, ``varchar``, ``char(n)`` and ``name`` as they are: their send form is their text
    output (padding included);
  - other types as ``col::text``, which is an I/O conversion (the type's output function) for
    every type without a cast of its own to text;
  - types with such a cast (``boolean`` → ``true``, ``inet`` → with its netmask, ``xml``,
    extension types like ``ltree``) through ``format('%s', col)``, which calls the output
    function too (NULL kept NULL). Like COPY itself, neither calls a function by name, so no
    privilege beyond ``SELECT`` on the table is needed.

Spending the server's time on text output only where the capture needs text is most of what the
binary COPY saves (docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from airflow_provider_cdc.cdc.sources.postgres.copy_binary import CopyChunk
from airflow_provider_cdc.cdc.sources.postgres.tables import pg_identifier
from airflow_provider_cdc.cdc.sources.postgres.types import BPCHAR, NAME, TEXT, VARCHAR

if TYPE_CHECKING:
    from airflow_provider_cdc.cdc.sources.postgres.events import TableEncoder


class PartitionRange(Protocol):
    """One partition of a table's snapshot read: the WHERE terms that select it."""

    def conditions(self) -> list[Any]: ...  # psycopg sql.Composable terms, ANDed


#: Types whose binary send form is their text output (``textsend`` and friends).
SENT_AS_TEXT = frozenset({TEXT, VARCHAR, BPCHAR, NAME})

#: Types with a cast to text other than an I/O conversion (a domain casts as its base type).
_CASTS_TO_TEXT = """
SELECT castsource::int8 FROM pg_cast
WHERE casttarget = 'pg_catalog.text'::regtype AND castmethod <> 'i' AND castsource = ANY(%s::oid[])
"""


class Route:
    BINARY = "binary"  # the send form, decoded by the codec
    SENT = "sent"  # selected as it is: the send form is the text output
    CAST = "cast"  # col::text, an I/O conversion
    FORMAT = "format"  # format('%s', col): the output function where a cast would differ


@dataclass(frozen=True)
class CopyPlan:
    """How each kept column of a :class:`TableEncoder` is selected (one :class:`Route` each)."""

    routes: tuple[str, ...]

    @classmethod
    def of(cls, conn: Any, encoder: TableEncoder) -> CopyPlan:
        bases = [c.type.resolved().oid for c in encoder.columns]
        texts = {
            base for base, codec in zip(bases, encoder.codecs) if codec.binary is None and base not in SENT_AS_TEXT
        }
        own_casts = {row[0] for row in conn.execute(_CASTS_TO_TEXT, (sorted(texts),)).fetchall()} if texts else set()
        return cls(
            tuple(
                Route.BINARY
                if codec.binary is not None
                else Route.SENT
                if base in SENT_AS_TEXT
                else Route.FORMAT
                if base in own_casts
                else Route.CAST
                for base, codec in zip(bases, encoder.codecs)
            )
        )

    def statement(self, encoder: TableEncoder, block_range: PartitionRange):  # -> sql.Composed
        """The COPY of one partition (``block_range.conditions()``: its WHERE terms)."""
        from psycopg import sql

        return sql.SQL("COPY ({}) TO STDOUT (FORMAT binary)").format(self.select(encoder, block_range))

    def select(self, encoder: TableEncoder, block_range: PartitionRange):  # -> sql.Composed
        """The SELECT of one partition that :meth:`statement` copies."""
        from psycopg import sql

        selected = []
        for column, route in zip(encoder.columns, self.routes):
            name = sql.Identifier(column.name)
            if route == Route.CAST:
                name = sql.SQL("{}::pg_catalog.text").format(name)
            elif route == Route.FORMAT:
                name = sql.SQL("CASE WHEN {0} IS NULL THEN NULL ELSE pg_catalog.format('%s', {0}) END").format(name)
            selected.append(name)
        where = block_range.conditions()
        condition = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(where) if where else sql.SQL("")
        return sql.SQL("SELECT {} FROM {}{}").format(
            sql.SQL(", ").join(selected), pg_identifier(encoder.table.ref), condition
        )

    def values(self, chunk: CopyChunk, encoder: TableEncoder) -> list[pa.Array]:
        """The typed values of every kept column of a chunk read with :meth:`statement`."""
        return [
            encoder.typed_binary(k, chunk.column(k))
            if route == Route.BINARY
            else encoder.typed_text(k, chunk.column(k).text())
            for k, route in enumerate(self.routes)
        ]
