"""Query-based watermark extraction, for every source: for tables or views without log-based capture.

Each run reads, in one consistent read, the rows whose cursor column (a timestamp, or a
monotonically increasing number) lies in ``(watermark - lookback, max(cursor)]``, and moves the
watermark to that maximum. The lookback re-reads a band below the watermark so rows of
transactions that committed late (their cursor value was taken before commit, so it can be below
a watermark already passed) are still picked up. Rows of the band that an earlier run already
emitted unchanged are dropped: each run stores the exact text of the rows it emitted inside the
next run's band ("seen" rows), committed with the window.

Deletes are invisible to this mode, and a row changed twice between runs is seen once, in its
last state. Rows are events in the same envelope as the log-based capture: ``op = "r"`` (or, with
a ``created_column``, ``"c"`` for rows created after the previous watermark and ``"u"`` for the
others), ``source.snapshot = "query"``, no position and no transaction.

A source gives a :class:`QuerySource`: its read of the band in one snapshot (its SQL) and its
events' ``source`` block; PostgreSQL's is :mod:`.sources.postgres.query`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from airflow_provider_cdc import __version__
from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcStateError, InvalidOffsetError
from airflow_provider_cdc.cdc.basics.naming import Topic, landed_path_problem, topic_directory
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.basics.window import Window, window_id_for
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry

if TYPE_CHECKING:  # pyarrow loads when a window runs, not when a DAG file (QueryExtraction) is parsed
    import pyarrow as pa

    from airflow_provider_cdc.cdc.sinks.parquet import ParquetSink

log = logging.getLogger(__name__)

QUERY_CONNECTOR = "postgresql-query"  # the offset's connector name (kept: stored offsets carry it)
OFFSET_FORMAT = 1


@dataclass(frozen=True)
class QueryExtraction:
    """What to extract and how (validated without I/O)."""

    topic_prefix: str
    table: TableRef
    cursor_column: str
    key_columns: tuple[str, ...] = ()  # default: the table's primary key (required for views)
    lookback: float = 0.0  # seconds for a temporal cursor, units for a numeric one
    created_column: str | None = None

    def __post_init__(self) -> None:
        if not self.cursor_column:
            raise CdcConfigurationError("cursor_column is required")
        if isinstance(self.lookback, bool) or not isinstance(self.lookback, (int, float)) or self.lookback < 0:
            raise CdcConfigurationError(f"lookback must be a number of seconds (or units) ≥ 0, got {self.lookback!r}")


@dataclass(frozen=True)
class QueryOffset:
    """The stored progress of one extraction: the watermark (PostgreSQL text of the cursor's last
    maximum) and the last committed window. Kept under its own topic prefix."""

    topic_prefix: str
    table: TableRef
    cursor_column: str
    watermark: str | None = None
    window_seq: int = 0
    seen_path: str | None = None  # the rows of the next run's band emitted so far
    revision: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": OFFSET_FORMAT,
                "connector": QUERY_CONNECTOR,
                "topic_prefix": self.topic_prefix,
                "table": self.table.to_json(),
                "cursor_column": self.cursor_column,
                "watermark": self.watermark,
                "window_seq": self.window_seq,
                "seen_path": self.seen_path,
                "revision": self.revision,
                "provider_version": __version__,
                **({"extra": self.extra} if self.extra else {}),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str, *, source: str = "offset store") -> QueryOffset:
        try:
            data = json.loads(text)
            if data.get("connector") != QUERY_CONNECTOR:
                raise InvalidOffsetError(
                    f"{source}: the stored offset belongs to connector {data.get('connector')!r}, not a query "
                    "extraction; give the extraction its own topic_prefix"
                )
            if int(data.get("format", 0)) > OFFSET_FORMAT:
                raise InvalidOffsetError(f"{source}: offset format {data['format']} is newer than this provider")
            return cls(
                topic_prefix=data["topic_prefix"],
                table=TableRef(*data["table"]),
                cursor_column=data["cursor_column"],
                watermark=data.get("watermark"),
                window_seq=int(data.get("window_seq", 0)),
                seen_path=data.get("seen_path"),
                revision=int(data.get("revision", 0)),
                extra=dict(data.get("extra") or {}),
            )
        except InvalidOffsetError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidOffsetError(f"{source}: malformed query extraction offset ({exc})") from None

    def check(self, extraction: QueryExtraction, *, source: str) -> None:
        if (self.table, self.cursor_column) != (extraction.table, extraction.cursor_column):
            raise InvalidOffsetError(
                f"{source}: the stored watermark is for {self.table}.{self.cursor_column}, not "
                f"{extraction.table}.{extraction.cursor_column}; delete it to start this extraction over"
            )

    def after(self, entry: CommitEntry) -> QueryOffset:
        """The offset that records ``entry`` (a committed query window)."""
        stats = entry.stats.get("query") or {}
        return replace(
            self, watermark=stats.get("watermark"), window_seq=entry.window.seq, seen_path=stats.get("seen_path")
        )


def seen_topic(prefix: str, ref: TableRef) -> Topic:
    """Where a run keeps the rows it emitted inside the next run's lookback band (not a topic)."""
    return Topic(
        f"{prefix}:query-seen:{ref.data_collection}", topic_directory(prefix, "_query_seen", ref.schema, ref.name)
    )


