"""A stream chunk's row messages kept raw, then built into event record batches column-wise.

:class:`StreamEventBuffer` holds one table version's pgoutput row messages until the chunk is
flushed; :class:`MessageBuffer` the chunk's logical messages; :class:`ChunkTransactions` the
transactions their rows index. The event layout and the snapshot's events are in :mod:`.events`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc import __version__
from airflow_provider_cdc.cdc.basics.errors import DecodingError
from airflow_provider_cdc.cdc.events.envelope import (
    TRANSACTION_BLOCK,
    TRUNCATE_FLAGS,
    UNCHANGED_LIST,
    Op,
    message_schema,
)
from airflow_provider_cdc.cdc.events.settings import EventContext
from airflow_provider_cdc.cdc.sources.postgres import columnar
from airflow_provider_cdc.cdc.sources.postgres.decoder import TupleData
from airflow_provider_cdc.cdc.sources.postgres.events import (
    CONNECTOR,
    SOURCE_BLOCK,
    TableEncoder,
    source_array,
    transaction_array,
)
from airflow_provider_cdc.cdc.sources.postgres.lsn import Lsn
from airflow_provider_cdc.cdc.sources.postgres.types import (
    ValueModes,
    cast_text,
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
        source = source_array(self.context, "", "", "false", sources)
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
                transaction_array([r[3] for r in self._rows]),
                message,
                pa.array(prefixes, pa.string()),
                pa.repeat(pa.scalar(self.context.window_id), n),
            ],
            schema=self.schema,
        )
