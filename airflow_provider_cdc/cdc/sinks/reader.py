"""Reading committed data back: only windows in the commit log, never half-written attempts.

``read_topic_arrow`` needs no Spark (local sinks); ``read_topic_spark`` works for any URI.
Both accept a topic name such as ``shop.public.orders`` or ``shop.transaction``, and merge
events written under different table schemas by the rules in :mod:`.schemas`.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from airflow_provider_cdc.cdc.sinks.commit_log import CommitEntry, CommitLog
from airflow_provider_cdc.cdc.sinks.schemas import conform_table, merge_schemas, spark_read_merged
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
            paths.append(storage.uri(dataset.path))
    return paths


def read_topic_arrow(base_path: str, topic_prefix: str, topic: str) -> pa.Table | None:
    """All committed rows of ``topic`` as one Arrow table (None if nothing was committed)."""
    paths = committed_paths(base_path, topic_prefix, topic)
    if not paths:
        return None
    files = sorted(f for p in paths for f in ds.dataset(p, format="parquet").files)
    tables = [ds.dataset(f, format="parquet").to_table() for f in files]
    if not tables:
        return None
    schema = merge_schemas([t.schema for t in tables])
    return pa.concat_tables([conform_table(t, schema) for t in tables])


def read_topic_spark(spark: Any, base_path: str, topic_prefix: str, topic: str) -> Any:
    """All committed rows of ``topic`` as a Spark DataFrame (None if nothing was committed)."""
    paths = committed_paths(base_path, topic_prefix, topic, spark)
    if not paths:
        return None
    return spark_read_merged(spark, paths)
