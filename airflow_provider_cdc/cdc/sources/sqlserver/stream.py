"""Reading one SQL Server window: every captured table's change rows in commit order.

A window covers the transactions whose commit LSN (``__$start_lsn``) is in ``[from, to)``. Each
table's changes are read from the capture instance(s) that cover that range: after a schema
change a table has two, and the older one is read below the newer one's ``start_lsn``, the newer
one from there, so no change is lost or read twice. Each instance's rows come ordered by
``__$start_lsn, __$seqval, __$operation`` (with ``__$command_id`` before ``__$seqval`` when the
change table is read directly: Debezium's fix for changes of one statement that share a
``__$seqval``); the instances' streams are merged in that order, which is the commit order of
the transactions and the log order of the changes inside them.

Operations: 1 delete, 2 insert, 3 and 4 the before and after image of an update (``all update
old``), which become one ``u`` event; an update that changes the key becomes a ``d`` followed by
a ``c``, carrying Debezium's key-change headers as columns, like on PostgreSQL. Events are handed
to the sink every ``max_changes_per_chunk`` changes, also in the middle of a transaction; each
transaction's BEGIN and END rows (with per-table counts) go with the chunk that ends it.

Each instance is read on its own connection (a cursor per instance, fetched in pages): drivers
differ in whether one connection can interleave several open result sets.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa

from airflow_provider_cdc.cdc.envelope import Op, transaction_batch, transaction_rows
from airflow_provider_cdc.cdc.errors import CdcConfigurationError, CdcStateError
from airflow_provider_cdc.cdc.event_settings import EventContext, EventSettings
from airflow_provider_cdc.cdc.naming import table_topic
from airflow_provider_cdc.cdc.progress import StreamStats
from airflow_provider_cdc.cdc.sources.sqlserver import admin
from airflow_provider_cdc.cdc.sources.sqlserver.admin import CaptureInstance, TableInfo, quote
from airflow_provider_cdc.cdc.sources.sqlserver.events import (
    SOURCE_BLOCK,
    StreamEventBuffer,
    TableEncoder,
)
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn
from airflow_provider_cdc.cdc.tables import TableRef
from airflow_provider_cdc.cdc.window import Window

log = logging.getLogger(__name__)

FETCH_ROWS = 2000
_OPS = {1: Op.DELETE, 2: Op.CREATE, 4: Op.UPDATE}


class ChangesPurgedError(CdcStateError):
    """The cleanup job removed change rows the window still needed (retention too short)."""


@dataclass(frozen=True)
class InstanceRange:
    """One capture instance's part of a window: commit LSNs in ``[low, high)``."""

    instance: CaptureInstance
    low: SqlServerLsn
    high: SqlServerLsn


def instance_ranges(
    tables: Sequence[TableInfo], window_from: SqlServerLsn, window_to: SqlServerLsn
) -> list[InstanceRange]:
    """Which instance reads which part of the window: each instance from its ``start_lsn`` (the
    window's start for the oldest) up to the next instance's ``start_lsn``."""
    out = []
    for table in tables:
        instances = table.instances
        for i, instance in enumerate(instances):
            low = window_from if i == 0 else max(window_from, instance.start_lsn or window_from)
            high = window_to
            if i + 1 < len(instances) and instances[i + 1].start_lsn is not None:
                high = min(window_to, instances[i + 1].start_lsn)
            if low < high:
                out.append(InstanceRange(instance, SqlServerLsn(low), SqlServerLsn(high)))
    return out


def readable(ranges: Sequence[InstanceRange]) -> list[InstanceRange]:
    """The ranges from where each instance's changes begin: SQL Server refuses a range that starts
    before an instance's start_lsn (error 313), and an instance created on a quiet database starts
    above the window's start. Call after :func:`check_retention`, which tells that from a purge."""
    out = []
    for part in ranges:
        start = part.instance.start_lsn
        low = max(part.low, SqlServerLsn(start)) if start is not None else part.low
        if low < part.high:
            out.append(InstanceRange(part.instance, SqlServerLsn(low), part.high))
    return out


def changes_sql(instance: CaptureInstance, encoder: TableEncoder, mode: str) -> str:
    """The T-SQL that reads one instance's change rows of ``[?, ?]`` (both inclusive), ordered."""
    metadata = "__$start_lsn, __$seqval, __$operation"
    if mode == "function":
        function = quote(f"fn_cdc_get_all_changes_{instance.name}")
        return (
            f"SELECT {metadata}, {encoder.select_list()} FROM cdc.{function}(?, ?, N'all update old') "
            "ORDER BY __$start_lsn, __$seqval, __$operation"
        )
    table = quote(f"{instance.name}_CT")
    return (
        f"SELECT {metadata}, {encoder.select_list()} FROM cdc.{table} "
        "WHERE __$start_lsn >= ? AND __$start_lsn <= ? "
        "ORDER BY __$start_lsn, __$command_id, __$seqval, __$operation"
    )


