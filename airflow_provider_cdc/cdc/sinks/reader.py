"""Reading committed data back: only windows in the commit log, never half-written attempts.

``read_topic_arrow`` needs no Spark (local and object-store sinks: Arrow's file system of the
store, through the active access); ``read_topic_spark`` works for any URI.
Both accept a topic name such as ``shop.public.orders`` or ``shop.transaction``, and merge
events written under different table schemas by the rules in :mod:`.schemas`.

On Iceberg and Delta sinks (told by the commit log's entries) they read the dataset's table
as it is now, restricted to the windows in the log: a table commit of a window whose entry a
crash kept out of the log is not read, and compaction or vacuum of the table changes nothing.

Taking the format from the log is a convenience of these public readers: whoever can write to
the sink can write a log entry naming a format, and they then open that format's tables. That
chooses no code (every Iceberg catalog the provider opens has pyiceberg's own FileIO and ignores
the import keys of a catalog server's config and of table metadata, see
:mod:`.iceberg`), but a capture's own runs do not rely on it: :func:`check_landed_tables`
takes the capture's configured ``sink_format`` and fails on an entry naming another.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from airflow_provider_cdc.cdc.basics.errors import CdcStateError
from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.events.envelope import WINDOW_ID_FIELD
from airflow_provider_cdc.cdc.sinks import object_store
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry, CommitLog
from airflow_provider_cdc.cdc.sinks.formats import PARQUET, local_base
from airflow_provider_cdc.cdc.sinks.lake_tables import table_format
from airflow_provider_cdc.cdc.sinks.object_store import is_object_store
from airflow_provider_cdc.cdc.sinks.schemas import conform_table, merge_schemas
from airflow_provider_cdc.cdc.sinks.storage import storage_for


def committed_windows(base_path: str, topic_prefix: str, spark: Any = None) -> list[CommitEntry]:
    """Effective commit entries, one per committed window, in window order."""
    storage = storage_for(base_path, (lambda: spark) if spark is not None else None)
    return CommitLog(storage, topic_prefix).committed()


def committed_paths(base_path: str, topic_prefix: str, topic: str, spark: Any = None) -> list[str]:
    storage = storage_for(base_path, (lambda: spark) if spark is not None else None)
    paths = []
    for entry in CommitLog(storage, topic_prefix).committed():
        dataset = entry.dataset(topic)
        if dataset is not None and dataset.events:
            paths.append(storage.dataset_uri(dataset.path))
    return paths


def table_format_of(entries: list[CommitEntry]) -> str | None:
    """The lake table format the entries were committed to (None: plain Parquet)."""
    return next((d.table["format"] for e in entries for d in e.datasets if d.table), None)


def committed_table_rows(
    base_path: str,
    topic_prefix: str,
    topic: str,
    entries: list[CommitEntry],
    table_catalog: dict[str, str] | None = None,
) -> pa.Table | None:
    """The rows of ``topic``'s lake table in the windows of ``entries`` (None: no such rows)."""
    fmt = table_format_of(entries)
    if fmt is None:
        raise CdcStateError(f"the commit log's windows of {topic!r} name no lake table format")
    seqs = [e.window.seq for e in entries if (d := e.dataset(topic)) is not None and d.events]
    if not seqs:
        return None
    tables = table_format(fmt, local_base(base_path), topic_prefix, table_catalog)
    if tables is None:
        raise RuntimeError(f"no lake table store for sink format {fmt!r}")
    rows = tables.scan_arrow(_topic(entries, topic), window_seqs=seqs)
    return rows if rows is not None and rows.num_rows else None


def committed_table_files(
    base_path: str,
    topic_prefix: str,
    topic: str,
    entries: list[CommitEntry],
    table_catalog: dict[str, str] | None = None,
) -> list[str]:
    """The Parquet files of ``topic``'s lake table now (Spark reads them, filtering windows)."""
    fmt = table_format_of(entries)
    if fmt is None:
        raise CdcStateError(f"the commit log's windows of {topic!r} name no lake table format")
    tables = table_format(fmt, local_base(base_path), topic_prefix, table_catalog)
    if tables is None:
        raise RuntimeError(f"no lake table store for sink format {fmt!r}")
    dataset = _topic(entries, topic)
    return tables.data_files(dataset) if tables.exists(dataset) else []


