"""PostgreSQL change events: Debezium's PostgreSQL ``source`` block and event assembly.

A :class:`TableEncoder` describes how one table version (a Relation message, or the catalog for
snapshots) becomes event columns: which columns are kept, each column's :class:`Codec`, masks.
Snapshot partitions build whole batches at once (:func:`snapshot_batch`); the stream buffers
rows per table version in a :class:`StreamEventBuffer`. Both convert text values through the
same encoder, which is what makes snapshot rows and stream rows identical.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc import __version__
from airflow_provider_cdc.cdc.columns import ColumnRules
from airflow_provider_cdc.cdc.envelope import (
    TRANSACTION_BLOCK,
    TRUNCATE_FLAGS,
    UNCHANGED_LIST,
    EventLayout,
    Op,
    message_schema,
)
from airflow_provider_cdc.cdc.errors import CdcConfigurationError, DecodingError
from airflow_provider_cdc.cdc.sources.postgres.decoder import UNCHANGED_TOAST, TupleData
from airflow_provider_cdc.cdc.sources.postgres.tables import Column, TableInfo
from airflow_provider_cdc.cdc.sources.postgres.types import Codec, ValueModes, cast_text, codec_for, text_codec

CONNECTOR = "postgresql"

SOURCE_BLOCK = pa.struct(
    [
        pa.field("version", pa.string()),
        pa.field("connector", pa.string()),
        pa.field("name", pa.string()),
        pa.field("ts_ms", pa.int64()),
        pa.field("snapshot", pa.string()),
        pa.field("db", pa.string()),
        pa.field("sequence", pa.string()),
        pa.field("schema", pa.string()),
        pa.field("table", pa.string()),
        pa.field("txId", pa.int64()),
        pa.field("lsn", pa.int64()),
        pa.field("xmin", pa.int64()),
        # Extension: LSN of the transaction's commit record. Events apply in
        # (commit_lsn, transaction.total_order) order; change LSNs interleave across transactions.
        pa.field("commit_lsn", pa.int64()),
    ]
)


@dataclass(frozen=True)
class EventSettings:
    """How values are represented and which columns and messages are captured."""

    modes: ValueModes = field(default_factory=ValueModes)
    columns: ColumnRules = field(default_factory=ColumnRules)
    message_prefix_include: tuple[str, ...] = ()
    message_prefix_exclude: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "modes": self.modes.to_dict(),
            "columns": self.columns.to_dict(),
            "message_prefix_include": list(self.message_prefix_include),
            "message_prefix_exclude": list(self.message_prefix_exclude),
        }

    @classmethod
    def from_dict(cls, data: dict) -> EventSettings:
        return cls(
            modes=ValueModes.from_dict(data.get("modes", {})),
            columns=ColumnRules.from_dict(data.get("columns", {})),
            message_prefix_include=tuple(data.get("message_prefix_include", ())),
            message_prefix_exclude=tuple(data.get("message_prefix_exclude", ())),
        )


@dataclass(frozen=True)
class EventContext:
    """Values shared by every event of one window."""

    topic_prefix: str
    database: str
    window_id: str
    ts_ms: int  # the window's planned time: fixed, so a re-run writes identical rows


def sequence(last_commit_lsn: int | None, lsn: int) -> str:
    """Debezium's ``source.sequence``: ``["<last committed LSN>","<LSN>"]`` as compact JSON."""
    return json.dumps([None if last_commit_lsn is None else str(last_commit_lsn), str(lsn)], separators=(",", ":"))


