"""The current-state job on Iceberg and Delta sinks: state tables in the same format, by MERGE.

For each captured table the state is a lake table of the sink's format at
``<state_path>/<topic dir>`` (Iceberg: identifier ``<prefix>_state.<schema>.<table>`` in the
sink's catalog, or a SQLite catalog in ``<state_path>/_cdc_catalog/``). A run applies the
committed windows after the one the table holds (its newest commit's tag) with
:func:`.merge.merge_windows`, touching only the rows and files of the keys they changed.

``as_of`` (a backfill, a cleared run, ``as_of_window``) is the format's time travel to the
version tagged with that window; when the job never stopped at that window (it ran at windows 3
and 6, ``as_of`` is 4), no version holds exactly that state, and it is rebuilt by the fold into
a Parquet version beside the table, as on a Parquet sink: the current table stays untouched.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError, CdcStateError
from airflow_provider_cdc.cdc.basics.naming import Topic
from airflow_provider_cdc.cdc.sinks import spark_files
from airflow_provider_cdc.cdc.sinks.commit_log import CommitLog
from airflow_provider_cdc.cdc.sinks.formats import WindowTag
from airflow_provider_cdc.cdc.sinks.reader import read_windows_spark
from airflow_provider_cdc.cdc.sinks.storage import storage_for
from airflow_provider_cdc.cdc.state.apply import apply_windows
from airflow_provider_cdc.cdc.state.tables import state_table
from airflow_provider_cdc.cdc.state.versions import StateLog, StateResult, StateVersion

TIME_TRAVEL = "time_travel"


def apply_windows_by_merge(
    spark: Any,
    *,
    sink_path: str,
    topic_prefix: str,
    topic: Topic,
    state_path: str,
    sink_format: str,
    as_of_seq: int | None = None,
    table_catalog: dict[str, str] | None = None,
    engine: str = "spark",
) -> StateResult:
    """Bring the state table of ``topic`` up to the last committed window, or answer ``as_of_seq``.
    ``engine``: ``"spark"``, or ``"arrow"`` (``spark`` unused: :func:`.arrow.merge_windows_arrow`)."""
    from airflow_provider_cdc.cdc.state.merge import merge_windows

    provider = None if engine == "arrow" else (lambda: spark)
    committed = CommitLog(storage_for(sink_path, provider), topic_prefix).committed()
    seqs = {e.window.seq for e in committed}
    if as_of_seq is not None and as_of_seq not in seqs:
        raise CdcConfigurationError(f"window {as_of_seq} of capture {topic_prefix!r} is not committed")
    if not committed:
        return StateResult(topic.name, None, (), "empty")
    state = state_table(sink_format, state_path, topic_prefix, topic, table_catalog)
    if as_of_seq is not None and as_of_seq < committed[-1].window.seq:
        return _as_of(spark, state, as_of_seq, sink_path, topic_prefix, topic, state_path, table_catalog, engine)
    target = committed[-1]
    held = state.current_window_seq() if state.exists() else None
    if held is not None and held >= target.window.seq:
        return StateResult(topic.name, _version(state, held, committed), (), "unchanged")
    pending = [e for e in committed if held is None or e.window.seq > held]
    last_snapshot = max((e.window.seq for e in pending if e.window.kind == "snapshot"), default=None)
    if last_snapshot is not None:
        pending = [e for e in pending if e.window.seq >= last_snapshot]
    if engine == "arrow":
        from airflow_provider_cdc.cdc.state.arrow import read_windows_arrow

        events = read_windows_arrow(
            sink_path, topic_prefix, topic.name, committed, pending, table_catalog=table_catalog
        )
    else:
        events = read_windows_spark(
            spark, sink_path, topic_prefix, topic.name, committed, pending, table_catalog=table_catalog
        )
    window = target.window
    tag = WindowTag(
        topic_prefix=topic_prefix,
        window_seq=window.seq,
        window_id=window.window_id,
        kind=window.kind,
        from_position=None if window.from_lsn is None else str(window.from_lsn),
        to_position=None if window.to_lsn is None else str(window.to_lsn),
        attempt=uuid.uuid4().hex[:16],
    )
    if engine == "arrow":
        from airflow_provider_cdc.cdc.state.arrow import merge_windows_arrow

        merged = merge_windows_arrow(events, state, tag=tag, snapshot_seq=last_snapshot)
    else:
        merged = merge_windows(spark, events, state, tag=tag, snapshot_seq=last_snapshot)
    if merged.action == "empty" and not state.exists():
        return StateResult(topic.name, None, tuple(e.window_id for e in pending), "empty")
    detail = {k: v for k, v in merged.to_dict().items() if k not in ("table", "window_seq")}
    return StateResult(
        topic.name, _version(state, window.seq, committed), tuple(e.window_id for e in pending), "applied", detail
    )


def read_state_table(
    spark: Any,
    *,
    state_path: str,
    topic_prefix: str,
    topic: Topic,
    sink_format: str,
    window_seq: int | None,
    table_catalog: dict[str, str] | None = None,
) -> Any:
    """The state of ``topic`` now, or at ``window_seq`` (the tagged version, else an as-of rebuild)."""
    state = state_table(sink_format, state_path, topic_prefix, topic, table_catalog)
    if window_seq is None:
        if not state.exists():
            raise CdcStateError(f"no state of {topic.name} yet")
        return spark_files.read_parquet(spark, state.data_files())
    exact = _exact_version(state, window_seq)
    if exact is not None:
        from airflow_provider_cdc.cdc.state.merge import _to_spark

        return _to_spark(spark, state.read_version(exact))
    rebuilt = _rebuilt(spark, state_path, topic_prefix, topic, window_seq)
    if rebuilt is None:
        raise CdcStateError(f"no state of {topic.name} at window {window_seq}: run the state job as of it first")
    return spark_files.read_parquet(spark, [storage_for(state_path, lambda: spark).uri(rebuilt.path)])


def _as_of(
    spark, state, as_of_seq, sink_path, topic_prefix, topic, state_path, table_catalog, engine="spark"
) -> StateResult:
    exact = _exact_version(state, as_of_seq) if state.exists() else None
    if exact is not None:
        rows = state.read_version(exact).num_rows
        from airflow_provider_cdc.cdc.basics.window import window_id_for

        version = StateVersion(as_of_seq, window_id_for(as_of_seq), f"{topic.directory}@{exact}", rows, True, _now())
        return StateResult(topic.name, version, (), TIME_TRAVEL)
    return apply_windows(
        spark,
        sink_path=sink_path,
        topic_prefix=topic_prefix,
        topic=topic,
        state_path=state_path,
        as_of_seq=as_of_seq,
        table_catalog=table_catalog,
        force_rebuild=True,
        engine=engine,
    )


def _exact_version(state: Any, window_seq: int) -> int | None:
    """The version tagged with exactly ``window_seq`` (the state the fold gives at that window);
    the newest such commit (an Iceberg merge tags its delete and its append)."""
    return next((version for version, seq in state.tagged_versions() if seq == window_seq), None)


def _rebuilt(spark: Any, state_path: str, topic_prefix: str, topic: Topic, window_seq: int) -> StateVersion | None:
    versions = StateLog(storage_for(state_path, lambda: spark), topic_prefix, topic).versions()
    return max((v for v in versions if v.window_seq == window_seq), key=lambda v: v.created_at_ms, default=None)


def _version(state: Any, window_seq: int, committed: list) -> StateVersion:
    """The current version as a :class:`StateVersion` (rows counted from the files' footers: the
    tables are copy-on-write, without delete files)."""
    rows = spark_files.count_rows(state.data_files())
    window_id = next((e.window_id for e in committed if e.window.seq == window_seq), str(window_seq))
    return StateVersion(window_seq, window_id, state.name, rows, False, _now())


def _now() -> int:
    return int(time.time() * 1000)
