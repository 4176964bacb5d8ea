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
"""

from __future__ import annotations

import heapq
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
from airflow_provider_cdc.cdc.sources.sqlserver import admin, server_clock
from airflow_provider_cdc.cdc.sources.sqlserver.connection import quote
from airflow_provider_cdc.cdc.sources.sqlserver.events import (
    SOURCE_BLOCK,
    StreamEventBuffer,
    TableEncoder,
)
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn
from airflow_provider_cdc.cdc.sources.sqlserver.tables import CaptureInstance, TableInfo
from airflow_provider_cdc.cdc.sources.sqlserver.types import MAX

log = logging.getLogger(__name__)

FETCH_ROWS = 2000
#: Function mode: a transaction's rows of one table held to check their order; beyond, read in order.
BUFFERED_TRANSACTION_ROWS = 10 * FETCH_ROWS
_OPS = {1: Op.DELETE, 2: Op.CREATE, 4: Op.UPDATE}


#: A before-image value SQL Server left out because the column did not change: the after image's.
_FROM_AFTER = object()


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


#: Columns a change row may not carry (Learn, cdc.fn_cdc_get_all_changes_<capture_instance>,
#: Remarks): image/text/ntext are NULL when __$operation is 1 or 3; varchar(max)/nvarchar(max)/
#: varbinary(max) are NULL when it is 3 unless the column changed. (Computed columns, always NULL,
#: are not captured at all: types.CATALOG_SQL, admin.CAPTURED_COLUMNS_SQL.)
_LOB_TYPES = ("text", "ntext", "image")
_MAX_TYPES = ("varchar", "nvarchar", "varbinary")


def uncarried_columns(encoder: TableEncoder) -> list[tuple[int, str]]:
    """``(index, "lob" | "max")`` of the encoder's columns whose before image SQL Server may leave NULL."""
    out = []
    for i, column in enumerate(encoder.columns):
        if column.type.name in _LOB_TYPES:
            out.append((i, "lob"))
        elif column.type.name in _MAX_TYPES and column.type.max_length == MAX:
            out.append((i, "max"))
    return out


def _literal(text: str) -> str:
    return text.replace("'", "''")


@dataclass(frozen=True)
class ChangesQuery:
    """How one instance's change rows are read. ``sql`` reads ``[?, ?]`` (both inclusive); its rows
    are ``__$start_lsn, __$seqval, __$operation``, then ``__$command_id`` when ``command_ids``, then
    the captured columns. ``transaction_sql`` reads one transaction (``__$start_lsn = ?``) from the
    change table in ``__$command_id`` order, with ``__$command_id``: function mode uses it for a
    transaction whose ``__$seqval`` order may be wrong. After the captured columns, a row has one
    ``__$update_mask`` flag (changed or not) per :func:`uncarried_columns`. ``key_positions``: the
    key's columns in a row without ``__$command_id``."""

    sql: str
    command_ids: bool
    transaction_sql: str
    key_positions: tuple[int, ...]


_METADATA = "__$start_lsn, __$seqval, __$operation"
# Microsoft: __$seqval "Should not be used for ordering. Instead, use the __$command_id column"
# (cdc.<capture_instance>_CT); Debezium's direct mode orders so too (SqlServerConnection.java).
_COMMAND_ORDER = "ORDER BY __$start_lsn, __$command_id, __$seqval, __$operation"


def changes_sql(instance: CaptureInstance, encoder: TableEncoder, mode: str) -> ChangesQuery:
    """The T-SQL that reads one instance's change rows, ordered (see :class:`ChangesQuery`)."""
    table = quote(f"{instance.name}_CT")
    columns = encoder.select_list() + "".join(
        f", sys.fn_cdc_has_column_changed(N'{_literal(instance.name)}', N'{_literal(encoder.columns[i].name)}', "
        f"__$update_mask) AS {quote('__$changed_' + encoder.columns[i].name)}"
        for i, _kind in uncarried_columns(encoder)
    )
    direct = f"SELECT {_METADATA}, __$command_id, {columns} FROM cdc.{table} "
    transaction_sql = direct + "WHERE __$start_lsn = ? " + _COMMAND_ORDER
    keys = tuple(3 + i for i in encoder.key_indexes)
    if mode == "function":
        function = quote(f"fn_cdc_get_all_changes_{instance.name}")
        sql = (
            f"SELECT {_METADATA}, {columns} FROM cdc.{function}(?, ?, N'all update old') "
            "ORDER BY __$start_lsn, __$seqval, __$operation"
        )
        return ChangesQuery(sql, False, transaction_sql, keys)
    sql = direct + "WHERE __$start_lsn >= ? AND __$start_lsn <= ? " + _COMMAND_ORDER
    return ChangesQuery(sql, True, transaction_sql, keys)


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


#: Where a change row sits among other tables' rows: (commit LSN, __$seqval, __$operation).
MergeKey = tuple[bytes, bytes, int]


