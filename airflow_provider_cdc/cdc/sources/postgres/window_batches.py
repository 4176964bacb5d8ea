"""Reading one stream window from Arrow batches of pgoutput messages, without Python per change.

:class:`BatchWindowCollector` is the :class:`~.stream.WindowCollector` fed record batches of
``(lsn, xid, data)`` rows, one pgoutput message per row in stream order, as the logical decoding
SQL functions (``pg_logical_slot_peek_binary_changes``) return them. It produces the same
``flush`` calls as the streaming collector fed the same messages, chunk for chunk.

Each batch is classified at once with numpy (the first byte of each message, and for row
messages the relation OID and the byte after it). Runs of *plain* messages — Begin, Commit, and
Insert/Update/Delete without an old tuple to inspect — are handled in bulk:

- the transaction ordinals (``total_order``, ``data_collection_order``), the transaction each
  row belongs to, and where a chunk fills up (``max_changes_per_chunk`` / ``MAX_CHUNK_BYTES``)
  are cumulative sums and a stable sort over the run;
- each table version's rows of a chunk are one ``take`` of the batch's message array, decoded
  column-wise when the chunk is flushed (:func:`.columnar.decode_array`);
- Begin and Commit fields are read for all at once, checked as the streaming collector checks
  them, and open and close transactions through its own methods, once per transaction.

Everything else goes through the streaming collector one message at a time, with its rules and
errors: Relation, Type, Origin, Truncate, logical messages, Updates carrying an old tuple (a key
change or REPLICA IDENTITY FULL), and anything out of the ordinary (a Begin at or past the
window's end, a Commit without its Begin, a change before its Relation or outside a
transaction, a message too short to classify). A run stops just before such a message, so the
order of effects, flushes and errors is the streaming collector's. Runs shorter than
:attr:`BatchWindowCollector.min_run` also go one message at a time (a run has a fixed cost).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from airflow_provider_cdc.cdc.basics.errors import DecodingError
from airflow_provider_cdc.cdc.sources.postgres import stream
from airflow_provider_cdc.cdc.sources.postgres.columnar import binary_buffers
from airflow_provider_cdc.cdc.sources.postgres.decoder import pg_timestamp_to_unix_us
from airflow_provider_cdc.cdc.sources.postgres.replication import XLogData

_BEGIN, _COMMIT = 0x42, 0x43
_INSERT, _UPDATE, _DELETE = 0x49, 0x55, 0x44
_NEW_TUPLE = 0x4E
_BEGIN_SIZE, _COMMIT_SIZE = 21, 26  # every well-formed Begin / Commit has exactly this size


@dataclass(frozen=True)
class _Messages:
    """One record batch of messages, classified."""

    data: pa.Array  # binary: the messages
    lsns: np.ndarray  # int64
    offsets: np.ndarray  # int64 (n + 1) into ``values``
    values: np.ndarray  # uint8
    sizes: np.ndarray  # int64; 0 for a null
    kinds: np.ndarray  # uint8: first byte (0 for an empty message)
    rows: np.ndarray  # bool: an Insert/Update/Delete for the bulk path
    oids: np.ndarray  # int64: the relation OID of row messages

    @classmethod
    def of(cls, batch: pa.RecordBatch) -> _Messages:
        data, lsn = batch.column("data"), batch.column("lsn")
        if data.type not in (pa.binary(), pa.large_binary()):  # e.g. a binary view
            data = data.cast(pa.large_binary())
        if lsn.null_count:
            raise DecodingError("a logical decoding result row has no LSN")
        offsets, values = binary_buffers(data)
        sizes = np.diff(offsets)
        if data.null_count:
            sizes[~data.is_valid().to_numpy(zero_copy_only=False)] = 0  # decoded as empty: an error
        starts = offsets[:-1]
        last = max(len(values) - 1, 0)
        padded = values if len(values) else np.zeros(1, np.uint8)

        def byte(at: int, present: np.ndarray) -> np.ndarray:
            return np.where(present, padded[np.minimum(starts + at, last)], 0).astype(np.int64)

        kinds = byte(0, sizes > 0).astype(np.uint8)
        tupled = sizes >= 6  # kind, OID, tuple marker
        oids = (byte(1, tupled) << 24) | (byte(2, tupled) << 16) | (byte(3, tupled) << 8) | byte(4, tupled)
        marker = byte(5, tupled)
        # An Update whose old tuple follows its OID is decoded one by one (it may be a key change).
        rows = tupled & ((kinds == _INSERT) | (kinds == _DELETE) | ((kinds == _UPDATE) & (marker == _NEW_TUPLE)))
        return cls(data, lsn.to_numpy(zero_copy_only=False).astype(np.int64), offsets, values, sizes, kinds, rows, oids)

    def __len__(self) -> int:
        return len(self.kinds)

    def payload(self, i: int) -> bytes:
        return self.values[self.offsets[i] : self.offsets[i] + self.sizes[i]].tobytes()

    def plain(self) -> np.ndarray:
        """The messages the bulk path handles (before the checks that need the collector's state)."""
        begin = (self.kinds == _BEGIN) & (self.sizes == _BEGIN_SIZE)
        commit = (self.kinds == _COMMIT) & (self.sizes == _COMMIT_SIZE)
        return self.rows | begin | commit


class BatchWindowCollector(stream.WindowCollector):
    """:class:`~.stream.WindowCollector` fed Arrow batches of pgoutput messages (see the module
    docstring); :meth:`finish` as there."""

    #: Shorter runs go one message at a time: a run's fixed numpy cost (~0.1 ms) is worth it
    #: only over many messages (e.g. not between the old-tuple Updates of a REPLICA IDENTITY FULL table).
    min_run: int = 32

    def consume_batches(self, batches: Iterable[pa.RecordBatch]) -> None:
        """Feed batches with columns ``lsn`` (int64: the message's LSN, the replication
        protocol's ``XLogData.wal_start``), ``xid`` (ignored) and ``data`` (binary: one pgoutput
        message), in stream order, until the window is complete or the batches run out."""
        for batch in batches:
            if self.done:
                return
            self._consume(_Messages.of(batch))

    def _consume(self, batch: _Messages) -> None:
        n = len(batch)
        others = np.flatnonzero(~batch.plain())
        pos = 0
        while pos < n and not self.done:
            stop = int(others[np.searchsorted(others, pos)]) if len(others) and others[-1] >= pos else n
            if stop - pos >= self.min_run:
                pos = self._run(batch, pos, stop)  # it may stop early, at a message for the streaming path
            else:
                while pos < stop and not self.done:  # a short run: one by one
                    self._one(batch, pos)
                    pos += 1
            if pos < n and not self.done:  # the message that ended the run
                self._one(batch, pos)
                pos += 1

    def _one(self, batch: _Messages, i: int) -> None:
        """Message ``i`` through the streaming collector (:meth:`consume`'s body)."""
        payload, lsn = batch.payload(i), int(batch.lsns[i])
        if payload and payload[0] in stream._ROW_KINDS:
            self._row(payload, lsn)
        else:
            self.feed(XLogData(lsn, payload))

    # -- runs of plain messages --------------------------------------------------------------

    def _run(self, batch: _Messages, start: int, stop: int) -> int:
        """Handle the plain messages ``start:stop`` in bulk, up to the first one that needs the
        streaming collector's handling; returns where it stopped."""
        to_lsn = self.window.to_lsn
        if to_lsn is None:
            return start  # the streaming path raises
        marks, cut = self._transaction_marks(batch, start, stop, to_lsn)
        rows = np.flatnonzero(batch.rows[start:cut]) + start
        oids = batch.oids[rows]
        relations = {oid: self._relations.get(oid, False) for oid in np.unique(oids).tolist()}
        unknown = [oid for oid, relation in relations.items() if relation is False]
        if unknown:  # a change before its Relation: the streaming path raises
            cut = int(rows[np.isin(oids, unknown)][0])
        captured = [oid for oid, relation in relations.items() if relation]
        keep = (rows < cut) & np.isin(oids, captured)  # changes of uncaptured tables are dropped
        rows, oids = rows[keep], oids[keep]
        marks = marks[: bisect.bisect_left(marks, (cut,))]
        kinds = np.array([m[1] for m in marks], np.int64)
        positions = np.array([m[0] for m in marks], np.int64)
        begins, commits = positions[kinds == _BEGIN], positions[kinds == _COMMIT]
        inside = int(self._tx is not None) + np.searchsorted(begins, rows) - np.searchsorted(commits, rows)
        if len(rows) and not inside.all():  # a change outside a transaction: the streaming path raises
            cut = int(rows[np.argmin(inside)])
            rows, oids = rows[rows < cut], oids[rows < cut]
            marks = marks[: bisect.bisect_left(marks, (cut,))]
        _Run(self, batch, rows, oids, marks, begins).apply(cut)
        return cut

    def _transaction_marks(self, batch: _Messages, start: int, stop: int, to_lsn: int) -> tuple[list[tuple], int]:
        """The Begins and Commits of ``start:stop`` that the bulk path may handle, as ``(position,
        kind, final LSN or flags, commit LSN, xid, timestamp)``, and where the first one it may not
        is (``stop`` if none): a Begin inside a transaction, at or past the window's end or before
        its start, a Commit without its Begin. Their fields are read for all at once (their sizes
        are exact)."""
        kinds = batch.kinds[start:stop]
        positions = np.flatnonzero((kinds == _BEGIN) | (kinds == _COMMIT)) + start
        at = batch.offsets[positions]
        kind = batch.kinds[positions]
        # Begin: final LSN, timestamp, xid; Commit: flags, commit LSN, end LSN, timestamp
        first = _field(batch.values, at + 1, np.where(kind == _BEGIN, 8, 1))
        second = _field(batch.values, at + np.where(kind == _BEGIN, 9, 2), 8)
        third = _field(batch.values, at + np.where(kind == _BEGIN, 17, 10), np.where(kind == _BEGIN, 4, 8))
        ts = np.where(kind == _BEGIN, second, _field(batch.values, at + 18, 8)).astype(np.int64)
        from_lsn = self.window.from_lsn
        final = None if self._tx is None else self._tx.final_lsn
        marks: list[tuple] = []
        for mark in zip(
            positions.tolist(), kind.tolist(), first.tolist(), second.tolist(), third.tolist(), ts.tolist()
        ):
            p, k, a, b, _, _ = mark
            if k == _BEGIN:
                if final is not None or a >= to_lsn or (from_lsn is not None and a < from_lsn):
                    return marks, p
                final = a
            elif final is None or b != final:  # a Commit
                return marks, p
            else:
                final = None
            marks.append(mark)
        return marks, stop


def _field(values: np.ndarray, at: np.ndarray, size: np.ndarray | int) -> np.ndarray:
    """The big-endian integers of ``size`` bytes (1, 4 or 8) at ``at`` (uint64; a signed 8-byte
    field is read back with ``astype(np.int64)``)."""
    width = 8
    if not len(at):
        return np.zeros(0, np.uint64)
    raw = values[np.minimum(at[:, None] + np.arange(width), len(values) - 1)].astype(np.uint64)
    whole = np.zeros(len(at), np.uint64)
    for i in range(width):
        whole = (whole << np.uint64(8)) | raw[:, i]
    return whole >> (np.uint64(8) * (width - np.broadcast_to(size, len(at)).astype(np.uint64)))


class _Run:
    """The bulk handling of one run of plain messages (see :meth:`BatchWindowCollector._run`).

    Rows are the run's captured changes; ``t`` numbers the run's transactions: 0 is the one open
    when the run starts (if any), ``k`` the one opened by the run's ``k``-th Begin."""

    def __init__(
        self,
        collector: BatchWindowCollector,
        batch: _Messages,
        rows: np.ndarray,
        oids: np.ndarray,
        marks: list[tuple],
        begins: np.ndarray,
    ):
        self.c, self.batch, self.rows, self.marks = collector, batch, rows, marks
        # Table versions (one per OID: a Relation message ends a run) and their data collections.
        self.oids, group = np.unique(oids, return_inverse=True)
        self.group = group.reshape(-1)
        tables = [collector._relations[oid][0].table for oid in self.oids.tolist()]
        names = [t.ref.data_collection for t in tables]
        self.collections = list(dict.fromkeys(names))
        counted_g = np.array([t.ref not in collector._uncounted for t in tables], bool)
        collection_g = np.array([self.collections.index(name) for name in names], np.int64)
        self.counted = counted_g[self.group] if len(rows) else np.zeros(0, bool)
        collection = collection_g[self.group] if len(rows) else np.zeros(0, np.int64)
        self.t = np.searchsorted(begins, rows)
        self.sizes = np.where(self.counted, batch.sizes[rows], 0)
        self._ordinals(collection, len(begins))

    def _ordinals(self, collection: np.ndarray, transactions: int) -> None:
        """``transaction.total_order`` / ``data_collection_order`` of each counted row, and what
        each transaction's counters grow by (per collection in order of first appearance)."""
        tx = self.c._tx
        counted, t = self.counted, self.t
        ncoll = max(len(self.collections), 1)
        self.count_of = np.bincount(t[counted], minlength=transactions + 1)
        self.counts: list[int] = self.count_of.tolist()
        # total: the counted rows before this one in its transaction, plus the open one's count
        running = np.cumsum(counted)
        before = np.concatenate([[0], np.cumsum(self.count_of)[:-1]])
        base = np.zeros(transactions + 1, np.int64)
        if tx is not None:
            base[0] = tx.total
        self.totals = np.where(counted, running - before[t] + base[t], 0)
        # order: the rank among the counted rows of the same (transaction, collection)
        key = (t * ncoll + collection)[counted]
        perm = np.argsort(key, kind="stable")
        ranked = key[perm]
        first = np.r_[True, ranked[1:] != ranked[:-1]] if len(ranked) else np.zeros(0, bool)
        index = np.arange(len(ranked))
        rank = index - np.maximum.accumulate(np.where(first, index, 0)) + 1
        order = np.empty(len(key), np.int64)
        order[perm] = rank
        if tx is not None and tx.per_collection:
            opened = np.array([tx.per_collection.get(name, 0) for name in self.collections], np.int64)
            order += np.where(key < ncoll, opened[np.minimum(key, ncoll - 1)], 0)
        self.orders = np.zeros(len(counted), np.int64)
        self.orders[counted] = order
        self.per_collection: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
        if len(self.collections) <= 1:
            return  # the transaction's count is its one collection's (see _grow)
        keys, first_index, counts = np.unique(key, return_index=True, return_counts=True)
        for k, f, n in zip(keys.tolist(), first_index.tolist(), counts.tolist()):
            self.per_collection[k // ncoll].append((f, k % ncoll, n))

    def _grow(self, t: int) -> None:
        """Add the run's rows of transaction ``t`` to its counters (before its Commit, or at the
        end of the run for the one left open)."""
        tx = self.c._tx
        if tx is None:
            return
        count = self.counts[t]
        if not count:
            return
        tx.total += count
        if len(self.collections) == 1:
            tx.per_collection[self.collections[0]] += count
            return
        for _, k, n in sorted(self.per_collection[t]):
            tx.per_collection[self.collections[k]] += n

    def apply(self, cut: int) -> None:
        """Chunk by chunk: the Begins and Commits before the chunk's last row, its rows, the flush."""
        c = self.c
        running = np.cumsum(self.counted)
        sizes = np.cumsum(self.sizes)
        nrows = len(self.rows)
        first_row, mark, t = 0, 0, 0
        transactions = [c._tx]
        while True:
            done_count = int(running[first_row - 1]) if first_row else 0
            done_bytes = int(sizes[first_row - 1]) if first_row else 0
            full = min(
                int(np.searchsorted(running, done_count + max(1, c.max_changes - c._buffered))),
                int(np.searchsorted(sizes, done_bytes + stream.MAX_CHUNK_BYTES - c._buffered_bytes)),
            )
            end_row = min(full + 1, nrows)
            end_pos = int(self.rows[full]) if full < nrows else cut
            marks = self.marks
            while mark < len(marks) and marks[mark][0] < end_pos:
                _, kind, final_lsn, _, xid, ts = marks[mark]
                if kind == _BEGIN:  # checked by _transaction_marks as _on_message would
                    c._open_transaction(xid, final_lsn, pg_timestamp_to_unix_us(ts))
                    t += 1
                    transactions.append(c._tx)
                else:
                    self._grow(t)
                    c._end_transaction(c._tx)
                mark += 1
            self._add(first_row, end_row, transactions)
            if full >= nrows:
                break
            c._flush_chunk()
            first_row = end_row
        self._grow(t)

    def _add(self, first: int, end: int, transactions: list) -> None:
        """Rows ``first:end`` into their table versions' buffers, in order of first appearance."""
        if end <= first:
            return
        c, batch = self.c, self.batch
        low = int(self.t[first])  # the rows' transactions are low..t[end - 1], in order
        t = self.t[first:end] - low
        chunk_index = np.array([tx.chunk_index for tx in transactions[low : int(self.t[end - 1]) + 1]], np.int32)
        group = self.group[first:end]
        seen, first_index = np.unique(group, return_index=True)
        for g in seen[np.argsort(first_index)].tolist():
            select = np.flatnonzero(group == g) + first
            buffer = c._buffer(int(self.oids[g]))
            rows = self.rows[select]
            buffer.add_many(
                batch.data.take(pa.array(rows)),
                batch.lsns[rows],
                chunk_index[t[select - first]],
                self.totals[select],
                self.orders[select],
            )
        counted = int(np.count_nonzero(self.counted[first:end]))
        c.stats.changes += counted
        c._buffered += counted
        c._buffered_bytes += int(self.sizes[first:end].sum())


__all__ = ["BatchWindowCollector"]
