"""The current-state job without Spark: reading, folding and writing on Arrow for small refreshes.

The state job (:func:`.state.run_state_job`) has two engines for the same work:

- ``spark``: the events, the base and the fold in Spark (tables larger than memory work);
- ``arrow``: the events read with Arrow (Parquet files of the pending windows, or the lake
  table's rows of those windows), the base read with Arrow (the current Parquet version, or the
  affected keys' rows of an Iceberg/Delta state table), :func:`.state_fold_arrow.fold`, and the
  new version written with Arrow (Parquet) or committed with pyiceberg/delta-rs (lake tables).
  No JVM starts; everything the fold touches is in the worker's memory.

``auto`` (:func:`choose_engine`) takes Arrow when the rows the fold reads (the pending events plus
the base it folds them over) are at most :data:`ARROW_MAX_ROWS` and their Parquet bytes at most
:data:`ARROW_MAX_BYTES`; measured in docs/benchmarks.md ("Current state without a JVM").
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.sinks import object_store
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry
from airflow_provider_cdc.cdc.sinks.schemas import conform_table, merge_schemas

log = logging.getLogger(__name__)

ARROW, SPARK, AUTO = "arrow", "spark", "auto"
STATE_ENGINES = (AUTO, ARROW, SPARK)
#: Above this many rows read by the fold (pending events + base rows), ``auto`` runs Spark.
ARROW_MAX_ROWS = 1_000_000
#: ... or above this many bytes of them (Parquet, compressed: the worker holds them decoded).
ARROW_MAX_BYTES = 256 * 1024 * 1024


def check_state_engine(engine: str) -> str:
    if engine not in STATE_ENGINES:
        raise CdcConfigurationError(f"state_engine must be one of {list(STATE_ENGINES)}, not {engine!r}")
    return engine


# -- choosing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RefreshSize:
    """What a refresh folds: the pending events and the base rows it reads, rows and bytes."""

    events: int
    base_rows: int
    base_bytes: int
    events_bytes: int

    @property
    def rows(self) -> int:
        return self.events + self.base_rows

    @property
    def bytes(self) -> int:
        return self.events_bytes + self.base_bytes

    def small(self) -> bool:
        return self.rows <= ARROW_MAX_ROWS and self.bytes <= ARROW_MAX_BYTES


def choose_engine(spec: Any) -> tuple[str, RefreshSize | None]:
    """The engine of a state job: ``spec.state_engine`` unless ``auto``; then Arrow for a small
    refresh, Spark otherwise (and for Hadoop URIs, which only Spark opens)."""
    if spec.state_engine != AUTO:
        return spec.state_engine, None
    if not all(_arrow_opens(p) for p in (spec.sink_path, spec.state_path)):
        return SPARK, None
    size = refresh_size(spec)
    return (ARROW if size.small() else SPARK), size


def _arrow_opens(path: str) -> bool:
    from airflow_provider_cdc.cdc.sinks.storage import is_uri

    return object_store.is_object_store(path) or not is_uri(path)


def refresh_size(spec: Any) -> RefreshSize:
    """The rows and bytes the next refresh of ``spec``'s topics reads, from the commit log's
    counts and the files' footers (no data read): the events of the windows after the state's
    current one (from the last snapshot window on), plus the base: a Parquet rebuild reads the
    whole current version, a MERGE the affected keys' rows (at most two per event)."""
    from airflow_provider_cdc.cdc.sinks.commit_log import CommitLog
    from airflow_provider_cdc.cdc.sinks.storage import storage_for
    from airflow_provider_cdc.cdc.state.versions import StateLog

    committed = CommitLog(storage_for(spec.sink_path), spec.topic_prefix).committed()
    if spec.as_of_seq is not None:
        committed = [e for e in committed if e.window.seq <= spec.as_of_seq]
    events = events_bytes = base_rows = base_bytes = 0
    for name, directory in spec.topics:
        topic = Topic(name, directory)
        current, held, table_rows = None, None, 0
        if spec.as_of_seq is not None:
            pass  # a rebuild as of a window folds every event since the snapshot before it, without a base
        elif spec.sink_format == "parquet":
            current = StateLog(storage_for(spec.state_path), spec.topic_prefix, topic).current()
            held = current.window_seq if current is not None else None
        else:
            held, table_rows = _lake_state(spec, topic)
        pending = [e for e in committed if held is None or e.window.seq > held]
        snapshot = max((e.window.seq for e in pending if e.window.kind == "snapshot"), default=None)
        if snapshot is not None:
            pending = [e for e in pending if e.window.seq >= snapshot]
        count = sum(d.events for e in pending if (d := e.dataset(name)) is not None)
        events += count
        events_bytes += _dataset_bytes(spec, pending, name)
        if snapshot is None and held is not None:
            if spec.sink_format == "parquet":
                base_rows += current.rows
                base_bytes += _tree_bytes(storage_for(spec.state_path).uri(current.path))
            else:
                base_rows += min(table_rows, 2 * count)
    return RefreshSize(events, base_rows, base_bytes, events_bytes)


