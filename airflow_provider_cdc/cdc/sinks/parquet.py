"""Parquet datasets with a commit log: the default sink.

Layout under the base path (``<dir>`` is the escaped topic name, see :mod:`..naming`)::

    <dir>/window=<window_id>/attempt=<attempt>/part-*.parquet   events of one window attempt
    _cdc_log/<prefix>/<n>.json                                   commit log (see commit_log.py)

A window writes into a fresh attempt directory, then publishes one commit-log entry naming it;
only then do readers see it. Re-running a window writes a new attempt and a new entry that
supersedes the old one, whose files are then deleted: a re-run replaces, never duplicates.

Driver-side batches (stream windows) are written with Arrow directly when the base path is
local or on an object store (:attr:`ParquetSink.arrow_writes`): the slot has one reader, so
Spark executors have nothing to parallelise there, and Arrow's writer avoids the JVM round trip.
Snapshot tasks write their own files there too (``write_parquet_file``, ``record_files``).
Other Hadoop URIs (``hdfs://``, ``file://``) go through Spark's writers (``write_dataframe``).
Spark never writes to an object store: its S3 connector is not used, Arrow's S3 file system is.

On an object store a file appears when its upload completes (one PUT, or a completed multipart
upload), whole or not at all: no temporary name and no rename, and a retried snapshot task's
file replaces its earlier one by the same name.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_cdc.cdc.basics import faults
from airflow_provider_cdc.cdc.basics.errors import from_remote_traceback
from airflow_provider_cdc.cdc.basics.naming import Topic, dataset_path
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.events.envelope import WINDOW_ID_FIELD
from airflow_provider_cdc.cdc.sinks import object_store
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry, CommitLog, DatasetCommit
from airflow_provider_cdc.cdc.sinks.formats import PARQUET, TableCommit, WindowTag, local_base
from airflow_provider_cdc.cdc.sinks.lake_tables import table_format
from airflow_provider_cdc.cdc.sinks.storage import LocalStorage, ObjectStoreStorage, ensure_private_root, storage_for

log = logging.getLogger(__name__)


class ParquetSink:
    def __init__(
        self,
        base_path: str,
        topic_prefix: str,
        spark_provider: Callable[[], Any] | None = None,
        *,
        sink_format: str = PARQUET,
        table_catalog: dict[str, str] | None = None,
    ):
        self.base_path = base_path
        self.topic_prefix = topic_prefix
        self.spark_provider = spark_provider
        ensure_private_root(base_path)  # a local sink's root, before anything lands in it: 0700
        self.storage = storage_for(base_path, spark_provider)
        self.log = CommitLog(self.storage, topic_prefix)
        self.sink_format = sink_format
        # Iceberg/Delta: each landed dataset is also a table the window's files are committed to.
        self.tables = table_format(sink_format, local_base(base_path), topic_prefix, table_catalog)

    @classmethod
    def for_spec(cls, spec: Any, spark_provider: Callable[[], Any] | None = None) -> ParquetSink:
        """The sink a job spec names (its path, prefix and table format)."""
        return cls(
            spec.sink_path,
            spec.topic_prefix,
            spark_provider,
            sink_format=spec.options.sink_format,
            table_catalog=spec.options.catalog_properties(),
        )

    @property
    def arrow_writes(self) -> bool:
        """Whether windows and snapshot tasks write their files with Arrow (local and object-store
        sinks) rather than through Spark's writer (other Hadoop URIs)."""
        return isinstance(self.storage, (LocalStorage, ObjectStoreStorage))

    #: The former name (a local sink was the only one Arrow wrote): callers that read the files
    #: back with Arrow when it is true should use :meth:`read_dataset`, which reaches the store.
    is_local = arrow_writes

    def read_dataset(self, rel: str, filter: Any = None) -> pa.Table:
        """The Parquet files of the dataset directory ``rel`` as one Arrow table (Arrow-written
        sinks: local or object store), optionally filtered (a ``pyarrow.dataset`` expression)."""
        import pyarrow.dataset as ds

        if isinstance(self.storage, ObjectStoreStorage):
            dataset = ds.dataset(self.storage.path(rel), filesystem=self.storage.filesystem, format="parquet")
        else:
            dataset = ds.dataset(self.storage.dataset_uri(rel), format="parquet")
        return dataset.to_table(filter=filter)

    def open_window(self, window: Window, topics: Iterable[Topic]) -> WindowWriter:
        return WindowWriter(self, window, topics)


