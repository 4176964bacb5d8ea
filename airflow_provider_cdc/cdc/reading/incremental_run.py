"""The incremental snapshot's part of one stream window's job, for every source.

While the window is read: signal-table inserts are collected, changes that supersede staged
chunk rows are noted, and (where the source can tell) transactions the chunk reads may not have
seen are remembered per table. After the window is read: the chunks staged by the previous window
are emitted, the signals are applied in commit order, and new chunks are read and staged.
Everything lands with the window's commit; the new state goes into the commit entry, and from
there into the offset (see :func:`planning.offset_after_commit`).

A source plugs in its :class:`~.chunks.ChunkReader` (reading), :class:`~.chunks.ChunkPositions`
(comparing its events with watermarks), an ``emit`` function (the ``op = r`` events of a chunk,
with its source block) and optionally a :class:`Visibility` (PostgreSQL's in-flight transactions).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc.cdc.basics.errors import CdcStateError
from airflow_provider_cdc.cdc.basics.naming import Topic, landed_path_problem
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.planning.incremental import (
    WATERMARK_SIGNAL_TYPES,
    IncrementalState,
    Signal,
    SignalError,
    StagedChunk,
    apply_signal,
)
from airflow_provider_cdc.cdc.planning.spec import CaptureOptions
from airflow_provider_cdc.cdc.reading.chunks import (
    CHUNK_ID_FIELD,
    ChunkKeyWatch,
    ChunkPositions,
    ChunkReader,
    iter_chunk_events,
    read_chunks,
    staged_topic,
)

log = logging.getLogger(__name__)

FlushFn = Callable[[dict[str, list[pa.RecordBatch]], pa.RecordBatch | None], None]


class Visibility(Protocol):
    """Which of a window's transactions a chunk read may not have seen (see ``read_chunks``)."""

    def note(self, ref: TableRef, batch: pa.RecordBatch) -> None:
        """Look at a chunk of ``ref``'s events of this window."""

    def unseen(self, ref: TableRef, snapshot: str | None) -> bool:
        """Did a transaction of this window (or carried from an earlier one) that changed ``ref``
        stay invisible to a chunk read that saw ``snapshot``?"""

    def carried(self) -> tuple[int, ...]:
        """What the next window has to keep checking (``IncrementalState.unresolved_xids``)."""


class EverythingSeen:
    """A source whose chunk reads see every transaction committed before their low watermark."""

    def note(self, ref: TableRef, batch: pa.RecordBatch) -> None:
        return None

    def unseen(self, ref: TableRef, snapshot: str | None) -> bool:
        return False

    def carried(self) -> tuple[int, ...]:
        return ()


class IncrementalRun:
    def __init__(
        self,
        *,
        state: IncrementalState | None,
        tables: dict[TableRef, Any],
        topic_prefix: str,
        signal_table: TableRef | None,
        options: CaptureOptions,
        positions: ChunkPositions,
        visibility: Visibility | None = None,
    ):
        self.tables = tables
        self.state = state or IncrementalState()
        self.topic_prefix = topic_prefix
        check_staged_paths(self.state.staged, topic_prefix)
        self.signal_table = signal_table
        self.options = options
        self.visibility = visibility or EverythingSeen()
        self.watch = ChunkKeyWatch(self.state.staged, topic_prefix, positions)
        self._table_topics = {Topic.for_table(topic_prefix, r.schema, r.name).name: r for r in self.tables}
        signal = signal_table
        self._signal_topic = None if signal is None else Topic.for_table(topic_prefix, signal.schema, signal.name)
        self._signal_is_captured = signal in self.tables
        self._signal_rows: list[tuple[Any, int, Any, Any, Any]] = []
        self.emitted: tuple[StagedChunk, ...] = ()
        self.notes: list[str] = []
        self.counts = {"emitted_chunks": 0, "emitted_rows": 0, "superseded_rows": 0, "staged_chunks": 0}

    @property
    def uncounted(self) -> frozenset[TableRef]:
        """The signal table, when it is read only for its signals."""
        signal = self.signal_table
        return frozenset() if signal is None or self._signal_is_captured else frozenset({signal})

    @property
    def staged_topics(self) -> list[Topic]:
        return [staged_topic(self.topic_prefix, ref) for ref in self.tables]

    def wrap(self, flush: FlushFn) -> FlushFn:
        """The reader's flush, watching each chunk of events before it is written."""

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
                        self.visibility.note(ref, batch)
            flush(batches, transactions)

        return observed

    def _collect_signals(self, batch: pa.RecordBatch) -> None:
        commit = pc.struct_field(batch.column("source"), "commit_lsn").to_pylist()
        order = pc.struct_field(batch.column("transaction"), "total_order").to_pylist()
        after = batch.column("after")
        ids, types, data = (pc.struct_field(after, n).to_pylist() for n in ("id", "type", "data"))
        for i, op in enumerate(batch.column("op").to_pylist()):
            if op in ("c", "r"):
                self._signal_rows.append((commit[i], order[i] or 0, ids[i], types[i], data[i]))

    def finish(
        self,
        reader: ChunkReader | None,
        *,
        writer: Any,
        sink: Any,
        encoder_for: Callable[[Any], Any],
        emit: Callable[[StagedChunk, pa.Array], pa.RecordBatch],
        window_id: str,
        position: str,
    ) -> dict[str, Any]:
        """Emit the previous window's chunks, apply signals, read new chunks; returns the stats.
        Chunks are written and staged with the window (``writer``); the previous window's staged
        chunks are read back from the ``sink``. (``reader`` None: the source cannot read chunks as
        configured, see ``Capture.incremental_unavailable``.)"""
        write = writer.write_batches
        stage = stage_into(writer, self.topic_prefix)

        def read_dataset(path: str, chunk_id: str) -> pa.Table:
            return read_staged(sink, path, chunk_id)

        prefix = self.topic_prefix
        for chunk, batch, superseded in iter_chunk_events(self.state.staged, self.watch, emit, read_dataset):
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
        if state.active and not state.paused and reader is None:
            self.notes.append("incremental snapshot waiting: this capture cannot read chunks (no signal table)")
        elif state.active and not state.paused and reader is not None:
            state, notes = read_chunks(
                state,
                self.tables,
                reader,
                encoder_for=encoder_for,
                window_id=window_id,
                chunk_size=self.options.incremental_chunk_size,
                max_chunks=self.options.incremental_chunks_per_run,
                stage=stage,
                unseen=self.visibility.unseen,
            )
            self.notes += notes
            self.counts["staged_chunks"] = len(state.staged)
        state = replace(state, unresolved_xids=self.visibility.carried())
        self.state = state
        return {"incremental": state.to_dict(), "incremental_run": {**self.counts, "notes": self.notes}}


