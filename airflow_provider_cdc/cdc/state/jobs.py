"""The current-state job and reader: which engine folds (Spark or Arrow) and which sink holds the
state (a Parquet sink's versions or an Iceberg/Delta state table); read a state back.

The top of the state stage: it imports the rest of it.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcStateError
from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.sinks import spark_files
from airflow_provider_cdc.cdc.sinks.commit_log import CommitLog
from airflow_provider_cdc.cdc.sinks.storage import ensure_private_root, storage_for
from airflow_provider_cdc.cdc.state.apply import apply_windows
from airflow_provider_cdc.cdc.state.versions import StateLog

log = logging.getLogger(__name__)


def read_state(
    spark: Any,
    *,
    state_path: str,
    topic_prefix: str,
    topic: Topic,
    window_seq: int | None = None,
    sink_format: str = "parquet",
    table_catalog: dict[str, str] | None = None,
) -> Any:
    """The current state table (or the version built at ``window_seq``) as a DataFrame; on
    Iceberg/Delta sinks the state table of that format (at the version tagged ``window_seq``)."""
    if sink_format != "parquet":
        from airflow_provider_cdc.cdc.state.lake import read_state_table

        return read_state_table(
            spark,
            state_path=state_path,
            topic_prefix=topic_prefix,
            topic=topic,
            sink_format=sink_format,
            window_seq=window_seq,
            table_catalog=table_catalog,
        )
    state = storage_for(state_path, lambda: spark)
    state_log = StateLog(state, topic_prefix, topic)
    versions = state_log.versions()
    version = (
        state_log.current()
        if window_seq is None
        else max((v for v in versions if v.window_seq == window_seq), key=lambda v: v.created_at_ms, default=None)
    )
    if version is None:
        raise CdcStateError(f"no state of {topic.name} {'yet' if window_seq is None else f'at window {window_seq}'}")
    return spark_files.read_parquet(spark, [state.uri(version.path)])


def run_state_job(spec: Any, spark_provider: Any = None) -> list[dict]:
    """Run a :class:`StateJobSpec`: one state table per topic."""
    from airflow_provider_cdc.cdc.sinks import object_store

    with object_store.using(spec.object_store):
        return _run_state_job(spec, spark_provider)


def _run_state_job(spec: Any, spark_provider: Any = None) -> list[dict]:
    from airflow_provider_cdc.cdc.sinks.reader import check_entry_formats
    from airflow_provider_cdc.cdc.state.arrow import ARROW, choose_engine

    engine, size = choose_engine(spec)
    if engine == ARROW:
        if not _arrow_opens(spec):
            raise CdcConfigurationError(
                f"state_engine='arrow' reads and writes local paths and object stores only, not "
                f"{spec.sink_path!r} / {spec.state_path!r}: use state_engine='spark' (or 'auto') for Hadoop URIs"
            )
        spark = None
    else:
        from airflow_provider_cdc.cdc.basics.spark_session import get_or_create_session

        spark = spark_provider() if spark_provider is not None else get_or_create_session(spec.spark)
    log.info("current-state engine: %s%s", engine, f" ({size})" if size is not None else "")
    ensure_private_root(spec.state_path)  # a local state path's root, before anything lands in it: 0700
    # The tables are of the capture's own format, never one a (forgeable) log entry names.
    check_entry_formats(
        CommitLog(storage_for(spec.sink_path, None if spark is None else lambda: spark), spec.topic_prefix).committed(),
        spec.sink_format,
        spec.topic_prefix,
    )
    results = []
    for name, directory in spec.topics:
        if spec.sink_format != "parquet":
            from airflow_provider_cdc.cdc.state.lake import apply_windows_by_merge

            result = apply_windows_by_merge(
                spark,
                sink_path=spec.sink_path,
                topic_prefix=spec.topic_prefix,
                topic=Topic(name, directory),
                state_path=spec.state_path,
                sink_format=spec.sink_format,
                as_of_seq=spec.as_of_seq,
                table_catalog=spec.catalog_properties(),
                engine=engine,
            )
            results.append({**result.to_dict(), "engine": engine})
            continue
        result = apply_windows(
            spark,
            sink_path=spec.sink_path,
            topic_prefix=spec.topic_prefix,
            topic=Topic(name, directory),
            state_path=spec.state_path,
            as_of_seq=spec.as_of_seq,
            table_catalog=spec.catalog_properties(),
            engine=engine,
        )
        results.append({**result.to_dict(), "engine": engine})
    return results


def _arrow_opens(spec: Any) -> bool:
    from airflow_provider_cdc.cdc.state.arrow import _arrow_opens as opens

    return opens(spec.sink_path) and opens(spec.state_path)
