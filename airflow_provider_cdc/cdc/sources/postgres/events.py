"""PostgreSQL change events: Debezium's PostgreSQL ``source`` block and event assembly.

A :class:`TableEncoder` describes how one table version (a Relation message, or the catalog for
snapshots) becomes event columns: which columns are kept, each column's :class:`Codec`, masks.
Snapshot partitions build whole batches at once (:class:`SnapshotBatches`); the stream buffers
rows per table version in a :class:`~.stream_events.StreamEventBuffer`. Both convert values through the same
encoder and its codecs (text forms, and for the snapshot's binary columns the send forms to the
same values), which is what makes snapshot rows and stream rows identical.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc import __version__
from airflow_provider_cdc.cdc.events.column_plan import ColumnPlan
from airflow_provider_cdc.cdc.events.envelope import (
    SOURCE_COMMON_FIELDS,
    TRANSACTION_BLOCK,
    TRUNCATE_FLAGS,
    UNCHANGED_LIST,
    EventLayout,
    Op,
)
from airflow_provider_cdc.cdc.events.settings import EventContext, EventSettings, read_event_ts_ms
from airflow_provider_cdc.cdc.sources.postgres.binary_values import BinaryColumn
from airflow_provider_cdc.cdc.sources.postgres.tables import Column, TableInfo
from airflow_provider_cdc.cdc.sources.postgres.types import (
    Codec,
    PgType,
    cast_binary,
    cast_text,
    codec_for,
    text_codec,
)

CONNECTOR = "postgresql"

SOURCE_BLOCK = pa.struct(
    [
        *SOURCE_COMMON_FIELDS,
        pa.field("txId", pa.int64()),
        pa.field("lsn", pa.int64()),
        pa.field("xmin", pa.int64()),
        # Extension: LSN of the transaction's commit record. Events apply in
        # (commit_lsn, transaction.total_order) order; change LSNs interleave across transactions.
        pa.field("commit_lsn", pa.int64()),
    ]
)


def sequence(last_commit_lsn: int | None, lsn: int) -> str:
    """Debezium's ``source.sequence``: ``["<last committed LSN>","<LSN>"]`` as compact JSON."""
    # int(): callers may pass an Lsn, whose str() is PostgreSQL's X/Y text; Debezium's are decimal.
    return json.dumps(
        [None if last_commit_lsn is None else str(int(last_commit_lsn)), str(int(lsn))], separators=(",", ":")
    )


class TableEncoder:
    """Text tuples of one table version → typed event columns (selection, codecs, masks)."""

    def __init__(
        self, table: TableInfo, columns: Sequence[Column], settings: EventSettings, *, docdb_text: bool = False
    ):
        self.table = table
        self.relation_columns = tuple(columns)
        plan = ColumnPlan.build(
            table.ref,
            columns,
            table.key_columns,
            settings.columns,
            name=lambda c: c.name,
            codec=lambda c, as_text: text_codec(settings.modes) if as_text else codec_for(c.type, settings.modes),
            source_type=SOURCE_BLOCK,
        )
        self.positions = plan.positions
        self.columns = plan.columns
        self.codecs: tuple[Codec, ...] = plan.codecs
        self.masks = list(plan.masks)
        self.key_columns = plan.key_columns
        self.key_indexes = plan.key_indexes
        relation_names = [c.name for c in columns]
        self.relation_key_indexes = tuple(relation_names.index(k) for k in self.key_columns)
        self.layout = plan.layout
        # YugabyteDB's stream prints char(n)/numeric(p,s) without their typmod (see _docdb_repair).
        self.repairs = tuple(_docdb_repair(c) if docdb_text else None for c in self.columns)

    def typed(self, text_columns: Sequence[pa.Array]) -> list[pa.Array]:
        """Convert kept columns' text (one string array per kept column) to their types."""
        return [self.typed_text(k, text) for k, text in enumerate(text_columns)]

    def typed_text(self, k: int, text: pa.Array) -> pa.Array:
        """Kept column ``k`` from its text form (a string array)."""
        column = self.columns[k]
        text = self.repaired(k, text)
        typed = cast_text(text, self.codecs[k], column=column.name, table=self.table.ref.data_collection)
        return self._masked(k, typed)

    def repaired(self, k: int, text: pa.Array) -> pa.Array:
        """Kept column ``k``'s text as a YSQL scan prints it (a no-op off YugabyteDB's stream)."""
        repair = self.repairs[k]
        return text if repair is None else repair(text)

    def typed_binary(self, k: int, values: BinaryColumn) -> pa.Array:
        """Kept column ``k`` from its binary send form (``codecs[k].binary`` must exist)."""
        column = self.columns[k]
        typed = cast_binary(values, self.codecs[k], column=column.name, table=self.table.ref.data_collection)
        return self._masked(k, typed)

    def _masked(self, k: int, typed: pa.Array) -> pa.Array:
        mask = self.masks[k]
        return typed if mask is None else mask.apply(typed, _char_length(self.columns[k]))


