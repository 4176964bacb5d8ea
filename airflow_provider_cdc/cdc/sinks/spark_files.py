"""Spark DataFrames from and to Parquet files on object stores, through Arrow inside Spark tasks.

Spark's own S3 connector (hadoop-aws and the AWS SDK jars) cannot be had here, so Spark never
opens an object-store URI itself (docs/architecture.md). This module is the one bridge:

- :func:`read_parquet` lists the files with Arrow on the driver, reads their footers there for
  the DataFrame's schema (files of different schemas merged by :mod:`.schemas`' rules), and reads
  the rows inside Spark tasks, one task per file, each with ``pyarrow.parquet`` through the
  store's Arrow file system; an :class:`Only` filter skips the files and row groups whose
  statistics exclude its values (as Spark pushes a filter down into its Parquet reader);
- :func:`write_parquet` writes a DataFrame with ``mapInArrow``: each partition's task writes one
  file named by its partition and a token of the write, and returns the name and row count to
  the driver; the Parquet types are the ones Spark's writer gives (timestamps as
  ``TIMESTAMP_MICROS``, with ``isAdjustedToUTC`` for ``TimestampType`` only).

Tasks do not see the driver's active access (:func:`.object_store.current`): each closure carries
it, credentials included, as snapshot tasks carry their database connection, and activates it
in the worker. Local paths and other Hadoop URIs (``file://``, ``hdfs://``) keep Spark's reader
and writer.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from airflow_provider_cdc.cdc.basics.errors import CdcStateError
from airflow_provider_cdc.cdc.basics.naming import path_from_uri
from airflow_provider_cdc.cdc.sinks import object_store
from airflow_provider_cdc.cdc.sinks.schemas import conform_table, merge_schemas

#: Spark keeps the DataFrame's schema in this footer key of the files it writes; written too.
SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"


@dataclass(frozen=True)
class WrittenFile:
    uri: str
    rows: int


def bridged(uri: str) -> bool:
    """True when ``uri`` is on an object store: read and written through Arrow, not Spark."""
    return object_store.is_object_store(uri)


# -- listing and footers (driver) --------------------------------------------------------------


def _is_data_file(name: str) -> bool:
    # Spark's and Hadoop's conventions: _SUCCESS, _metadata, .crc and temporary files are not data.
    return name.endswith(".parquet") and not name.startswith(("_", "."))


def list_parquet_files(uris: Sequence[str]) -> list[str]:
    """The Parquet files of ``uris`` (files, or dataset directories listed recursively), as URIs
    of the scheme given, in a stable order; :class:`CdcStateError` when one does not exist."""
    files: list[str] = []
    for uri in uris:
        fs, path = object_store.filesystem(uri)
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            files.append(uri)
            continue
        if info.type == pafs.FileType.NotFound:
            raise CdcStateError(f"{uri!r} does not exist on the object store: nothing to read")
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
        base = uri.rstrip("/")
        found = sorted(
            i.path[len(path.rstrip("/")) + 1 :]
            for i in infos
            if i.type == pafs.FileType.File and _is_data_file(i.base_name)
        )
        files += [f"{base}/{rel}" for rel in found]
    return files


def read_footer(uri: str) -> pq.FileMetaData:
    """The footer of one Parquet file (its schema and row groups' statistics): one ranged GET."""
    fs, path = object_store.filesystem(uri)
    try:
        return pq.read_metadata(path, filesystem=fs)
    except OSError as exc:
        raise OSError(object_store.redact(f"cannot read the footer of {uri}: {exc}")) from None


@dataclass(frozen=True)
class Only:
    """Only the rows whose top-level ``column`` is one of ``values`` (plain values: strings,
    numbers): row groups whose statistics exclude them all are not read, files of no such row
    group not opened, as Spark's reader prunes with a pushed filter."""

    column: str
    values: tuple[Any, ...]

    def row_groups(self, footer: pq.FileMetaData) -> list[int]:
        schema = footer.schema.to_arrow_schema()
        if self.column not in schema.names:
            return []  # the column is null in every row of the file: none is one of the values
        index = footer.schema.names.index(self.column)
        return [g for g in range(footer.num_row_groups) if self._may_hold(footer.row_group(g).column(index))]

    def _may_hold(self, chunk: Any) -> bool:
        stats = chunk.statistics
        if stats is None or not stats.has_min_max:
            return True
        try:
            return any(stats.min <= v <= stats.max for v in self.values)
        except TypeError:  # statistics of another type than the values: read it
            return True

    def apply(self, table: pa.Table) -> pa.Table:
        import pyarrow.compute as pc

        mask = pc.is_in(
            table.column(self.column), value_set=pa.array(self.values, table.schema.field(self.column).type)
        )
        return table.filter(mask)


# -- reading --------------------------------------------------------------------------------


def read_parquet(spark: Any, uris: Sequence[str], *, only: Only | None = None) -> Any:
    """Parquet files or dataset directories as one DataFrame: object stores through Arrow in
    Spark tasks (schemas merged; ``only`` prunes row groups and rows there), other paths with
    ``spark.read.parquet`` as before (``only`` is then the caller's filter to apply)."""
    if not any(bridged(u) for u in uris):
        return spark.read.parquet(*uris)
    if not all(bridged(u) for u in uris):
        raise CdcStateError(f"cannot read object-store and other paths in one DataFrame: {list(uris)!r}")
    files = list_parquet_files(uris)
    if not files:
        raise CdcStateError(f"no Parquet files under {list(uris)!r}")
    with ThreadPoolExecutor(max_workers=min(8, len(files)), thread_name_prefix="cdc-footers") as pool:
        footers = list(pool.map(read_footer, files))  # one GET each: in parallel
    return read_files(spark, files, footers, only=only)


def read_files(
    spark: Any, files: Sequence[str], footers: Sequence[pq.FileMetaData], *, only: Only | None = None
) -> Any:
    """``files`` (object-store URIs, with their ``footers``) as one DataFrame of their merged
    schema (all files', pruned or not: the same schema whatever ``only`` keeps), each file read
    by a Spark task (its own, unless there are more files than a few waves of tasks)."""
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    schemas = [f.schema.to_arrow_schema().remove_metadata() for f in footers]
    spark_schema = from_arrow_schema(merge_schemas(schemas), prefer_timestamp_ntz=True)
    # The batches a task returns must have exactly the Arrow types Spark expects of the schema.
    target = to_arrow_schema(spark_schema, timezone="UTC")
    access = object_store.current()
    reads = [(f, None if only is None else only.row_groups(footer)) for f, footer in zip(files, footers)]
    reads = [(f, groups) for f, groups in reads if groups is None or groups]

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with object_store.task_access(access):
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    yield from _read_file(*reads[index], target, only)

    # A task per file, up to a few waves of the session's cores (then a task reads several files).
    tasks = min(len(reads), max(8, 4 * spark.sparkContext.defaultParallelism))
    ids = spark.range(0, len(reads), 1, numPartitions=max(1, tasks))
    return ids.mapInArrow(read, spark_schema)


def _read_file(
    uri: str, row_groups: list[int] | None, target: pa.Schema, only: Only | None
) -> Iterator[pa.RecordBatch]:
    fs, path = object_store.filesystem(uri)
    try:
        handle = pq.ParquetFile(fs.open_input_file(path))
    except OSError as exc:
        raise OSError(object_store.redact(f"cannot read {uri}: {exc}")) from None
    with handle:
        for batch in handle.iter_batches(row_groups=row_groups):
            table = pa.Table.from_batches([batch])
            if only is not None:
                table = only.apply(table)
            yield from conform_table(table, target).to_batches()


# -- writing --------------------------------------------------------------------------------


def write_parquet(frame: Any, uri: str, *, mode: str = "error") -> list[WrittenFile]:
    """Write ``frame`` as Parquet files into the directory ``uri``; ``mode`` as Spark's
    (``error``, ``overwrite``, ``append``). Object stores: one file per non-empty partition,
    written by its task (one empty file holding the schema when the frame is empty, as Spark's
    writer leaves); other paths: Spark's writer, files listed after it."""
    if not bridged(uri):
        frame.write.mode(mode).parquet(uri)
        return []
    directory = uri.rstrip("/")
    _prepare_directory(directory, mode)
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(frame.schema, timezone="UTC").with_metadata({SPARK_SCHEMA_KEY: frame.schema.json()})
    access = object_store.current()
    token = uuid.uuid4().hex

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        name = f"part-{context.partitionId() if context else 0:05d}-{token}.parquet"
        with object_store.task_access(access):
            rows = _write_file(f"{directory}/{name}", schema, batches)
        if rows:
            yield pa.RecordBatch.from_pydict({"file": [name], "rows": [rows]})

    written = [
        WrittenFile(f"{directory}/{row['file']}", int(row["rows"]))
        for row in frame.mapInArrow(write, "file string, rows long").collect()
    ]
    _remove_unreported(directory, token, {w.uri for w in written})
    if not written:
        name = f"part-00000-{token}.parquet"
        _write_file(f"{directory}/{name}", schema, iter(()), keep_empty=True)
        written = [WrittenFile(f"{directory}/{name}", 0)]
    return sorted(written, key=lambda w: w.uri)


def _remove_unreported(directory: str, token: str, reported: set[str]) -> None:
    """Delete this write's files that no successful task reported: a failed task attempt's file
    whose retry wrote no rows for that partition (Spark's own writer commits only the files of
    successful attempts; a retry with rows replaces its file by the same name)."""
    for uri in list_parquet_files([directory]) if _has_files(directory) else []:
        if token in uri.rsplit("/", 1)[1] and uri not in reported:
            object_store.delete_prefix(object_store.library_uri(uri))


def _has_files(directory: str) -> bool:
    fs, path = object_store.filesystem(directory)
    return bool(fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)))


