"""Reading one stream window from the slot: frames → decoded messages → event batches.

The :class:`WindowCollector` is fed replication frames in order and decides when the window is
complete (see :mod:`..window` for the bounds). Memory is bounded by ``max_changes_per_chunk``:
whenever that many changes are buffered they are handed to ``flush`` as Arrow batches, even in
the middle of a transaction; transaction boundary rows are emitted at each commit. Nothing is
acknowledged here.
"""

from __future__ import annotations

import logging
import re
import struct
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pyarrow as pa

from airflow_provider_cdc.cdc.basics.errors import CdcStateError, DecodingError
from airflow_provider_cdc.cdc.basics.naming import message_topic, table_topic
from airflow_provider_cdc.cdc.basics.progress import StreamStats as ProgressStats
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.events.envelope import MESSAGE_DATA_COLLECTION, transaction_batch, transaction_rows
from airflow_provider_cdc.cdc.sources.postgres.columnar import TRUNCATE_ROW
from airflow_provider_cdc.cdc.sources.postgres.decoder import (
    UNCHANGED_TOAST,
    Begin,
    Commit,
    LogicalMessage,
    Message,
    Origin,
    Relation,
    Truncate,
    TypeInfo,
    Update,
    decode_message,
    encode_delete,
    encode_insert,
    encode_update,
)
from airflow_provider_cdc.cdc.sources.postgres.events import EventContext, EventSettings, TableEncoder
from airflow_provider_cdc.cdc.sources.postgres.replication import Keepalive, XLogData
from airflow_provider_cdc.cdc.sources.postgres.stream_events import ChunkTransactions, MessageBuffer, StreamEventBuffer
from airflow_provider_cdc.cdc.sources.postgres.tables import Column, TableInfo, TableRef
from airflow_provider_cdc.cdc.sources.postgres.types import TypeCache

log = logging.getLogger(__name__)

#: Prefix of the non-transactional logical message each window emits after its target, so the
#: walsender provably passes the target even when the captured tables are idle.
MARKER_PREFIX = "airflow_provider_cdc.window_end"
#: Messages the capture writes for itself (window ends, incremental snapshot watermarks).
INTERNAL_PREFIX = "airflow_provider_cdc."

#: ``flush(event_batches_by_topic, transaction_batch_or_None)``
FlushFn = Callable[[dict[str, list[pa.RecordBatch]], pa.RecordBatch | None], None]


#: A chunk is also flushed once its raw messages reach this many bytes, so wide rows (large
#: text or jsonb) cannot grow a chunk of ``max_changes_per_chunk`` rows without bound.
MAX_CHUNK_BYTES = 128 * 1024 * 1024

_ROW_KINDS = frozenset(b"IUD")
_UINT32 = struct.Struct("!I")