def _docdb_repair(column: Column) -> Callable[[pa.Array], pa.Array] | None:
    """How to turn YugabyteDB's streamed text of ``column`` into what its snapshot prints.

    YB's walsender rebuilds each datum with typmod -1 (``ybc_pggate.cc``,
    ``YBCPgGetCDCConsistentChanges``: ``YBCPgTypeAttrs type_attrs{-1 /* typmod */}``). DocDB keeps
    ``char(n)`` right-trimmed (``YbDatumToBPChar``) and ``numeric`` normalized (``numeric_normalize``),
    so ``bpcharin``/``numeric_in`` without the typmod restore neither padding nor scale; a YSQL
    scan passes the column's typmod and does. Arrays are stored whole and keep both."""
    resolved = column.type.resolved()
    if resolved.type_name == "bpchar" and resolved.modifier > 4:
        width = resolved.modifier - 4
        return lambda text: pc.utf8_rpad(text, width=width, padding=" ")
    scale = resolved.numeric_precision_scale() if resolved.type_name == "numeric" else None
    if scale is not None and scale[1] > 0:
        return lambda text: _numeric_at_scale(text, resolved)
    return None


def _numeric_at_scale(text: pa.Array, pg_type: PgType) -> pa.Array:
    from airflow_provider_cdc.cdc.sources.postgres.types import numeric_at_scale

    return pa.array([None if v is None else numeric_at_scale(v, pg_type) for v in text.to_pylist()], text.type)


def _char_length(column: Column) -> int | None:
    # varchar(n)/char(n) typmod is n + 4; hashes are shortened to the column's length, like Debezium.
    resolved = column.type.resolved()
    return resolved.modifier - 4 if resolved.type_name in ("varchar", "bpchar") and resolved.modifier > 4 else None


