"""Reading one SQL Server window: every captured table's change rows in commit order.

A window covers the transactions whose commit LSN (``__$start_lsn``) is in ``[from, to)``. Each
table's changes are read from the capture instance(s) that cover that range: after a schema
change a table has two, and the older one is read below the newer one's ``start_lsn``, the newer
one from there, so no change is lost or read twice.

Order inside a transaction is ``__$command_id``'s, not ``__$seqval``'s (Microsoft,
cdc.<capture_instance>_CT: ``__$seqval`` "should not be used for ordering. Instead, use the
__$command_id column"). An update of a key or unique column over several rows is stored as a
delete and an insert per row, all the deletes first in ``__$command_id`` order, while in
``__$seqval`` order a row's insert may come before another's delete of the same key (KB3030352).
``direct`` mode (the default, as in Debezium since DBZ-9394) reads the change table ordered by
``__$start_lsn, __$command_id, __$seqval, __$operation``. ``function`` mode reads
``cdc.fn_cdc_get_all_changes_<instance>``, which has no ``__$command_id``, ordered by
``__$start_lsn, __$seqval, __$operation``; a transaction in which a key is inserted and later
deleted in that order is read again from the change table in ``__$command_id`` order (the only
way to tell an INSERT then DELETE from a deferred update logged insert-first). The instances'
streams are merged by commit LSN, then ``__$command_id`` where read.

Operations: 1 delete, 2 insert, 3 and 4 the before and after image of an update (``all update
old``), which become one ``u`` event; an update that changes the key becomes a ``d`` followed by
a ``c``, carrying Debezium's key-change headers as columns, like on PostgreSQL. Events are handed
to the sink every ``max_changes_per_chunk`` changes, also in the middle of a transaction; each
transaction's BEGIN and END rows (with per-table counts) go with the chunk that ends it.

Each instance is read on its own connection (a cursor per instance, fetched in pages): drivers
differ in whether one connection can interleave several open result sets.

Here: :class:`WindowReader`, the rows to events. Which instance reads which range, and the
queries, are :mod:`.change_queries`; the merge in commit order is :mod:`.commit_order`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcStateError
from airflow_provider_cdc.cdc.basics.naming import table_topic
from airflow_provider_cdc.cdc.basics.progress import StreamStats
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.events.envelope import Op, transaction_batch, transaction_rows
from airflow_provider_cdc.cdc.events.settings import EventContext, EventSettings
from airflow_provider_cdc.cdc.sources.sqlserver import server_clock
from airflow_provider_cdc.cdc.sources.sqlserver.change_queries import uncarried_columns
from airflow_provider_cdc.cdc.sources.sqlserver.events import (
    StreamEventBuffer,
    TableEncoder,
)
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn
from airflow_provider_cdc.cdc.sources.sqlserver.tables import CaptureInstance, TableInfo

log = logging.getLogger(__name__)

_OPS = {1: Op.DELETE, 2: Op.CREATE, 4: Op.UPDATE}


#: A before-image value SQL Server left out because the column did not change: the after image's.
_FROM_AFTER = object()


@dataclass
class _Transaction:
    commit_lsn: SqlServerLsn
    transaction_id: str
    ts_ms: int
    total_order: int = 0
    counts: dict[str, int] = field(default_factory=dict)


class WindowReader:
    """Merges the instances' change rows in commit order into chunks of events."""

    def __init__(
        self,
        *,
        tables: dict[str, TableInfo],
        context: EventContext,
        settings: EventSettings,
        max_changes_per_chunk: int,
        flush: Callable[[dict[str, list[pa.RecordBatch]], pa.RecordBatch | None], None],
        commit_times: Callable[[SqlServerLsn, SqlServerLsn], dict[int, tuple[datetime, bytes | None]]],
        server_time_zone: str = "UTC",
        uncounted: frozenset[TableRef] = frozenset(),
        resolve_at: Callable[[bytes, datetime], datetime] | None = None,
    ):
        """``uncounted``: tables read for the capture's own use (the signal table), whose rows
        are neither changes nor part of the transaction metadata. ``resolve_at(lsn, local)``: the
        instant of a commit whose local time is in a repeated hour (clocks going back), from the
        commits of that hour before it (server_clock.resolve_at); without it, from this window's."""
        self.tables = tables
        self._uncounted = uncounted
        self.context = context
        self.settings = settings
        self.max_changes_per_chunk = max_changes_per_chunk
        self.flush = flush
        self.commit_times = commit_times
        self.zone = server_clock.zone_of(server_time_zone)
        # Commit times in LSN order: the second pass of a repeated hour is recognised by going back.
        self._clock = server_clock.CommitClock(self.zone)
        self._resolve_at = resolve_at
        self._anchored_hour: tuple[datetime, datetime] | None = None
        self.stats = StreamStats()
        self._buffers: dict[str, StreamEventBuffer] = {}
        self._encoders: dict[str, TableEncoder] = {}
        self._uncarried: dict[str, list[tuple[int, str]]] = {}  # per instance: uncarried_columns
        self._pending_transactions: list[dict] = []
        self._buffered = 0
        self._times: dict[int, tuple[datetime, bytes | None]] = {}

    def encoder(self, instance: CaptureInstance) -> TableEncoder:
        found = self._encoders.get(instance.name)
        if found is None:
            table = self.tables[instance.table.data_collection]
            available = {c.name: c for c in table.columns}
            missing = [c for c in instance.columns if c not in available]
            if missing:
                raise CdcConfigurationError(
                    f"capture instance {instance.name!r} captures column(s) {missing} that {table.ref} no longer has; "
                    "their type is unknown to the capture"
                )
            found = TableEncoder(table, [available[c] for c in instance.columns], self.settings)
            self._encoders[instance.name] = found
        return found

    def read(self, rows: Iterator[tuple[CaptureInstance, tuple]], window: Window) -> StreamStats:
        """Consume merged ``(instance, row)`` pairs (row: start_lsn, seqval, operation, values...)."""
        if window.from_lsn is None or window.to_lsn is None:
            raise CdcStateError(f"stream window {window.describe()} has no start or end position")
        current: _Transaction | None = None
        current_start: bytes | None = None
        pending_before: tuple | None = None
        for instance, row in rows:
            # The raw bytes compared, an LSN object made once per transaction: this loop runs per row.
            raw_start, seqval, operation = row[0], int.from_bytes(row[1], "big"), int(row[2])
            width = len(self.encoder(instance).columns)
            values, changed = row[3 : 3 + width], row[3 + width :]
            if operation in (1, 3) and changed:
                values = self._before_image(instance, values, changed, operation)
            if current is None or raw_start != current_start:
                if current is not None:
                    self._end(current)
                current = self._begin(SqlServerLsn(raw_start), window)
                current_start = raw_start
            if operation == 3:
                pending_before = values
                continue
            before = None
            if operation == 4:
                if pending_before is None:
                    raise CdcStateError(
                        f"capture instance {instance.name!r}: an update's after image at {SqlServerLsn(seqval)} has no "
                        "before image "
                        "(the change rows were read with a row filter other than 'all update old')"
                    )
                before, pending_before = self._unchanged_from_after(instance, pending_before, values), None
            self._event(instance, current, operation, before, values, seqval)
            if self._buffered >= self.max_changes_per_chunk:
                self._flush_chunk()
        if current is not None:
            self._end(current)
        self._flush_chunk()
        return self.stats

    def _before_image(self, instance: CaptureInstance, values: tuple, changed: tuple, operation: int) -> tuple:
        """A delete's or an update's before image with what SQL Server did not carry marked: an
        image/text/ntext value of a delete or of a changed column is unknown (the unavailable-value
        placeholder, as PostgreSQL's unchanged TOAST values); an unchanged column's is left as
        :data:`_FROM_AFTER`, taken from the after image (:meth:`_unchanged_from_after`)."""
        out = list(values)
        found = self._uncarried.get(instance.name)
        if found is None:
            found = self._uncarried[instance.name] = uncarried_columns(self.encoder(instance))
        for (index, kind), flag in zip(found, changed):
            if operation == 3 and not flag:
                out[index] = _FROM_AFTER
            elif kind == "lob":
                out[index] = self._placeholder(instance, index)
        return tuple(out)

    def _unchanged_from_after(self, instance: CaptureInstance, before: tuple, after: tuple) -> tuple:
        return tuple(a if b is _FROM_AFTER else b for b, a in zip(before, after))

    def _placeholder(self, instance: CaptureInstance, index: int) -> Any:
        placeholder = self.settings.modes.unavailable_value_placeholder
        if self.encoder(instance).columns[index].type.name != "image":
            return placeholder
        return bytes.fromhex(placeholder[4:]) if placeholder.startswith("hex:") else placeholder.encode()

    def _begin(self, commit_lsn: SqlServerLsn, window: Window) -> _Transaction:
        found = self._times.get(int(commit_lsn))
        if found is None:
            # One lookup per page of the window: the commit times of what comes next.
            self._times = self.commit_times(commit_lsn, SqlServerLsn(window.to_lsn).previous())
            found = self._times.get(int(commit_lsn))
        end_time, tran_id = found if found is not None else (None, None)
        ts_ms = 0 if end_time is None else int(self._utc(commit_lsn, end_time).timestamp() * 1000)
        transaction_id = tran_id.hex() if tran_id else str(commit_lsn)
        return _Transaction(commit_lsn, transaction_id, ts_ms)

    def _utc(self, commit_lsn: SqlServerLsn, local: datetime) -> datetime:
        """``cdc.lsn_time_mapping`` times are the server's local time: in its zone, across DST."""
        if self._resolve_at is not None and server_clock.is_repeated(local, self.zone):
            hour = server_clock.repeated_hour(local, self.zone)
            if hour != self._anchored_hour:  # its first commit here: earlier windows may hold the hour's start
                self._anchored_hour = hour
                found = self._resolve_at(commit_lsn.to_bytes(), local)
                self._clock.last = found if self._clock.last is None else max(self._clock.last, found)
                return found
        return self._clock.utc(local)

    def _event(
        self,
        instance: CaptureInstance,
        txn: _Transaction,
        operation: int,
        before: Sequence[Any] | None,
        values: Sequence[Any],
        seqval: int,  # __$seqval as a number
    ) -> None:
        encoder = self.encoder(instance)
        ref = instance.table
        # The topic's name only: Topic.for_table also escapes a directory name, per row.
        topic = table_topic(self.context.topic_prefix, ref.schema, ref.name)
        buffer = self._buffers.get(topic)
        if buffer is None or buffer.encoder is not encoder:
            if buffer is not None:
                self._flush_chunk()  # a new capture instance's layout: new batch
            buffer = self._buffers[topic] = StreamEventBuffer(encoder, self.context)
        op = _OPS.get(operation)
        if op is None:
            raise CdcStateError(
                f"capture instance {instance.name!r}: unknown __$operation {operation} at {SqlServerLsn(seqval)}"
            )
        after = None if operation == 1 else values
        before = values if operation == 1 else before
        collection = ref.data_collection
        if op == Op.UPDATE and before is not None and encoder.key_indexes:
            old_key = tuple(before[i] for i in encoder.key_indexes)
            new_key = tuple(after[i] for i in encoder.key_indexes)  # type: ignore[index]
            if old_key != new_key:  # Debezium: a key change is a delete and a create
                self.stats.key_changes += 1
                self._add(buffer, txn, collection, Op.DELETE, before, None, seqval, new_key=new_key)
                self._add(buffer, txn, collection, Op.CREATE, None, after, seqval, event_serial_no=2, old_key=old_key)
                return
        self._add(buffer, txn, collection, op, before, after, seqval)

    def _add(
        self,
        buffer: StreamEventBuffer,
        txn: _Transaction,
        collection: str,
        op: str,
        before: Sequence[Any] | None,
        after: Sequence[Any] | None,
        seqval: int,  # __$seqval as a number
        **extra: Any,
    ) -> None:
        # Counters and one append per event: the buffer builds source and transaction at the flush.
        # Rows of uncounted tables (the signal table) are neither changes nor counted in transactions.
        count = 0
        if buffer.encoder.table.ref not in self._uncounted:
            txn.total_order += 1
            count = txn.counts[collection] = txn.counts.get(collection, 0) + 1
            self.stats.changes += 1
        buffer.add(op, before, after, seqval, txn, txn.total_order, count, **extra)
        self._buffered += 1

    def _end(self, txn: _Transaction) -> None:
        if not txn.counts:  # only rows of uncounted tables
            return
        self._pending_transactions += transaction_rows(
            transaction_id=txn.transaction_id, ts_ms=txn.ts_ms, counts=txn.counts, window_id=self.context.window_id
        )
        self.stats.transactions += 1
        self.stats.last_commit_lsn = int(txn.commit_lsn)
        self.stats.last_tx_id = txn.transaction_id
        self.stats.last_commit_ts_us = txn.ts_ms * 1000

    def _flush_chunk(self) -> None:
        if not self._buffered and not self._pending_transactions:
            return
        batches = {topic: [buffer.to_batch()] for topic, buffer in self._buffers.items() if len(buffer)}
        transactions = transaction_batch(self._pending_transactions) if self._pending_transactions else None
        self.flush(batches, transactions)
        self._buffers = {}
        self._pending_transactions = []
        self._buffered = 0
        self.stats.chunk_written(log, batches)


__all__ = ["WindowReader"]