@dataclass
class _Transaction:
    xid: int
    final_lsn: int
    commit_ts_us: int
    id: str
    previous_commit_lsn: int | None
    chunk_index: int = 0  # index in the chunk's transaction table
    total: int = 0
    per_collection: Counter = field(default_factory=Counter)

    def entry(self) -> tuple:
        return (self.commit_ts_us // 1000, self.previous_commit_lsn, self.xid, self.final_lsn, self.id)


@dataclass
class StreamStats(ProgressStats):
    messages: int = 0
    messages_skipped: int = 0


class WindowCollector:
    #: The text values are YugabyteDB's walsender's (typmod -1): see ``events._docdb_repair``.
    docdb_text: bool = False

    def __init__(
        self,
        *,
        window: Window,
        tables: dict[TableRef, TableInfo],
        context: EventContext,
        topic_prefix: str,
        previous_commit_lsn: int | None,
        max_changes_per_chunk: int,
        flush: FlushFn,
        settings: EventSettings | None = None,
        types: TypeCache | None = None,
        uncounted: frozenset[TableRef] = frozenset(),
    ):
        """``uncounted``: tables read for the capture's own use (the signal table), whose rows
        are neither changes nor part of the transaction metadata."""
        self.window = window
        self._uncounted = uncounted
        self.settings = settings or EventSettings()
        self.types = types or TypeCache(
            known={(c.type.oid, c.type.modifier): c.type for t in tables.values() for c in t.columns}
        )
        self._include = [re.compile(p) for p in self.settings.message_prefix_include]
        self._exclude = [re.compile(p) for p in self.settings.message_prefix_exclude]
        self.tables = tables
        self.context = context
        self.topic_prefix = topic_prefix
        # A plain int like every later commit LSN (the spec's is an Lsn, whose text is X/Y).
        self.previous_commit_lsn = None if previous_commit_lsn is None else int(previous_commit_lsn)
        self.max_changes = max_changes_per_chunk
        self._flush = flush
        self.stats = StreamStats()
        self.done = False
        self._relations: dict[int, tuple[TableEncoder, int] | None] = {}
        self._relation_versions: Counter = Counter()
        self._buffers: dict[tuple[int, int], StreamEventBuffer] = {}
        # relation oid → its buffer in the current chunk; None: published but not captured
        self._targets: dict[int, StreamEventBuffer | None] = {}
        self._messages = MessageBuffer(context, self.settings.modes)
        self._buffered = 0
        self._buffered_bytes = 0
        self._tx_rows: list[dict] = []
        self._chunk_txs: list[tuple] = []
        self._tx: _Transaction | None = None

    # -- feeding -----------------------------------------------------------------------------

    def consume(self, frames: Iterable[XLogData | Keepalive]) -> None:
        """Feed frames until the window is complete: :meth:`feed` with the row-message path
        inlined, because it runs once per change."""
        row, feed = self._row, self.feed
        for frame in frames:
            if type(frame) is XLogData:
                payload = frame.payload
                if payload and payload[0] in _ROW_KINDS and not self.done:
                    row(payload, frame.wal_start)
                    continue
            if feed(frame):
                return

    def feed(self, frame: XLogData | Keepalive) -> bool:
        """Process one frame; returns True once the window is complete."""
        if self.done:
            return True
        to_lsn = self.window.to_lsn
        if to_lsn is None:
            raise CdcStateError(f"stream window {self.window.describe()} has no end position")
        if isinstance(frame, Keepalive):
            if self._tx is None and frame.wal_end >= to_lsn:
                self.done = True
            return self.done
        payload = frame.payload
        if payload and payload[0] in _ROW_KINDS:
            self._row(payload, frame.wal_start)  # the hot path: no per-row decoding here
            return False
        return self._on_message(decode_message(payload), frame.wal_start)

    def _on_message(self, message: Message, lsn: int) -> bool:
        """One decoded non-row message (``lsn``: its frame's start); True once the window is
        complete. Separate from :meth:`feed` so a source with other frame rules (YugabyteDB)
        reuses the message handling."""
        to_lsn = self.window.to_lsn
        if to_lsn is None:
            raise CdcStateError(f"stream window {self.window.describe()} has no end position")
        if isinstance(message, Begin):
            if message.final_lsn >= to_lsn:
                self.done = True
                return True
            if self.window.from_lsn is not None and message.final_lsn < self.window.from_lsn:
                raise DecodingError(
                    f"received a transaction committed at {message.final_lsn:X}, before the window "
                    f"start {self.window.from_lsn}; the slot or start position is inconsistent"
                )
            self._open_transaction(message.xid, message.final_lsn, message.commit_ts_us)
        elif isinstance(message, Commit):
            self._commit(message)
        elif isinstance(message, Relation):
            self._relation(message)
        elif isinstance(message, Truncate):
            self._truncate(message, lsn)
        elif isinstance(message, LogicalMessage):
            # A non-transactional message's LSN is where its record ends: it belongs to the
            # window when it starts before the target, i.e. ends at or before it.
            if not message.transactional and self._tx is None and message.lsn > to_lsn:
                self.done = True
                return True
            self._message(message)
        elif isinstance(message, (TypeInfo, Origin)):
            pass  # types resolve through the catalog; origins are not part of events
        return False

    def extra_stats(self) -> dict[str, int]:
        """What a source's collector adds to the commit entry's stats (nothing for PostgreSQL)."""
        return {}

    def finish(self) -> StreamStats:
        if self._tx is not None:
            raise DecodingError(f"the stream ended inside transaction {self._tx.xid}")
        self._flush_chunk()
        return self.stats

    # -- messages ----------------------------------------------------------------------------

    def _relation(self, message: Relation) -> None:
        self._targets.pop(message.oid, None)
        ref = TableRef(message.namespace or "pg_catalog", message.name)
        table = self.tables.get(ref)
        if table is None:
            self._relations[message.oid] = None  # published but not captured
            return
        columns = tuple(Column(c.name, self.types.get(c.type_oid, c.type_modifier)) for c in message.columns)
        current = self._relations.get(message.oid)
        if current is not None and current[0].relation_columns == columns:
            return
        # A new column set (ALTER TABLE inside the window): a new table version, written as its
        # own batches; readers merge the versions (see sinks/schemas.py).
        self._relation_versions[message.oid] += 1
        encoder = TableEncoder(table, columns, self.settings, docdb_text=self.docdb_text)
        self._relations[message.oid] = (encoder, self._relation_versions[message.oid])

    def _buffer(self, relation_oid: int) -> StreamEventBuffer | None:
        try:
            relation = self._relations[relation_oid]
        except KeyError:
            raise DecodingError(f"change for relation {relation_oid} arrived before its Relation message") from None
        if relation is None:
            return None
        encoder, version = relation
        key = (relation_oid, version)
        buffer = self._buffers.get(key)
        if buffer is None:
            buffer = self._buffers[key] = StreamEventBuffer(encoder, self.context)
            buffer.counted = encoder.table.ref not in self._uncounted
        return buffer

    def _row(self, payload: bytes, lsn: int) -> None:
        """One Insert/Update/Delete message, buffered raw (see :mod:`.columnar`)."""
        try:
            (oid,) = _UINT32.unpack_from(payload, 1)
        except struct.error:
            raise DecodingError(f"malformed pgoutput {chr(payload[0])!r} message ({len(payload)} bytes)") from None
        buffer = self._targets.get(oid, False)
        if buffer is False:
            buffer = self._targets[oid] = self._buffer(oid)
        if buffer is None:
            return
        if payload[0] == 0x55 and len(payload) > 5 and payload[5] != 0x4E:  # an Update carrying its old tuple
            self._update_with_old(buffer, oid, payload, lsn)
        else:
            self._add(buffer, payload, lsn)

    def _update_with_old(self, buffer: StreamEventBuffer, oid: int, payload: bytes, lsn: int) -> None:
        """An Update with an old 'K' (key changed) or 'O' (REPLICA IDENTITY FULL) tuple: decoded
        here, because it may become two events or need the old row's values."""
        message = decode_message(payload)
        if not isinstance(message, Update) or message.old is None:
            raise DecodingError(f"expected an Update with its old tuple at LSN {lsn}, got {type(message).__name__}")
        old, new = message.old, message.new
        if len(old) != len(new):
            raise DecodingError(f"update of {buffer.encoder.table.ref}: old and new tuples differ in width")
        if message.old_kind == "O" and UNCHANGED_TOAST in new:
            # REPLICA IDENTITY FULL: the old row carries the value the WAL left out of the new one.
            new = tuple(o if v is UNCHANGED_TOAST else v for o, v in zip(old, new))
            payload = encode_update(oid, message.old_kind, old, new)
        keys = buffer.encoder.relation_key_indexes
        if keys and any(old[i] != new[i] for i in keys):
            # A primary-key change: Debezium's delete of the old key, then create of the new,
            # each carrying the other key. (An old 'K' tuple has every non-key column null:
            # exactly Debezium's before image under REPLICA IDENTITY DEFAULT / USING INDEX.)
            old_key, new_key = tuple(old[i] for i in keys), tuple(new[i] for i in keys)
            self._add(buffer, encode_delete(oid, message.old_kind or "K", old), lsn, new_key=new_key)
            # The delete may have filled and flushed the chunk: the create goes to the next one's.
            current = self._buffer(oid)
            self._add(buffer if current is None else current, encode_insert(oid, new), lsn, old_key=old_key)
            self.stats.key_changes += 1
        else:
            self._add(buffer, payload, lsn)

    def _truncate(self, message: Truncate, lsn: int) -> None:
        flags = (message.cascade, message.restart_identity)
        for oid in message.relation_oids:
            buffer = self._buffer(oid) if oid in self._relations else None
            if buffer is not None:
                self._add(buffer, TRUNCATE_ROW, lsn, truncate=flags)

    def _message(self, message: LogicalMessage) -> None:
        prefix = message.prefix
        internal = prefix.startswith(INTERNAL_PREFIX)
        if internal or not self._wants_prefix(prefix):
            self.stats.messages_skipped += not internal
            return
        tx = self._tx if message.transactional else None
        if tx is None:
            # Not part of a transaction: no txId and no commit; it is ordered by its own LSN.
            source = (self.context.ts_ms, self.previous_commit_lsn, None, message.lsn, message.lsn)
            self._messages.add(prefix, message.content, source=source, transaction=None)
        else:
            tx.total += 1
            tx.per_collection[MESSAGE_DATA_COLLECTION] += 1
            source = (tx.commit_ts_us // 1000, self.previous_commit_lsn, tx.xid, message.lsn, tx.final_lsn)
            transaction = (tx.id, tx.total, tx.per_collection[MESSAGE_DATA_COLLECTION])
            self._messages.add(prefix, message.content, source=source, transaction=transaction)
        self.stats.messages += 1
        self._count_buffered()

    def _wants_prefix(self, prefix: str) -> bool:
        if self._include:
            return any(p.fullmatch(prefix) for p in self._include)
        return not any(p.fullmatch(prefix) for p in self._exclude)

    def _add(
        self,
        buffer: StreamEventBuffer,
        payload: bytes,
        lsn: int,
        *,
        old_key=None,
        new_key=None,
        truncate=None,
    ) -> None:
        tx = self._tx
        if tx is None:
            raise DecodingError("a row change arrived outside a transaction")
        if not buffer.counted:
            buffer.add(payload, lsn, tx.chunk_index, 0, 0, old_key=old_key, new_key=new_key, truncate=truncate)
            return
        collection = buffer.encoder.table.ref.data_collection
        tx.total += 1
        tx.per_collection[collection] += 1
        buffer.add(
            payload,
            lsn,
            tx.chunk_index,
            tx.total,
            tx.per_collection[collection],
            old_key=old_key,
            new_key=new_key,
            truncate=truncate,
        )
        self.stats.changes += 1
        self._buffered_bytes += len(payload)
        self._count_buffered()

    def _count_buffered(self) -> None:
        self._buffered += 1
        if self._buffered >= self.max_changes or self._buffered_bytes >= MAX_CHUNK_BYTES:
            self._flush_chunk()

    def _open_transaction(self, xid: int, final_lsn: int, commit_ts_us: int) -> None:
        """Open a transaction (its Begin checked against the window)."""
        tx = _Transaction(
            xid, final_lsn, commit_ts_us, f"{xid}:{final_lsn}", self.previous_commit_lsn, len(self._chunk_txs)
        )
        self._chunk_txs.append(tx.entry())
        self._tx = tx

    def _commit(self, message: Commit) -> None:
        tx = self._tx
        if tx is None:
            raise DecodingError("Commit without Begin")
        if message.commit_lsn != tx.final_lsn:
            raise DecodingError(f"Commit LSN {message.commit_lsn:X} does not match Begin's final LSN {tx.final_lsn:X}")
        self._end_transaction(tx)

    def _end_transaction(self, tx: _Transaction) -> None:
        """Close the open transaction ``tx`` (its Commit checked): its BEGIN/END rows, if it
        has events."""
        if tx.total:
            self._tx_rows.extend(
                transaction_rows(
                    transaction_id=tx.id,
                    ts_ms=tx.commit_ts_us // 1000,
                    counts=dict(tx.per_collection),
                    window_id=self.context.window_id,
                )
            )
            self.stats.transactions += 1
            self.stats.last_commit_lsn = tx.final_lsn
            self.stats.last_tx_id = tx.xid
            self.stats.last_commit_ts_us = tx.commit_ts_us
            self.previous_commit_lsn = tx.final_lsn
        self._tx = None

    def _flush_chunk(self) -> None:
        batches: dict[str, list[pa.RecordBatch]] = {}
        transactions = ChunkTransactions.of(self._chunk_txs)
        for buffer in self._buffers.values():
            if len(buffer):
                ref = buffer.encoder.table.ref
                topic = table_topic(self.topic_prefix, ref.schema, ref.name)
                batches.setdefault(topic, []).append(buffer.to_batch(transactions))
        if len(self._messages):
            batches[message_topic(self.topic_prefix)] = [self._messages.to_batch()]
            self._messages = MessageBuffer(self.context, self.settings.modes)
        tx_batch = transaction_batch(self._tx_rows) if self._tx_rows else None
        if batches or tx_batch is not None:
            self._flush(batches, tx_batch)
            self.stats.chunk_written(log, batches)
        self._buffers = {}
        self._targets = {}
        self._buffered = 0
        self._buffered_bytes = 0
        self._tx_rows = []
        self._chunk_txs = []
        if self._tx is not None:  # a transaction open across the chunk boundary
            self._tx.chunk_index = 0
            self._chunk_txs.append(self._tx.entry())