def merged_changes(
    connect: Callable[[], Any],
    ranges: Sequence[InstanceRange],
    query_for: Callable[[CaptureInstance], ChangesQuery],
) -> Iterator[tuple[CaptureInstance, tuple]]:
    """The change rows of every range (``start_lsn, seqval, operation, values...``). Each table's
    rows keep their own order (``__$command_id``'s where read); the tables' streams are merged by
    (commit LSN, ``__$seqval``, operation), the log position, as Debezium merges change tables
    (TxLogPosition): ``__$command_id`` orders the changes of one change table, and nothing documents
    it as comparable across tables."""
    opened: list[Any] = []

    def pages(conn: Any, sql: str, *params: Any) -> Iterator[tuple]:
        cursor = conn.cursor()
        cursor.execute(sql, *params)
        while True:
            page = cursor.fetchmany(FETCH_ROWS)
            if not page:
                break
            for row in page:
                yield tuple(row)
        cursor.close()

    def keyed(part: InstanceRange) -> Iterator[tuple[MergeKey, CaptureInstance, tuple]]:
        conn = connect()
        opened.append(conn)
        query = query_for(part.instance)
        rows = pages(conn, query.sql, part.low.to_bytes(), part.high.previous().to_bytes())
        if query.command_ids:
            ordered = (_without_command_id(row) for row in rows)
        else:
            # A connection of its own: the first one's result set is still open (no MARS).
            second: list[Any] = []

            def read_transaction(lsn: bytes) -> Iterator[tuple]:
                if not second:
                    second.append(connect())
                    opened.append(second[0])
                return pages(second[0], query.transaction_sql, lsn)

            ordered = _in_command_order(rows, query, read_transaction)
        for key, row in ordered:
            yield key, part.instance, row

    try:
        for _key, instance, row in heapq.merge(*(keyed(p) for p in ranges), key=lambda item: item[0]):
            yield instance, row
    finally:
        for conn in opened:
            try:
                conn.close()
            except Exception:
                pass


def _without_command_id(row: tuple) -> tuple[MergeKey, tuple]:
    """A change-table row's merge key, and the row without its ``__$command_id``."""
    return (bytes(row[0]), bytes(row[1]), int(row[2])), row[:3] + row[4:]


def _in_command_order(
    rows: Iterator[tuple], query: ChangesQuery, read_transaction: Callable[[bytes], Iterator[tuple]]
) -> Iterator[tuple[MergeKey, tuple]]:
    """Function-mode rows (no ``__$command_id``), one transaction at a time: as read, unless the
    ``__$seqval`` order may be wrong (:func:`seqval_order_is_ambiguous`); then the transaction is
    read again from the change table in ``__$command_id`` order. Holds up to
    :data:`BUFFERED_TRANSACTION_ROWS` rows of one table's transaction in memory; a larger one is
    read from the change table, streamed, whether ambiguous or not."""
    transaction: list[tuple] = []
    skipping: bytes | None = None  # a large transaction read from the change table instead
    for row in rows:
        lsn = bytes(row[0])
        if lsn == skipping:
            continue
        if transaction and lsn != bytes(transaction[0][0]):
            yield from _transaction_in_order(transaction, query, read_transaction)
            transaction = []
        transaction.append(row)
        if len(transaction) > BUFFERED_TRANSACTION_ROWS:
            skipping, transaction = lsn, []
            yield from (_without_command_id(r) for r in read_transaction(lsn))
    if transaction:
        yield from _transaction_in_order(transaction, query, read_transaction)


def _transaction_in_order(
    transaction: list[tuple], query: ChangesQuery, read_transaction: Callable[[bytes], Iterator[tuple]]
) -> Iterator[tuple[MergeKey, tuple]]:
    if not seqval_order_is_ambiguous(transaction, query.key_positions):
        for row in transaction:
            yield (bytes(row[0]), bytes(row[1]), int(row[2])), row
        return
    again = [_without_command_id(row) for row in read_transaction(bytes(transaction[0][0]))]
    if len(again) != len(transaction):  # cannot happen while the window is below the cleanup's low water mark
        raise CdcStateError(
            f"the change table holds {len(again)} rows of transaction {SqlServerLsn(bytes(transaction[0][0]))} where "
            f"the change function returned {len(transaction)}: the cleanup job ran while it was read. Run the "
            "window again"
        )
    log.info("transaction %s re-read in __$command_id order", SqlServerLsn(bytes(transaction[0][0])))
    yield from again


def seqval_order_is_ambiguous(transaction: Sequence[tuple], key_positions: Sequence[int]) -> bool:
    """Whether a transaction's rows in ``__$seqval`` order insert a key (2) and later delete it (1).

    That is what an ``INSERT`` then a ``DELETE`` of the key looks like, and also a deferred update
    (an update of a key or unique column: a delete and an insert per row) whose insert SQL Server
    logged first (KB3030352: "an insert operation may unexpectedly appear before a delete
    operation"; ``__$seqval`` "should not be used for ordering", cdc.<capture_instance>_CT). Only
    ``__$command_id`` tells them apart. Without a key, any delete after an insert counts."""
    inserted: set[tuple] = set()
    for row in transaction:
        key = tuple(row[i] for i in key_positions)
        operation = int(row[2])
        if operation == 2:
            inserted.add(key)
        elif operation == 1 and key in inserted:
            return True
    return False


__all__ = [
    "SOURCE_BLOCK",
    "ChangesPurgedError",
    "ChangesQuery",
    "InstanceRange",
    "WindowReader",
    "changes_sql",
    "check_retention",
    "instance_ranges",
    "merged_changes",
    "readable",
    "seqval_order_is_ambiguous",
    "uncarried_columns",
]
