"""The Spark ↔ object-store Parquet bridge (cdc/sinks/spark_files.py) against a real S3 server:
what it writes and reads equals what Spark's own writer and reader do on a local path."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_cdc.cdc.sinks import object_store, spark_files
from airflow_provider_cdc.cdc.sinks.spark_files import spark_read_merged
from tests.support.s3_server import BUCKET

pytestmark = pytest.mark.spark

SCHEMA = (
    "id long, amount decimal(10,2), big decimal(38,10), at timestamp, local timestamp_ntz, day date, "
    "after struct<name:string, tags:array<string>, attrs:map<string,int>, inner:struct<x:double>>, raw binary"
)


def _rows():
    at = dt.datetime(2024, 3, 1, 12, 30, 15, 123456, tzinfo=dt.UTC)
    return [
        (
            i,
            Decimal(f"{i}.25"),
            Decimal("12345678901234567890.0123456789"),
            at + dt.timedelta(hours=i),
            dt.datetime(2024, 3, 1, 1, 2, 3, 654321) + dt.timedelta(days=i),
            dt.date(2024, 1, 1) + dt.timedelta(days=i),
            None if i == 3 else (f"n{i}", [f"t{i}", None], {"k": i}, (i / 3,)),
            bytes([i, 0, 255]),
        )
        for i in range(1, 6)
    ]


def _sorted(frame):
    return [r.asDict(recursive=True) for r in frame.orderBy("id").collect()]


def _physical(file: str, filesystem=None) -> str:
    """The Parquet schema of a file (physical and logical types), without Arrow's own names."""
    lines = str(pq.ParquetFile(file, filesystem=filesystem).schema).splitlines()
    return "\n".join(lines[2:])  # past the object's repr and the root group's name


def test_round_trip_equals_sparks_own_writer_and_reader(spark, s3_prefix, s3_server, tmp_path):
    frame = spark.createDataFrame(_rows(), SCHEMA).repartition(2)
    local = str(tmp_path / "local")
    frame.write.parquet(local)
    written = spark_files.write_parquet(frame, f"{s3_prefix}/bridge")

    assert sum(w.rows for w in written) == 5 and len(written) == 2
    keys = s3_server.keys("lake", f"{s3_prefix.split('/', 3)[3]}/bridge/")
    assert sorted(f"s3://lake/{k}" for k in keys) == [w.uri for w in written]
    back = spark_files.read_parquet(spark, [f"{s3_prefix}/bridge"])
    expected = spark.read.parquet(local)
    assert back.schema == expected.schema
    rows = _sorted(back)
    assert rows == _sorted(expected)
    assert len(rows) == 5 and rows[2]["after"] is None and rows[0]["after"]["tags"] == ["t1", None]
    # The files have the Parquet types Spark's writer gives (timestamps, decimals, nesting).
    spark_file = next(p for p in (tmp_path / "local").iterdir() if p.suffix == ".parquet")
    fs, path = object_store.filesystem(written[0].uri)
    assert _physical(path, fs) == _physical(str(spark_file))
    # DuckDB reads them from the store (over Arrow's S3 file system: httpfs cannot be installed here).
    import duckdb
    import pyarrow.dataset as ds

    bridge = ds.dataset(path.rsplit("/", 1)[0], filesystem=fs, format="parquet")  # noqa: F841 - DuckDB scans it
    query = 'SELECT sum(amount), max("at"), count(*) FILTER (WHERE "after" IS NULL) FROM bridge'
    assert duckdb.sql(query).fetchall() == [
        (Decimal("16.25"), dt.datetime(2024, 3, 1, 17, 30, 15, 123456, tzinfo=dt.UTC), 1)
    ]
    # Spark's reader reads the bridge's files as its own (copied down to a local path).
    copy = tmp_path / "copy.parquet"
    copy.write_bytes(fs.open_input_file(path).read())
    assert spark.read.parquet(str(copy)).schema == expected.schema