def _lake_state(spec: Any, topic: Topic) -> tuple[int | None, int]:
    from airflow_provider_cdc.cdc.sinks import spark_files
    from airflow_provider_cdc.cdc.state.tables import state_table

    state = state_table(spec.sink_format, spec.state_path, spec.topic_prefix, topic, spec.catalog_properties())
    if not state.exists():
        return None, 0
    return state.current_window_seq(), spark_files.count_rows(state.data_files())


def _dataset_bytes(spec: Any, pending: list[CommitEntry], name: str) -> int:
    """The Parquet bytes of a Parquet sink's pending datasets (lake sinks: rows only)."""
    if spec.sink_format != "parquet":
        return 0
    from airflow_provider_cdc.cdc.sinks.storage import storage_for

    storage = storage_for(spec.sink_path)
    return sum(
        _tree_bytes(storage.dataset_uri(d.path)) for e in pending if (d := e.dataset(name)) is not None and d.events
    )


def _tree_bytes(uri: str) -> int:
    try:
        return sum(fs.get_file_info(path).size or 0 for fs, path in _files([uri]))
    except (OSError, FileNotFoundError):
        return 0


# -- reading and writing -------------------------------------------------------------------------


def _files(uris: list[str]) -> list[tuple[Any, str]]:
    from airflow_provider_cdc.cdc.sinks.reader import _parquet_files

    return sorted(_parquet_files(uris), key=lambda file: file[1])


def read_parquet_arrow(uris: list[str]) -> pa.Table | None:
    """Parquet files or dataset directories as one table, schemas merged by name (as Spark's reader
    of the state job merges them); None if there are no files."""
    from airflow_provider_cdc.cdc.sinks.reader import read_parquet_file

    tables = [read_parquet_file(fs, path) for fs, path in _files(uris)]
    if not tables:
        return None
    schema = merge_schemas([t.schema for t in tables])
    return pa.concat_tables([conform_table(t, schema) for t in tables])


def read_windows_arrow(
    sink_path: str,
    topic_prefix: str,
    topic: str,
    committed: list[CommitEntry],
    windows: list[CommitEntry],
    *,
    table_catalog: dict[str, str] | None = None,
) -> pa.Table | None:
    """As :func:`.reader.read_windows_spark`, as an Arrow table: the rows of ``topic`` in ``windows``."""
    from airflow_provider_cdc.cdc.sinks.reader import committed_table_rows, table_format_of
    from airflow_provider_cdc.cdc.sinks.storage import storage_for

    written = [(e, d) for e in windows if (d := e.dataset(topic)) is not None and d.events]
    if not written:
        return None
    if table_format_of(committed) is None:
        storage = storage_for(sink_path)
        return read_parquet_arrow([storage.dataset_uri(d.path) for _, d in written])
    from airflow_provider_cdc.cdc.state.table_rows import plain_types  # lake tables only

    rows = committed_table_rows(sink_path, topic_prefix, topic, [e for e, _ in written], table_catalog)
    return None if rows is None else plain_types(rows)