class WindowWriter:
    """Writes one attempt of one window; nothing is visible until :meth:`commit`."""

    def __init__(self, sink: ParquetSink, window: Window, topics: Iterable[Topic]):
        self.sink = sink
        self.window = window
        self.topics = {t.name: t for t in topics}
        self.attempt = uuid.uuid4().hex[:16]
        self._ops: dict[str, Counter] = {}
        self._events: Counter = Counter()
        self._parts = 0
        self._files = _FileWriter()

    def dataset_path(self, topic: Topic) -> str:
        return dataset_path(topic.directory, self.window.window_id, self.attempt)

    def write_chunk(self, batches: dict[str, list[pa.RecordBatch]], transactions: pa.RecordBatch | None) -> None:
        """Append one chunk of driver-side batches (stream windows)."""
        files: list[tuple[pa.Table, str]] = []
        for topic_name, topic_batches in batches.items():
            files += self._prepare(self.topics[topic_name], topic_batches)
        if transactions is not None:
            files += self._prepare(self._transaction_topic(), [transactions])
        self._files.submit(files, after=lambda: faults.point("window.chunk_written"))

    def write_batches(self, topic: Topic, batches: list[pa.RecordBatch]) -> None:
        self._files.submit(self._prepare(topic, batches))

    def _prepare(self, topic: Topic, batches: list[pa.RecordBatch]) -> list[tuple[pa.Table, str]]:
        """Count the batches and name their files; local files are returned to be written,
        other storage is written here through Spark."""
        by_schema: dict[pa.Schema, list[pa.RecordBatch]] = {}
        for batch in batches:
            if batch.num_rows:
                by_schema.setdefault(batch.schema, []).append(batch)
        files = []
        for schema, group in by_schema.items():
            table = pa.Table.from_batches(group, schema=schema)
            self._count(topic, table)
            if self.sink.arrow_writes:
                self._parts += 1
                files.append((table, f"{self._file_uri(self.dataset_path(topic))}/part-{self._parts:05d}.parquet"))
            else:
                from airflow_provider_cdc.cdc.basics.spark_session import spark_schema

                spark = self.sink.spark_provider()
                frame = spark.createDataFrame(table, schema=spark_schema(table.schema))
                frame.coalesce(1).write.mode("append").parquet(self.sink.storage.uri(self.dataset_path(topic)))
        return files

    def task_directory(self, topic: Topic) -> str:
        """The attempt's directory of ``topic`` for files Arrow writes (:func:`write_parquet_file`):
        a local directory (created) or an object-store URI (keys need no directory)."""
        if isinstance(self.sink.storage, ObjectStoreStorage):
            return self.sink.storage.dataset_uri(self.dataset_path(topic))
        from pathlib import Path

        path = self.sink.storage.uri(self.dataset_path(topic))
        Path(path).mkdir(parents=True, exist_ok=True)
        return path

    def record_files(self, topic: Topic, files: Any) -> int:
        """Run a Spark DataFrame of ``(file, rows)`` written by tasks into
        :meth:`task_directory` (snapshot events, all ``op = r``); returns the rows written."""
        try:
            written = files.collect()
        except Exception as exc:
            original = from_remote_traceback(str(exc))
            if original is not None:
                raise original from None
            raise
        rows = sum(int(row["rows"]) for row in written)
        if rows:
            self._ops.setdefault(topic.name, Counter())["r"] += rows
            self._events[topic.name] += rows
        return rows

    def write_dataframe(self, topic: Topic, frame: Any) -> int:
        """Write a Spark DataFrame of events (snapshot partitions); returns the rows written."""
        uri = self.sink.storage.uri(self.dataset_path(topic))
        try:
            frame.write.mode("append").parquet(uri)
        except Exception as exc:
            original = from_remote_traceback(str(exc))
            if original is not None:
                raise original from None
            raise
        files = [n for n in self.sink.storage.list_names(self.dataset_path(topic)) if n.endswith(".parquet")]
        if not files:
            return 0
        spark = self.sink.spark_provider()
        rows = spark.read.parquet(uri).groupBy("op").count().collect()
        counts = {row["op"]: int(row["count"]) for row in rows}
        for op, n in counts.items():
            self._ops.setdefault(topic.name, Counter())[op] += n
            self._events[topic.name] += n
        return sum(counts.values())

    def commit(
        self,
        window: Window,
        *,
        transactions: int = 0,
        last_commit_lsn: int | None = None,
        last_tx_id: int | None = None,
        last_commit_ts_us: int | None = None,
        stats: dict[str, Any] | None = None,
    ) -> CommitEntry:
        """Publish the window in the commit log, then drop files of superseded attempts."""
        self._files.drain()
        self._files.close()
        tables = self._commit_tables(window, stats or {})
        datasets = tuple(
            DatasetCommit(
                topic=name,
                path=self.dataset_path(self.topics[name]),
                events=self._events[name],
                ops=dict(self._ops.get(name, {})),
                table=tables[name].to_dict() if name in tables else None,
            )
            for name in sorted(self._events)
            if self._events[name]
        )
        entry = CommitEntry(
            topic_prefix=self.sink.topic_prefix,
            window=window,
            attempt=self.attempt,
            datasets=datasets,
            transactions=transactions,
            last_commit_lsn=last_commit_lsn,
            last_tx_id=last_tx_id,
            last_commit_ts_us=last_commit_ts_us,
            committed_at_ms=int(time.time() * 1000),
            stats=stats or {},
        )
        committed = self.sink.log.append(entry)
        faults.point("sink.committed")
        if self.sink.tables is None:
            # Lake tables keep superseded attempts' files for time travel: their maintenance
            # (vacuum, snapshot expiry) removes them, not the writer.
            self._remove_other_attempts()
        return committed

    def _commit_tables(self, window: Window, stats: dict[str, Any]) -> dict[str, TableCommit]:
        """Commit this attempt's files of every landed dataset to its table (transactions last),
        before the commit-log entry: a crash in between leaves table commits a retry replaces."""
        formats = self.sink.tables
        if formats is None:
            return {}
        tag = WindowTag(
            topic_prefix=self.sink.topic_prefix,
            window_seq=window.seq,
            window_id=window.window_id,
            kind=window.kind,
            from_position=None if window.from_lsn is None else str(window.from_lsn),
            to_position=None if window.to_lsn is None else str(window.to_lsn),
            attempt=self.attempt,
            run_id=(stats.get("run") or {}).get("run_id"),
        )
        transactions = Topic.transactions(self.sink.topic_prefix).name
        landed = sorted(
            (t for t in self.topics.values() if not t.name.startswith(self.sink.topic_prefix + ":")),
            key=lambda t: (t.name == transactions, t.name),
        )
        commits = {}
        for topic in landed:
            rel = self.dataset_path(topic)
            names = sorted(n for n in self.sink.storage.list_names(rel) if n.endswith(".parquet"))
            commit = formats.commit_window(topic, [self._file_uri(f"{rel}/{n}") for n in names], tag)
            if commit is not None:
                commits[topic.name] = commit
            faults.point("sink.table_committed")
        return commits

    def _file_uri(self, rel: str) -> str:
        """A landed file or directory as Arrow and the table libraries name it (``s3://``, not ``s3a://``)."""
        if isinstance(self.sink.storage, ObjectStoreStorage):
            return self.sink.storage.dataset_uri(rel)
        return self.sink.storage.uri(rel)

    def close(self) -> None:
        """Stop the file writer thread once its last write is done (nothing is committed)."""
        self._files.close()

    def _remove_other_attempts(self) -> None:
        # Files of crashed or superseded attempts of this window are garbage once the entry is
        # published; a failure here leaves only unreferenced files behind.
        storage = self.sink.storage
        keep = f"attempt={self.attempt}"
        for topic in self.topics.values():
            window_dir = f"{topic.directory}/window={self.window.window_id}"
            try:
                for name in storage.list_names(window_dir):
                    if name.startswith("attempt=") and name != keep:
                        storage.delete_tree(f"{window_dir}/{name}")
            except Exception:
                log.warning("could not clean old attempts under %s", storage.uri(window_dir), exc_info=True)

    def _transaction_topic(self) -> Topic:
        topic = Topic.transactions(self.sink.topic_prefix)
        self.topics.setdefault(topic.name, topic)
        return topic

    def _count(self, topic: Topic, table: pa.Table) -> None:
        self._events[topic.name] += table.num_rows
        if "op" in table.column_names:
            counter = self._ops.setdefault(topic.name, Counter())
            for item in pc.value_counts(table.column("op")).to_pylist():
                counter[item["values"]] += item["counts"]