def check_retention(
    conn: Any, ranges: Sequence[InstanceRange], known: set[str], starts: dict[str, str] | None = None
) -> None:
    """Fail when the cleanup job purged changes a range needs: an instance read before (``known``)
    whose oldest change is now past the range's start, and past where it started when a window first
    saw it (``starts``: an instance created on a quiet database starts above the capture job's
    newest LSN, and has lost nothing). A new instance starts where it starts."""
    starts = starts or {}
    for part in ranges:
        oldest = admin.min_lsn(conn, part.instance.name)
        if oldest is None:
            raise CdcStateError(
                f"capture instance {part.instance.name!r} of {part.instance.table} no longer exists: it was disabled "
                "(sys.sp_cdc_disable_table) while the capture still needed its changes. Re-enable CDC on the table "
                "and re-snapshot (snapshot_mode='when_needed' or 'always')"
            )
        unmoved = starts.get(part.instance.name) == str(oldest)
        if part.instance.name in known and oldest > part.low and not unmoved:
            raise ChangesPurgedError(
                f"the changes of capture instance {part.instance.name!r} from {part.low} are gone: its oldest change "
                f"is now {oldest} (the cleanup job's retention is shorter than the time between runs). "
                "Re-snapshot (snapshot_mode='when_needed' records the gap and re-snapshots), and raise the retention "
                "(sys.sp_cdc_change_job @job_type = N'cleanup', @retention = <minutes>)"
            )


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
    ):
        """``uncounted``: tables read for the capture's own use (the signal table), whose rows
        are neither changes nor part of the transaction metadata."""
        self.tables = tables
        self._uncounted = uncounted
        self.context = context
        self.settings = settings
        self.max_changes_per_chunk = max_changes_per_chunk
        self.flush = flush
        self.commit_times = commit_times
        self.zone = ZoneInfo(server_time_zone)
        self.stats = StreamStats()
        self._buffers: dict[str, StreamEventBuffer] = {}
        self._encoders: dict[str, TableEncoder] = {}
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
        assert window.from_lsn is not None and window.to_lsn is not None
        current: _Transaction | None = None
        current_start: bytes | None = None
        pending_before: tuple | None = None
        for instance, row in rows:
            # The raw bytes compared, an LSN object made once per transaction: this loop runs per row.
            raw_start, seqval, operation = row[0], int.from_bytes(row[1], "big"), int(row[2])
            values = row[3:]
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
                before, pending_before = pending_before, None
            self._event(instance, current, operation, before, values, seqval)
            if self._buffered >= self.max_changes_per_chunk:
                self._flush_chunk()
        if current is not None:
            self._end(current)
        self._flush_chunk()
        return self.stats

    def _begin(self, commit_lsn: SqlServerLsn, window: Window) -> _Transaction:
        found = self._times.get(int(commit_lsn))
        if found is None:
            # One lookup per page of the window: the commit times of what comes next.
            self._times = self.commit_times(commit_lsn, SqlServerLsn(window.to_lsn).previous())
            found = self._times.get(int(commit_lsn))
        end_time, tran_id = found if found is not None else (None, None)
        ts_ms = 0 if end_time is None else int(_utc(end_time, self.zone).timestamp() * 1000)
        transaction_id = tran_id.hex() if tran_id else str(commit_lsn)
        return _Transaction(commit_lsn, transaction_id, ts_ms)

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


def merged_changes(
    connect: Callable[[], Any],
    ranges: Sequence[InstanceRange],
    sql_for: Callable[[CaptureInstance], str],
) -> Iterator[tuple[CaptureInstance, tuple]]:
    """The change rows of every range, merged by (commit LSN, change LSN, operation)."""
    opened: list[Any] = []

    def rows(part: InstanceRange) -> Iterator[tuple]:
        conn = connect()
        opened.append(conn)
        cursor = conn.cursor()
        cursor.execute(sql_for(part.instance), part.low.to_bytes(), part.high.previous().to_bytes())
        while True:
            page = cursor.fetchmany(FETCH_ROWS)
            if not page:
                break
            for row in page:
                yield tuple(row)
        cursor.close()

    def keyed(part: InstanceRange) -> Iterator[tuple[tuple[bytes, bytes, int], CaptureInstance, tuple]]:
        for row in rows(part):
            yield (bytes(row[0]), bytes(row[1]), int(row[2])), part.instance, row

    try:
        for _key, instance, row in heapq.merge(*(keyed(p) for p in ranges), key=lambda item: item[0]):
            yield instance, row
    finally:
        for conn in opened:
            try:
                conn.close()
            except Exception:
                pass


def _utc(value: datetime, zone: ZoneInfo) -> datetime:
    """``cdc.lsn_time_mapping`` times are the server's local time (naive): interpret them in its zone."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=zone)
    return value.astimezone(timezone.utc)


__all__ = [
    "SOURCE_BLOCK",
    "ChangesPurgedError",
    "InstanceRange",
    "WindowReader",
    "changes_sql",
    "check_retention",
    "instance_ranges",
    "merged_changes",
    "readable",
]
