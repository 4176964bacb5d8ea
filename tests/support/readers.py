"""Both window readers on the same window: the SQL functions and the replication protocol must land
the same events, bit for bit (sources/postgres/sql_window.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry
from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job
from airflow_provider_cdc.cdc.sources.postgres.spec import PostgresJobSpec


def no_spark():
    raise AssertionError("a stream window on a local sink must not start Spark")


def run_with(spec: PostgresJobSpec, reader: str, sink: Path | str) -> CommitEntry:
    """Run ``spec``'s window with ``reader`` ('sql' or 'stream') into a Parquet sink at ``sink``."""
    options = replace(spec.options, window_reader=reader, sink_format="parquet")
    return run_job(replace(spec, options=options, sink_path=str(sink)), spark_provider=no_spark)


def landed(sink: Path | str, entry: CommitEntry, prefix: str = "t") -> dict[str, pa.Table]:
    """Every dataset the window landed, as committed."""
    return {d.topic: read_topic_arrow(str(sink), prefix, d.topic) for d in entry.datasets}


def assert_readers_agree(spec: PostgresJobSpec, scratch: Path) -> None:
    """Read the (unacknowledged) window of ``spec`` with each reader and compare what lands: the
    same datasets, rows, order and bytes; the commit entries' counts alike."""
    sql = run_with(spec, "sql", scratch / "sql")
    stream = run_with(spec, "stream", scratch / "stream")
    assert [(d.topic, d.events, d.ops) for d in sql.datasets] == [(d.topic, d.events, d.ops) for d in stream.datasets]
    assert sql.transactions == stream.transactions
    prefix = spec.topic_prefix
    by_sql, by_stream = landed(scratch / "sql", sql, prefix), landed(scratch / "stream", stream, prefix)
    assert by_sql.keys() == by_stream.keys()
    for topic, table in by_sql.items():
        other = by_stream[topic]
        if table is None or other is None:
            assert table is other, topic
            continue
        assert table.schema == other.schema, topic
        for name in table.column_names:
            ours, theirs = (t.column(name).combine_chunks() for t in (table, other))
            assert _same(ours, theirs), f"{topic}: the readers landed different values in {name!r}"


def _same(a: pa.Array, b: pa.Array) -> bool:
    """Equal values, floats by their bits (NaN equals itself, -0.0 differs from 0.0)."""
    if a.type != b.type or len(a) != len(b):
        return False
    if a.equals(b):
        return True
    if not a.is_valid().equals(b.is_valid()):
        return False
    if pa.types.is_floating(a.type):
        width = {16: pa.int16(), 32: pa.int32(), 64: pa.int64()}[a.type.bit_width]
        return a.view(width).equals(b.view(width))
    if pa.types.is_struct(a.type):
        return all(_same(a.field(i), b.field(i)) for i in range(a.type.num_fields))
    if pa.types.is_list(a.type) or pa.types.is_large_list(a.type):
        return a.value_lengths().equals(b.value_lengths()) and _same(a.flatten(), b.flatten())
    return False


def run_spec_file(path: str) -> None:
    """Run the window job of a spec file in this process (a subprocess a test kills mid-read)."""
    spec = PostgresJobSpec.from_json(Path(path).read_text(encoding="utf-8"))
    run_job(replace(spec, connection=spec.connection.with_password_from_env()), spark_provider=no_spark)