class TableEncoder:
    """Text tuples of one table version → typed event columns (selection, codecs, masks)."""

    def __init__(self, table: TableInfo, columns: Sequence[Column], settings: EventSettings):
        self.table = table
        self.relation_columns = tuple(columns)
        rules = settings.columns
        schema, name = table.ref.schema, table.ref.name
        keys = set(table.key_columns)
        self.positions = tuple(
            i for i, c in enumerate(columns) if rules.keeps(f"{schema}.{name}.{c.name}", is_key=c.name in keys)
        )
        self.columns = tuple(columns[i] for i in self.positions)
        if not self.columns:
            raise CdcConfigurationError(f"the column filters leave no column of {table.ref} to capture")
        self.codecs: tuple[Codec, ...] = tuple(
            text_codec(settings.modes)
            if rules.keeps_text(f"{schema}.{name}.{c.name}")
            else codec_for(c.type, settings.modes)
            for c in self.columns
        )
        self.masks = []
        for column, codec in zip(self.columns, self.codecs):
            mask = rules.mask_for(f"{schema}.{name}.{column.name}")
            if mask is not None and column.name in keys:
                raise CdcConfigurationError(
                    f"{table.ref}.{column.name} is a key column: key columns are never masked (merges need them)"
                )
            if mask is not None and not pa.types.is_string(codec.arrow_type):
                raise CdcConfigurationError(
                    f"masking rule {mask.pattern!r} matches {table.ref}.{column.name}, which is captured as "
                    f"{codec.description}; masks apply to character columns only"
                )
            self.masks.append(mask)
        names = [c.name for c in self.columns]
        self.key_columns = tuple(k for k in table.key_columns if k in names)
        self.key_indexes = tuple(names.index(k) for k in self.key_columns)
        relation_names = [c.name for c in columns]
        self.relation_key_indexes = tuple(relation_names.index(k) for k in self.key_columns)
        self.layout = EventLayout(
            value_fields=tuple(pa.field(c.name, codec.arrow_type) for c, codec in zip(self.columns, self.codecs)),
            key_columns=self.key_columns,
            source_type=SOURCE_BLOCK,
        )

    def typed(self, text_columns: Sequence[pa.Array]) -> list[pa.Array]:
        """Convert kept columns' text (one string array per kept column) to their types."""
        name = self.table.ref.data_collection
        out = []
        for text, column, codec, mask in zip(text_columns, self.columns, self.codecs, self.masks):
            typed = cast_text(text, codec, column=column.name, table=name)
            if mask is not None:
                typed = mask.apply(typed, _char_length(column))
            out.append(typed)
        return out


def _char_length(column: Column) -> int | None:
    # varchar(n)/char(n) typmod is n + 4; hashes are shortened to the column's length, like Debezium.
    resolved = column.type.resolved()
    return resolved.modifier - 4 if resolved.type_name in ("varchar", "bpchar") and resolved.modifier > 4 else None


def snapshot_batch(
    encoder: TableEncoder,
    text_columns: Sequence[pa.Array],
    *,
    context: EventContext,
    snapshot_lsn: int,
    snapshot_xmin: int | None,
    snapshot_ts_ms: int,
) -> pa.RecordBatch:
    """``op = r`` events for rows read by a snapshot partition (text of the kept columns).

    The snapshot's reading transactions are read-only and have no transaction id, so ``txId``
    is null; ``xmin`` carries the snapshot's xmin (transactions from there on are not in it).
    """
    layout = encoder.layout
    length = len(text_columns[0]) if text_columns else 0
    after = layout.value_struct(encoder.typed(text_columns), None)
    ref = encoder.table.ref
    source = {
        "version": __version__,
        "connector": CONNECTOR,
        "name": context.topic_prefix,
        "ts_ms": snapshot_ts_ms,
        "snapshot": "true",
        "db": context.database,
        "sequence": sequence(None, snapshot_lsn),
        "schema": ref.schema,
        "table": ref.name,
        "txId": None,
        "lsn": snapshot_lsn,
        "xmin": snapshot_xmin,
        "commit_lsn": snapshot_lsn,
    }
    return layout.assemble(
        before=pa.nulls(length, layout.value_type),
        after=after,
        source=pa.repeat(pa.scalar(source, SOURCE_BLOCK), length),
        op=pa.repeat(pa.scalar(Op.READ), length),
        ts_ms=context.ts_ms,
        transaction=None,
        window_id=context.window_id,
    )