def write_version_arrow(rows: pa.Table, uri: str) -> int:
    """Write a state version's rows as one Parquet file in the directory ``uri`` (Spark's writer
    options: snappy, microsecond timestamps); an empty version is one file holding the schema."""
    from airflow_provider_cdc.cdc.sinks.spark_files import _open_writer

    name = f"part-00000-{uuid.uuid4().hex}.snappy.parquet"
    if object_store.is_object_store(uri):
        fs, path = object_store.filesystem(f"{uri.rstrip('/')}/{name}")
    else:
        from pyarrow import fs as pafs

        os.makedirs(uri, mode=0o700, exist_ok=True)
        fs, path = pafs.LocalFileSystem(), f"{uri}/{name}"
    writer = _open_writer(fs, path, rows.schema)
    try:
        writer.write_table(rows, row_group_size=131_072)
    finally:
        writer.close()
    return rows.num_rows


# -- MERGE into Iceberg / Delta state tables -----------------------------------------------------


class ArrowFold:
    """The engine operations :func:`.merge.merge_windows` needs, on Arrow: the events are
    an Arrow table in the worker's memory, the fold is :func:`.state_fold_arrow.fold`."""

    label = "arrow"

    def pending(self, events: pa.Table, first: int | None, last: int) -> pa.Table:
        seq = pc.cast(events.column("window_id"), pa.int64())
        keep = pc.less_equal(seq, last)
        if first is not None:
            keep = pc.and_(keep, pc.greater_equal(seq, first))
        return events.filter(keep)

    def keys(self, events: pa.Table | None, keys: Any = None) -> list[str]:
        """The key columns, as the fold finds them (the fields of ``__debezium_oldkey``)."""
        if events is None:
            return list(keys or ())
        fields = events.schema.field("__debezium_oldkey").type if "__debezium_oldkey" in events.column_names else []
        found = [f.name for f in fields]
        if keys is not None and sorted(keys) != sorted(found):
            raise CdcConfigurationError(f"key columns {list(keys)} given, but the events are keyed by {found}")
        return found

    @contextlib.contextmanager
    def held(self, events: pa.Table) -> Iterator[pa.Table]:
        yield events  # already in memory

    def shape(self, events: pa.Table) -> tuple[bool, int]:
        return bool(pc.any(pc.equal(events.column("op"), "t")).as_py()), events.num_rows

    def affected_keys(self, events: pa.Table, keys: list[str]) -> pa.Table:
        return affected_keys(events, keys)

    def fold(self, events: pa.Table | None, base: pa.Table | None) -> pa.Table | None:
        from airflow_provider_cdc.cdc.state.arrow_fold import fold

        return fold(events, base)


def merge_windows_arrow(events: pa.Table | None, state: Any, *, tag: Any, snapshot_seq: int | None = None) -> Any:
    """:func:`.merge.merge_windows` on Arrow: the same decisions and state-table calls."""
    from airflow_provider_cdc.cdc.state.merge import merge_windows

    return merge_windows(None, events, state, tag=tag, snapshot_seq=snapshot_seq, engine=ArrowFold())


def affected_keys(events: pa.Table, keys: list[str]) -> pa.Table:
    """The distinct keys of the events: after and before images, and the old key of a moved row."""
    from airflow_provider_cdc.cdc.state.arrow_fold import _conformed, _struct

    value_type = events.schema.field("after").type
    parts = []
    for column in ("after", "before", "__debezium_oldkey"):
        struct = _struct(events, column)
        parts.append(pa.table({k: _conformed(struct, k, value_type.field(k).type) for k in keys}))
    images = pa.concat_tables(parts)
    valid = np.ones(images.num_rows, dtype=bool)
    for k in keys:
        valid &= images.column(k).is_valid().to_numpy(zero_copy_only=False)
    return images.filter(pa.array(valid)).group_by(keys).aggregate([])
