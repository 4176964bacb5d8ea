"""Incremental snapshot chunks, for every source: reading them, and emitting them a window later.

See :mod:`.incremental` for the algorithm. A source supplies a :class:`ChunkReader` (how one
chunk is read between its watermarks, in its SQL) and :class:`ChunkPositions` (how its events'
commit positions compare with the watermarks, and which of its events a chunk's read could not
have seen); everything else is here. Reading happens at the end of a stream window's job (after
its stream, so the window's transactions are known); the chunk's rows are staged in the sink with
that window's commit. The next window's job watches its stream for changes to staged keys
(:class:`ChunkKeyWatch`) and then emits what survives (:func:`iter_chunk_events`).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc.cdc.basics import faults
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.naming import Topic, is_staged_topic, staged_topic
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.events.envelope import Op
from airflow_provider_cdc.cdc.planning.incremental import IncrementalState, StagedChunk, TableProgress
from airflow_provider_cdc.cdc.planning.row_filter import Column, Node, parse_filter, resolve_columns

log = logging.getLogger(__name__)

CHUNK_ID_FIELD = "chunk_id"

__all__ = [
    "CHUNK_ID_FIELD",
    "ChunkKeyWatch",
    "ChunkPlan",
    "ChunkPositions",
    "ChunkRead",
    "ChunkReader",
    "is_staged_topic",
    "iter_chunk_events",
    "read_chunks",
    "staged_topic",
    "surviving_rows",
]


# -- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkPlan:
    """What to read next for one table: the source's table description (``ref``, ``key_columns``)
    and event encoder (``columns``, ``key_columns``, ``layout``), and the table's progress."""

    table: Any
    encoder: Any
    progress: TableProgress

    @property
    def ref(self) -> TableRef:
        return self.table.ref

    @property
    def order_columns(self) -> tuple[str, ...]:
        """The columns chunks are ordered and paginated by."""
        if self.progress.surrogate_key:
            return (self.progress.surrogate_key,)
        return tuple(self.table.key_columns)

    @property
    def match_columns(self) -> tuple[str, ...]:
        """What identifies a row when a stream change supersedes a chunk row: the key, or the
        surrogate key for a table without one."""
        return tuple(self.table.key_columns) or self.order_columns

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.encoder.columns]

    @property
    def unmasked_columns(self) -> list[str]:
        """Captured columns whose values the events carry as they are: the only ones a filter or
        a surrogate key may use (selecting or ordering by a masked column would reveal it)."""
        masks = getattr(self.encoder, "masks", None) or [None] * len(self.encoder.columns)
        return [c.name for c, mask in zip(self.encoder.columns, masks) if mask is None]

    def row_filter(self, fold: Callable[[str], str] | None) -> tuple[Node, dict[Column, str]] | None:
        """The table's filter and its columns' names, parsed again from the stored text (an offset is
        not trusted to hold what the signal gave); None without one. ``fold``: see
        :func:`row_filter.resolve_columns`."""
        if not self.progress.condition:
            return None
        node = parse_filter(self.progress.condition, what=f"the stored filter of {self.ref}")
        return node, resolve_columns(node, self.unmasked_columns, fold=fold, table=str(self.ref))

    def check(self) -> None:
        """Fail with a clear message when this table cannot be chunked as asked."""
        if not self.order_columns:
            raise CdcConfigurationError(
                f"{self.ref} has no primary key: an incremental snapshot needs one, or a surrogate-key column"
            )
        names = self.column_names
        missing = [c for c in (*self.order_columns, *self.match_columns) if c not in names]
        if missing:
            raise CdcConfigurationError(
                f"column(s) {', '.join(missing)} of {self.ref} are not captured (or do not exist); the incremental "
                "snapshot orders and matches rows by them"
            )
        surrogate = self.progress.surrogate_key
        if surrogate and surrogate not in self.unmasked_columns:
            raise CdcConfigurationError(
                f"surrogate-key {surrogate!r} of {self.ref} is a masked column: ordering chunks by it would reveal "
                "its values (chunk bounds are kept in the offset); choose an unmasked column"
            )


