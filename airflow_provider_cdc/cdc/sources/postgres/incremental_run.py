"""The incremental snapshot's part of one stream window's job.

While the window is read: signal-table inserts are collected, changes that supersede staged
chunk rows are noted, and transactions that were still in flight when the job started are
remembered per table. After the window is read: the chunks staged by the previous window are
emitted, the signals are applied in commit order, and new chunks are read and staged. Everything
lands with the window's commit; the new state goes into the commit entry, and from there into the
offset (see :func:`planning.offset_after_commit`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc.cdc.naming import Topic
from airflow_provider_cdc.cdc.sources.postgres.chunks import (
    ChunkKeyWatch,
    Watermarks,
    iter_chunk_events,
    read_chunks,
    staged_topic,
)
from airflow_provider_cdc.cdc.sources.postgres.events import EventContext
from airflow_provider_cdc.cdc.sources.postgres.incremental import (
    WATERMARK_SIGNAL_TYPES,
    IncrementalState,
    Signal,
    SignalError,
    XidSnapshot,
    apply_signal,
)
from airflow_provider_cdc.cdc.sources.postgres.spec import PostgresJobSpec
from airflow_provider_cdc.cdc.sources.postgres.tables import TableInfo, TableRef

log = logging.getLogger(__name__)

FlushFn = Callable[[dict[str, list[pa.RecordBatch]], pa.RecordBatch | None], None]


class IncrementalRun:
    def __init__(self, spec: PostgresJobSpec, tables: dict[TableRef, TableInfo], baseline: XidSnapshot):
        self.spec = spec
        self.tables = {ref: t for ref, t in tables.items() if ref in spec.tables}
        self.state = spec.incremental or IncrementalState()
        self.watch = ChunkKeyWatch(self.state.staged, spec.topic_prefix)
        self.baseline = baseline
        self._table_topics = {Topic.for_table(spec.topic_prefix, r.schema, r.name).name: r for r in self.tables}
        signal = spec.signal_table
        self._signal_topic = None if signal is None else Topic.for_table(spec.topic_prefix, signal.schema, signal.name)
        self._signal_is_captured = signal in self.tables
        self._signal_rows: list[tuple[int, int, Any, Any, Any]] = []
        # Transactions of this window's events that the job's starting snapshot did not see (in
        # flight then, or committed but held back), per table, and those carried from earlier
        # windows; ``unseen`` checks chunk reads against them.
        self._in_flight: dict[TableRef, set[int]] = {}
        carried = np.array(self.state.unresolved_xids, dtype=np.int64)
        # Once the job's starting snapshot sees a carried transaction, every later read does.
        self._unresolved = {int(x) for x in carried[~baseline.sees(carried)]} if len(carried) else set()
        self._resolved: set[int] = set()
        self.notes: list[str] = []
        self.counts = {"emitted_chunks": 0, "emitted_rows": 0, "superseded_rows": 0, "staged_chunks": 0}

    @property
    def uncounted(self) -> frozenset[TableRef]:
        """The signal table, when it is read only for its signals."""
        signal = self.spec.signal_table
        return frozenset() if signal is None or self._signal_is_captured else frozenset({signal})

    @property
    def staged_topics(self) -> list[Topic]:
        return [staged_topic(self.spec.topic_prefix, ref) for ref in self.tables]

    def wrap(self, flush: FlushFn) -> FlushFn:
        """The collector's flush, watching each chunk of events before it is written."""

        def observed(batches: dict[str, list[pa.RecordBatch]], transactions: pa.RecordBatch | None) -> None:
            if self._signal_topic is not None:
                signal_batches = batches.get(self._signal_topic.name, [])
                if not self._signal_is_captured:
                    batches = {k: v for k, v in batches.items() if k != self._signal_topic.name}
                for batch in signal_batches:
                    self._collect_signals(batch)
            self.watch.observe(batches)
            for topic, topic_batches in batches.items():
                ref = self._table_topics.get(topic)
                if ref is not None:
                    for batch in topic_batches:
                        self._note_in_flight(ref, batch)
            flush(batches, transactions)

        return observed

    def _collect_signals(self, batch: pa.RecordBatch) -> None:
        source = batch.column("source")
        commit = pc.struct_field(source, "commit_lsn").to_pylist()
        order = pc.struct_field(batch.column("transaction"), "total_order").to_pylist()
        after = batch.column("after")
        ids, types, data = (pc.struct_field(after, n).to_pylist() for n in ("id", "type", "data"))
        for i, op in enumerate(batch.column("op").to_pylist()):
            if op in ("c", "r"):
                self._signal_rows.append((commit[i] or 0, order[i] or 0, ids[i], types[i], data[i]))

    def _note_in_flight(self, ref: TableRef, batch: pa.RecordBatch) -> None:
        xids = pc.struct_field(batch.column("source"), "txId").fill_null(0).to_numpy(zero_copy_only=False)
        xids = np.unique(xids[xids != 0] & 0xFFFFFFFF)
        hit = xids[~self.baseline.sees(xids)] if len(xids) else xids
        if len(hit):
            self._in_flight.setdefault(ref, set()).update(int(x) for x in hit)

    def unseen(self, ref: TableRef, snapshot: XidSnapshot) -> bool:
        """Did a transaction that changed ``ref`` in this window, or any carried from an earlier
        window, stay invisible to the chunk's ``snapshot``? Its changes precede the chunk's low
        watermark, so no later stream event can supersede the chunk's stale rows."""
        xids = sorted(self._in_flight.get(ref, set()) | self._unresolved)
        if not xids:
            return False
        seen = snapshot.sees(np.array(xids, dtype=np.int64))
        self._resolved.update(x for x, s in zip(xids, seen) if s)
        return not seen.all()

    def unresolved_xids(self) -> tuple[int, ...]:
        """What the next window carries: this window's and earlier held-back transactions that no
        chunk read has seen yet."""
        candidates = self._unresolved.union(*self._in_flight.values())
        return tuple(sorted(candidates - self._resolved))

    def finish(
        self,
        conn: Any,
        context: EventContext,
        write: Callable[[Topic, list[pa.RecordBatch]], None],
        stage: Callable[[TableRef, pa.RecordBatch], str],
        read_dataset: Callable[[str, str], pa.Table],
        position: str,
    ) -> dict[str, Any]:
        """Emit the previous window's chunks, apply signals, read new chunks; returns the stats."""
        prefix = self.spec.topic_prefix
        for chunk, batch, superseded in iter_chunk_events(self.state.staged, self.watch, context, read_dataset):
            if batch.num_rows:
                write(Topic.for_table(prefix, chunk.table.schema, chunk.table.name), [batch])
            self.counts["emitted_chunks"] += 1
            self.counts["emitted_rows"] += batch.num_rows
            self.counts["superseded_rows"] += superseded
            log.info(
                "incremental chunk %s of %s: %d rows emitted, %d superseded by the stream",
                chunk.chunk_id,
                chunk.table,
                batch.num_rows,
                superseded,
            )
        self.emitted = self.state.staged
        state = replace(self.state, staged=())
        for commit, _, signal_id, kind, data in sorted(self._signal_rows, key=lambda r: (r[0], r[1])):
            if kind in WATERMARK_SIGNAL_TYPES:
                continue
            try:
                signal = Signal.parse(signal_id, kind, data, origin="signal table")
                state, note = apply_signal(state, signal, list(self.tables), position=f"{position} (commit {commit})")
            except SignalError as exc:
                note = f"rejected: {exc}"
                log.warning("%s", note)
            else:
                log.info("%s", note)
            self.notes.append(note)
        if state.active and not state.paused:
            options = self.spec.options
            state, notes = read_chunks(
                conn,
                state,
                self.tables,
                settings=self.spec.events,
                window_id=context.window_id,
                chunk_size=options.incremental_chunk_size,
                max_chunks=options.incremental_chunks_per_run,
                watermarks=Watermarks(self.spec.incremental_watermarks, self.spec.signal_table),
                stage=stage,
                unseen=self.unseen,
            )
            self.notes += notes
            self.counts["staged_chunks"] = len(state.staged)
        state = replace(state, unresolved_xids=self.unresolved_xids())
        self.state = state
        return {"incremental": state.to_dict(), "incremental_run": {**self.counts, "notes": self.notes}}