def _topic(entries: list[CommitEntry], name: str) -> Topic:
    """The :class:`Topic` of a landed dataset, its directory taken from where a window wrote it."""
    for entry in reversed(entries):
        dataset = entry.dataset(name)
        if dataset is not None:
            return Topic(name, dataset.path.split("/window=", 1)[0])
    raise ValueError(f"no committed window wrote {name!r}")


def read_topic_arrow(
    base_path: str, topic_prefix: str, topic: str, *, table_catalog: dict[str, str] | None = None
) -> pa.Table | None:
    """All committed rows of ``topic`` as one Arrow table (None if nothing was committed)."""
    entries = committed_windows(base_path, topic_prefix)
    if table_format_of(entries) is not None:
        return committed_table_rows(base_path, topic_prefix, topic, entries, table_catalog)
    paths = committed_paths(base_path, topic_prefix, topic)
    if not paths:
        return None
    files = sorted(_parquet_files(paths), key=lambda file: file[1])
    tables = [read_parquet_file(fs, f) for fs, f in files]
    if not tables:
        return None
    schema = merge_schemas([t.schema for t in tables])
    return pa.concat_tables([conform_table(t, schema) for t in tables])


def _parquet_files(dataset_uris: list[str]) -> list[tuple[Any, str]]:
    """Every Parquet file of the datasets, with the file system that reads it (an object store's
    URI is opened with its own client, verbatim; others as Arrow reads them): the files
    ``pyarrow.dataset`` finds (names starting with ``.`` or ``_`` skipped), without importing it
    (~1 s of a task's CPU: its import makes pyarrow import pandas, apache/arrow#34994)."""
    from pyarrow import fs as pafs

    files = []
    for uri in dataset_uris:
        if is_object_store(uri):
            filesystem, path = object_store.filesystem(uri)
        else:
            filesystem, path = pafs.FileSystem.from_uri(uri) if "://" in uri else (pafs.LocalFileSystem(), uri)
        files += [(filesystem, f) for f in _files_under(filesystem, path)]
    return files


def _files_under(filesystem: Any, path: str) -> list[str]:
    """``path`` if it is a file, else the files below it whose relative path has no part starting
    with ``.`` or ``_`` (``pyarrow.dataset``'s default ``ignore_prefixes``); missing: an error."""
    from pyarrow import fs as pafs

    info = filesystem.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(path)
    if info.type == pafs.FileType.File:
        return [path]
    base = path.rstrip("/")
    found = filesystem.get_file_info(pafs.FileSelector(base, recursive=True))
    return [
        f.path
        for f in found
        if f.type == pafs.FileType.File
        and not any(part.startswith((".", "_")) for part in f.path[len(base) :].strip("/").split("/"))
    ]


def read_parquet_file(filesystem: Any, path: str) -> pa.Table:
    """One Parquet file as a table, as ``pyarrow.dataset`` reads it, through ``pq.ParquetFile``
    (``pq.read_table`` imports ``pyarrow.dataset``)."""
    import pyarrow.parquet as pq

    with filesystem.open_input_file(path) as source:
        return pq.ParquetFile(source).read()


def read_topic_spark(
    spark: Any, base_path: str, topic_prefix: str, topic: str, *, table_catalog: dict[str, str] | None = None
) -> Any:
    """All committed rows of ``topic`` as a Spark DataFrame (None if nothing was committed)."""
    entries = committed_windows(base_path, topic_prefix, spark)
    return read_windows_spark(spark, base_path, topic_prefix, topic, entries, entries, table_catalog=table_catalog)