@dataclass(frozen=True)
class ChunkRead:
    after: list[pa.Array]  # typed value structs, in key order
    rows: int
    last_key: tuple[str, ...] | None  # in the source's text form
    low_lsn: int | None  # None: found later by ChunkReader.settle
    high_lsn: int | None
    snapshot: str | None  # what the read saw, in the source's text form (None: nothing to check)
    read_ts_ms: int


class ChunkReader(Protocol):
    """A source's reading of chunks (its SQL, its watermarks)."""

    def max_key(self, plan: ChunkPlan) -> tuple[str, ...] | None:
        """The table's last key now (text form), or None when it has no rows to read."""

    def read(self, plan: ChunkPlan, chunk_id: str, limit: int) -> ChunkRead:
        """One chunk after ``plan.progress.last_key`` up to its max key, between two watermarks."""

    def settle(self, chunks: list[StagedChunk]) -> list[StagedChunk]:
        """The chunks of this run with their watermark positions (a source that learns them only
        from its change log fills them in here; the others return ``chunks``)."""

    def table_failure(self, exc: BaseException) -> bool:
        """Is ``exc`` a failure of one table's read (mark it failed, go on with the others), rather
        than of the session (the run fails and retries)?"""


def read_chunks(
    state: IncrementalState,
    tables: dict[TableRef, Any],
    reader: ChunkReader,
    *,
    encoder_for: Callable[[Any], Any],
    window_id: str,
    chunk_size: int,
    max_chunks: int,
    stage: Callable[[TableRef, pa.RecordBatch], str],
    unseen: Callable[[TableRef, str | None], bool] = lambda ref, snapshot: False,
) -> tuple[IncrementalState, list[str]]:
    """Read up to ``max_chunks`` chunks of the active tables, in order, staging each with
    ``stage(table, batch) -> dataset path``. A table that cannot be read (a bad condition, a
    missing column, no key, dropped) is marked failed and the others continue.

    ``unseen(table, snapshot)``: does this window hold a change of ``table`` by a transaction the
    chunk's read did not see? Such a change precedes the chunk's watermarks, so it could not be
    matched later: the chunk is not kept, and the table retries it in the next run."""
    notes: list[str] = []
    before = len(state.staged)
    staged = list(state.staged)
    budget = max_chunks
    for progress in state.active:
        if budget <= 0:
            break
        table = tables.get(progress.table)
        try:
            if table is None:
                raise CdcConfigurationError(f"{progress.table} is not captured any more")
            plan = ChunkPlan(table, encoder_for(table), progress)
            plan.check()
            if progress.max_key is None:
                max_key = reader.max_key(plan)
                if max_key is None:
                    progress = replace(progress, status="done")
                    notes.append(f"incremental snapshot of {plan.ref}: no rows to read")
                    state = state.with_table(progress)
                    continue
                progress = replace(progress, status="running", max_key=max_key)
                plan = replace(plan, progress=progress)
            while budget > 0 and progress.active:
                # Unique across retries of the window and captures sharing a signal table.
                chunk_id = f"{window_id}-{len(staged) + 1:04d}-{secrets.token_hex(4)}"
                read = reader.read(plan, chunk_id, chunk_size)
                budget -= 1
                if unseen(plan.ref, read.snapshot):
                    notes.append(
                        f"chunk {chunk_id} of {plan.ref} not kept: a committed change was not yet visible "
                        "to its read (a commit waiting for a synchronous standby?); it is read again in the next run"
                    )
                    budget = 0
                    break
                # Done when the chunk came back short, or ended at the max key (no empty last read).
                done = read.rows < chunk_size or read.last_key == progress.max_key
                if read.rows:
                    path = stage(plan.ref, _staged_batch(chunk_id, read.after))
                    faults.point("incremental.chunk_staged")
                    staged.append(
                        StagedChunk(
                            chunk_id=chunk_id,
                            table=plan.ref,
                            signal_id=progress.signal_id,
                            path=path,
                            rows=read.rows,
                            low_lsn=-1 if read.low_lsn is None else read.low_lsn,
                            high_lsn=-1 if read.high_lsn is None else read.high_lsn,
                            snapshot=read.snapshot,
                            match_columns=plan.match_columns,
                            key_columns=tuple(plan.encoder.key_columns),
                            read_ts_ms=read.read_ts_ms,
                        )
                    )
                progress = replace(
                    progress,
                    status="done" if done else "running",
                    last_key=read.last_key or progress.last_key,
                    chunks=progress.chunks + (1 if read.rows else 0),
                    rows=progress.rows + read.rows,
                )
                plan = replace(plan, progress=progress)
            state = state.with_table(progress)
            if not progress.active:
                notes.append(f"incremental snapshot of {plan.ref}: all {progress.rows} rows read")
        except Exception as exc:
            if not isinstance(exc, CdcConfigurationError) and not reader.table_failure(exc):
                raise  # the session died: the run fails and retries, nothing is lost
            message = _failure_message(exc, progress)
            log.warning("incremental snapshot of %s failed: %s", progress.table, message)
            notes.append(f"incremental snapshot of {progress.table} failed: {message}")
            state = state.with_table(replace(progress, status="failed", error=message))
    staged[before:] = reader.settle(staged[before:])
    return replace(state, staged=tuple(staged)), notes