def _source_array(context: EventContext, schema: str, table: str, snapshot: str, rows: list[tuple]) -> pa.StructArray:
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


def _transaction_array(rows: list[tuple | None]) -> pa.Array:
    if all(r is None for r in rows):
        return pa.nulls(len(rows), TRANSACTION_BLOCK)
    return pa.array(
        [None if r is None else {"id": r[0], "total_order": r[1], "data_collection_order": r[2]} for r in rows],
        TRANSACTION_BLOCK,
    )


class StreamEventBuffer:
    """Rows of one table version waiting to become a record batch."""

    def __init__(self, encoder: TableEncoder, context: EventContext):
        self.encoder = encoder
        self.context = context
        self._width = len(encoder.relation_columns)
        self._null_tuple: TupleData = (None,) * self._width
        self._ops: list[str] = []
        self._before: list[TupleData | None] = []
        self._after: list[TupleData | None] = []
        self._source: list[tuple] = []
        self._transaction: list[tuple | None] = []
        self._key_change: list[tuple[TupleData | None, TupleData | None]] = []
        self._truncate: list[tuple[bool, bool] | None] = []
        self._any_key_change = False
        self._any_truncate = False

    def __len__(self) -> int:
        return len(self._ops)

    def add(
        self,
        op: str,
        before: TupleData | None,
        after: TupleData | None,
        *,
        source: tuple,
        transaction: tuple,
        old_key: TupleData | None = None,
        new_key: TupleData | None = None,
        truncate: tuple[bool, bool] | None = None,
    ) -> None:
        """``source`` is ``(commit_ts_ms, previous_commit_lsn, xid, lsn, commit_lsn)``."""
        self._ops.append(op)
        self._before.append(before)
        self._after.append(after)
        self._source.append(source)
        self._transaction.append(transaction)
        self._key_change.append((old_key, new_key))
        self._truncate.append(truncate)
        if old_key is not None or new_key is not None:
            self._any_key_change = True
        if truncate is not None:
            self._any_truncate = True

    def to_batch(self) -> pa.RecordBatch:
        encoder = self.encoder
        layout = encoder.layout
        before, _ = self._value_column(self._before)
        after, unchanged = self._value_column(self._after)
        ref = encoder.table.ref
        old_key = new_key = None
        if self._any_key_change and layout.key_columns:
            old_key = self._key_column([old for old, _ in self._key_change])
            new_key = self._key_column([new for _, new in self._key_change])
        truncate = (
            pa.array(
                [None if t is None else {"cascade": t[0], "restart_identity": t[1]} for t in self._truncate],
                TRUNCATE_FLAGS,
            )
            if self._any_truncate
            else None
        )
        return layout.assemble(
            before=before,
            after=after,
            source=_source_array(self.context, ref.schema, ref.name, "false", self._source),
            op=pa.array(self._ops, pa.string()),
            ts_ms=self.context.ts_ms,
            transaction=_transaction_array(self._transaction),
            window_id=self.context.window_id,
            old_key=old_key,
            new_key=new_key,
            unchanged=unchanged,
            truncate=truncate,
        )

    def _value_column(self, rows: list[TupleData | None]) -> tuple[pa.Array, pa.Array | None]:
        """The struct column of kept values, and the list of unchanged-TOAST columns per row."""
        encoder = self.encoder
        present = [r is not None for r in rows]
        if not any(present):
            return pa.nulls(len(rows), encoder.layout.value_type), None
        null_tuple, width = self._null_tuple, self._width
        filled = [r if r is not None else null_tuple for r in rows]
        toast_rows: dict[int, list[int]] = {}
        for i, row in enumerate(filled):
            if len(row) != width:
                raise DecodingError(f"{encoder.table.ref}: a row has {len(row)} values, the relation has {width}")
            if UNCHANGED_TOAST in row:
                toast_rows[i] = [j for j, v in enumerate(row) if v is UNCHANGED_TOAST]
                filled[i] = tuple(None if v is UNCHANGED_TOAST else v for v in row)
        transposed = list(zip(*filled))
        text_columns = [pa.array(transposed[p], pa.binary()).cast(pa.string()) for p in encoder.positions]
        children = encoder.typed(text_columns)
        unchanged = None
        if toast_rows:
            kept = {p: k for k, p in enumerate(encoder.positions)}
            names: list[list[str] | None] = [None] * len(rows)
            rows_by_column: dict[int, list[int]] = {}
            for i, positions in toast_rows.items():
                kept_here = [kept[p] for p in positions if p in kept]
                names[i] = [encoder.columns[k].name for k in kept_here] or None
                for k in kept_here:
                    rows_by_column.setdefault(k, []).append(i)
            for k, row_ids in rows_by_column.items():
                placeholder = encoder.codecs[k].placeholder
                if placeholder is not None:  # text and binary columns carry Debezium's placeholder
                    flags = [False] * len(rows)
                    for i in row_ids:
                        flags[i] = True
                    children[k] = pc.if_else(pa.array(flags), pa.scalar(placeholder, children[k].type), children[k])
            unchanged = pa.array(names, UNCHANGED_LIST)
        return encoder.layout.value_struct(children, present), unchanged

    def _key_column(self, keys: list[TupleData | None]) -> pa.Array:
        encoder = self.encoder
        present = [k is not None for k in keys]
        if not any(present):
            return pa.nulls(len(keys), encoder.layout.key_type)
        null_key = (None,) * len(encoder.key_columns)
        transposed = list(zip(*[k if k is not None else null_key for k in keys]))
        children = []
        for column_index, key_index in enumerate(encoder.key_indexes):
            column, codec = encoder.columns[key_index], encoder.codecs[key_index]
            text = pa.array(transposed[column_index], pa.binary()).cast(pa.string())
            children.append(cast_text(text, codec, column=column.name, table=encoder.table.ref.data_collection))
        return encoder.layout.key_struct(children, present)


