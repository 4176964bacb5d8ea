"""Query-based watermark extraction of one table or view (no replication slot needed).

For sources where log-based capture is not possible: no REPLICATION privilege, views, or tables
of a database without ``wal_level = logical``. See :mod:`airflow_provider_cdc.cdc.sources.postgres.query`
for the algorithm and docs/query_extraction.md for what it can and cannot see (deletes).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from airflow_provider_cdc.captures.base import check_object_store_conn_id
from airflow_provider_cdc.cdc.basics.errors import OffsetMismatchError
from airflow_provider_cdc.cdc.basics.naming import validate_topic_prefix
from airflow_provider_cdc.cdc.basics.tables import TableRef
from airflow_provider_cdc.cdc.basics.window import Window
from airflow_provider_cdc.cdc.planning.runs import decide, record_run
from airflow_provider_cdc.cdc.planning.spec import DEFAULT_SPARK_MASTER, SparkOptions
from airflow_provider_cdc.cdc.reading.query_extract import QueryExtraction, QueryOffset
from airflow_provider_cdc.cdc.sinks.commit_log import CommitLog
from airflow_provider_cdc.cdc.sinks.path_checks import check_writable
from airflow_provider_cdc.cdc.sinks.storage import storage_for
from airflow_provider_cdc.offsets.base import OffsetStore
from airflow_provider_cdc.operators.base import fail_fast_on_terminal_errors
from airflow_provider_cdc.utils.runs import run_interval
from airflow_provider_cdc.version_compat import AirflowSkipException, BaseOperator, Context


class PostgresQueryExtractOperator(BaseOperator):
    """Each run extracts the rows of ``table`` whose ``cursor_column`` moved past the stored
    watermark (minus ``lookback``), as Debezium-shaped events (``source.snapshot = "query"``).

    :param postgres_conn_id: the source's Airflow connection (no REPLICATION needed)
    :param table: ``schema.table`` (a table, view, materialized view or foreign table)
    :param cursor_column: a timestamp/date column, or an increasing integer/numeric column
    :param topic_prefix: the extraction's own prefix (it keys the offset, the lock and the topic)
    :param sink_path: base directory or Hadoop URI of the datasets. Templated.
    :param key_columns: what identifies a row (default: the primary key; required for views)
    :param lookback: seconds (temporal cursor) or units (numeric cursor) re-read below the
        watermark, for transactions that commit late; rows already emitted unchanged are dropped
    :param created_column: optional creation-time column: rows created after the previous
        watermark become ``c`` events, the others ``u`` (default: every row is ``r``)
    :param offset_store: ``"variable"``, ``"state_table"`` or an :class:`OffsetStore`
    :param offset_table: the ``state_table`` store's table (``schema.table``)
    :param offset_table_owner: the role owning ``offset_table`` when it is not the connection's
        role (an administrator created it): any other owner is refused, as for captures
    :param object_store_conn_id: an Airflow ``aws`` connection for a ``sink_path`` on S3 (as a
        capture's); None: the workers' own credentials
    """

    template_fields: Sequence[str] = ("sink_path",)
    ui_color = "#e8f4d4"

    def __init__(
        self,
        *,
        postgres_conn_id: str,
        table: str | TableRef,
        cursor_column: str,
        topic_prefix: str,
        sink_path: str,
        key_columns: Sequence[str] = (),
        lookback: float = 0.0,
        created_column: str | None = None,
        offset_store: str | OffsetStore = "variable",
        offset_table: str = "cdc_state.offsets",
        offset_table_owner: str | None = None,
        spark_master: str = DEFAULT_SPARK_MASTER,
        object_store_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        validate_topic_prefix(topic_prefix)
        if "{{" not in str(sink_path):  # templated: checked when it is rendered
            check_object_store_conn_id(object_store_conn_id, str(sink_path))
        if isinstance(key_columns, str):
            key_columns = [key_columns]
        self.extraction = QueryExtraction(
            topic_prefix=topic_prefix,
            table=TableRef.coerce(table),
            cursor_column=cursor_column,
            key_columns=tuple(key_columns),
            lookback=lookback,
            created_column=created_column,
        )
        self.postgres_conn_id = postgres_conn_id
        self.sink_path = sink_path
        self.offset_store = offset_store
        self.offset_table = offset_table
        self.offset_table_owner = offset_table_owner
        self.spark_master = spark_master
        self.object_store_conn_id = object_store_conn_id

    def _store(self) -> OffsetStore:
        from airflow_provider_cdc.capture import PostgresCapture

        capture = PostgresCapture(
            postgres_conn_id=self.postgres_conn_id,
            tables=[self.extraction.table],
            topic_prefix=self.extraction.topic_prefix,
            sink_path=self.sink_path,
            offset_store=self.offset_store,
            offset_table=self.offset_table,
            offset_table_owner=self.offset_table_owner,
        )
        return capture.store()

    def execute(self, context: Context) -> dict[str, Any]:
        # The hook and the engine (psycopg, pyarrow) load here, not when the DAG file is parsed.
        from airflow_provider_cdc import spark_runner
        from airflow_provider_cdc.hooks.postgres_cdc import PostgresCdcHook

        prefix = self.extraction.topic_prefix
        hook = PostgresCdcHook(self.postgres_conn_id)
        store = self._store()
        source = store.describe(prefix)
        interval = run_interval(context)
        self._killed, self._executing = False, True
        try:
            with spark_runner.cancel_before_timeout(lambda: self._executing), self._object_store():
                return self._extract(context, hook, store, source, interval)
        except BaseException as exc:
            if self._killed:  # on_kill cancelled the jobs; PySpark's cleanup may have hidden its exception
                from airflow.sdk.exceptions import AirflowTaskTerminated

                if not isinstance(exc, AirflowTaskTerminated):
                    raise AirflowTaskTerminated(f"task {self.task_id!r} was killed during its run") from exc
                raise
            if not isinstance(exc, Exception):  # an interrupt: on_kill would find no run
                _cancel_spark_jobs(self.log)
            raise
        finally:
            self._executing = False

    @contextmanager
    def _object_store(self) -> Iterator[None]:
        """The ``aws`` connection's access, read now and active for the run (see CdcCaptureOperator)."""
        from airflow_provider_cdc.cdc.sinks import object_store

        access = None
        if self.object_store_conn_id is not None:
            from airflow_provider_cdc.captures.object_store_connection import object_store_access

            with fail_fast_on_terminal_errors():
                check_object_store_conn_id(self.object_store_conn_id, self.sink_path)
                access = object_store_access(self.object_store_conn_id)
        with object_store.using(access):
            yield

    def _extract(self, context: Context, hook: Any, store: OffsetStore, source: str, interval: Any) -> dict[str, Any]:
        from airflow_provider_cdc.cdc.sources.postgres.query import run_query_window

        extraction = self.extraction
        prefix = extraction.topic_prefix
        with fail_fast_on_terminal_errors(), hook.capture_lock(prefix):
            check_writable(self.sink_path)
            commit_log = CommitLog(storage_for(self.sink_path), prefix)
            text = store.load(prefix)
            stored = QueryOffset.from_json(text, source=source) if text else None
            if stored is not None:
                stored.check(extraction, source=source)
            offset = stored or QueryOffset(prefix, extraction.table, extraction.cursor_column)
            latest = commit_log.latest()
            committed = latest.window.seq if latest else 0
            if offset.window_seq > committed:
                raise OffsetMismatchError(
                    f"{source} says query window {offset.window_seq} landed, but the sink's commit log ends at "
                    f"{committed or 'none'}: the sink path changed or lost files"
                )
            if latest is not None and committed > offset.window_seq:  # a run stopped after its commit
                offset = _with_run(offset.after(latest), latest)
            decision = decide(interval, offset.extra.get("runs"), "query", commit_log.committed)
            self.log.info("%s", decision.reason)
            if decision.replay:
                self._save(store, offset, stored)
                landed = decision.landed
                if not landed:
                    raise AirflowSkipException(f"{decision.reason}: nothing to report")
                return {**landed[-1].stats.get("query", {}), "window_id": landed[-1].window_id, "replayed": True}
            window = Window(offset.window_seq + 1, "query", None, None, int(time.time() * 1000))
            entry = run_query_window(
                extraction,
                hook.resolved_connection_info(),  # the sslmode settled here: Spark's tasks do not probe
                self.sink_path,
                window,
                offset,
                spark_provider=self._spark,
                run=None if interval is None else interval.to_dict(),
            )
            offset = _with_run(offset.after(entry), entry)
            self._save(store, offset, stored)
        summary = {**entry.stats["query"], "window_id": entry.window_id, "sink_path": self.sink_path}
        self.log.info("query window %s: %s", entry.window_id, summary)
        return summary

    def on_kill(self) -> None:
        """Killed by Airflow (a timeout, "mark failed", its supervisor's SIGTERM): cancel the
        in-process Spark jobs of the window, and end a run still executing here; nothing is saved
        after a kill (the offset only follows a commit; the lock is released as the run unwinds,
        or by the server)."""
        self._killed = True
        if not getattr(self, "_executing", False):
            return
        try:
            _cancel_spark_jobs(self.log)
            from airflow_provider_cdc import spark_runner

            spark_runner.drop_interrupted_call()  # the main thread waits in py4j: see there
        finally:
            from airflow.sdk.exceptions import AirflowTaskTerminated

            raise AirflowTaskTerminated(
                f"task {self.task_id!r} was killed during its run: no offset past the last committed window was saved"
            )

    def _save(self, store: OffsetStore, offset: QueryOffset, stored: QueryOffset | None) -> None:
        if stored is not None and offset == stored:
            return
        if getattr(self, "_killed", False):  # a kill during the supervisor's escalation: save nothing
            from airflow.sdk.exceptions import AirflowTaskTerminated

            raise AirflowTaskTerminated(f"task {self.task_id!r} was killed: not saving the offset")
        expected = stored.revision if stored is not None else None
        saved = replace(offset, revision=(expected or 0) + 1)
        store.save(saved.topic_prefix, saved.to_json(), revision=saved.revision, expected_revision=expected)

    def _spark(self) -> Any:
        from airflow_provider_cdc.cdc.basics.spark_session import get_or_create_session

        return get_or_create_session(SparkOptions(master=self.spark_master))


def _cancel_spark_jobs(log: Any) -> None:
    from airflow_provider_cdc import spark_runner

    log.warning("task killed: cancelling the in-process Spark jobs")
    spark_runner.cancel_embedded()  # never raises


def _with_run(offset: QueryOffset, entry: Any) -> QueryOffset:
    """Remember the run that landed ``entry`` (for backfills, see utils/runs.py)."""
    if not entry.stats.get("run"):
        return offset
    return replace(
        offset, extra={**offset.extra, "runs": record_run(offset.extra.get("runs"), entry.stats["run"], "query")}
    )