def test_files_of_two_schemas_are_merged_like_sparks_local_read(spark, s3_prefix, tmp_path):
    old = pa.table({"id": pa.array([1, 2], pa.int32()), "name": ["a", "b"]})
    new = pa.table({"id": pa.array([3], pa.int64()), "price": pa.array([Decimal("1.50")], pa.decimal128(5, 2))})
    (tmp_path / "d").mkdir()
    for name, table in (("part-0.parquet", old), ("part-1.parquet", new)):
        pq.write_table(table, str(tmp_path / "d" / name))
        fs, path = object_store.filesystem(f"{s3_prefix}/d/{name}")
        pq.write_table(table, path, filesystem=fs)

    merged = spark_read_merged(spark, [f"{s3_prefix}/d"])
    local = spark_read_merged(spark, [str(tmp_path / "d")])
    # Same columns and types (their order follows the order the reader lists the files in:
    # Spark's by size, the bridge's by name).
    assert sorted(merged.schema.fields, key=lambda f: f.name) == sorted(local.schema.fields, key=lambda f: f.name)
    assert merged.schema.simpleString() == "struct<id:bigint,name:string,price:decimal(5,2)>"
    assert _sorted(merged) == _sorted(local)


def test_an_empty_frame_leaves_one_file_with_its_schema(spark, s3_prefix):
    frame = spark.createDataFrame([], "id long, at timestamp")
    written = spark_files.write_parquet(frame, f"{s3_prefix}/empty")
    assert [w.rows for w in written] == [0]
    back = spark_files.read_parquet(spark, [f"{s3_prefix}/empty"])
    assert back.schema == frame.schema and back.count() == 0
    with pytest.raises(FileExistsError):
        spark_files.write_parquet(frame, f"{s3_prefix}/empty")
    assert len(spark_files.write_parquet(frame, f"{s3_prefix}/empty", mode="overwrite")) == 1
    assert len(spark_files.list_parquet_files([f"{s3_prefix}/empty"])) == 1


def test_only_reads_the_files_and_row_groups_that_may_hold_the_values(spark, s3_prefix):
    files = {
        "part-1.parquet": pa.table({"window_id": ["w1"] * 2, "n": [1, 2], "old": ["x", "y"]}),
        "part-2.parquet": pa.table({"window_id": ["w2"] * 2, "n": [3, 4]}),
        "part-3.parquet": pa.table({"window_id": ["w2", "w2", "w3", "w3"], "n": [5, 6, 7, 8]}),
    }
    for name, table in files.items():
        fs, path = object_store.filesystem(f"{s3_prefix}/t/{name}")
        pq.write_table(table, path, filesystem=fs, row_group_size=2)  # part-3: a row group per window

    only = spark_files.Only("window_id", ("w2",))
    frame = spark_files.read_parquet(spark, [f"{s3_prefix}/t"], only=only)
    assert frame.rdd.getNumPartitions() == 2  # part-1 is not opened
    assert frame.schema.simpleString() == "struct<window_id:string,n:bigint,old:string>"  # all files' columns
    assert _sorted_by(frame, "n") == [{"window_id": "w2", "n": n, "old": None} for n in (3, 4, 5, 6)]
    fs, path = object_store.filesystem(f"{s3_prefix}/t/part-3.parquet")
    assert only.row_groups(pq.read_metadata(path, filesystem=fs)) == [0]
    none = spark_files.read_parquet(spark, [f"{s3_prefix}/t"], only=spark_files.Only("window_id", ("w9",)))
    assert none.schema == frame.schema and none.count() == 0


def _sorted_by(frame, column):
    return [r.asDict() for r in frame.orderBy(column).collect()]


def test_a_failed_write_leaves_no_file_and_unreported_files_are_removed(s3_server, s3_prefix):
    schema = pa.schema([("id", pa.int64())])

    def failing():
        yield pa.record_batch([pa.array([1, 2])], schema=schema)
        raise OSError("the source went away")

    with pytest.raises(OSError, match="the source went away"):
        spark_files._write_file(f"{s3_prefix}/w/part-00000-tok.parquet", schema, failing())
    root = object_store.split_bucket(s3_prefix)[1]
    assert s3_server.keys(BUCKET, root + "/") == []  # not a valid file of half the rows

    # A failed task attempt's file that its successful retry did not report goes; others stay.
    for name in ("part-00000-tok.parquet", "part-00001-tok.parquet", "part-00000-other.parquet"):
        spark_files._write_file(
            f"{s3_prefix}/w/{name}", schema, iter([pa.record_batch([pa.array([1])], schema=schema)])
        )
    spark_files._remove_unreported(f"{s3_prefix}/w", "tok", {f"{s3_prefix}/w/part-00000-tok.parquet"})
    assert sorted(k.rsplit("/", 1)[1] for k in s3_server.keys(BUCKET, root + "/")) == [
        "part-00000-other.parquet",
        "part-00000-tok.parquet",
    ]