def _prepare_directory(directory: str, mode: str) -> None:
    if mode not in ("error", "errorifexists", "overwrite", "append"):
        raise ValueError(f"write mode {mode!r}: use 'error', 'overwrite' or 'append'")
    if mode == "append":
        return
    if _has_files(directory):
        if mode == "overwrite":
            object_store.delete_prefix(object_store.library_uri(directory))  # leaves no marker object
        else:
            raise FileExistsError(f"{directory} already holds files: refusing to write Parquet files into it")


def _write_file(uri: str, schema: pa.Schema, batches: Iterator[pa.RecordBatch], *, keep_empty: bool = False) -> int:
    """Write ``batches`` into one Parquet file at ``uri`` (opened at the first row: a partition
    without rows writes nothing unless ``keep_empty``); returns the rows written."""
    fs, path = object_store.filesystem(uri)
    writer: pq.ParquetWriter | None = None
    rows = 0
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            if writer is None:
                # The batches' own types (Spark's Arrow form of the schema), with its footer key.
                writer = _open_writer(fs, path, batch.schema.with_metadata(schema.metadata))
            writer.write_batch(batch)
            rows += batch.num_rows
        if writer is None and keep_empty:
            writer = _open_writer(fs, path, schema)
        if writer is not None:
            writer.close()  # completes the upload: the object appears whole
    except BaseException as exc:
        # Closing is the only way to end Arrow's upload: it would leave a valid file of part of
        # the rows, so the object is deleted after it.
        if writer is not None:
            with contextlib.suppress(Exception):  # the write's own error is the one to report
                writer.close()
                object_store.delete_prefix(object_store.library_uri(uri))
        if isinstance(exc, OSError):
            raise OSError(object_store.redact(f"cannot write {uri}: {exc}")) from None
        raise
    return rows


