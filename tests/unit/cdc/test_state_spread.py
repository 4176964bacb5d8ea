"""MERGE into state tables with updates spread uniformly over the keys (issue 32, item 3).

Copy-on-write rewrites every file holding a changed key: with a uniform spread that is most of
the table's files. These tests pin down what must hold whatever the cost: the merged state equals
the rebuild, and readers that know nothing of this package (Polars, DuckDB) see the same rows.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from airflow_provider_cdc.cdc.state.delta_table import DeltaStateTable
from airflow_provider_cdc.cdc.state.iceberg_table import IcebergStateTable
from airflow_provider_cdc.cdc.state.merge import merge_windows
from airflow_provider_cdc.cdc.state.table_rows import plain_types
from airflow_provider_cdc.cdc.state.tables import StateTable
from tests.unit.cdc.test_state_merge import FORMATS, EventLog, duckdb_rows, rows_of, state_table

pytestmark = pytest.mark.spark

ROWS = 2000


def _row(i: int, status: str) -> dict:
    return {"id": i, "status": status, "note": f"order {i} for customer {i % 97}"}


def polars_rows(state: StateTable) -> list[tuple]:
    """The state as Polars reads the table through its format (scan_delta / scan_iceberg)."""
    import polars as pl

    if isinstance(state, DeltaStateTable):
        frame = pl.scan_delta(state.uri).collect()
    else:
        assert isinstance(state, IcebergStateTable)
        frame = pl.scan_iceberg(state._table()).collect()
    return rows_of(plain_types(frame.to_arrow()))


@pytest.mark.parametrize("fmt", FORMATS)
def test_uniform_windows_equal_the_rebuild_for_every_reader(spark, tmp_path, fmt, monkeypatch):
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")  # plan with pyiceberg, without a warning
    log = EventLog(tmp_path / "events", {"id": pa.int64(), "status": pa.string(), "note": pa.string()}, ["id"])
    # Several files (delta-rs sizes them by bytes on disk, pyiceberg by Arrow bytes).
    state = state_table(fmt, tmp_path, target_file_size=(2 if fmt == "delta" else 16) * 1024, row_group_rows=500)
    snapshot = [_row(i, "new") for i in range(ROWS)]
    log.snapshot(snapshot)
    # The snapshot window's state written as is (its fold, a rewrite, is tested elsewhere).
    rows = pa.Table.from_pylist(snapshot, schema=pa.schema(list(log.layout.value_type)))
    state.overwrite(rows, log.tag(), keys=["id"])
    files = len(state.data_files())
    assert files >= 2, files

    # One window: updates and deletes spread over every file's key range, inserts at new keys.
    rng = random.Random(32)
    for i in sorted(rng.sample(range(ROWS), 60)):
        log.update({}, _row(i, "paid"))
    for i in rng.sample(range(ROWS), 10):
        log.delete({"id": i})
    for i in range(ROWS, ROWS + 20):
        log.insert(_row(i, "new"))
    log.commit()
    result = merge_windows(spark, log.events(spark, since=log.seq), state, tag=log.tag())
    assert result.action == "merged", result
    expected = log.rebuild(spark)
    assert rows_of(state.read_version()) == expected, fmt
    assert duckdb_rows(state) == expected, fmt
    assert polars_rows(state) == expected, fmt