class SnapshotBatches:
    """``op = r`` event batches of the rows one snapshot partition reads (typed values of the
    kept columns), all at the snapshot's position.

    The snapshot's reading transactions are read-only and have no transaction id, so ``txId``
    is null; ``xmin`` carries the snapshot's xmin (transactions from there on are not in it).
    The columns that are the same in every row (``source``, ``op``, the null ``before`` and
    extension columns) are built once and sliced for each batch: building them per batch was
    most of the envelope's cost (57 → 11 ns per row, docs/benchmarks.md)."""

    def __init__(
        self,
        encoder: TableEncoder,
        *,
        context: EventContext,
        snapshot_lsn: int,
        snapshot_xmin: int | None,
        snapshot_ts_ms: int,
    ):
        ref = encoder.table.ref
        self.layout = encoder.layout
        self.context = context
        self.source = read_source(context, ref.schema, ref.name, "true", snapshot_ts_ms, snapshot_lsn, snapshot_xmin)
        self._capacity = 0
        self._repeated: dict[str, pa.Array] = {}

    def batch(self, values: Sequence[pa.Array]) -> pa.RecordBatch:
        after = self.layout.value_struct(values, None)
        n = len(after)
        if n > self._capacity:
            self._capacity = n
            layout = self.layout
            self._repeated = {
                "before": pa.nulls(n, layout.value_type),
                "source": pa.repeat(pa.scalar(self.source, SOURCE_BLOCK), n),
                "op": pa.repeat(pa.scalar(Op.READ), n),
                "transaction": pa.nulls(n, TRANSACTION_BLOCK),
                "unchanged": pa.nulls(n, UNCHANGED_LIST),
                "truncate": pa.nulls(n, TRUNCATE_FLAGS),
                **(
                    {"old_key": pa.nulls(n, layout.key_type), "new_key": pa.nulls(n, layout.key_type)}
                    if layout.key_columns
                    else {}
                ),
            }
        return self.layout.assemble(
            after=after,
            ts_ms=read_event_ts_ms(self.context, self.source),
            window_id=self.context.window_id,
            **{name: array.slice(0, n) for name, array in self._repeated.items()},
        )


def read_source(
    context: EventContext, schema: str, table: str, snapshot: str, ts_ms: int, lsn: int | None, xmin: int | None
) -> dict:
    """The ``source`` block of rows read by a query (snapshots, incremental chunks, query
    extraction): no transaction, positioned at ``lsn`` (None: no position in the WAL)."""
    return {
        "version": __version__,
        "connector": CONNECTOR,
        "name": context.topic_prefix,
        "ts_ms": ts_ms,
        "snapshot": snapshot,
        "db": context.database,
        "sequence": None if lsn is None else sequence(None, lsn),
        "schema": schema,
        "table": table,
        "txId": None,
        "lsn": lsn,
        "xmin": xmin,
        "commit_lsn": lsn,
    }


def read_events(
    layout: EventLayout, after: pa.Array, source: dict, context: EventContext, op: pa.Array | None = None
) -> pa.RecordBatch:
    """Events of rows read by a query: no before image, one ``source``, ``op = r`` unless given."""
    return layout.query_events(
        after, source, ts_ms=read_event_ts_ms(context, source), window_id=context.window_id, op=op
    )


def source_array(context: EventContext, schema: str, table: str, snapshot: str, rows: list[tuple]) -> pa.StructArray:
    """``source`` for stream rows of ``(commit_ts_ms, previous_commit_lsn, xid, lsn, commit_lsn)``."""
    n = len(rows)
    ts, prev_commit, xids, lsns, commit_lsns = (list(c) for c in zip(*rows))
    return pa.StructArray.from_arrays(
        [
            pa.repeat(pa.scalar(__version__), n),
            pa.repeat(pa.scalar(CONNECTOR), n),
            pa.repeat(pa.scalar(context.topic_prefix), n),
            pa.array(ts, pa.int64()),
            pa.repeat(pa.scalar(snapshot), n),
            pa.repeat(pa.scalar(context.database), n),
            pa.array([sequence(p, lsn) for p, lsn in zip(prev_commit, lsns)], pa.string()),
            pa.repeat(pa.scalar(schema), n),
            pa.repeat(pa.scalar(table), n),
            pa.array(xids, pa.int64()),
            pa.array(lsns, pa.int64()),
            pa.nulls(n, pa.int64()),
            pa.array(commit_lsns, pa.int64()),
        ],
        fields=list(SOURCE_BLOCK),
    )


def transaction_array(rows: list[tuple | None]) -> pa.Array:
    if all(r is None for r in rows):
        return pa.nulls(len(rows), TRANSACTION_BLOCK)
    return pa.array(
        [None if r is None else {"id": r[0], "total_order": r[1], "data_collection_order": r[2]} for r in rows],
        TRANSACTION_BLOCK,
    )