# -- the staged chunks in the sink -----------------------------------------------------------------


def check_staged_paths(chunks: Sequence[StagedChunk], topic_prefix: str) -> None:
    """Staged chunks come from the offset, which others can edit: each path must be where this
    capture stages that table's chunks (it is read, then deleted, after the chunk is emitted)."""
    for chunk in chunks:
        directory = staged_topic(topic_prefix, chunk.table).directory
        head, _, attempt = str(chunk.path).rpartition("/attempt=")
        window_id = head.rpartition("/window=")[2]
        if not str(chunk.path).startswith(f"{directory}/window="):
            problem: str | None = f"it is not under {directory}/, where {chunk.table}'s chunks are staged"
        else:
            problem = landed_path_problem(topic_prefix, chunk.path, window_id, attempt, parts=4)
        if problem:
            raise CdcStateError(
                f"the offset's staged incremental-snapshot chunk {chunk.chunk_id!r} has path {chunk.path!r}: "
                f"{problem}. "
                "The offset was edited; nothing was read or deleted. Restore the offset, or stop the incremental "
                "snapshot (stop-snapshot) after removing the chunk from it"
            )


def stage_into(writer: Any, topic_prefix: str) -> Callable[[TableRef, pa.RecordBatch], str]:
    """``stage(table, batch) -> dataset path``: a chunk's rows written with the window's commit."""

    def stage(ref: TableRef, batch: pa.RecordBatch) -> str:
        topic = staged_topic(topic_prefix, ref)
        writer.write_batches(topic, [batch])
        return writer.dataset_path(topic)

    return stage


def read_staged(sink: Any, path: str, chunk_id: str) -> pa.Table:
    """One chunk of a staged dataset written by the previous window (each chunk is its own file,
    so the filter skips the others by their statistics)."""
    if sink.arrow_writes:  # local or object store: Arrow reads it (Spark cannot reach an object store)
        import pyarrow.dataset as ds

        return sink.read_dataset(path, filter=ds.field(CHUNK_ID_FIELD) == chunk_id)
    from pyspark.sql import functions as F

    uri = sink.storage.dataset_uri(path)
    return sink.spark_provider().read.parquet(uri).where(F.col(CHUNK_ID_FIELD) == chunk_id).toArrow()


def drop_emitted_chunks(sink: Any, chunks: Any) -> None:
    # Staged rows are garbage once the window that emitted them is committed; a failure here
    # leaves only unreferenced files behind.
    for path in sorted({c.path.rsplit("/attempt=", 1)[0] for c in chunks}):
        try:
            sink.storage.delete_tree(path)
        except OSError as exc:  # pragma: no cover - best effort
            log.warning("could not remove staged chunks %s: %s", path, exc)