def _failure_message(exc: Exception, progress: TableProgress) -> str:
    """What the log, the offset and XCom say of a table's failed read. A server's own error text
    is left out when the table has a filter: the filter's author chose the values the server
    quotes back, and an error is how a crafted query would carry data out."""
    if isinstance(exc, CdcConfigurationError) or not progress.condition:
        return " ".join(str(exc).split())
    state = getattr(exc, "sqlstate", None) or (exc.args[0] if exc.args and isinstance(exc.args[0], str) else None)
    code = f", SQLSTATE {state}" if state and len(str(state)) <= 5 else ""
    return (
        f"the server refused the chunk query with the filter {progress.condition!r} ({type(exc).__name__}{code}); "
        "check that each value suits its column's type"
    )


def _staged_batch(chunk_id: str, after: list[pa.Array]) -> pa.RecordBatch:
    values = pa.concat_arrays(after) if len(after) > 1 else after[0]
    return pa.RecordBatch.from_arrays(
        [pa.repeat(pa.scalar(chunk_id), len(values)), values], names=[CHUNK_ID_FIELD, "after"]
    )


# -- emitting ----------------------------------------------------------------------------------


class ChunkPositions(Protocol):
    """How a source's events compare with chunk watermarks."""

    def commits(self, source: pa.Array) -> pa.Array:
        """The events' commit positions (from their ``source`` blocks), comparable with :meth:`bound`."""

    def bound(self, position: int) -> Any:
        """A watermark position as a scalar comparable with :meth:`commits`."""

    def unseen(self, source: pa.Array, chunk: StagedChunk) -> np.ndarray | None:
        """Which events' transactions the chunk's read did not see (None: it saw every committed one)."""


class ChunkKeyWatch:
    """Watches a window's events for changes that supersede rows of staged chunks.

    A chunk row is superseded when its key is changed by a transaction that commits before the
    chunk's high watermark and either commits after its low watermark (DBLog's rule) or was not
    visible to the chunk's read (a commit still in flight when the chunk was read). A TRUNCATE
    under the same condition supersedes every row of the chunk."""

    def __init__(self, chunks: Sequence[StagedChunk], topic_prefix: str, positions: ChunkPositions):
        self._positions = positions
        self._by_topic: dict[str, list[StagedChunk]] = {}
        for chunk in chunks:
            topic = Topic.for_table(topic_prefix, chunk.table.schema, chunk.table.name).name
            self._by_topic.setdefault(topic, []).append(chunk)
        self._keys: dict[str, list[pa.Table]] = {c.chunk_id: [] for c in chunks}
        self.truncated: set[str] = set()

    def observe(self, batches: dict[str, list[pa.RecordBatch]]) -> None:
        for topic, chunks in self._by_topic.items():
            for batch in batches.get(topic, ()):
                self._observe(batch, chunks)

    def _observe(self, batch: pa.RecordBatch, chunks: list[StagedChunk]) -> None:
        source = batch.column("source")
        commit = self._positions.commits(source)
        for chunk in chunks:
            before_high = pc.less(commit, self._positions.bound(chunk.high_lsn))
            after_low = pc.greater_equal(commit, self._positions.bound(chunk.low_lsn))
            unseen = self._positions.unseen(source, chunk)
            if unseen is not None:
                after_low = pc.or_(after_low, pa.array(unseen))
            mask = pc.and_(before_high, after_low).fill_null(False)
            if not pc.any(mask).as_py():
                continue
            ops = pc.filter(batch.column("op"), mask)
            if pc.any(pc.equal(ops, Op.TRUNCATE)).as_py():
                self.truncated.add(chunk.chunk_id)
            before, after = (pc.filter(batch.column(n), mask) for n in ("before", "after"))
            self._keys[chunk.chunk_id].append(
                pa.table({f"k{i}": _field(after, before, c) for i, c in enumerate(chunk.match_columns)})
            )

    def superseded(self, chunk: StagedChunk) -> pa.Table | None:
        """Distinct keys of ``chunk``'s table changed inside its watermark window."""
        tables = [t for t in self._keys.get(chunk.chunk_id, ()) if t.num_rows]
        if not tables:
            return None
        keys = pa.concat_tables(tables, promote_options="permissive")
        keys = keys.filter(pc.invert(pc.is_null(keys.column(0))))  # truncates carry no key
        return keys.group_by(keys.column_names).aggregate([])


