"""Parquet datasets with a commit log: the default sink.

Layout under the base path (``<dir>`` is the escaped topic name, see :mod:`..naming`)::

    <dir>/window=<window_id>/attempt=<attempt>/part-*.parquet   events of one window attempt
    _cdc_log/<prefix>/<n>.json                                   commit log (see commit_log.py)

A window writes into a fresh attempt directory, then publishes one commit-log entry naming it;
only then do readers see it. Re-running a window writes a new attempt and a new entry that
supersedes the old one, whose files are then deleted: a re-run replaces, never duplicates.

Driver-side batches (stream windows) are written with Arrow directly when the base path is
local: the slot has one reader, so Spark executors have nothing to parallelise there, and
Arrow's writer avoids the JVM round trip. Hadoop URIs go through Spark's writers. Snapshot
tables are always written by Spark tasks (``write_dataframe``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_cdc.cdc import faults
from airflow_provider_cdc.cdc.errors import from_remote_traceback
from airflow_provider_cdc.cdc.naming import Topic
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry, CommitLog, DatasetCommit
from airflow_provider_cdc.cdc.sinks.storage import LocalStorage, storage_for
from airflow_provider_cdc.cdc.window import Window

log = logging.getLogger(__name__)


class ParquetSink:
    def __init__(self, base_path: str, topic_prefix: str, spark_provider: Callable[[], Any] | None = None):
        self.base_path = base_path
        self.topic_prefix = topic_prefix
        self.spark_provider = spark_provider
        self.storage = storage_for(base_path, spark_provider)
        self.log = CommitLog(self.storage, topic_prefix)

    @property
    def is_local(self) -> bool:
        return isinstance(self.storage, LocalStorage)

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

    def dataset_path(self, topic: Topic) -> str:
        return f"{topic.directory}/window={self.window.window_id}/attempt={self.attempt}"

    def write_chunk(self, batches: dict[str, list[pa.RecordBatch]], transactions: pa.RecordBatch | None) -> None:
        """Append one chunk of driver-side batches (stream windows)."""
        for topic_name, topic_batches in batches.items():
            self.write_batches(self.topics[topic_name], topic_batches)
        if transactions is not None:
            self.write_batches(self._transaction_topic(), [transactions])
        faults.point("window.chunk_written")

    def write_batches(self, topic: Topic, batches: list[pa.RecordBatch]) -> None:
        by_schema: dict[pa.Schema, list[pa.RecordBatch]] = {}
        for batch in batches:
            if batch.num_rows:
                by_schema.setdefault(batch.schema, []).append(batch)
        for schema, group in by_schema.items():
            table = pa.Table.from_batches(group, schema=schema)
            self._count(topic, table)
            if self.sink.is_local:
                self._parts += 1
                path = f"{self.sink.storage.uri(self.dataset_path(topic))}/part-{self._parts:05d}.parquet"
                _ensure_parent(path)
                pq.write_table(table, path)
            else:
                from airflow_provider_cdc.cdc.spark_session import spark_schema

                spark = self.sink.spark_provider()
                frame = spark.createDataFrame(table, schema=spark_schema(table.schema))
                frame.coalesce(1).write.mode("append").parquet(self.sink.storage.uri(self.dataset_path(topic)))

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
        datasets = tuple(
            DatasetCommit(
                topic=name,
                path=self.dataset_path(self.topics[name]),
                events=self._events[name],
                ops=dict(self._ops.get(name, {})),
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
        self._remove_other_attempts()
        return committed

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


def _ensure_parent(path: str) -> None:
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