def read_windows_spark(
    spark: Any,
    base_path: str,
    topic_prefix: str,
    topic: str,
    committed: list[CommitEntry],
    windows: list[CommitEntry],
    *,
    table_catalog: dict[str, str] | None = None,
) -> Any:
    """The rows of ``topic`` in ``windows`` (some of the ``committed`` entries) as a Spark
    DataFrame; None when those windows wrote none."""
    from airflow_provider_cdc.cdc.sinks.spark_files import Only, spark_read_merged

    storage = storage_for(base_path, lambda: spark)
    written = [(e, d) for e in windows if (d := e.dataset(topic)) is not None and d.events]
    if not written:
        return None
    if table_format_of(committed) is None:
        return spark_read_merged(spark, [storage.dataset_uri(d.path) for _, d in written])
    files = committed_table_files(base_path, topic_prefix, topic, committed, table_catalog)
    if not files:
        return None
    from pyspark.sql import functions as F

    ids = [e.window_id for e, _ in written]
    # On an object store the footers' statistics skip the files of other windows, as Spark's
    # pushed-down filter does locally: a run reads its windows' files, not the whole table.
    return spark_read_merged(spark, files, only=Only(WINDOW_ID_FIELD, tuple(ids))).where(
        F.col(WINDOW_ID_FIELD).isin(ids)
    )


def check_entry_formats(entries: list[CommitEntry], sink_format: str, topic_prefix: str) -> None:
    """Every entry landed in the capture's own ``sink_format``: an entry naming another format is
    refused before anything it names is opened (a Parquet capture never opens a lake table, nor
    one format's table as another's, because the log says so)."""
    for entry in entries:
        for dataset in entry.datasets:
            named = dataset.table.get("format") if dataset.table else None
            if named is not None and named != sink_format:
                raise CdcStateError(
                    f"commit log entry of window {entry.window_id} says {dataset.topic} landed in a table of format "
                    f"{named!r}, but capture {topic_prefix!r} writes sink_format={sink_format!r}: nothing it names is "
                    "opened. Whoever can write to the sink can write such an entry; move it aside once you know where "
                    "it came from (if the capture's sink_format was changed, set it back, or move the sink aside and "
                    "re-snapshot)"
                )


def check_landed_tables(
    entry: CommitEntry | None,
    base_path: str,
    topic_prefix: str,
    table_catalog: dict[str, str] | None = None,
    *,
    sink_format: str,
) -> None:
    """The lake tables the newest window committed to still hold it: a table dropped, replaced or
    rolled back under the capture fails the run (like a deleted sink directory), before anything
    is read, instead of silently losing the windows it held.

    The tables are those of the capture's configured ``sink_format``, never of a format the log
    names: whoever can write to the sink can write a log entry, and a Parquet capture must not
    open an Iceberg catalog (or a Delta table) because one says so. An entry naming another
    format fails the run, opening nothing."""
    if entry is None:
        return
    check_entry_formats([entry], sink_format, topic_prefix)
    if sink_format == PARQUET:
        return
    tables = table_format(sink_format, local_base(base_path), topic_prefix, table_catalog)
    if tables is None:
        raise RuntimeError(f"no lake table store for sink format {sink_format!r}")
    for dataset in entry.datasets:
        if not dataset.table:
            continue
        topic = Topic(dataset.topic, dataset.path.split("/window=", 1)[0])
        if not tables.exists(topic):
            raise CdcStateError(
                f"the {sink_format} table of {dataset.topic} ({tables.table_uri(topic)}) is gone, but "
                f"the commit log says window {entry.window_id} landed there: restore the table, or move the sink "
                "aside and re-snapshot"
            )
        if not tables.holds_window(topic, entry.window.seq):
            raise CdcStateError(
                f"the {sink_format} table of {dataset.topic} ({tables.table_uri(topic)}) no longer holds "
                f"window {entry.window_id}, the newest one the commit log says landed there (was it rolled back "
                "or overwritten?): restore it to a version that holds the window"
            )