class MessageBuffer:
    """Logical decoding messages (``op = m``) of one window, for ``<prefix>.message``."""

    def __init__(self, context: EventContext, modes: ValueModes):
        self.context = context
        self.binary_mode = modes.binary
        content_type = pa.binary() if modes.binary == "bytes" else pa.string()
        self.schema = message_schema(SOURCE_BLOCK, content_type)
        self._rows: list[tuple] = []

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, prefix: str, content: bytes, *, source: tuple, transaction: tuple | None) -> None:
        self._rows.append((prefix, content, source, transaction))

    def to_batch(self) -> pa.RecordBatch:
        import base64

        prefixes = [r[0] for r in self._rows]
        if self.binary_mode == "base64":
            contents: list = [base64.b64encode(r[1]).decode() for r in self._rows]
        elif self.binary_mode == "hex":
            contents = [r[1].hex() for r in self._rows]
        else:
            contents = [r[1] for r in self._rows]
        sources = [r[2] for r in self._rows]
        source = _source_array(self.context, "", "", "false", sources)
        txids = [s[2] for s in sources]
        if any(t is None for t in txids):  # non-transactional messages have no transaction id
            source = pa.StructArray.from_arrays(
                [
                    source.field(i) if f.name != "txId" else pa.array(txids, pa.int64())
                    for i, f in enumerate(SOURCE_BLOCK)
                ],
                fields=list(SOURCE_BLOCK),
            )
        message = pa.StructArray.from_arrays(
            [
                pa.array(prefixes, pa.string()),
                pa.array(contents, self.schema.field("message").type.field("content").type),
            ],
            names=["prefix", "content"],
        )
        n = len(self._rows)
        return pa.RecordBatch.from_arrays(
            [
                source,
                pa.repeat(pa.scalar(Op.MESSAGE), n),
                pa.repeat(pa.scalar(self.context.ts_ms, pa.int64()), n),
                _transaction_array([r[3] for r in self._rows]),
                message,
                pa.array(prefixes, pa.string()),
                pa.repeat(pa.scalar(self.context.window_id), n),
            ],
            schema=self.schema,
        )