class QueryRead(Protocol):
    """One run's read of a source in one snapshot."""

    high: str | None  # the run's upper bound in the source's text form (None: the table is empty)

    def batches(self) -> Iterator[tuple[list[pa.Array], pa.Array, pa.Array, pa.Array]]:
        """``(column values, in the overlap with the old band, in the next band, created flag)``
        per batch of rows in ``[watermark - lookback, high]``, ordered by the cursor; the flags
        are ``"true"``/``"false"`` text."""

    def events(self, values: list[pa.Array], created: pa.Array) -> pa.RecordBatch:
        """The envelopes of kept rows."""


class QuerySource(Protocol):
    def read(
        self, extraction: QueryExtraction, watermark: str | None, window: Window
    ) -> AbstractContextManager[QueryRead]:
        """A consistent read (validated: columns, cursor type) for one window."""


def _row_text(columns: list[pa.Array]) -> pa.Array:
    """Each row's exact text (all columns; nulls distinct from empty strings), for dedup."""
    import pyarrow.compute as pc

    marked = [pc.if_else(pc.is_null(c), "\x00N", pc.binary_join_element_wise("\x00V", c, "")) for c in columns]
    return pc.binary_join_element_wise(*marked, "\x1f")


def run_query_window(
    extraction: QueryExtraction,
    source: QuerySource,
    sink_path: str,
    window: Window,
    offset: QueryOffset | None,
    *,
    spark_provider: Callable[[], Any] | None = None,
    run: dict[str, Any] | None = None,
) -> CommitEntry:
    """Extract one window and commit it; returns the commit entry (the caller stores the offset)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from airflow_provider_cdc.cdc.sinks.parquet import ParquetSink

    started = time.monotonic()
    watermark = offset.watermark if offset else None
    sink = ParquetSink(sink_path, extraction.topic_prefix, spark_provider)
    ref = extraction.table
    topic = Topic.for_table(extraction.topic_prefix, ref.schema, ref.name)
    seen_out = seen_topic(extraction.topic_prefix, ref)
    writer = sink.open_window(window, [topic, seen_out])
    seen = _read_seen(sink, _checked_seen_path(offset, seen_out, extraction.topic_prefix)) if offset else set()
    try:
        with source.read(extraction, watermark, window) as read:
            high = read.high
            rows = dropped = 0
            band_rows: list[pa.Array] = []
            seen_values = pa.array(sorted(seen), pa.string())
            for values, overlap, band, created in read.batches():
                text = _row_text(values)
                repeated = pc.and_(pc.equal(overlap, "true"), pc.is_in(text, value_set=seen_values))
                keep = pc.invert(pc.fill_null(repeated, False))
                dropped += len(text) - pc.sum(keep.cast(pa.int64())).as_py()
                # Every row of the next run's band, emitted now or before, is "seen" there.
                band_rows.append(pc.filter(text, pc.equal(band, "true")))
                values = [pc.filter(c, keep) for c in values]
                if len(values[0]):
                    writer.write_batches(topic, [read.events(values, pc.filter(created, keep))])
                    rows += len(values[0])
    finally:
        writer.close()
    new_watermark = high if high is not None else watermark
    band_text = pa.concat_arrays(band_rows) if band_rows else pa.array([], pa.string())
    if high is None and seen:  # nothing new: the band is unchanged, so carry the seen rows over
        band_text = pa.array(sorted(seen), pa.string())
    seen_path = None
    if len(band_text):
        writer.write_batches(seen_out, [pa.RecordBatch.from_arrays([band_text], names=["row"])])
        seen_path = writer.dataset_path(seen_out)
    entry = writer.commit(
        window,
        stats={
            "query": {
                "table": ref.data_collection,
                "cursor_column": extraction.cursor_column,
                "previous_watermark": watermark,
                "watermark": new_watermark,
                "rows": rows,
                "duplicates_dropped": dropped,
                "seen_path": seen_path,
            },
            "seconds": round(time.monotonic() - started, 3),
            "job_pid": os.getpid(),
            **({"run": run} if run else {}),
        },
    )
    log.info(
        "query window %s of %s: %d rows (%d already emitted dropped), watermark %s → %s",
        window.window_id,
        ref,
        rows,
        dropped,
        watermark,
        new_watermark,
    )
    return entry


def _checked_seen_path(offset: Any, topic: Topic, prefix: str) -> str | None:
    """The previous window's seen rows: a path read back from the offset or the commit log (both
    writable by others), so it must be this table's seen dataset of that window, or the rows it
    names would silently drop matching rows from the next band."""
    path = offset.seen_path
    if not path:
        return None
    head, _, attempt = str(path).rpartition("/attempt=")
    window_id = head.rpartition("/window=")[2]
    problem = (
        None
        if str(path).startswith(f"{topic.directory}/window=") and window_id == window_id_for(offset.window_seq)
        else f"it is not {topic.directory}/window={window_id_for(offset.window_seq)}/attempt=<id>"
    ) or landed_path_problem(prefix, path, window_id, attempt)
    if problem:
        raise CdcStateError(
            f"the stored seen-rows path {path!r} of {topic.name} is not this capture's: {problem}. The offset or the "
            "commit log was edited; nothing was read"
        )
    return path


def _read_seen(sink: ParquetSink, path: str | None) -> set[str]:
    if path is None:
        return set()
    uri = sink.storage.dataset_uri(path)
    if sink.arrow_writes:  # local or object store: Arrow reads it (Spark cannot reach an object store)
        table = sink.read_dataset(path)
    else:
        if sink.spark_provider is None:
            raise CdcConfigurationError(f"reading {uri} needs Spark (the sink is not a local directory): none here")
        table = sink.spark_provider().read.parquet(uri).toArrow()
    return set(table.column("row").to_pylist())