class _FileWriter:
    """Writes local Parquet files on one background thread, in order, one chunk at a time.

    ``pq.write_table`` releases the GIL for its whole run, so the file of one chunk is written
    while the next chunk is read from the slot (decoding is many short numpy/Arrow calls and
    stays on the reading thread, where it does not wait for the GIL). At most one chunk is in
    flight, so memory stays bounded by two chunks. A failed write is raised by the next
    ``submit`` or by ``drain``; nothing after it is written."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future | None = None

    def submit(self, files: list[tuple[pa.Table, str]], after: Callable[[], None] | None = None) -> None:
        self.drain()
        if not files and after is None:
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cdc-parquet")
        self._pending = self._executor.submit(_write_files, files, after)

    def drain(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Wait for the last write and stop the thread; its error, if any, stays for ``drain``."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def write_parquet_file(path: str, batches: Iterable[pa.RecordBatch], *, row_group_rows: int = 131_072) -> int:
    """Stream record batches (one schema) into one Parquet file, local or on an object store
    (``s3://...``, through the active access); returns the rows written.

    The file appears atomically, so a reader or a retried task never sees half a file; no rows →
    no file. Locally it is written under a temporary name, then renamed; on an object store the
    object appears when its upload completes (an existing one of that name is replaced whole),
    and one whose write failed is deleted. Row groups are written on a background thread
    (``write_table`` releases the GIL for its whole run) while the next one's batches are
    produced, so a snapshot task keeps reading from its server while it writes; memory is two
    row groups."""
    if object_store.is_object_store(path):
        return _write_object(path, batches, row_group_rows)
    import os

    temporary = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
    writer = _RowGroupWriter(
        lambda schema: pq.ParquetWriter(temporary, schema, use_dictionary=_dictionary_columns(schema))
    )
    try:
        total = writer.write(batches, row_group_rows)
        if total:
            os.replace(temporary, path)
    finally:
        writer.shutdown()
        if os.path.exists(temporary):
            os.remove(temporary)
    return total


def _write_object(uri: str, batches: Iterable[pa.RecordBatch], row_group_rows: int) -> int:
    fs, key = object_store.filesystem(uri)
    stream: Any = None

    def open_writer(schema: pa.Schema) -> pq.ParquetWriter:
        nonlocal stream
        stream = fs.open_output_stream(key)  # the object appears when the stream closes
        return pq.ParquetWriter(stream, schema, use_dictionary=_dictionary_columns(schema))

    writer = _RowGroupWriter(open_writer)
    complete = False
    try:
        total = writer.write(batches, row_group_rows)
        if stream is not None:
            stream.close()
        complete = True
    finally:
        writer.shutdown()
        if not complete and stream is not None:
            # Closing completes the upload (Arrow has no abort): remove the partial object.
            try:
                stream.close()
            finally:
                object_store.delete_prefix(uri)
    return total


class _RowGroupWriter:
    """Row groups of a stream of batches written on a background thread, one at a time."""

    def __init__(self, open_writer: Callable[[pa.Schema], pq.ParquetWriter]):
        self._open = open_writer
        self._writer: pq.ParquetWriter | None = None
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cdc-parquet")

    def write(self, batches: Iterable[pa.RecordBatch], row_group_rows: int) -> int:
        """Write every batch; the file's footer too (the writer is closed). The rows written."""
        in_flight: Future | None = None
        pending: list[pa.RecordBatch] = []
        pending_rows = total = 0

        def write(group: list[pa.RecordBatch]) -> None:
            nonlocal in_flight
            if in_flight is not None:
                in_flight.result()  # one row group at a time, in order; raises its error
            if self._writer is None:
                raise RuntimeError("row group written before the Parquet writer was opened")
            in_flight = self._background.submit(self._writer.write_table, pa.Table.from_batches(group))

        for batch in batches:
            if not batch.num_rows:
                continue
            if self._writer is None:
                self._writer = self._open(batch.schema)
            pending.append(batch)
            pending_rows += batch.num_rows
            total += batch.num_rows
            if pending_rows >= row_group_rows:
                write(pending)
                pending, pending_rows = [], 0
        if self._writer is not None:
            if pending:
                write(pending)
            if in_flight is not None:
                in_flight.result()
            writer, self._writer = self._writer, None
            writer.close()
        return total

    def shutdown(self) -> None:
        self._background.shutdown(wait=True)  # a failed read never leaves a write running
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _write_files(files: list[tuple[pa.Table, str]], after: Callable[[], None] | None) -> None:
    for table, path in files:
        if object_store.is_object_store(path):
            _write_object(path, table.to_batches(), max(table.num_rows, 1))
        else:
            _ensure_parent(path)
            pq.write_table(table, path, use_dictionary=_dictionary_columns(table.schema))
    if after is not None:
        after()


#: Columns worth dictionary-encoding: constant or low-cardinality within a chunk. Dictionary
#: encoding of every column (pyarrow's default) spends ~40 % of the write on high-cardinality
#: values (keys, text, LSNs) for almost no size gain (measured: bench/stream_window.py).
_DICTIONARY_COLUMNS = frozenset(
    [f"source.{name}" for name in ("version", "connector", "name", "snapshot", "db", "schema", "table")]
    + ["op", "transaction.id", WINDOW_ID_FIELD, "prefix", "message.prefix", "status"]
)


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    names = {field.name for field in schema}
    flat = [f"{field.name}.{child.name}" for field in schema if pa.types.is_struct(field.type) for child in field.type]
    return sorted(_DICTIONARY_COLUMNS & (names | set(flat)))


def _ensure_parent(path: str) -> None:
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
