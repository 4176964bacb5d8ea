"""Current state by MERGE: pending windows applied to an Iceberg or Delta state table, key by key.

Where :func:`.state.apply_windows` rebuilds a Parquet state table whole every run, here a run
touches only the keys its windows changed:

1. the affected keys: every event's key, from its after and before images and, for the create
   half of a key change, ``__debezium_oldkey`` (the moved row's old key);
2. the base: the state table's rows of those keys, read with the keys as a pushed-down filter;
3. the new rows: :func:`.state.fold` of the events over that base, the very fold the rebuild runs,
   so the rows of affected keys are the rebuild's by construction (a key absent from its result
   was deleted); every other row is one the events do not touch, which the rebuild copies as is;
4. one table commit removing the base rows and writing the new ones (:meth:`.StateTable.commit_merge`),
   tagged with the newest window.

The whole table is rewritten (:meth:`.StateTable.overwrite`, one commit, tagged the same way) when
a pending window is a snapshot (a complete image: what came before does not count), when the events
hold a truncate (the fold drops the base anyway), when there is no table yet, and for tables
without a key (``REPLICA IDENTITY FULL`` and no primary key): those are multisets whose delete
names a row only by its values and removes one of possibly several equal rows, and neither
format can delete one of N equal rows (there is no row identity to merge on), so the rows are
recounted over the whole table.

Idempotent: the table's newest tag says which window it holds, and only events of later windows
(up to the tag's) apply. The affected rows and new rows travel through the driver as Arrow (a
window's keys: small); the full rewrites bring the whole table through the driver.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.sinks.formats import TableCommit, WindowTag
from airflow_provider_cdc.cdc.state.spark_fold import fold
from airflow_provider_cdc.cdc.state.table_rows import plain_types, rows_with_keys
from airflow_provider_cdc.cdc.state.tables import StateTable

log = logging.getLogger(__name__)

MERGED, REWRITTEN, UNCHANGED, EMPTY = "merged", "rewritten", "unchanged", "empty"


@dataclass(frozen=True)
class MergeResult:
    table: str
    action: str  # merged | rewritten | unchanged | empty
    window_seq: int  # the window the table holds afterwards (for "empty": the window applied)
    commit: TableCommit | None = None
    reason: str | None = None  # why rewritten: snapshot | truncate | keyless | new table
    affected_keys: int = 0
    rows_written: int = 0
    rows_deleted: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "commit": self.commit.to_dict() if self.commit else None}


class SparkFold:
    """The engine operations :func:`merge_windows` needs, in Spark (tables larger than memory):
    events are a DataFrame; keys, bases and results cross to the state table as Arrow."""

    label = "spark"

    def __init__(self, spark: Any):
        self.spark = spark

    def pending(self, events: Any, first: int | None, last: int) -> Any:
        return _pending(events, first, last)

    def keys(self, events: Any, keys: Sequence[str] | None) -> list[str]:
        return _keys(events, keys)

    @contextlib.contextmanager
    def held(self, events: Any) -> Iterator[Any]:
        held = events.persist()  # read by several jobs
        try:
            yield held
        finally:
            held.unpersist()

    def shape(self, events: Any) -> tuple[bool, int]:
        return _shape(events)

    def affected_keys(self, events: Any, keys: list[str]) -> pa.Table:
        return _affected_keys(events, keys).toArrow()

    def fold(self, events: Any, base: pa.Table | None) -> pa.Table | None:
        folded = fold(self.spark, events, None if base is None else _to_spark(self.spark, base))
        return None if folded is None else folded.toArrow()


def merge_windows(
    spark: Any,
    events: Any,
    state: StateTable,
    *,
    tag: WindowTag,
    keys: Sequence[str] | None = None,
    snapshot_seq: int | None = None,
    engine: Any = None,
) -> MergeResult:
    """Bring ``state`` up to window ``tag.window_seq`` with ``events`` (in the event schema, as
    the engine's fold takes them; None if the windows have no events of this table).

    Only events of windows after the one the table holds, up to ``tag.window_seq``, apply (so
    the events of every committed window may be passed). ``keys``: the table's key columns
    (default: those of the events' ``__debezium_oldkey``; none for a keyless table).
    ``snapshot_seq``: the last snapshot window among the pending ones (a tag of kind
    ``snapshot`` is one), from the commit log: a snapshot window cannot be told from its events.
    ``engine``: whose operations run the fold (default :class:`SparkFold` of ``spark``; the
    Arrow one is :class:`.arrow.ArrowFold`): the decisions and the table's commits are
    these, whichever it is."""
    engine = engine or SparkFold(spark)
    held = state.current_window_seq()
    if held is not None and held >= tag.window_seq:
        return MergeResult(state.name, UNCHANGED, held)
    if tag.kind == "snapshot":
        snapshot_seq = max(snapshot_seq or 0, tag.window_seq)
    reset = snapshot_seq is not None and (held is None or snapshot_seq > held)
    if events is not None:
        first = snapshot_seq if reset else (held + 1 if held is not None else None)
        events = engine.pending(events, first, tag.window_seq)
    keys = engine.keys(events, keys)
    if reset or not state.exists():
        return _rewrite(engine, events, state, tag, keys, None, "snapshot" if reset else "new table")
    if events is None:
        return MergeResult(state.name, EMPTY, tag.window_seq)
    with engine.held(events) as events:
        truncated, count = engine.shape(events)
        if count == 0:
            return MergeResult(state.name, EMPTY, tag.window_seq)
        if truncated:
            # The fold drops the base at the truncate; an empty base of the table's schema keeps
            # the columns the rebuild's (whole) base would have contributed.
            return _rewrite(engine, events, state, tag, keys, state.schema().empty_table(), "truncate")
        if not keys:
            return _rewrite(engine, events, state, tag, keys, state.read_version(), "keyless")
        return _merge(engine, events, state, tag, keys)


def read_state_as_of(state: StateTable, window_seq: int) -> pa.Table:
    """The state table as of window ``window_seq``: the version tagged with the newest window at
    or before it (CdcStateError naming the window if the table has none)."""
    return state.read_version(state.version_for_window(window_seq))


def _merge(engine: Any, events: Any, state: StateTable, tag: WindowTag, keys: list[str]) -> MergeResult:
    key_values = plain_types(engine.affected_keys(events, keys))
    base = state.read_keys(keys, key_values)
    new_rows = plain_types(engine.fold(events, base))
    commit = state.commit_merge(new_rows, base.select(keys), tag, keys=keys)
    deleted = len(rows_with_keys(base.select(keys), keys, new_rows, keep=False))
    log.info(
        "state table %s at window %s (%s): %d keys affected, %d rows written, %d deleted (%s)",
        state.name,
        tag.window_id,
        engine.label,
        len(key_values),
        len(new_rows),
        deleted,
        "no change" if commit is None else f"{commit.files_removed} files rewritten",
    )
    action = MERGED if commit is not None else EMPTY
    return MergeResult(state.name, action, tag.window_seq, commit, None, len(key_values), len(new_rows), deleted)


def _rewrite(
    engine: Any, events: Any, state: StateTable, tag: WindowTag, keys: list[str], base: pa.Table | None, reason: str
) -> MergeResult:
    folded = engine.fold(events, base)
    if folded is None:  # no events at all (an empty snapshot window, say)
        current = state.schema()
        if current is None:
            return MergeResult(state.name, EMPTY, tag.window_seq, reason=reason)
        rows = current.empty_table()
    else:
        rows = plain_types(folded)
    commit = state.overwrite(rows, tag, keys=keys)
    log.info(
        "state table %s at window %s (%s): rewritten (%s), %d rows",
        state.name,
        tag.window_id,
        engine.label,
        reason,
        len(rows),
    )
    return MergeResult(state.name, REWRITTEN, tag.window_seq, commit, reason, rows_written=len(rows))


def _pending(events: Any, first: int | None, last: int) -> Any:
    from pyspark.sql import functions as F

    seq = F.col("window_id").cast("long")
    return events.filter(seq <= last if first is None else seq.between(first, last))


def _keys(events: Any, keys: Sequence[str] | None) -> list[str]:
    """The key columns, as the fold finds them (the fields of ``__debezium_oldkey``)."""
    if events is None:
        return list(keys or ())
    fields = events.schema.fieldNames()
    found = list(events.schema["__debezium_oldkey"].dataType.fieldNames()) if "__debezium_oldkey" in fields else []
    if keys is not None and sorted(keys) != sorted(found):
        raise CdcConfigurationError(f"key columns {list(keys)} given, but the events are keyed by {found}")
    return found


def _shape(events: Any) -> tuple[bool, int]:
    """(whether the events hold a truncate, how many events): one Spark job."""
    from pyspark.sql import functions as F

    row = events.agg(
        F.max(F.when(F.col("op") == "t", F.lit(1))).alias("truncated"), F.count(F.lit(1)).alias("n")
    ).collect()[0]
    return row["truncated"] is not None, int(row["n"])


def _affected_keys(events: Any, keys: list[str]) -> Any:
    """The distinct keys of the events: after and before images, and the old key of a moved row."""
    from pyspark.sql import functions as F

    value_type = events.schema["after"].dataType

    def key_of(column: str) -> Any:
        return F.struct(*[F.col(f"{column}.`{k}`").cast(value_type[k].dataType).alias(k) for k in keys])

    images = F.array(key_of("after"), key_of("before"), key_of("__debezium_oldkey"))
    return events.select(F.explode(images).alias("_k")).select("_k.*").dropna(how="any").distinct()


def _to_spark(spark: Any, table: pa.Table) -> Any:
    """An Arrow table as a DataFrame, timestamps without a zone as TIMESTAMP_NTZ (as the events)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return spark.createDataFrame(table, schema=from_arrow_schema(table.schema, prefer_timestamp_ntz=True))
