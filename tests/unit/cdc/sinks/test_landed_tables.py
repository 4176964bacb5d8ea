"""A run fails, naming the table, when a lake table lost the newest window the log says it holds."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_cdc.cdc.basics.errors import CdcStateError
from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.basics.window import Window, window_id_for
from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry, DatasetCommit
from airflow_provider_cdc.cdc.sinks.formats import WindowTag
from airflow_provider_cdc.cdc.sinks.lake_tables import table_format
from airflow_provider_cdc.cdc.sinks.reader import check_landed_tables

TOPIC = Topic.for_table("p", "public", "orders")


def _land(base, fmt: str, seq: int) -> CommitEntry:
    tables = table_format(fmt, str(base), "p")
    rel = f"{TOPIC.directory}/window={window_id_for(seq)}/attempt=a{seq}"
    (base / rel).mkdir(parents=True)
    pq.write_table(pa.table({"window_id": [window_id_for(seq)], "op": ["c"], "id": [seq]}), base / rel / "part.parquet")
    tag = WindowTag("p", seq, window_id_for(seq), "stream", str(seq), str(seq + 1), f"a{seq}")
    commit = tables.commit_window(TOPIC, [str(base / rel / "part.parquet")], tag)
    window = Window(seq, "stream", seq, seq + 1, 0)
    dataset = DatasetCommit(TOPIC.name, rel, 1, {"c": 1}, commit.to_dict())
    return CommitEntry("p", window, f"a{seq}", (dataset,), 1, None, None, None, 0)


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
def test_a_table_that_holds_the_newest_window_passes_and_a_missing_one_fails(tmp_path, fmt):
    _land(tmp_path, fmt, 1)
    newest = _land(tmp_path, fmt, 2)
    check_landed_tables(newest, str(tmp_path), "p", sink_format=fmt)
    shutil.rmtree(tmp_path / TOPIC.directory)
    if fmt == "iceberg":
        table_format(fmt, str(tmp_path), "p").catalog.drop_table(("p", "public", "orders"))
    with pytest.raises(CdcStateError, match="is gone"):
        check_landed_tables(newest, str(tmp_path), "p", sink_format=fmt)


def test_a_delta_table_restored_to_before_the_newest_window_fails(tmp_path):
    from deltalake import DeltaTable

    _land(tmp_path, "delta", 1)
    newest = _land(tmp_path, "delta", 2)
    table = DeltaTable(str(tmp_path / TOPIC.directory))
    table.restore(table.version() - 1)
    with pytest.raises(CdcStateError, match="no longer holds window 0000000002"):
        check_landed_tables(newest, str(tmp_path), "p", sink_format="delta")
