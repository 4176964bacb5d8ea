"""PostgreSQL change events: Debezium's PostgreSQL ``source`` block and event assembly.

A :class:`TableEncoder` describes how one table version (a Relation message, or the catalog for
snapshots) becomes event columns: which columns are kept, each column's :class:`Codec`, masks.
Snapshot partitions build whole batches at once (:class:`SnapshotBatches`); the stream buffers
rows per table version in a :class:`StreamEventBuffer`. Both convert values through the same
encoder and its codecs (text forms, and for the snapshot's binary columns the send forms to the
same values), which is what makes snapshot rows and stream rows identical.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc import __version__
from airflow_provider_cdc.cdc.basics.errors import DecodingError
from airflow_provider_cdc.cdc.events.column_plan import ColumnPlan
from airflow_provider_cdc.cdc.events.envelope import (
    SOURCE_COMMON_FIELDS,
    TRANSACTION_BLOCK,
    TRUNCATE_FLAGS,
    UNCHANGED_LIST,
    EventLayout,
    Op,
    message_schema,
)
from airflow_provider_cdc.cdc.events.settings import EventContext, EventSettings, read_event_ts_ms
from airflow_provider_cdc.cdc.sources.postgres import columnar
from airflow_provider_cdc.cdc.sources.postgres.binary_values import BinaryColumn
from airflow_provider_cdc.cdc.sources.postgres.decoder import TupleData
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.tables import Column, TableInfo
from airflow_provider_cdc.cdc.sources.postgres.types import (
    Codec,
    PgType,
    ValueModes,
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


@dataclass(frozen=True)
class ChunkTransactions:
    """The transactions of one chunk, indexed by the ``tx`` of each buffered row.

    Each entry is ``(commit_ts_ms, previous_commit_lsn, xid, commit_lsn, transaction_id)``;
    the per-row source and transaction columns are gathered from these arrays."""

    ts_ms: pa.Array
    xid: pa.Array
    commit_lsn: pa.Array
    transaction_id: pa.Array
    sequence_prefix: pa.Array  # '["<previous commit>","' or '[null,"'

    @classmethod
    def of(cls, entries: Sequence[tuple]) -> ChunkTransactions:
        ts, previous, xids, commits, ids = (list(c) for c in zip(*entries)) if entries else ([],) * 5
        return cls(
            ts_ms=pa.array(ts, pa.int64()),
            xid=pa.array(xids, pa.int64()),
            commit_lsn=pa.array(commits, pa.int64()),
            transaction_id=pa.array(ids, pa.string()),
            sequence_prefix=pa.array(['[null,"' if p is None else f'["{int(p)}","' for p in previous], pa.string()),
        )


_OP_CODES = np.zeros(256, np.int8)
_OP_CODES[[columnar.INSERT, columnar.UPDATE, columnar.DELETE, columnar.TRUNCATE]] = [0, 1, 2, 3]


@functools.cache
def _op_names() -> pa.Array:
    # Built on first use: an Arrow array from Python values makes pyarrow import pandas (~1 s of
    # CPU, apache/arrow#34994), which tasks that import this module but build no events (setup)
    # should not pay.
    return pa.array([Op.CREATE, Op.UPDATE, Op.DELETE, Op.TRUNCATE], pa.string())


class StreamEventBuffer:
    """Row messages of one table version, kept raw until the chunk becomes a record batch.

    Rows are pgoutput Insert/Update/Delete messages (or :data:`columnar.TRUNCATE_ROW`), decoded
    all at once by :func:`columnar.decode_rows` when the chunk is flushed. ``tx`` indexes the
    chunk's :class:`ChunkTransactions`; ``total``/``order`` are the event's
    ``transaction.total_order`` and ``data_collection_order``. Key changes and truncates, which
    are rare, carry their extra fields in sparse maps. Rows come one by one (:meth:`add`) or as
    Arrow arrays of many (:meth:`add_many`, the columnar window collector's path), in any mix.
    """

    def __init__(self, encoder: TableEncoder, context: EventContext):
        self.encoder = encoder
        self.context = context
        self.counted = True  # False: rows of a table read for the capture itself (signals)
        self.width = len(encoder.relation_columns)
        self.payloads: list[bytes] = []
        self.lsns: list[int] = []
        self.txs: list[int] = []
        self.totals: list[int] = []
        self.orders: list[int] = []
        # rows added as arrays, and rows of ``add`` sealed before them: (payloads, lsns, txs, totals, orders)
        self._parts: list[tuple[pa.Array, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._sealed = 0  # rows in ``_parts``
        self._key_changes: dict[int, tuple[TupleData | None, TupleData | None]] = {}
        self._truncates: dict[int, tuple[bool, bool]] = {}

    def __len__(self) -> int:
        return self._sealed + len(self.payloads)

    def add(
        self,
        payload: bytes,
        lsn: int,
        tx: int,
        total: int,
        order: int,
        *,
        old_key: TupleData | None = None,
        new_key: TupleData | None = None,
        truncate: tuple[bool, bool] | None = None,
    ) -> None:
        if old_key is not None or new_key is not None:
            self._key_changes[len(self)] = (old_key, new_key)
        if truncate is not None:
            self._truncates[len(self)] = truncate
        self.payloads.append(payload)
        self.lsns.append(lsn)
        self.txs.append(tx)
        self.totals.append(total)
        self.orders.append(order)

    def add_many(
        self, payloads: pa.Array, lsns: np.ndarray, txs: np.ndarray, totals: np.ndarray, orders: np.ndarray
    ) -> None:
        """Many plain row messages at once (``payloads``: a binary array without nulls), after
        the rows added so far; the other arguments are as :meth:`add`'s, one element per row."""
        if payloads.type == pa.large_binary():  # the parts are concatenated as one binary array
            payloads = payloads.cast(pa.binary())
        self._seal()
        self._parts.append(
            (payloads, lsns.astype(np.int64), txs.astype(np.int32), totals.astype(np.int64), orders.astype(np.int64))
        )
        self._sealed += len(payloads)

    def _seal(self) -> None:
        """Move the rows of :meth:`add` into ``_parts``, so rows added as arrays follow them."""
        if self.payloads:
            self._parts.append(
                (
                    pa.array(self.payloads, pa.binary()),
                    np.array(self.lsns, np.int64),
                    np.array(self.txs, np.int32),
                    np.array(self.totals, np.int64),
                    np.array(self.orders, np.int64),
                )
            )
            self._sealed += len(self.payloads)
            self.payloads, self.lsns, self.txs, self.totals, self.orders = [], [], [], [], []

    def _decoded(self) -> tuple[columnar.RowMessages, pa.Array, pa.Array, pa.Array, pa.Array]:
        """The rows' layout, and their tx / LSN / total / order columns."""
        if not self._parts:  # rows of ``add`` only (the streaming collector)
            return (
                columnar.decode_rows(self.payloads, self.width),
                pa.array(self.txs, pa.int32()),
                pa.array(self.lsns, pa.int64()),
                pa.array(self.totals, pa.int64()),
                pa.array(self.orders, pa.int64()),
            )
        self._seal()
        payloads, lsns, txs, totals, orders = (list(c) for c in zip(*self._parts))
        self.lsns = np.concatenate(lsns)  # (for errors) the buffer is used up: its parts go now
        self._parts = []
        return (
            _joined(payloads, self.width),
            pa.array(np.concatenate(txs), pa.int32()),
            pa.array(self.lsns, pa.int64()),
            pa.array(np.concatenate(totals), pa.int64()),
            pa.array(np.concatenate(orders), pa.int64()),
        )

    def to_batch(self, transactions: ChunkTransactions) -> pa.RecordBatch:
        encoder = self.encoder
        layout = encoder.layout
        ref = encoder.table.ref
        try:
            rows, tx, lsns, totals, orders = self._decoded()
        except columnar.MalformedRow as exc:
            raise DecodingError(f"{ref}: the change at LSN {Lsn(int(self.lsns[exc.row]))}: {exc}") from None
        n = len(rows)
        before, _ = self._image(rows, rows.old, toast=False)
        after, unchanged = self._image(rows, rows.new, toast=True)
        sequences = pc.binary_join_element_wise(
            transactions.sequence_prefix.take(tx), pc.cast(lsns, pa.string()), '"]', ""
        )
        source = pa.StructArray.from_arrays(
            [
                pa.repeat(pa.scalar(__version__), n),
                pa.repeat(pa.scalar(CONNECTOR), n),
                pa.repeat(pa.scalar(self.context.topic_prefix), n),
                transactions.ts_ms.take(tx),
                pa.repeat(pa.scalar("false"), n),
                pa.repeat(pa.scalar(self.context.database), n),
                sequences,
                pa.repeat(pa.scalar(ref.schema), n),
                pa.repeat(pa.scalar(ref.name), n),
                transactions.xid.take(tx),
                lsns,
                pa.nulls(n, pa.int64()),
                transactions.commit_lsn.take(tx),
            ],
            fields=list(SOURCE_BLOCK),
        )
        transaction = pa.StructArray.from_arrays(
            [
                transactions.transaction_id.take(tx),
                totals,
                orders,
            ],
            fields=list(TRANSACTION_BLOCK),
        )
        old_key = new_key = None
        if self._key_changes and layout.key_columns:
            changes = self._key_changes
            old_key = self._key_column([changes[i][0] if i in changes else None for i in range(n)])
            new_key = self._key_column([changes[i][1] if i in changes else None for i in range(n)])
        truncate = None
        if self._truncates:
            flags = self._truncates
            truncate = pa.array(
                [{"cascade": flags[i][0], "restart_identity": flags[i][1]} if i in flags else None for i in range(n)],
                TRUNCATE_FLAGS,
            )
        return layout.assemble(
            before=before,
            after=after,
            source=source,
            op=_op_names().take(pa.array(_OP_CODES[rows.kinds])),
            ts_ms=self.context.ts_ms,
            transaction=transaction,
            window_id=self.context.window_id,
            old_key=old_key,
            new_key=new_key,
            unchanged=unchanged,
            truncate=truncate,
        )

    def _image(
        self, rows: columnar.RowMessages, image: columnar.TupleImage, *, toast: bool
    ) -> tuple[pa.Array, pa.Array | None]:
        """The struct column of kept values of one tuple image, and (``toast``) the list of
        unchanged-TOAST columns per row."""
        encoder = self.encoder
        n = len(rows)
        if not image.present.any():
            return pa.nulls(n, encoder.layout.value_type), None
        texts = image.kinds == columnar.TEXT
        fields = encoder.layout.value_fields
        # A column without a value in this image (a key-only old tuple's other columns) is all
        # null: no gather, no conversion.
        children = [
            encoder.typed_text(k, rows.text(image, p)) if texts[p].any() else pa.nulls(n, fields[k].type)
            for k, p in enumerate(encoder.positions)
        ]
        unchanged = None
        kept_toast = image.kinds[list(encoder.positions)] == columnar.UNCHANGED
        if toast and kept_toast.any():
            for k in np.flatnonzero(kept_toast.any(axis=1)):
                placeholder = encoder.codecs[k].placeholder
                if placeholder is not None:  # text and binary columns carry Debezium's placeholder
                    children[k] = pc.if_else(
                        pa.array(kept_toast[k]), pa.scalar(placeholder, children[k].type), children[k]
                    )
            names: list[list[str] | None] = [None] * n
            for i in np.flatnonzero(kept_toast.any(axis=0)):
                names[i] = [encoder.columns[k].name for k in np.flatnonzero(kept_toast[:, i])]
            unchanged = pa.array(names, UNCHANGED_LIST)
        mask = None if image.present.all() else pa.array(~image.present)
        value = pa.StructArray.from_arrays(children, fields=list(encoder.layout.value_fields), mask=mask)
        return value, unchanged

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
            text = encoder.repaired(key_index, pa.array(transposed[column_index], pa.binary()).cast(pa.string()))
            children.append(cast_text(text, codec, column=column.name, table=encoder.table.ref.data_collection))
        return encoder.layout.key_struct(children, present)


def _joined(parts: list[pa.Array], width: int) -> columnar.RowMessages:
    """The row messages of ``parts`` (binary arrays, in order; the list is emptied), decoded as
    one chunk. Each part is copied into the chunk's buffer and released at once, so the messages
    are held about once, not twice (``concat_arrays`` holds every part until it returns); the
    buffer ends with the decoder's padding, so it is not copied again."""
    sizes = np.concatenate([np.diff(columnar.binary_buffers(part)[0]) for part in parts])
    total = int(sizes.sum())
    buffer = np.empty(total + len(columnar.PADDING), np.uint8)
    buffer[total:] = 0
    at = 0
    parts.reverse()
    while parts:
        offsets, values = columnar.binary_buffers(parts.pop())
        end = at + int(offsets[-1] - offsets[0])
        buffer[at:end] = values[offsets[0] : offsets[-1]]
        at = end
    return columnar.decode_buffer(buffer, sizes, width)


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
