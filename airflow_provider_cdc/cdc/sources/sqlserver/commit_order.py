"""The capture instances' change rows merged into one stream in commit order (the log position,
as Debezium merges change tables), each transaction's rows in ``__$command_id`` order: in
``function`` mode, a transaction whose ``__$seqval`` order may be wrong is read again from the
change table (KB3030352; see :mod:`.stream`'s docstring).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcStateError
from airflow_provider_cdc.cdc.sources.sqlserver.change_queries import ChangesQuery, InstanceRange
from airflow_provider_cdc.cdc.sources.sqlserver.lsn import SqlServerLsn
from airflow_provider_cdc.cdc.sources.sqlserver.tables import CaptureInstance

log = logging.getLogger(__name__)

FETCH_ROWS = 2000
#: Function mode: a transaction's rows of one table held to check their order; beyond, read in order.
BUFFERED_TRANSACTION_ROWS = 10 * FETCH_ROWS


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


__all__ = ["BUFFERED_TRANSACTION_ROWS", "FETCH_ROWS", "MergeKey", "merged_changes", "seqval_order_is_ambiguous"]
