"""The landed Iceberg and Delta tables, read without the product: DuckDB, Polars, pyiceberg, deltalake.

A capture lands a snapshot and two stream windows (one with a column added); then a window's
table commits are made while its commit-log entry is not (a crash between the two), and the
window is run again. Every reader must see exactly the committed events, once.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import duckdb
import polars as pl
import pytest

from airflow_provider_cdc.cdc.basics import faults
from airflow_provider_cdc.cdc.basics.errors import CdcTransientError
from airflow_provider_cdc.cdc.sinks.reader import read_topic_arrow
from airflow_provider_cdc.cdc.sources.postgres.jobs import run_job
from tests.support.databases import stream_window
from tests.support.scenario import Scenario

pytestmark = pytest.mark.spark


def _canonical(rows) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)


def _own_library(sink: Path, sink_format: str, topic_dir: str) -> list[dict]:
    """The table read by its format's own library, as any tool would: by location."""
    if sink_format == "delta":
        from deltalake import DeltaTable

        return DeltaTable(str(sink / topic_dir)).to_pyarrow_table().to_pylist()
    return _iceberg_table(sink).scan().to_arrow().to_pylist()


def _data_files(sink: Path, sink_format: str, topic_dir: str) -> list[str]:
    if sink_format == "delta":
        from deltalake import DeltaTable

        return [f.removeprefix("file://") for f in DeltaTable(str(sink / topic_dir)).file_uris()]
    return [task.file.file_path.removeprefix("file://") for task in _iceberg_table(sink).scan().plan_files()]


def _iceberg_table(sink: Path):
    """The orders table through the default catalog: a SQLite file beside the sink."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("cdc", uri=f"sqlite:///{sink}/_cdc_catalog/iceberg.db", warehouse=f"file://{sink}")
    return catalog.load_table(("t", "public", "orders"))


@pytest.mark.parametrize("sink_format", ["iceberg", "delta"])
def test_third_party_readers_see_exactly_the_committed_events(db15, spark, tmp_path, sink_format, monkeypatch):
    db = db15
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, status text, qty int)")
    db.execute("INSERT INTO orders SELECT g, 'new', g FROM generate_series(1, 50) g")
    scenario = Scenario(db, ["public.orders"], tmp_path, spark=spark, sink_format=sink_format)
    scenario.snapshot()
    db.execute("UPDATE orders SET status = 'paid' WHERE id <= 10; DELETE FROM orders WHERE id > 45")
    scenario.window()
    db.execute("ALTER TABLE orders ADD COLUMN note text; INSERT INTO orders VALUES (100, 'new', 1, 'gift')")
    db.execute("UPDATE orders SET note = 'rush' WHERE id = 1")

    # The third window: killed after its table commit, before its commit-log entry; then run again.
    end = db.current_lsn()
    spec = scenario._spec(stream_window(scenario.seq + 1, scenario.position, end))
    monkeypatch.setattr(faults, "_hits", Counter())  # fault counts are per process
    monkeypatch.setenv(faults.ENV, "sink.table_committed:raise:1")
    with pytest.raises(CdcTransientError):
        run_job(spec)
    monkeypatch.delenv(faults.ENV)
    third = run_job(spec)
    scenario.seq += 1
    scenario._acknowledge(end)

    committed = read_topic_arrow(str(scenario.sink), "t", "t.public.orders").to_pylist()
    assert len(committed) == 50 + 10 + 5 + 2
    assert {e["window_id"] for e in committed} == {"0000000001", "0000000002", third.window_id}

    topic_dir = third.dataset("t.public.orders").path.split("/window=")[0]
    assert _canonical(_own_library(scenario.sink, sink_format, topic_dir)) == _canonical(committed)

    files = _data_files(scenario.sink, sink_format, topic_dir)
    duck = duckdb.sql(
        "SELECT window_id, op, after.id AS id, after.note AS note FROM read_parquet($files, union_by_name = true)",
        params={"files": files},
    ).fetchall()
    assert sorted(duck, key=str) == sorted(
        ((e["window_id"], e["op"], (e["after"] or {}).get("id"), (e["after"] or {}).get("note")) for e in committed),
        key=str,
    )

    if sink_format == "delta":
        frame = pl.read_delta(str(scenario.sink / topic_dir))
    else:
        frame = pl.scan_iceberg(_iceberg_table(scenario.sink)).collect()
    assert frame.height == len(committed)
    assert frame.filter(pl.col("op") == "d").height == 5
    scenario.assert_state_matches_source("public.orders", ["id"])
