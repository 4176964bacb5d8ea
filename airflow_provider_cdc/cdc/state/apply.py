"""Bringing a Parquet sink's state table up to a committed window: fold the windows after the
current version (in Spark or Arrow) into a new version.

Applying windows that are already applied changes nothing; ``as_of_seq`` rebuilds the state at
any committed window without moving the current version.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError
from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.sinks import spark_files
from airflow_provider_cdc.cdc.sinks.commit_log import CommitLog
from airflow_provider_cdc.cdc.sinks.reader import read_windows_spark
from airflow_provider_cdc.cdc.sinks.storage import storage_for
from airflow_provider_cdc.cdc.state.spark_fold import _write_version, fold
from airflow_provider_cdc.cdc.state.versions import StateLog, StateResult, StateVersion

log = logging.getLogger(__name__)


def apply_windows(
    spark: Any,
    *,
    sink_path: str,
    topic_prefix: str,
    topic: Topic,
    state_path: str,
    as_of_seq: int | None = None,
    table_catalog: dict[str, str] | None = None,
    force_rebuild: bool = False,
    engine: str = "spark",
) -> StateResult:
    """Bring the state table of ``topic`` up to ``as_of_seq`` (default: the last committed window).

    ``force_rebuild``: fold ``as_of_seq``'s state from the events into a rebuilt version whatever
    the current one is (lake-format sinks keep their current state in a table, not here).
    ``engine``: ``"spark"``, or ``"arrow"`` (``spark`` unused: :mod:`.arrow`)."""
    provider = None if engine == "arrow" else (lambda: spark)
    sink = storage_for(sink_path, provider)
    state = storage_for(state_path, provider)
    entries = committed = CommitLog(sink, topic_prefix).committed()
    if as_of_seq is not None:
        if as_of_seq not in {e.window.seq for e in entries}:
            raise CdcConfigurationError(f"window {as_of_seq} of capture {topic_prefix!r} is not committed")
        entries = [e for e in entries if e.window.seq <= as_of_seq]
    if not entries:
        return StateResult(topic.name, None, (), "empty")
    state_log = StateLog(state, topic_prefix, topic)
    current = None if force_rebuild else state_log.current()
    target = entries[-1].window
    rebuild = force_rebuild or (current is not None and target.seq < current.window_seq)
    if current is not None and target.seq == current.window_seq:
        return StateResult(topic.name, current, (), "unchanged")
    existing = next((v for v in state_log.versions() if v.window_seq == target.seq), None)
    if rebuild and existing is not None:
        return StateResult(topic.name, existing, (), "unchanged")
    base = None if rebuild or current is None else current
    pending = [e for e in entries if base is None or e.window.seq > base.window_seq]
    last_snapshot = max((e.window.seq for e in pending if e.window.kind == "snapshot"), default=None)
    if last_snapshot is not None:
        base = None  # a snapshot window is a complete image: earlier state does not matter
        pending = [e for e in pending if e.window.seq >= last_snapshot]
    if engine == "arrow":
        from airflow_provider_cdc.cdc.state import arrow as state_arrow
        from airflow_provider_cdc.cdc.state import arrow_fold as state_fold_arrow

        events = state_arrow.read_windows_arrow(
            sink_path, topic_prefix, topic.name, committed, pending, table_catalog=table_catalog
        )
        base_frame = state_arrow.read_parquet_arrow([state.uri(base.path)]) if base is not None else None
        folded = state_fold_arrow.fold(events, base_frame)
    else:
        events = read_windows_spark(
            spark, sink_path, topic_prefix, topic.name, committed, pending, table_catalog=table_catalog
        )
        base_frame = spark_files.read_parquet(spark, [state.uri(base.path)]) if base is not None else None
        folded = fold(spark, events, base_frame)
    if folded is None:
        folded = base_frame
    attempt = uuid.uuid4().hex[:12]
    rel = f"{topic.directory}/version={target.window_id}-{attempt}"
    if folded is None:
        return StateResult(topic.name, None, tuple(e.window_id for e in pending), "empty")
    if engine == "arrow":
        rows = state_arrow.write_version_arrow(folded, state.uri(rel))
    else:
        rows = _write_version(spark, folded, state.uri(rel))
    version = StateVersion(target.seq, target.window_id, rel, rows, rebuild, int(time.time() * 1000))
    state_log.append(version)
    log.info(
        "state of %s at window %s: %d rows (%s, %s)",
        topic.name,
        target.window_id,
        rows,
        "rebuilt" if rebuild else "applied",
        engine,
    )
    return StateResult(topic.name, version, tuple(e.window_id for e in pending), "rebuilt" if rebuild else "applied")