def _field(after: pa.Array, before: pa.Array, name: str) -> pa.Array:
    def get(struct: pa.Array) -> pa.Array | None:
        try:
            return pc.struct_field(struct, name)
        except (KeyError, pa.ArrowInvalid):
            return None

    new, old = get(after), get(before)
    if new is None or old is None:
        return new if new is not None else old if old is not None else pa.nulls(len(after))
    return pc.coalesce(new, old.cast(new.type)) if old.type != new.type else pc.coalesce(new, old)


def surviving_rows(chunk: StagedChunk, after: pa.Array, watch: ChunkKeyWatch) -> pa.Array:
    """The chunk's rows whose keys no stream change superseded."""
    if chunk.chunk_id in watch.truncated:
        return after.slice(0, 0)
    keys = watch.superseded(chunk)
    if keys is None or not len(after):
        return after
    rows = pa.table({f"k{i}": pc.struct_field(after, c) for i, c in enumerate(chunk.match_columns)})
    rows = rows.append_column("__row", pa.array(np.arange(len(after))))
    keys = pa.table(
        [keys.column(i).cast(rows.column(i).type) for i in range(keys.num_columns)], names=keys.column_names
    )
    try:
        kept = rows.join(keys, keys=keys.column_names, join_type="left anti").column("__row").combine_chunks()
        return after.take(pc.take(kept, pc.sort_indices(kept)))  # the join does not keep row order
    except pa.ArrowNotImplementedError:  # key types Arrow's hash join does not support
        changed = set(zip(*(keys.column(i).to_pylist() for i in range(keys.num_columns))))
        values = zip(*(rows.column(i).to_pylist() for i in range(keys.num_columns)))
        return after.filter(pa.array([v not in changed for v in values]))


def staged_rows(read_dataset: Callable[[str, str], pa.Table], chunk: StagedChunk) -> pa.Array:
    """The staged rows of one chunk, in key order."""
    table = read_dataset(chunk.path, chunk.chunk_id)
    rows = table.filter(pc.equal(table.column(CHUNK_ID_FIELD), chunk.chunk_id)).column("after")
    return rows.combine_chunks() if isinstance(rows, pa.ChunkedArray) else rows


def iter_chunk_events(
    chunks: Sequence[StagedChunk],
    watch: ChunkKeyWatch,
    emit: Callable[[StagedChunk, pa.Array], pa.RecordBatch],
    read_dataset: Callable[[str, str], pa.Table],
) -> Iterator[tuple[StagedChunk, pa.RecordBatch, int]]:
    """For each staged chunk: the ``op = r`` events of its surviving rows (``emit``, positioned at
    its high watermark) and how many rows the stream superseded."""
    for chunk in chunks:
        after = staged_rows(read_dataset, chunk)
        kept = surviving_rows(chunk, after, watch)
        yield chunk, emit(chunk, kept), len(after) - len(kept)
