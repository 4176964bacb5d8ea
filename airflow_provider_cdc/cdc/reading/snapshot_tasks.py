"""A snapshot's partitions as Spark tasks, for every source.

A source plans a table's snapshot as a list of partitions (PostgreSQL: block ranges of one
exported snapshot; SQL Server: key ranges) and supplies ``read(partition)``, which runs in a
Spark Python worker and yields the partition's ``op = r`` event batches. This module runs one
task per partition: on a local or object-store sink each task writes its own Parquet file with
Arrow (no Arrow → JVM row conversion and no Spark writer: about half the snapshot's time,
docs/benchmarks.md; on an object store through Arrow's S3 file system, with the access the
driver captured, as the task carries the database connection); on other sinks (``hdfs://``,
``file://``) the batches become a DataFrame that Spark writes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.sinks import object_store
from airflow_provider_cdc.cdc.sinks.object_store import ObjectStoreAccess
from airflow_provider_cdc.cdc.sinks.parquet import write_parquet_file

Reader = Callable[[Any], Iterator[pa.RecordBatch]]


def write_partitions(
    spark: Any,
    writer: Any,
    topic: Topic,
    partitions: Sequence[Any],
    read: Reader,
    *,
    file_name: Callable[[Any], str],
    schema: pa.Schema,
    arrow_writes: bool,
) -> int:
    """Read every partition in a Spark task and write its events to ``topic``; the rows written.

    ``read`` and ``file_name`` are pickled to the workers (module-level functions or partials of
    them). ``file_name(partition)`` names the partition's file, so a retried task replaces its
    own file instead of adding a second one. With ``arrow_writes`` (the sink's
    :attr:`~.ParquetSink.arrow_writes`) each task writes its file with Arrow."""
    work = _work(spark, len(partitions))
    parts = list(partitions)
    if arrow_writes:
        directory = writer.task_directory(topic)
        # The workers do not see the driver's active access: it travels with the task (only to a store).
        access = object_store.current() if object_store.is_object_store(directory) else None
        files = functools.partial(_write, read, file_name, parts, directory, access)
        return writer.record_files(topic, work.mapInArrow(files, "file string, rows long"))
    from airflow_provider_cdc.cdc.basics.spark_session import spark_schema

    frame = work.mapInArrow(functools.partial(_read, read, parts), spark_schema(schema))
    return writer.write_dataframe(topic, frame)


def _work(spark: Any, count: int) -> Any:
    """One Spark partition per snapshot partition, holding its index.

    ``spark.range`` is planned and run by the JVM alone; a DataFrame of the partitions themselves
    (``createDataFrame`` over a parallelized list) cost 0.3-0.7 s more per snapshot job, measured
    on jobs that do nothing else (docs/benchmarks.md)."""
    return spark.range(0, count, 1, max(count, 1))


def _mine(parts: list[Any], batches: Iterator[pa.RecordBatch]) -> Iterator[Any]:
    """The partitions of one Spark task of :func:`_work`."""
    for batch in batches:
        for index in batch.column("id").to_pylist():
            yield parts[index]


def _read(read: Reader, parts: list[Any], batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    # Runs in Spark's Python workers.
    for part in _mine(parts, batches):
        yield from read(part)


def _write(
    read: Reader,
    file_name: Callable[[Any], str],
    parts: list[Any],
    directory: str,
    access: ObjectStoreAccess | None,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    # Runs in Spark's Python workers: each partition becomes one Parquet file. The access is
    # active for this task only: a reused worker must not keep another capture's keys.
    with object_store.task_access(access):
        for part in _mine(parts, batches):
            path = f"{directory}/{file_name(part)}"
            written = write_parquet_file(path, read(part))
            yield pa.RecordBatch.from_pydict({"file": [path], "rows": [written]})