def _open_writer(fs: Any, path: str, schema: pa.Schema) -> pq.ParquetWriter:
    # Spark's writer: decimals of up to 18 digits as INT32/INT64, microsecond timestamps.
    return pq.ParquetWriter(
        path,
        schema,
        filesystem=fs,
        compression="snappy",
        coerce_timestamps="us",
        store_decimal_as_integer=True,
    )


def count_rows(uris: Sequence[str]) -> int:
    """The rows of the Parquet files ``uris`` (object-store URIs or local paths), from their footers."""
    total = 0
    for uri in uris:
        if not bridged(uri):
            total += pq.read_metadata(uri).num_rows
            continue
        fs, path = object_store.filesystem(uri)
        with fs.open_input_file(path) as handle:
            total += pq.ParquetFile(handle).metadata.num_rows
    return total


# -- Spark ---------------------------------------------------------------------------------------


def spark_read_merged(spark: Any, paths: Sequence[str], *, only: Any = None) -> Any:
    """Read Parquet datasets whose schemas may differ, merged by the rules above.

    ``only`` (an :class:`Only`) lets the object-store reader skip row groups and rows
    outside it; the caller still filters the DataFrame (Spark's reader pushes that filter down)."""
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    if any(bridged(p) for p in paths):
        # Spark cannot open object stores here: Arrow reads them in Spark tasks, merging alike.
        return read_parquet(spark, paths, only=only)

    # One window directory can hold files of several table versions (an ALTER TABLE inside the
    # window), and Spark reads a directory with one schema: group the files by their schema.
    # inputFiles() are encoded URIs: decoded once, or Hadoop reads an escaped directory's '%' twice.
    files = [path_from_uri(f) for path in paths for f in spark.read.parquet(path).inputFiles()]
    groups: dict[str, list[str]] = {}
    schemas: dict[str, Any] = {}
    for file in files:
        schema = spark.read.parquet(file).schema
        groups.setdefault(schema.json(), []).append(file)
        schemas[schema.json()] = schema
    frames = [spark.read.schema(schemas[key]).parquet(*group) for key, group in groups.items()]
    arrow_schemas = [to_arrow_schema(frame.schema, timezone="UTC") for frame in frames]
    merged = from_arrow_schema(merge_schemas(arrow_schemas), prefer_timestamp_ntz=True)
    result = None
    for frame in frames:
        shaped = frame.select(*[_spark_conform(frame.schema, field).alias(field.name) for field in merged.fields])
        result = shaped if result is None else result.unionByName(shaped)
    return result


def _spark_conform(source_schema: Any, field: Any, prefix: str = "") -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, MapType, StringType, StructType

    names = {f.name: f for f in source_schema.fields}
    path = f"{prefix}`{field.name}`"
    if field.name not in names:
        return F.lit(None).cast(field.dataType)
    source_type = names[field.name].dataType
    if isinstance(field.dataType, StructType) and isinstance(source_type, StructType):
        children = [_spark_conform(source_type, child, f"{path}.").alias(child.name) for child in field.dataType.fields]
        return F.when(F.col(path).isNull(), F.lit(None)).otherwise(F.struct(*children)).cast(field.dataType)
    if isinstance(field.dataType, StringType) and isinstance(source_type, (StructType, ArrayType, MapType)):
        return F.to_json(F.col(path))
    return F.col(path).cast(field.dataType)
