"""The snapshot's ``COPY (SELECT ...) TO STDOUT (FORMAT binary)``: one route per column.

- **binary**: the column's codec converts the binary send form (``Codec.binary``: integers,
  floats, booleans, dates, timestamps, times, uuid, bytea; see :mod:`.binary_values`), so the
  column is selected as it is;
- **text**: every other column is selected as its text output, the same text pgoutput sends
  and the codec converts on the stream. ``text``, ``varchar``, ``char(n)`` and ``name`` are
  selected as they are (their send form is their text output, padding included); any other type
  through its own output function, ``textin(<typoutput>(col))``, which is exactly what an I/O
  conversion does. ``col::text`` would not do: some types have casts to text that differ from
  their output (``boolean`` → ``true``, ``inet`` → with its netmask, ``char(n)`` → trimmed).

Spending the server's time on text output only where the capture needs text is most of what the
binary COPY saves (docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from airflow_provider_cdc.cdc.sources.postgres.copy_binary import CopyChunk
from airflow_provider_cdc.cdc.sources.postgres.types import BPCHAR, NAME, TEXT, VARCHAR

if TYPE_CHECKING:
    from airflow_provider_cdc.cdc.sources.postgres.events import TableEncoder
    from airflow_provider_cdc.cdc.sources.postgres.snapshot import BlockRange

#: Types whose binary send form is their text output (``textsend`` and friends).
SENT_AS_TEXT = frozenset({TEXT, VARCHAR, BPCHAR, NAME})

_OUTPUT_FUNCTIONS = """
SELECT t.oid::int8, n.nspname::text, p.proname::text
FROM pg_type t JOIN pg_proc p ON p.oid = t.typoutput JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE t.oid = ANY(%s::oid[])
"""


@dataclass(frozen=True)
class CopyPlan:
    """How each kept column of ``encoder`` is selected: ``binary[k]`` says whether column ``k``
    is read in its send form; ``output[k]`` is the (schema, name) of the output function that
    makes its text, or None when the column is selected as it is."""

    binary: tuple[bool, ...]
    output: tuple[tuple[str, str] | None, ...]

    @classmethod
    def of(cls, conn: Any, encoder: TableEncoder) -> CopyPlan:
        binary = tuple(codec.binary is not None for codec in encoder.codecs)
        # the declared type's output function (a domain's is its base type's)
        needs_output = [not b and c.type.resolved().oid not in SENT_AS_TEXT for c, b in zip(encoder.columns, binary)]
        functions = {}
        if any(needs_output):
            oids = sorted({c.type.oid for c, needed in zip(encoder.columns, needs_output) if needed})
            functions = {oid: (nsp, name) for oid, nsp, name in conn.execute(_OUTPUT_FUNCTIONS, (oids,)).fetchall()}
        output = tuple(functions[c.type.oid] if needed else None for c, needed in zip(encoder.columns, needs_output))
        return cls(binary, output)

    def statement(self, encoder: TableEncoder, block_range: BlockRange):  # -> sql.Composed
        from psycopg import sql

        selected = []
        for column, function in zip(encoder.columns, self.output):
            name = sql.Identifier(column.name)
            if function is not None:
                name = sql.SQL("pg_catalog.textin({}({}))").format(sql.Identifier(*function), name)
            selected.append(name)
        where = []
        if block_range.first > 0:
            where.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({block_range.first},0)")))
        if block_range.end is not None:
            where.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({block_range.end},0)")))
        condition = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(where) if where else sql.SQL("")
        return sql.SQL("COPY (SELECT {} FROM {}{}) TO STDOUT (FORMAT binary)").format(
            sql.SQL(", ").join(selected), encoder.table.ref.sql(), condition
        )

    def values(self, chunk: CopyChunk, encoder: TableEncoder) -> list[pa.Array]:
        """The typed values of every kept column of a chunk read with :meth:`statement`."""
        return [
            encoder.typed_binary(k, chunk.column(k)) if binary else encoder.typed_text(k, chunk.column(k).text())
            for k, binary in enumerate(self.binary)
        ]
